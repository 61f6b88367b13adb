package python

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"unicode/utf8"
)

// Memory reads another process's memory. ReadAt fills all of p or fails.
type Memory interface {
	ReadAt(p []byte, addr uint64) error
}

// ProcMem reads a process's memory through /proc/PID/mem: no ptrace
// attach and no pause, only the access check ptrace_may_access makes.
// It is safe for concurrent use; Close releases the file.
type ProcMem struct{ f *os.File }

// OpenMem opens the memory of pid under procfs ("/proc").
func OpenMem(procfs string, pid int) (*ProcMem, error) {
	f, err := os.Open(procfs + "/" + strconv.Itoa(pid) + "/mem")
	if err != nil {
		return nil, fmt.Errorf("open memory of %d: %w", pid, err)
	}
	return &ProcMem{f: f}, nil
}

// ReadAt fills p from the process's memory at addr; a short read is an error.
func (m *ProcMem) ReadAt(p []byte, addr uint64) error {
	if addr > 1<<63 {
		return fmt.Errorf("read %#x: address out of range", addr)
	}
	n, err := m.f.ReadAt(p, int64(addr))
	if n == len(p) {
		return nil
	}
	if err == nil {
		err = errors.New("short read")
	}
	return fmt.Errorf("read %d bytes at %#x: %w", len(p), addr, err)
}

// Close closes the process's memory file.
func (m *ProcMem) Close() error { return m.f.Close() }

// Bounds of what is read for one name.
const (
	maxStringChars = 4096
	codeHeaderMax  = 512
)

// ErrNotCode is matched by the error for an address that does not hold a
// code object (a frame read while it changed, or a corrupt chain).
var ErrNotCode = errors.New("not a code object")

// Code is what naming a frame needs of one code object.
type Code struct {
	Name      string // co_qualname where the version has it, else co_name
	File      string
	FirstLine int64
	table     []byte
	kind      int
	bytecode  uint64 // 3.11+: where the bytecode starts in the process
	size      int64
}

// Line returns the line of the instruction the frame reported: its
// f_lasti (3.6–3.10) or its instruction pointer (3.11+). 0: no line.
func (c *Code) Line(instr uint64) int64 {
	switch c.kind {
	case tableLnotab:
		if int32(instr) < 0 {
			return c.FirstLine
		}
		return lineLnotab(c.table, c.FirstLine, uint64(uint32(instr)))
	case table310:
		if int32(instr) < 0 {
			return c.FirstLine
		}
		return line310(c.table, c.FirstLine, 2*uint64(uint32(instr)))
	}
	if instr < c.bytecode {
		return c.FirstLine
	}
	return lineLocation(c.table, c.FirstLine, (instr-c.bytecode)/2)
}

// memSize estimates what c holds.
// memSize is what c costs in a Namer's cache: the struct and its map entry
// (about 200 bytes with the allocator's rounding), then its strings and
// line table.
func (c *Code) memSize() int64 { return 200 + int64(len(c.Name)+len(c.File)+len(c.table)) }

// Reader reads one process's interpreter objects with one layout.
type Reader struct {
	mem      Memory
	l        Layout
	codeType uint64 // the type object already checked to be "code"
}

// NewReader returns a reader of mem with layout l.
func NewReader(mem Memory, l Layout) *Reader { return &Reader{mem: mem, l: l} }

func (r *Reader) u64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := r.mem.ReadAt(b[:], addr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// Code reads the code object at addr.
func (r *Reader) Code(addr uint64) (*Code, error) {
	l := &r.l
	if addr == 0 || addr&7 != 0 {
		return nil, fmt.Errorf("code at %#x: %w", addr, ErrNotCode)
	}
	end := max(l.CodeFilename, l.CodeName, l.CodeQualname, l.CodeLineTable, l.CodeFirstLine) + 8
	if end > codeHeaderMax || l.CodeFilename < 0 || l.CodeName < 0 || l.CodeLineTable < 0 || l.CodeFirstLine < 0 {
		return nil, fmt.Errorf("code at %#x: layout of 3.%d has no code object", addr, l.Minor)
	}
	h := make([]byte, end)
	if err := r.mem.ReadAt(h, addr); err != nil {
		return nil, fmt.Errorf("code at %#x: %w", addr, err)
	}
	typ := binary.LittleEndian.Uint64(h[8:])
	if err := r.checkType(typ, "code"); err != nil {
		return nil, fmt.Errorf("code at %#x: %w", addr, err)
	}
	ptr := func(off int64) uint64 { return binary.LittleEndian.Uint64(h[off:]) }
	c := &Code{FirstLine: int64(int32(binary.LittleEndian.Uint32(h[l.CodeFirstLine:]))), kind: l.lineTableKind()}
	nameAt := ptr(l.CodeName)
	if l.CodeQualname >= 0 {
		nameAt = ptr(l.CodeQualname)
	}
	var err error
	if c.Name, err = r.String(nameAt); err != nil {
		return nil, fmt.Errorf("code at %#x: name: %w", addr, err)
	}
	if c.File, err = r.String(ptr(l.CodeFilename)); err != nil {
		return nil, fmt.Errorf("code at %#x: file: %w", addr, err)
	}
	if c.table, err = r.Bytes(ptr(l.CodeLineTable)); err != nil {
		return nil, fmt.Errorf("code at %#x: line table: %w", addr, err)
	}
	if l.InstrIsPointer() {
		if l.CodeAdaptive < 0 {
			return nil, fmt.Errorf("code at %#x: layout of 3.%d has no bytecode offset", addr, l.Minor)
		}
		c.bytecode = addr + uint64(l.CodeAdaptive)
	}
	c.size = c.memSize()
	return c, nil
}

// checkType verifies that the object type at typ is named want. One
// verified address per reader is remembered.
func (r *Reader) checkType(typ uint64, want string) error {
	if typ != 0 && typ == r.codeType {
		return nil
	}
	if typ == 0 || typ&7 != 0 || r.l.TypeName < 0 {
		return fmt.Errorf("type at %#x: %w", typ, ErrNotCode)
	}
	namePtr, err := r.u64(typ + uint64(r.l.TypeName))
	if err != nil {
		return fmt.Errorf("type at %#x: %w", typ, err)
	}
	var b [8]byte
	if err := r.mem.ReadAt(b[:len(want)+1], namePtr); err != nil {
		return fmt.Errorf("type name at %#x: %w", namePtr, err)
	}
	if string(b[:len(want)]) != want || b[len(want)] != 0 {
		return fmt.Errorf("type %q: %w", b[:len(want)], ErrNotCode)
	}
	r.codeType = typ
	return nil
}

// String reads the str object at addr (a compact string, as every name
// and file name of a code object is).
func (r *Reader) String(addr uint64) (string, error) {
	l := &r.l
	if addr == 0 || addr&7 != 0 {
		return "", fmt.Errorf("str at %#x: bad address", addr)
	}
	var h [40]byte // ob_refcnt, ob_type, length, hash, state
	if err := r.mem.ReadAt(h[:], addr); err != nil {
		return "", fmt.Errorf("str at %#x: %w", addr, err)
	}
	return decodeString(h[:], func(off int64, p []byte) error { return r.mem.ReadAt(p, addr+uint64(off)) }, l)
}

// decodeString decodes a str from its header h and a reader of its body.
func decodeString(h []byte, read func(off int64, p []byte) error, l *Layout) (string, error) {
	n := int64(binary.LittleEndian.Uint64(h[16:]))
	state := binary.LittleEndian.Uint32(h[32:])
	kind := int64(state >> 2 & 7)
	compact := state>>5&1 == 1
	ascii := state>>6&1 == 1
	if n < 0 || n > maxStringChars {
		return "", fmt.Errorf("str of %d characters", n)
	}
	if !compact {
		return "", errors.New("str not compact")
	}
	if ascii {
		if kind != 1 {
			return "", fmt.Errorf("ascii str of kind %d", kind)
		}
		b := make([]byte, n)
		if err := read(l.ASCIISize, b); err != nil {
			return "", err
		}
		for _, c := range b {
			if c >= 0x80 {
				return "", errors.New("ascii str with a non-ascii byte")
			}
		}
		return string(b), nil
	}
	switch kind {
	case 1, 2, 4:
	default:
		return "", fmt.Errorf("str of kind %d", kind)
	}
	b := make([]byte, n*kind)
	if err := read(l.CompactSize, b); err != nil {
		return "", err
	}
	out := make([]byte, 0, n)
	for i := int64(0); i < n; i++ {
		var c rune
		switch kind {
		case 1:
			c = rune(b[i])
		case 2:
			c = rune(binary.LittleEndian.Uint16(b[2*i:]))
		case 4:
			c = rune(binary.LittleEndian.Uint32(b[4*i:]))
		}
		if !utf8.ValidRune(c) {
			return "", fmt.Errorf("str with code point %#x", c)
		}
		out = utf8.AppendRune(out, c)
	}
	return string(out), nil
}

// Bytes reads the bytes object at addr, at most maxLineTable bytes.
func (r *Reader) Bytes(addr uint64) ([]byte, error) {
	if addr == 0 || addr&7 != 0 || r.l.BytesData < 0 {
		return nil, fmt.Errorf("bytes at %#x: bad address", addr)
	}
	n, err := r.u64(addr + 16)
	if err != nil {
		return nil, fmt.Errorf("bytes at %#x: %w", addr, err)
	}
	if n > maxLineTable {
		return nil, fmt.Errorf("bytes at %#x: %d bytes", addr, n)
	}
	b := make([]byte, n)
	if err := r.mem.ReadAt(b, addr+uint64(r.l.BytesData)); err != nil {
		return nil, fmt.Errorf("bytes at %#x: %w", addr, err)
	}
	return b, nil
}
