package perl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sonde-dev/sonde/internal/cstr"
)

// Bounds of what is read for one name.
const (
	maxNameBytes = 1024 // a sub or package name
	maxPathBytes = 4096 // a file name
)

// ErrNotSub is matched by the error for an address that does not hold a
// sub (CV) or statement (COP) the namer can read: a frame read while it
// changed, or a corrupt chain.
var ErrNotSub = errors.New("not a perl sub")

// Frame kinds as the eBPF walker reports them (perl.h's enum
// perl_frame_kind). A sub's frame is reported by its CV, the others by
// their current statement (COP).
const (
	KindSub     = 1 // a sub
	KindEval    = 2 // an eval block or string
	KindRequire = 3 // a required file's top-level code (require, use)
	KindMain    = 4 // the program's top-level code
)

// Func is what naming a frame needs of one sub or statement.
type Func struct {
	Name string // Pkg::sub, (eval), (require), (main)
	File string
	// Check is the word the walker reports with the frame to tell this
	// object from another later at the same address: the low 32 bits of
	// a CV's body pointer (sv_any), of a COP's file pointer.
	Check uint32
	// hdr is the object's bytes as read: a cached Func is used again only
	// while they are unchanged.
	hdr []byte
}

func (f *Func) memSize() int64 { return 160 + int64(len(f.Name)+len(f.File)+len(f.hdr)) }

// Reader reads interpreter objects out of a process's memory. It is not
// safe for concurrent use.
type Reader struct {
	mem Memory
	l   Layout
}

// NewReader returns a Reader of mem with layout l.
func NewReader(mem Memory, l Layout) *Reader { return &Reader{mem: mem, l: l} }

func (r *Reader) u64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := r.mem.ReadAt(b[:], addr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (r *Reader) u32(addr uint64) (uint32, error) {
	var b [4]byte
	if err := r.mem.ReadAt(b[:], addr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// goodPtr says whether addr may be an 8-aligned user address.
func goodPtr(addr uint64) bool { return addr != 0 && addr&7 == 0 && addr < 1<<47 }

// svType returns the type of the SV at addr and its body (sv_any).
func (r *Reader) svType(addr uint64) (typ uint8, body uint64, flags uint32, err error) {
	if !goodPtr(addr) {
		return 0, 0, 0, fmt.Errorf("sv at %#x: bad address: %w", addr, ErrNotSub)
	}
	b := make([]byte, r.l.SvFlags+4)
	if err := r.mem.ReadAt(b, addr); err != nil {
		return 0, 0, 0, fmt.Errorf("sv at %#x: %w", addr, err)
	}
	flags = binary.LittleEndian.Uint32(b[r.l.SvFlags:])
	body = binary.LittleEndian.Uint64(b)
	if !goodPtr(body) {
		return 0, 0, 0, fmt.Errorf("sv at %#x: body at %#x: %w", addr, body, ErrNotSub)
	}
	return uint8(flags & svTypeMask), body, flags, nil
}

// cvHeader returns the bytes of the CV at addr that name it: its body
// pointer and the body's stash, name (GV or HEK), file and flags.
func (r *Reader) cvHeader(addr uint64) (hdr []byte, body uint64, err error) {
	typ, body, _, err := r.svType(addr)
	if err != nil {
		return nil, 0, err
	}
	if typ != svtPVCV {
		return nil, 0, fmt.Errorf("cv at %#x: type %d: %w", addr, typ, ErrNotSub)
	}
	l := r.l
	n := max(l.XcvStash+8, l.XcvGV+8, l.XcvFile+8, l.XcvFlags+4)
	hdr = make([]byte, 8+n)
	binary.LittleEndian.PutUint64(hdr, body)
	if err := r.mem.ReadAt(hdr[8:], body); err != nil {
		return nil, 0, fmt.Errorf("cv at %#x: body: %w", addr, err)
	}
	return hdr, body, nil
}

// Sub reads the CV at addr: its name (Pkg::sub) and file.
func (r *Reader) Sub(addr uint64) (*Func, error) {
	l := r.l
	hdr, body, err := r.cvHeader(addr)
	if err != nil {
		return nil, err
	}
	b := hdr[8:]
	stash := binary.LittleEndian.Uint64(b[l.XcvStash:])
	gv := binary.LittleEndian.Uint64(b[l.XcvGV:])
	fileAt := binary.LittleEndian.Uint64(b[l.XcvFile:])
	flags := binary.LittleEndian.Uint32(b[l.XcvFlags:])
	f := &Func{Check: uint32(body), hdr: hdr}
	var nameHek uint64
	if flags&cvfNamed != 0 {
		nameHek = gv
	} else if gv != 0 {
		typ, gbody, _, err := r.svType(gv)
		if err != nil {
			return nil, fmt.Errorf("cv at %#x: glob: %w", addr, err)
		}
		if typ != svtPVGV {
			return nil, fmt.Errorf("cv at %#x: glob of type %d: %w", addr, typ, ErrNotSub)
		}
		if nameHek, err = r.u64(gbody + uint64(l.XgvNameHek)); err != nil {
			return nil, fmt.Errorf("cv at %#x: glob name: %w", addr, err)
		}
		if stash, err = r.u64(gbody + uint64(l.XgvStash)); err != nil {
			return nil, fmt.Errorf("cv at %#x: glob stash: %w", addr, err)
		}
	}
	name := "__ANON__"
	if nameHek != 0 {
		if name, err = r.Hek(nameHek); err != nil {
			return nil, fmt.Errorf("cv at %#x: name: %w", addr, err)
		}
	}
	pkg := "__ANON__"
	if stash != 0 {
		if pkg, err = r.StashName(stash); err != nil {
			return nil, fmt.Errorf("cv at %#x: package: %w", addr, err)
		}
	}
	f.Name = pkg + "::" + name
	if fileAt != 0 {
		if f.File, err = r.CString(fileAt, maxPathBytes); err != nil {
			return nil, fmt.Errorf("cv at %#x: file: %w", addr, err)
		}
	}
	return f, nil
}

// maxHashMax bounds a stash's bucket array's last index: a package of
// millions of names is no package.
const maxHashMax = 1<<24 - 1

// auxAfterArray returns where a hash at addr with body keeps its aux struct
// in Perls before 5.36: right after its bucket array, HvARRAY(hv)[HvMAX+1].
func (r *Reader) auxAfterArray(addr, body uint64) (uint64, error) {
	array, err := r.u64(addr + uint64(r.l.SvU))
	if err != nil {
		return 0, fmt.Errorf("bucket array: %w", err)
	}
	hmax, err := r.u64(body + uint64(r.l.XhvMax))
	if err != nil {
		return 0, fmt.Errorf("bucket count: %w", err)
	}
	if array == 0 || hmax > maxHashMax || (hmax+1)&hmax != 0 {
		return 0, fmt.Errorf("bucket array %#x of %d: %w", array, hmax+1, ErrNotSub)
	}
	return array + (hmax+1)*8, nil
}

// StashName returns the name of the package (stash, a hash) at addr;
// "__ANON__" for one without a name (a deleted package).
func (r *Reader) StashName(addr uint64) (string, error) {
	l := r.l
	typ, body, flags, err := r.svType(addr)
	if err != nil {
		return "", err
	}
	if typ != svtPVHV {
		return "", fmt.Errorf("stash at %#x: type %d: %w", addr, typ, ErrNotSub)
	}
	if flags&svfOOK == 0 {
		return "__ANON__", nil
	}
	aux := body + uint64(l.XhvAux)
	if l.XhvAux < 0 {
		if aux, err = r.auxAfterArray(addr, body); err != nil {
			return "", fmt.Errorf("stash at %#x: %w", addr, err)
		}
	}
	name, err := r.u64(aux + uint64(l.AuxName))
	if err != nil {
		return "", fmt.Errorf("stash at %#x: name: %w", addr, err)
	}
	count, err := r.u32(aux + uint64(l.AuxNameCount))
	if err != nil {
		return "", fmt.Errorf("stash at %#x: name: %w", addr, err)
	}
	if count != 0 && name != 0 {
		// Several names (a package renamed or aliased): the first is its
		// name.
		if name, err = r.u64(name); err != nil {
			return "", fmt.Errorf("stash at %#x: names: %w", addr, err)
		}
	}
	if name == 0 {
		return "__ANON__", nil
	}
	return r.Hek(name)
}

// Hek reads the hash key (HEK) at addr.
func (r *Reader) Hek(addr uint64) (string, error) {
	if addr == 0 || addr >= 1<<47 || addr&3 != 0 {
		return "", fmt.Errorf("hek at %#x: bad address", addr)
	}
	n, err := r.u32(addr + uint64(r.l.HekLen))
	if err != nil {
		return "", fmt.Errorf("hek at %#x: %w", addr, err)
	}
	if n == 0 || n > maxNameBytes {
		return "", fmt.Errorf("hek at %#x: %d bytes", addr, int32(n))
	}
	b := make([]byte, n)
	if err := r.mem.ReadAt(b, addr+uint64(r.l.HekKey)); err != nil {
		return "", fmt.Errorf("hek at %#x: %w", addr, err)
	}
	return cstr.Clean(b), nil
}

// CString reads the NUL-terminated string at addr, of at most limit bytes.
func (r *Reader) CString(addr uint64, limit int) (string, error) {
	if addr == 0 || addr >= 1<<47 {
		return "", fmt.Errorf("string at %#x: bad address", addr)
	}
	var out []byte
	chunk := make([]byte, 64)
	for len(out) < limit {
		// Reads stop at a page's end: the string may end just before an
		// unmapped page.
		n := min(uint64(len(chunk)), 4096-(addr+uint64(len(out)))%4096)
		b := chunk[:n]
		if err := r.mem.ReadAt(b, addr+uint64(len(out))); err != nil {
			return "", fmt.Errorf("string at %#x: %w", addr, err)
		}
		if i := bytes.IndexByte(b, 0); i >= 0 {
			out = append(out, b[:i]...)
			if len(out) == 0 {
				return "", fmt.Errorf("string at %#x: empty", addr)
			}
			if len(out) > limit {
				break
			}
			return cstr.Clean(out), nil
		}
		out = append(out, b...)
	}
	return "", fmt.Errorf("string at %#x: longer than %d bytes", addr, limit)
}

// Cop reads the file and line of the statement (COP) at addr.
func (r *Reader) Cop(addr uint64) (file string, line int64, fileAt uint64, err error) {
	if !goodPtr(addr) {
		return "", 0, 0, fmt.Errorf("cop at %#x: bad address: %w", addr, ErrNotSub)
	}
	b := make([]byte, max(r.l.CopLine+4, r.l.CopFile+8))
	if err := r.mem.ReadAt(b, addr); err != nil {
		return "", 0, 0, fmt.Errorf("cop at %#x: %w", addr, err)
	}
	line = int64(binary.LittleEndian.Uint32(b[r.l.CopLine:]))
	fileAt = binary.LittleEndian.Uint64(b[r.l.CopFile:])
	if fileAt == 0 {
		return "", line, 0, nil
	}
	file, err = r.CString(fileAt, maxPathBytes)
	if err != nil {
		return "", 0, 0, fmt.Errorf("cop at %#x: file: %w", addr, err)
	}
	return file, line, fileAt, nil
}

// Code reads the statement at addr of a frame of kind (not KindSub), as
// the walker reports it: named after its kind, with the statement's file.
func (r *Reader) Code(addr uint64, kind uint8) (*Func, error) {
	file, _, fileAt, err := r.Cop(addr)
	if err != nil {
		return nil, err
	}
	hdr := make([]byte, 8)
	binary.LittleEndian.PutUint64(hdr, fileAt)
	return &Func{Name: codeName(kind), File: file, Check: uint32(fileAt), hdr: hdr}, nil
}

// codeName names a frame that is not a sub's.
func codeName(kind uint8) string {
	switch kind {
	case KindEval:
		return "(eval)"
	case KindRequire:
		return "(require)"
	}
	return "(main)"
}

// same reports whether the object f was read from at addr (of kind) still
// holds the bytes it was read from; readable is false where it could not
// be read at all (the process has exited, or the object's memory was
// unmapped).
func (r *Reader) same(f *Func, addr uint64, kind uint8) (same, readable bool) {
	if kind == KindSub {
		hdr, _, err := r.cvHeader(addr)
		if err != nil {
			return false, errors.Is(err, ErrNotSub)
		}
		return string(hdr) == string(f.hdr), true
	}
	fileAt, err := r.u64(addr + uint64(r.l.CopFile))
	if err != nil {
		return false, false
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], fileAt)
	return string(b[:]) == string(f.hdr), true
}
