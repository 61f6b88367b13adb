package php

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sonde-dev/sonde/internal/cstr"
)

// Bounds of what is read for one name.
const (
	maxNameBytes = 1024 // a function or class name
	maxPathBytes = 4096 // a file name
)

// ErrNotFunction is matched by the error for an address that does not hold
// a zend_function (a frame read while it changed, or a corrupt chain).
var ErrNotFunction = errors.New("not a php function")

// Frame kinds as the eBPF walker reports them (php.h's enum
// php_frame_kind).
const (
	KindFunction = 1 // a user function or method
	KindInternal = 2 // a function of the engine or an extension (C)
	KindMain     = 3 // the script's top-level code
	KindInclude  = 4 // an included file's top-level code
	KindEval     = 5 // eval'd code
)

// CodeKind says whether frames of kind are a file's top-level code, which
// the walker reports by their file name's zend_string: the op_array of
// such code lives only while it runs (an FPM request's script, an
// include), the name (interned) for the process's life.
func CodeKind(kind uint8) bool { return kind == KindMain || kind == KindInclude || kind == KindEval }

// Func is what naming a frame needs of one zend_function.
type Func struct {
	Name      string // Class::method, function, {closure}, {main}, ...
	File      string // "" for an internal function
	LineStart int64
	Internal  bool
	// Closure: a closure's function, a copy in its Closure object, which
	// is freed with it while its opcodes (its declaring function's) live
	// on.
	Closure bool
	// Check is the word the walker reports with the frame to tell this
	// function from another later at the same address: the low 32 bits
	// of its opcodes (user code) or of its name (internal functions).
	Check uint32
	// hdr is the function's first bytes (type, flags, name, scope) as
	// read: a cached Func is used again only while they are unchanged.
	hdr []byte
}

func (f *Func) memSize() int64 { return 160 + int64(len(f.Name)+len(f.File)+len(f.hdr)) }

// Reader reads engine objects out of a process's memory. It is not safe
// for concurrent use.
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

// header returns the common part of the zend_function at addr, as read:
// enough for its type, flags, name and scope.
func (r *Reader) header(addr uint64) ([]byte, error) {
	if addr == 0 || addr&7 != 0 || addr >= 1<<47 {
		return nil, fmt.Errorf("function at %#x: %w", addr, ErrNotFunction)
	}
	n := max(r.l.FnType+1, r.l.FnFlags+4, r.l.FnName+8, r.l.FnScope+8)
	b := make([]byte, n)
	if err := r.mem.ReadAt(b, addr); err != nil {
		return nil, fmt.Errorf("function at %#x: %w", addr, err)
	}
	return b, nil
}

// Function reads the zend_function at addr; kind is how the walker saw its
// frame (Kind*), which names a function without a name.
func (r *Reader) Function(addr uint64, kind uint8) (*Func, error) {
	l := r.l
	hdr, err := r.header(addr)
	if err != nil {
		return nil, err
	}
	typ := hdr[l.FnType]
	flags := binary.LittleEndian.Uint32(hdr[l.FnFlags:])
	nameAt := binary.LittleEndian.Uint64(hdr[l.FnName:])
	scopeAt := binary.LittleEndian.Uint64(hdr[l.FnScope:])
	f := &Func{hdr: hdr}
	name := ""
	if nameAt != 0 {
		if name, err = r.String(nameAt, maxNameBytes); err != nil {
			return nil, fmt.Errorf("function at %#x: name: %w", addr, err)
		}
	}
	switch typ {
	case internalFunction:
		f.Internal = true
		f.Check = uint32(nameAt)
		if name == "" {
			return nil, fmt.Errorf("internal function at %#x without a name: %w", addr, ErrNotFunction)
		}
	case userFunction, evalCode:
		body := make([]byte, max(l.OpOpcodes+8, l.OpFilename+8, l.OpLineStart+4))
		if err := r.mem.ReadAt(body, addr); err != nil {
			return nil, fmt.Errorf("function at %#x: %w", addr, err)
		}
		opcodes := binary.LittleEndian.Uint64(body[l.OpOpcodes:])
		if opcodes == 0 {
			return nil, fmt.Errorf("function at %#x without opcodes: %w", addr, ErrNotFunction)
		}
		f.Check = uint32(opcodes)
		f.Closure = flags&zendACCClosure != 0
		if fileAt := binary.LittleEndian.Uint64(body[l.OpFilename:]); fileAt != 0 {
			if f.File, err = r.String(fileAt, maxPathBytes); err != nil {
				return nil, fmt.Errorf("function at %#x: file: %w", addr, err)
			}
		}
		f.LineStart = int64(binary.LittleEndian.Uint32(body[l.OpLineStart:]))
		if name == "" {
			name = codeName(typ, kind)
		}
	default:
		return nil, fmt.Errorf("function at %#x: type %d: %w", addr, typ, ErrNotFunction)
	}
	if scopeAt != 0 && (nameAt != 0 || flags&zendACCClosure != 0) {
		nameAt, err := r.u64(scopeAt + uint64(l.ClassName))
		if err != nil {
			return nil, fmt.Errorf("function at %#x: class: %w", addr, err)
		}
		class, err := r.String(nameAt, maxNameBytes)
		if err != nil {
			return nil, fmt.Errorf("function at %#x: class name: %w", addr, err)
		}
		name = class + "::" + name
	}
	f.Name = name
	return f, nil
}

// codeName names a file's top-level code.
func codeName(typ byte, kind uint8) string {
	switch {
	case typ == evalCode || kind == KindEval:
		return "{eval}"
	case kind == KindMain:
		return "{main}"
	}
	return "{include}"
}

// Code reads the file name (a zend_string) at addr of top-level code of
// kind (see CodeKind), as the walker reports such a frame.
func (r *Reader) Code(addr uint64, kind uint8) (*Func, error) {
	file, err := r.String(addr, maxPathBytes)
	if err != nil {
		return nil, fmt.Errorf("code of file at %#x: %w", addr, err)
	}
	hdr := make([]byte, r.l.StrVal+min(8, int64(len(file))))
	if err := r.mem.ReadAt(hdr, addr); err != nil {
		return nil, fmt.Errorf("code of file at %#x: %w", addr, err)
	}
	return &Func{Name: codeName(0, kind), File: file, Check: uint32(addr), hdr: hdr}, nil
}

// Same reports whether the function at addr still starts with the bytes f
// was read from; readable is false where they could not be read at all
// (the process has exited, or the memory was unmapped).
func (r *Reader) Same(f *Func, addr uint64) (same, readable bool) {
	b := make([]byte, len(f.hdr))
	if r.mem.ReadAt(b, addr) != nil {
		return false, false
	}
	return string(b) == string(f.hdr), true
}

// String reads the zend_string at addr, of at most limit bytes.
func (r *Reader) String(addr uint64, limit int) (string, error) {
	if addr == 0 || addr&7 != 0 || addr >= 1<<47 {
		return "", fmt.Errorf("string at %#x: bad address", addr)
	}
	h := make([]byte, r.l.StrVal)
	if err := r.mem.ReadAt(h, addr); err != nil {
		return "", fmt.Errorf("string at %#x: %w", addr, err)
	}
	n := binary.LittleEndian.Uint64(h[r.l.StrLen:])
	if n == 0 || n > uint64(limit) {
		return "", fmt.Errorf("string at %#x: %d bytes", addr, n)
	}
	b := make([]byte, n)
	if err := r.mem.ReadAt(b, addr+uint64(r.l.StrVal)); err != nil {
		return "", fmt.Errorf("string at %#x: %w", addr, err)
	}
	if s := cstr.Clean(b); s != "" {
		return s, nil
	}
	return "", fmt.Errorf("string at %#x: starts with a NUL", addr)
}

// Line returns the line of the opline at addr in the user function fn, or
// 0 where addr is not one of fn's opcodes.
func (r *Reader) Line(fn, opline uint64) int64 {
	l := r.l
	b := make([]byte, max(l.OpOpcodes+8, l.OpLast+4))
	if r.mem.ReadAt(b, fn) != nil {
		return 0
	}
	opcodes := binary.LittleEndian.Uint64(b[l.OpOpcodes:])
	last := uint64(binary.LittleEndian.Uint32(b[l.OpLast:]))
	if opline < opcodes || opline >= opcodes+last*uint64(l.OpSize) || (opline-opcodes)%uint64(l.OpSize) != 0 {
		return 0
	}
	var ln [4]byte
	if r.mem.ReadAt(ln[:], opline+uint64(l.OpLineno)) != nil {
		return 0
	}
	return int64(binary.LittleEndian.Uint32(ln[:]))
}
