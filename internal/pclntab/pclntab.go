// Package pclntab reads the Go runtime's PC/line table (.gopclntab) directly
// from its bytes: function names, file/line positions, stack-pointer deltas
// and the inline tree, for Go 1.18 and later.
//
// Unlike debug/gosym it builds nothing per function: Open checks the header
// and keeps sub-slices of the section, and each lookup binary-searches the
// function table and decodes only the pcvalue tables of the function that
// covers the PC. A Table is immutable and safe for concurrent use.
package pclntab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// ErrUnsupported is returned by Open for tables older than Go 1.18 or with
// an unknown magic number.
var ErrUnsupported = errors.New("unsupported pclntab version")

// Magic numbers at the start of the table (internal/abi.PCLnTabMagic).
const (
	magic118 = 0xfffffff0 // Go 1.18 and 1.19
	magic120 = 0xfffffff1 // Go 1.20 and later
)

// Table-internal constants (internal/abi).
const (
	pcdataInlTreeIndex = 2
	funcdataInlTree    = 3
	noFuncdata         = ^uint32(0)
)

// maxInlineDepth bounds the inline chain of one PC; a hostile tree could
// otherwise loop forever. Real chains are a handful of levels deep.
const maxInlineDepth = 128

// Frame is one source-level frame: a function and the position in it.
// For an inlined caller the position is the call site of its callee.
type Frame struct {
	Function string
	File     string
	Line     int64
}

// Table reads one binary's pclntab.
//
// The strings it returns point into the bytes given to Open, which the Table
// owns from then on: they stay valid as long as the strings are referenced,
// and keeping such a string keeps the whole section alive. Callers that
// cache names for longer than the Table should clone them.
type Table struct {
	data      []byte // the whole section
	gofunc    []byte // funcdata base (go:func.*); nil: no inline trees
	textStart uint64
	big       bool // big-endian
	ver120    bool // Go 1.20+ func and inline-tree layouts
	quantum   uint32
	nfunc     uint32

	funcnametab, cutab, filetab, pctab, functab, funcs []byte
}

// Open parses the header of a Go 1.18+ pclntab.
//
// pclntab is the content of the .gopclntab section. textStart is the address
// of runtime.text (moduledata.text), the base of the table's entry offsets;
// for internally linked binaries it is the start of .text. gofunc is the
// memory from the address of go:func.* (moduledata.gofunc) on: function
// metadata offsets, among them the inline trees, are relative to it; from
// Go 1.26 it lies inside the pclntab section. With a nil gofunc, Frames
// cannot expand inlined calls and names each PC by its physical function.
//
// Open takes ownership of both slices: the caller must not modify them.
func Open(pclntab []byte, textStart uint64, gofunc []byte) (*Table, error) {
	if len(pclntab) < 8 {
		return nil, fmt.Errorf("pclntab: %d bytes is too short for a header", len(pclntab))
	}
	t := &Table{data: pclntab, gofunc: gofunc, textStart: textStart}
	le, be := binary.LittleEndian.Uint32(pclntab), binary.BigEndian.Uint32(pclntab)
	switch {
	case le == magic120 || le == magic118:
		t.ver120 = le == magic120
	case be == magic120 || be == magic118:
		t.big, t.ver120 = true, be == magic120
	default:
		return nil, fmt.Errorf("pclntab: magic %#x: %w", le, ErrUnsupported)
	}
	if pclntab[4] != 0 || pclntab[5] != 0 {
		return nil, errors.New("pclntab: bad header padding")
	}
	switch pclntab[6] {
	case 1, 2, 4:
		t.quantum = uint32(pclntab[6])
	default:
		return nil, fmt.Errorf("pclntab: pc quantum %d", pclntab[6])
	}
	ptr := int(pclntab[7])
	if ptr != 4 && ptr != 8 {
		return nil, fmt.Errorf("pclntab: pointer size %d", ptr)
	}
	// Header words: nfunc, nfiles, (unused) textStart, then the offsets of
	// funcnametab, cutab, filetab, pctab and the function table.
	const nwords = 8
	if len(pclntab) < 8+nwords*ptr {
		return nil, fmt.Errorf("pclntab: %d bytes is too short for a header", len(pclntab))
	}
	word := func(i int) uint64 {
		b := pclntab[8+i*ptr:]
		if ptr == 4 {
			return uint64(t.u32(b))
		}
		if t.big {
			return binary.BigEndian.Uint64(b)
		}
		return binary.LittleEndian.Uint64(b)
	}
	sub := func(name string, i int) ([]byte, error) {
		off := word(i)
		if off > uint64(len(pclntab)) {
			return nil, fmt.Errorf("pclntab: %s offset %#x beyond %d bytes", name, off, len(pclntab))
		}
		return pclntab[off:], nil
	}
	var err error
	if t.funcnametab, err = sub("funcnametab", 3); err != nil {
		return nil, err
	}
	if t.cutab, err = sub("cutab", 4); err != nil {
		return nil, err
	}
	if t.filetab, err = sub("filetab", 5); err != nil {
		return nil, err
	}
	if t.pctab, err = sub("pctab", 6); err != nil {
		return nil, err
	}
	if t.funcs, err = sub("functab", 7); err != nil {
		return nil, err
	}
	// The function table holds nfunc (entry, func offset) pairs of uint32
	// and the end PC of the last function.
	nfunc := word(0)
	if nfunc == 0 || len(t.funcs) < 4 || nfunc > uint64(len(t.funcs)-4)/8 {
		return nil, fmt.Errorf("pclntab: %d functions do not fit in %d bytes", nfunc, len(t.funcs))
	}
	t.nfunc = uint32(nfunc)
	t.functab = t.funcs[:nfunc*8+4]
	return t, nil
}

// NumFuncs returns the number of functions in the table.
func (t *Table) NumFuncs() int { return int(t.nfunc) }

// PCQuantum is the size of the smallest instruction of the table's
// architecture: 1 on x86, 4 on arm64 (and other fixed-width ISAs).
func (t *Table) PCQuantum() uint32 { return t.quantum }

// Size returns the bytes the Table holds: the section and, when it lies
// outside it, the funcdata region.
func (t *Table) Size() int64 {
	n := int64(len(t.data)) + int64(unsafe.Sizeof(*t))
	if len(t.gofunc) > 0 && !within(t.gofunc, t.data) {
		n += int64(len(t.gofunc))
	}
	return n
}

// within reports whether b lies inside the memory of outer.
func within(b, outer []byte) bool {
	if len(b) == 0 || len(outer) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(outer)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p < start+uintptr(len(outer))
}

func (t *Table) u32(b []byte) uint32 {
	if t.big {
		return binary.BigEndian.Uint32(b)
	}
	return binary.LittleEndian.Uint32(b)
}

// u32at reads the uint32 at off in b; ok is false when it does not fit.
func (t *Table) u32at(b []byte, off uint64) (uint32, bool) {
	if off > uint64(len(b)) || uint64(len(b))-off < 4 {
		return 0, false
	}
	return t.u32(b[off:]), true
}

// cstring returns the NUL-terminated string at off in b without copying.
func cstring(b []byte, off uint64) (string, bool) {
	if off >= uint64(len(b)) {
		return "", false
	}
	b = b[off:]
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	if n == len(b) {
		return "", false // unterminated: corrupt
	}
	if n == 0 {
		return "", true
	}
	return unsafe.String(&b[0], n), true
}

// funcInfo is a decoded _func record.
type funcInfo struct {
	entry              uint64 // absolute address
	end                uint64
	nameOff            uint32
	pcsp, pcfile, pcln uint32
	npcdata, cuOffset  uint32
	nfuncdata          uint32
	funcID             uint8
	flag               FuncFlag
	tail               []byte // pcdata then funcdata offsets
}

// FuncFlag holds the runtime's flags of a function (internal/abi.FuncFlag);
// their bits have not changed since Go 1.17.
type FuncFlag uint8

const (
	// FlagTopFrame marks a function at the outermost end of its stack
	// (runtime.goexit, runtime.mstart, runtime.rt0_go): the runtime's own
	// traceback stops there and calls the stack complete.
	FlagTopFrame FuncFlag = 1 << iota
	// FlagSPWrite marks a function that writes SP in a way its pcsp table
	// cannot describe, such as a switch to another stack: the runtime does
	// not unwind through it as a caller.
	FlagSPWrite
	// FlagAsm marks a function written in assembly.
	FlagAsm
)

// Func is one function of the table.
type Func struct {
	Entry, End uint64 // [Entry, End): the function's code and padding
	// ID is the runtime's internal/abi.FuncID: 0 for ordinary functions,
	// another value for a few runtime functions the linker recognizes by
	// name. The numbering differs between Go releases (new IDs are
	// inserted in alphabetical order).
	ID      uint8
	Flag    FuncFlag
	nameOff uint32
}

// FuncName returns the name of a function of this table.
func (t *Table) FuncName(f Func) string { return t.name(f.nameOff) }

// Funcs calls yield for every function, in address order, until yield
// returns false.
func (t *Table) Funcs(yield func(Func) bool) error {
	for i := uint32(0); i < t.nfunc; i++ {
		f, ok, err := t.funcAt(i)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if !yield(Func{Entry: f.entry, End: f.end, ID: f.funcID, Flag: f.flag, nameOff: f.nameOff}) {
			return nil
		}
	}
	return nil
}

// Layout of _func (runtime/runtime2.go); Go 1.20 added startLine, moving
// funcID, flag and nfuncdata back by 4 bytes. The record ends with funcID,
// flag, a pad byte and nfuncdata.
const (
	funcSize118 = 40
	funcSize120 = 44
)

// lookup finds the function covering pc. ok is false when none does;
// err reports a table that contradicts itself.
func (t *Table) lookup(pc uint64) (f funcInfo, ok bool, err error) {
	if pc < t.textStart || pc-t.textStart >= 1<<32 {
		return f, false, nil
	}
	off := uint32(pc - t.textStart)
	end := t.u32(t.functab[t.nfunc*8:])
	if off >= end {
		return f, false, nil
	}
	// Largest i with entry(i) <= off.
	lo, hi := uint32(0), t.nfunc
	for lo < hi {
		m := lo + (hi-lo)/2
		if t.u32(t.functab[m*8:]) <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return f, false, nil
	}
	return t.funcAt(lo - 1)
}

// funcAt decodes the record of function i of the function table.
func (t *Table) funcAt(i uint32) (f funcInfo, ok bool, err error) {
	entry := t.u32(t.functab[i*8:])
	next := t.u32(t.functab[(i+1)*8:])
	if next <= entry {
		return f, false, fmt.Errorf("pclntab: function table is not sorted at %d", i)
	}
	funcOff := uint64(t.u32(t.functab[i*8+4:]))
	size := uint64(funcSize118)
	if t.ver120 {
		size = funcSize120
	}
	if funcOff > uint64(len(t.funcs)) || uint64(len(t.funcs))-funcOff < size {
		return f, false, fmt.Errorf("pclntab: function %d record at %#x is out of bounds", i, funcOff)
	}
	b := t.funcs[funcOff:]
	if got := t.u32(b); got != entry {
		return f, false, fmt.Errorf("pclntab: function %d record has entry %#x, table says %#x", i, got, entry)
	}
	f = funcInfo{
		entry:     t.textStart + uint64(entry),
		end:       t.textStart + uint64(next),
		nameOff:   t.u32(b[4:]),
		pcsp:      t.u32(b[16:]),
		pcfile:    t.u32(b[20:]),
		pcln:      t.u32(b[24:]),
		npcdata:   t.u32(b[28:]),
		cuOffset:  t.u32(b[32:]),
		funcID:    b[size-4],
		flag:      FuncFlag(b[size-3]),
		nfuncdata: uint32(b[size-1]),
	}
	// The pcdata and funcdata offsets follow the record.
	n := (uint64(f.npcdata) + uint64(f.nfuncdata)) * 4
	rest := uint64(len(b)) - size
	if n > rest {
		return f, false, fmt.Errorf("pclntab: function %d: %d pcdata do not fit", i, f.npcdata)
	}
	f.tail = b[size : size+n]
	return f, true, nil
}

// pcvalue decodes the pcvalue table at off in pctab up to pc. ok is false
// when there is no table or it does not cover pc.
func (t *Table) pcvalue(f *funcInfo, off uint32, pc uint64) (int32, bool) {
	if off == 0 || uint64(off) >= uint64(len(t.pctab)) {
		return -1, false
	}
	p := t.pctab[off:]
	cur, val := f.entry, int32(-1)
	for {
		// Each step is a zig-zag value delta and a PC delta, both uvarints;
		// a zero value delta after the first step ends the table.
		uv, n := binary.Uvarint(p)
		if n <= 0 || (uv == 0 && cur != f.entry) {
			return -1, false
		}
		p = p[n:]
		d := uint32(uv)
		val += int32(-(d & 1) ^ (d >> 1))
		pcd, n := binary.Uvarint(p)
		if n <= 0 {
			return -1, false
		}
		p = p[n:]
		cur += (pcd & 0xffffffff) * uint64(t.quantum)
		if pc < cur {
			return val, true
		}
		if cur >= f.end {
			return -1, false
		}
	}
}

// fileLine returns the source position of pc in f's line tables.
func (t *Table) fileLine(f *funcInfo, pc uint64) (string, int64) {
	fileno, ok1 := t.pcvalue(f, f.pcfile, pc)
	line, ok2 := t.pcvalue(f, f.pcln, pc)
	if !ok1 || !ok2 || fileno < 0 || line < 0 {
		return "?", 0
	}
	fileoff, ok := t.u32at(t.cutab, (uint64(f.cuOffset)+uint64(fileno))*4)
	if !ok || fileoff == ^uint32(0) {
		return "?", 0
	}
	file, ok := cstring(t.filetab, uint64(fileoff))
	if !ok {
		return "?", 0
	}
	return file, int64(line)
}

func (t *Table) name(nameOff uint32) string {
	s, ok := cstring(t.funcnametab, uint64(nameOff))
	if !ok {
		return "?"
	}
	return s
}

// FuncRange returns the address range [start, end) of the function that
// covers pc.
func (t *Table) FuncRange(pc uint64) (start, end uint64, ok bool) {
	f, ok, err := t.lookup(pc)
	if !ok || err != nil {
		return 0, 0, false
	}
	return f.entry, f.end, true
}

// FuncAt returns the function that covers pc.
func (t *Table) FuncAt(pc uint64) (Func, bool) {
	f, ok, err := t.lookup(pc)
	if !ok || err != nil {
		return Func{}, false
	}
	return Func{Entry: f.entry, End: f.end, ID: f.funcID, Flag: f.flag, nameOff: f.nameOff}, true
}

// Range returns the addresses the table's functions cover: from the first
// function's entry to the end of the last one.
func (t *Table) Range() (lo, hi uint64) {
	return t.textStart + uint64(t.u32(t.functab)), t.textStart + uint64(t.u32(t.functab[t.nfunc*8:]))
}

// FuncSPDeltas is SPDeltas for the one function fn (as FuncAt returned it).
func (t *Table) FuncSPDeltas(fn Func, yield func(start, end uint64, delta int32) bool) error {
	f, ok, err := t.lookup(fn.Entry)
	if err != nil {
		return err
	}
	if !ok || f.entry != fn.Entry {
		return fmt.Errorf("pclntab: no function at %#x", fn.Entry)
	}
	t.spRanges(&f, yield)
	return nil
}

// SPDelta returns the stack pointer offset at pc from the pcsp table: the
// bytes the function has pushed onto its frame, not counting the return
// address. ok is false when no function or table covers pc.
func (t *Table) SPDelta(pc uint64) (int32, bool) {
	f, ok, err := t.lookup(pc)
	if !ok || err != nil {
		return 0, false
	}
	return t.pcvalue(&f, f.pcsp, pc)
}

// SPDeltas calls yield for every range [start, end) of every function in
// which the stack pointer sits delta bytes below its value at the function's
// entry, in address order, until yield returns false. Delta Padding marks
// the bytes after the end of a function's table, up to the next function:
// the linker's alignment fill, where no instruction runs. Delta -1 marks the
// rest of a function whose table cannot be decoded.
func (t *Table) SPDeltas(yield func(start, end uint64, delta int32) bool) error {
	for i := uint32(0); i < t.nfunc; i++ {
		f, ok, err := t.funcAt(i)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if !t.spRanges(&f, yield) {
			return nil
		}
	}
	return nil
}

// spRanges walks f's pcsp table; it returns false when yield asked to stop.
func (t *Table) spRanges(f *funcInfo, yield func(start, end uint64, delta int32) bool) bool {
	if f.pcsp == 0 || uint64(f.pcsp) >= uint64(len(t.pctab)) {
		return yield(f.entry, f.end, -1)
	}
	p := t.pctab[f.pcsp:]
	cur, val := f.entry, int32(-1)
	rest := int32(-1) // what the bytes after the last range are
	for cur < f.end {
		uv, n := binary.Uvarint(p)
		if uv == 0 && n == 1 && cur != f.entry {
			rest = Padding // the table's end: the function's code ends here
			break
		}
		if n <= 0 {
			break
		}
		p = p[n:]
		d := uint32(uv)
		val += int32(-(d & 1) ^ (d >> 1))
		pcd, n := binary.Uvarint(p)
		if n <= 0 || pcd == 0 {
			break
		}
		p = p[n:]
		next := min(cur+(pcd&0xffffffff)*uint64(t.quantum), f.end)
		if !yield(cur, next, val) {
			return false
		}
		cur = next
	}
	if cur < f.end {
		return yield(cur, f.end, rest)
	}
	return true
}

// Padding is the delta SPDeltas gives the bytes between the end of a
// function's code and the next function.
const Padding = -2

// Frames appends the frames of pc to dst, innermost first: the inlined
// calls at pc, then the physical function. Each caller level's position is
// its call site. pc should be a call PC, that is a return address minus one.
// When no function covers pc Frames returns dst unchanged; an error means
// the table contradicts itself, and dst is returned with what was decoded.
func (t *Table) Frames(pc uint64, dst []Frame) ([]Frame, error) {
	f, ok, err := t.lookup(pc)
	if !ok || err != nil {
		return dst, err
	}
	tree, ix := t.inlTree(&f, pc)
	for depth := 0; ix >= 0; depth++ {
		if depth == maxInlineDepth {
			return dst, fmt.Errorf("pclntab: inline chain at %#x deeper than %d", pc, maxInlineDepth)
		}
		nameOff, parentPC, ok := t.inlCall(tree, ix)
		if !ok {
			return dst, fmt.Errorf("pclntab: inline tree index %d at %#x out of bounds", ix, pc)
		}
		file, line := t.fileLine(&f, pc)
		dst = append(dst, Frame{Function: t.name(nameOff), File: file, Line: line})
		pc = f.entry + uint64(parentPC)
		ix, _ = t.pcvalue(&f, t.pcdataOff(&f, pcdataInlTreeIndex), pc)
	}
	file, line := t.fileLine(&f, pc)
	return append(dst, Frame{Function: t.name(f.nameOff), File: file, Line: line}), nil
}

func (t *Table) pcdataOff(f *funcInfo, i uint32) uint32 {
	if i >= f.npcdata {
		return 0
	}
	return t.u32(f.tail[i*4:])
}

// inlTree returns f's inline tree and the index of the inlined call at pc,
// or -1 when pc is not in an inlined call.
func (t *Table) inlTree(f *funcInfo, pc uint64) ([]byte, int32) {
	if t.gofunc == nil || funcdataInlTree >= f.nfuncdata {
		return nil, -1
	}
	off := t.u32(f.tail[(f.npcdata+funcdataInlTree)*4:])
	if off == noFuncdata || uint64(off) >= uint64(len(t.gofunc)) {
		return nil, -1
	}
	ix, ok := t.pcvalue(f, t.pcdataOff(f, pcdataInlTreeIndex), pc)
	if !ok {
		return nil, -1
	}
	return t.gofunc[off:], ix
}

// inlCall decodes entry ix of an inline tree (runtime.inlinedCall): 16
// bytes {funcID, pad, nameOff, parentPc, startLine} from Go 1.20, before
// that 20 bytes {parent, funcID, pad, file, line, nameOff, parentPc}.
func (t *Table) inlCall(tree []byte, ix int32) (nameOff, parentPC uint32, ok bool) {
	size, nameAt, parentAt := uint64(20), uint64(12), uint64(16)
	if t.ver120 {
		size, nameAt, parentAt = 16, 4, 8
	}
	base := uint64(ix) * size
	if base > uint64(len(tree)) || uint64(len(tree))-base < size {
		return 0, 0, false
	}
	return t.u32(tree[base+nameAt:]), t.u32(tree[base+parentAt:]), true
}
