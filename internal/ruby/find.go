package ruby

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
)

// Memory reads another process's memory; python.ProcMem is one.
type Memory = python.Memory

// Range is [Start, End) in a process's address space.
type Range struct{ Start, End uint64 }

// Interp is a Ruby VM found in a process: where its state is and how to
// read it. Addresses are the process's.
type Interp struct {
	Version      string // "3.1.2"
	Major, Minor int
	Layout       Layout
	// File is the ELF that holds the VM (libruby-3.1.so.3.1.2, or a
	// statically linked ruby), as the agent opened it.
	File string
	// VMPtr is &ruby_current_vm_ptr.
	VMPtr uint64
	// TLSOffset says where a thread's ruby_current_ec is: at its thread
	// pointer (fsbase) minus TLSOffset. libruby's TLS block is in the
	// static TLS area (the library is loaded at start-up), at the same
	// place for every thread.
	TLSOffset uint64
	// Core is vm_exec_core, the VM loop: a native frame there runs the
	// Ruby frames from the current one up to the first with
	// VM_FRAME_FLAG_FINISH. Exec is the function that calls it
	// (rb_vm_exec; vm_exec in 3.3).
	Core, Exec Range
	// Classes are the IDs classes keep their names under; zero where they
	// were not found (methods are then named without their class).
	Classes ClassIDs
}

// ErrNotRuby is matched when a process maps no Ruby VM.
var ErrNotRuby = errors.New("no ruby vm")

// ErrNotStarted is matched when a process maps a Ruby VM that has not set
// up its main thread yet: it is looked at again later.
var ErrNotStarted = errors.New("ruby vm not started")

// engineName matches the files that may hold the VM: libruby-3.1.so.3.1,
// libruby.so.3.1, ruby, ruby3.1.
var engineName = regexp.MustCompile(`^(?:libruby(?:-[0-9.]+)?\.so(?:\.[0-9.]+)?|ruby[0-9.]*)$`)

// Find locates the VM in p with the table's layouts. mem is p's memory,
// read to find the thread-local execution context and check the layout.
func Find(p *process.Process, mem Memory) (*Interp, error) {
	return FindWith(p, mem, LayoutFor)
}

// FindWith is Find with the versions layouts knows instead of the table's.
func FindWith(p *process.Process, mem Memory, layouts LayoutFunc) (*Interp, error) {
	seen := map[string]bool{}
	var firstErr error
	for _, m := range p.Mappings {
		if !m.FileBacked() || !m.Executable() || seen[m.Path] || !engineName.MatchString(filepath.Base(m.Path)) {
			continue
		}
		seen[m.Path] = true
		in, err := findIn(p, m, mem, layouts)
		if err == nil {
			return in, nil
		}
		if firstErr == nil || !errors.Is(err, ErrNotRuby) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrNotRuby
}

// binInfo is what one VM binary says, whichever process maps it.
type binInfo struct {
	version      string
	major, minor int
	vmPtr        uint64     // ruby_current_vm_ptr's file address
	ec           uint64     // ruby_current_ec's offset in libruby's TLS block
	exec         [2]uint64  // the function that calls vm_exec_core
	object       elf.Symbol // rb_cObject, 0: none
	tlsAlign     uint64
	core         [2]uint64 // vm_exec_core's file addresses
}

// binCache keeps the binInfo of the binaries read so far by device, inode,
// size and mtime, up to maxBins. Safe for concurrent use.
var binCache = struct {
	sync.Mutex
	m map[binKey]*binInfo
}{m: map[binKey]*binInfo{}}

const maxBins = 64

type binKey struct {
	dev, ino    uint64
	size, mtime int64
}

// readBin reads path's symbols, version and VM loop, or finds them cached.
func readBin(path string) (*binInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var key binKey
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		key = binKey{uint64(s.Dev), s.Ino, st.Size(), st.ModTime().UnixNano()}
		binCache.Lock()
		bi, ok := binCache.m[key]
		binCache.Unlock()
		if ok {
			return bi, nil
		}
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bi, err := readELF(f)
	if err != nil {
		return nil, err
	}
	if key != (binKey{}) {
		binCache.Lock()
		if len(binCache.m) >= maxBins {
			clear(binCache.m)
		}
		binCache.m[key] = bi
		binCache.Unlock()
	}
	return bi, nil
}

func readELF(f *elf.File) (*binInfo, error) {
	syms := elfx.FindSymbols(f, "ruby_current_vm_ptr", "ruby_current_ec", "rb_vm_exec", "ruby_version", "rb_cObject",
		"ruby_vm_at_exit", "rb_current_receiver", "rb_iseq_eval")
	ver, ok := syms["ruby_version"]
	if !ok {
		return nil, fmt.Errorf("no ruby_version: %w", ErrNotRuby)
	}
	bi := &binInfo{object: syms["rb_cObject"]}
	b, err := readAddr(f, ver.Value, 16)
	if err != nil {
		return nil, fmt.Errorf("ruby_version: %w", err)
	}
	if bi.major, bi.minor, bi.version, err = ParseVersion(b); err != nil {
		return nil, err
	}
	var tlsSize uint64
	for _, p := range f.Progs {
		if p.Type == elf.PT_TLS {
			bi.tlsAlign, tlsSize = max(p.Align, 1), p.Memsz
		}
	}
	if bi.tlsAlign == 0 {
		return nil, fmt.Errorf("ruby %s: no TLS segment", bi.version)
	}
	hdr := f.Section(".eh_frame_hdr")
	if hdr == nil || hdr.Type == elf.SHT_NOBITS || hdr.Size > 16<<20 {
		return nil, fmt.Errorf("ruby %s: no .eh_frame_hdr", bi.version)
	}
	hb, err := hdr.Data()
	if err != nil {
		return nil, fmt.Errorf(".eh_frame_hdr: %w", err)
	}
	starts, err := ParseEhFrameHdr(hb, hdr.Addr)
	if err != nil {
		return nil, err
	}
	// Exported (Debian's 3.1) or in .symtab (an unstripped build), else
	// read from the code of the public API (hidden.go).
	hidden := f.Machine == elf.EM_X86_64
	if s, ok := syms["ruby_current_vm_ptr"]; ok {
		bi.vmPtr = s.Value
	} else if fn, ok := syms["ruby_vm_at_exit"]; ok && hidden {
		if bi.vmPtr, err = hiddenVMPtr(f, fn); err != nil {
			return nil, fmt.Errorf("ruby %s: %w: %w", bi.version, err, ErrUnknownVersion)
		}
	} else {
		return nil, fmt.Errorf("ruby %s: no ruby_current_vm_ptr: %w", bi.version, ErrUnknownVersion)
	}
	if s, ok := syms["ruby_current_ec"]; ok && elf.ST_TYPE(s.Info) == elf.STT_TLS {
		bi.ec = s.Value
	} else if fn, ok := syms["rb_current_receiver"]; ok && hidden {
		if bi.ec, err = hiddenEC(f, fn, tlsSize); err != nil {
			return nil, fmt.Errorf("ruby %s: %w: %w", bi.version, err, ErrUnknownVersion)
		}
	} else {
		return nil, fmt.Errorf("ruby %s: no thread-local ruby_current_ec: %w", bi.version, ErrUnknownVersion)
	}
	if s, ok := syms["rb_vm_exec"]; ok {
		bi.exec = [2]uint64{s.Value, s.Value + s.Size}
		if bi.core[0], bi.core[1], err = loopIn(f, s.Value, s.Value+s.Size, starts); err != nil {
			return nil, fmt.Errorf("ruby %s: rb_vm_exec: %w", bi.version, err)
		}
	} else if fn, ok := syms["rb_iseq_eval"]; ok && hidden {
		if bi.exec, bi.core, err = hiddenExec(f, fn, starts); err != nil {
			return nil, fmt.Errorf("ruby %s: %w: %w", bi.version, err, ErrUnknownVersion)
		}
	} else {
		return nil, fmt.Errorf("ruby %s: no rb_vm_exec: %w", bi.version, ErrUnknownVersion)
	}
	return bi, nil
}

// readAddr reads n bytes at file address addr from the section that holds
// them.
func readAddr(f *elf.File, addr uint64, n int) ([]byte, error) {
	s := sectionOf(f, addr)
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, fmt.Errorf("no section holds %#x", addr)
	}
	b := make([]byte, min(uint64(n), s.Addr+s.Size-addr))
	if _, err := s.ReadAt(b, int64(addr-s.Addr)); err != nil {
		return nil, err
	}
	return b, nil
}

// loopIn runs VMLoop on the code of the function at [start, end) (its
// first 64 KiB).
func loopIn(f *elf.File, start, end uint64, starts []uint64) (uint64, uint64, error) {
	code, err := readAddr(f, start, int(min(end-start, 1<<16)))
	if err != nil {
		return 0, 0, err
	}
	return VMLoop(code, start, starts)
}

// rel32 is the target of the relative call or jump (e8 or e9 rel32) at
// code[i], code being at file address at.
func rel32(code []byte, i int, at uint64) uint64 {
	return uint64(int64(at) + int64(i) + 5 + int64(int32(binary.LittleEndian.Uint32(code[i+1:]))))
}

// ParseVersion reads ruby_version's bytes ("3.1.2\0"). Only Ruby 3 is
// recognised.
func ParseVersion(b []byte) (major, minor int, version string, err error) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	parts := bytes.Split(b, []byte("."))
	if len(parts) != 3 {
		return 0, 0, "", fmt.Errorf("ruby version %q: %w", b, ErrNotRuby)
	}
	var n [3]int
	for i, p := range parts {
		if len(p) == 0 || len(p) > 4 {
			return 0, 0, "", fmt.Errorf("ruby version %q: %w", b, ErrNotRuby)
		}
		v, err := strconv.Atoi(string(p))
		if err != nil || v < 0 {
			return 0, 0, "", fmt.Errorf("ruby version %q: %w", b, ErrNotRuby)
		}
		n[i] = v
	}
	version = fmt.Sprintf("%d.%d.%d", n[0], n[1], n[2])
	if n[0] != 3 {
		return n[0], n[1], version, fmt.Errorf("ruby %s: %w", version, ErrUnknownVersion)
	}
	return n[0], n[1], version, nil
}

// ParseEhFrameHdr returns the sorted function starts of an .eh_frame_hdr
// at file address addr: its binary search table, in the encoding every
// linker writes (datarel sdata4 pairs).
func ParseEhFrameHdr(b []byte, addr uint64) ([]uint64, error) {
	if len(b) < 12 || b[0] != 1 {
		return nil, errors.New(".eh_frame_hdr: bad header")
	}
	if b[1] != 0x1b || b[2] != 0x03 || b[3] != 0x3b {
		return nil, fmt.Errorf(".eh_frame_hdr: encodings %#x %#x %#x not supported", b[1], b[2], b[3])
	}
	n := uint64(binary.LittleEndian.Uint32(b[8:]))
	if n > uint64(len(b)-12)/8 {
		return nil, fmt.Errorf(".eh_frame_hdr: %d entries in %d bytes", n, len(b))
	}
	out := make([]uint64, 0, n)
	for i := uint64(0); i < n; i++ {
		rel := int32(binary.LittleEndian.Uint32(b[12+8*i:]))
		pc := uint64(int64(addr) + int64(rel))
		if len(out) > 0 && pc < out[len(out)-1] {
			return nil, errors.New(".eh_frame_hdr: table not sorted")
		}
		out = append(out, pc)
	}
	return out, nil
}

// VMLoop finds vm_exec_core, a local function, from the code of rb_vm_exec
// (at file address at): of the functions it calls directly (an e8 rel32
// whose target starts a function of starts), the largest. It returns the
// function's extent up to the next function's start.
func VMLoop(code []byte, at uint64, starts []uint64) (start, end uint64, err error) {
	for i := 0; i+5 <= len(code); i++ {
		if code[i] != 0xe8 {
			continue
		}
		t := rel32(code, i, at)
		j, found := searchStart(starts, t)
		if !found || j+1 >= len(starts) {
			continue
		}
		if e := starts[j+1]; e-t > end-start {
			start, end = t, e
		}
	}
	if end-start < 4096 {
		return 0, 0, errors.New("no vm loop called from rb_vm_exec")
	}
	return start, end, nil
}

func searchStart(starts []uint64, pc uint64) (int, bool) {
	lo, hi := 0, len(starts)
	for lo < hi {
		m := (lo + hi) / 2
		if starts[m] < pc {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(starts) && starts[lo] == pc
}

// findIn reads the VM of the file mapped by m.
func findIn(p *process.Process, m process.Mapping, mem Memory, layouts LayoutFunc) (*Interp, error) {
	path := p.FilePath(m)
	if path == "" {
		return nil, fmt.Errorf("ruby file %s: not readable: %w", m.Path, ErrNotRuby)
	}
	bi, err := readBin(path)
	if err != nil {
		return nil, fmt.Errorf("ruby file %s: %w", m.Path, err)
	}
	l, err := layouts(bi.major, bi.minor)
	if err != nil {
		return nil, fmt.Errorf("ruby %s: %w", bi.version, err)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ruby file %s: %w", m.Path, err)
	}
	base, err := elfx.LoadBias(f, m.Start, m.Offset)
	_ = f.Close() // read only
	if err != nil {
		return nil, fmt.Errorf("ruby file %s: %w", m.Path, err)
	}
	in := &Interp{Version: bi.version, Major: bi.major, Minor: bi.minor, Layout: l, File: path,
		VMPtr: base + bi.vmPtr,
		Core:  Range{base + bi.core[0], base + bi.core[1]},
		Exec:  Range{base + bi.exec[0], base + bi.exec[1]}}
	if in.TLSOffset, err = tlsOffset(mem, l, in.VMPtr, bi.ec, bi.tlsAlign); err != nil {
		return nil, fmt.Errorf("ruby %s: %w", bi.version, err)
	}
	if bi.object.Value != 0 {
		r := NewReader(mem, l)
		if obj, err := r.ptr(base + bi.object.Value); err == nil && obj != 0 {
			// Not found: methods are named without their class.
			in.Classes, _ = r.FindClassIDs(obj)
		}
	}
	return in, nil
}

// tlsScan bounds how far below the main thread's thread pointer its
// ruby_current_ec is looked for: the static TLS blocks of the libraries
// loaded at start-up.
const tlsScan = 4096

// tlsOffset finds where a thread's ruby_current_ec lies below its thread
// pointer, from the main thread: its rb_thread_t holds its thread pointer
// (thread_id, pthread_self()) and its execution context, which the
// thread's ruby_current_ec points to. The one word below the thread
// pointer that holds it, at the variable's place in a block of libruby's
// TLS alignment, is the variable. It also checks the layout: the context
// names the thread as its own.
func tlsOffset(mem Memory, l Layout, vmPtr, sym, align uint64) (uint64, error) {
	r := &Reader{mem: mem, l: l}
	vm, err := r.u64(vmPtr)
	if err != nil {
		// A process caught while the loader has mapped libruby's code but
		// not yet its data: looked at again.
		return 0, fmt.Errorf("ruby_current_vm_ptr: %w: %w", err, ErrNotStarted)
	}
	if vm == 0 {
		return 0, ErrNotStarted
	}
	th, err := r.ptr(vm + uint64(l.VMMainThread))
	if err != nil {
		return 0, fmt.Errorf("main thread: %w", err)
	}
	if th == 0 {
		return 0, ErrNotStarted
	}
	ec, err := r.ptr(th + uint64(l.ThreadEC))
	if err != nil {
		return 0, fmt.Errorf("main thread: %w", err)
	}
	tp, err := r.threadPointer(th)
	if err != nil {
		return 0, fmt.Errorf("main thread: %w", err)
	}
	if ec == 0 || tp == 0 || tp < tlsScan {
		return 0, ErrNotStarted
	}
	if back, err := r.u64(ec + uint64(l.ECThread)); err != nil || back != th {
		return 0, fmt.Errorf("main thread %#x: its context %#x does not name it: %w", th, ec, ErrUnknownVersion)
	}
	// Read down from the thread pointer a page at a time: the block below
	// the area may be unmapped.
	var buf []byte
	for lo := tp; tp-lo < tlsScan; {
		next := max((lo-1)&^4095, tp-tlsScan)
		b := make([]byte, lo-next)
		if err := mem.ReadAt(b, next); err != nil {
			if len(buf) == 0 {
				return 0, fmt.Errorf("static tls: %w", err)
			}
			break
		}
		buf, lo = append(b, buf...), next
	}
	return tlsMatch(buf, tp, ec, sym, align)
}

// tlsMatch finds the word of buf (the tlsScan bytes below thread pointer
// tp) that holds ec at a place where a TLS block of alignment align holds
// its variable at sym, and returns tp minus its address.
func tlsMatch(buf []byte, tp, ec, sym, align uint64) (uint64, error) {
	var found uint64
	n := 0
	for i := 0; i+8 <= len(buf); i += 8 {
		if binary.LittleEndian.Uint64(buf[i:]) != ec {
			continue
		}
		addr := tp - uint64(len(buf)) + uint64(i)
		if align == 0 || (addr-sym)%align != 0 {
			continue
		}
		found = tp - addr
		n++
	}
	switch {
	case n == 0:
		return 0, fmt.Errorf("ruby_current_ec not in the main thread's static tls")
	case n > 1:
		return 0, fmt.Errorf("ruby_current_ec: %d candidates in the main thread's static tls", n)
	}
	return found, nil
}
