package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"unicode/utf8"
)

// Bounds of what is read for one name.
const (
	maxNameBytes = 1024 // a label
	maxPathBytes = 4096 // a file name
	maxIseqWords = 1 << 24
	maxInsnInfos = 1 << 24
)

// ErrNotIseq is matched by the error for an address that does not hold an
// instruction sequence (a frame read while it changed, or a corrupt chain).
var ErrNotIseq = errors.New("not a ruby iseq")

// Iseq is what naming a frame needs of one instruction sequence.
type Iseq struct {
	Label     string // "gamma_burn", "block in main", "<main>"
	File      string
	FirstLine int64
	Encoded   uint64 // iseq_encoded
	Words     uint64 // iseq_size
	Insns     uint64 // insns_info.body
	NInsns    uint64 // insns_info.size
	Succ      uint64 // insns_info.succ_index_table
	// hdr is the iseq's first bytes (flags, wrapper, body) as read: a
	// cached Iseq is used again only while they are unchanged.
	hdr []byte
}

func (s *Iseq) memSize() int64 { return 160 + int64(len(s.Label)+len(s.File)+len(s.hdr)) }

// Reader reads VM objects out of a process's memory. It is not safe for
// concurrent use.
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

// ptr reads a pointer: 0, or 8-aligned in the user half.
func (r *Reader) ptr(addr uint64) (uint64, error) {
	v, err := r.u64(addr)
	if err != nil {
		return 0, err
	}
	if !okPtr(v) && v != 0 {
		return 0, fmt.Errorf("pointer %#x at %#x", v, addr)
	}
	return v, nil
}

func okPtr(v uint64) bool { return v != 0 && v&7 == 0 && v < 1<<47 }

// header returns the iseq's first words, as read, if it is one.
func (r *Reader) header(addr uint64) ([]byte, error) {
	if !okPtr(addr) {
		return nil, fmt.Errorf("iseq at %#x: %w", addr, ErrNotIseq)
	}
	b := make([]byte, r.l.IseqBody+8)
	if err := r.mem.ReadAt(b, addr); err != nil {
		return nil, fmt.Errorf("iseq at %#x: %w", addr, err)
	}
	fl := binary.LittleEndian.Uint64(b)
	if fl&tMask != tImemo || (fl>>r.l.ImemoTypeShift)&15 != imemoIseq {
		return nil, fmt.Errorf("iseq at %#x: flags %#x: %w", addr, fl, ErrNotIseq)
	}
	return b, nil
}

// Iseq reads the instruction sequence at addr.
func (r *Reader) Iseq(addr uint64) (*Iseq, error) {
	l := r.l
	hdr, err := r.header(addr)
	if err != nil {
		return nil, err
	}
	body := binary.LittleEndian.Uint64(hdr[l.IseqBody:])
	if !okPtr(body) {
		return nil, fmt.Errorf("iseq at %#x: body %#x: %w", addr, body, ErrNotIseq)
	}
	b := make([]byte, max(l.BodyIseqSize+4, l.BodyEncoded+8, l.BodyPath+8, l.BodyLabel+8, l.BodyFirstLine+8,
		l.BodyInsns+8, l.BodyInsnsSize+4, l.BodySuccTable+8))
	if err := r.mem.ReadAt(b, body); err != nil {
		return nil, fmt.Errorf("iseq at %#x: body: %w", addr, err)
	}
	s := &Iseq{hdr: hdr,
		Encoded: binary.LittleEndian.Uint64(b[l.BodyEncoded:]),
		Words:   uint64(binary.LittleEndian.Uint32(b[l.BodyIseqSize:])),
		Insns:   binary.LittleEndian.Uint64(b[l.BodyInsns:]),
		NInsns:  uint64(binary.LittleEndian.Uint32(b[l.BodyInsnsSize:])),
		Succ:    binary.LittleEndian.Uint64(b[l.BodySuccTable:]),
	}
	if !okPtr(s.Encoded) || s.Words == 0 || s.Words > maxIseqWords || s.NInsns > maxInsnInfos ||
		(s.NInsns > 0 && !okPtr(s.Insns)) || (s.NInsns > 1 && !okPtr(s.Succ)) {
		return nil, fmt.Errorf("iseq at %#x: body %#x does not make sense: %w", addr, body, ErrNotIseq)
	}
	if fl := binary.LittleEndian.Uint64(b[l.BodyFirstLine:]); fl&1 == 1 && int64(fl) >= 0 {
		s.FirstLine = int64(fl >> 1)
	}
	if s.Label, err = r.String(binary.LittleEndian.Uint64(b[l.BodyLabel:]), maxNameBytes); err != nil {
		return nil, fmt.Errorf("iseq at %#x: label: %w", addr, err)
	}
	if s.File, err = r.Path(binary.LittleEndian.Uint64(b[l.BodyPath:])); err != nil {
		return nil, fmt.Errorf("iseq at %#x: path: %w", addr, err)
	}
	return s, nil
}

// Same reports whether the iseq at addr still starts with the bytes s was
// read from.
func (r *Reader) Same(s *Iseq, addr uint64) bool {
	same, _ := r.same(s, addr)
	return same
}

// same is Same, and whether the process's memory could be read at all:
// /proc/PID/mem of a process whose memory is gone (it exited) reads
// nothing (EOF), while an address it no longer maps fails with EIO.
func (r *Reader) same(s *Iseq, addr uint64) (same, readable bool) {
	b := make([]byte, len(s.hdr))
	if err := r.mem.ReadAt(b, addr); err != nil {
		return false, !errors.Is(err, io.EOF)
	}
	return string(b) == string(s.hdr), true
}

// String reads the String object at addr, of at most limit bytes.
func (r *Reader) String(addr uint64, limit int) (string, error) {
	l := r.l
	if !okPtr(addr) {
		return "", fmt.Errorf("string at %#x: bad address", addr)
	}
	h := make([]byte, max(l.StrEmbedAry, l.StrHeapPtr+8, l.StrHeapLen+8))
	if err := r.mem.ReadAt(h, addr); err != nil {
		return "", fmt.Errorf("string at %#x: %w", addr, err)
	}
	fl := binary.LittleEndian.Uint64(h)
	if fl&tMask != tString {
		return "", fmt.Errorf("string at %#x: flags %#x", addr, fl)
	}
	var n, at uint64
	if fl&l.StrNoEmbed != 0 {
		n = binary.LittleEndian.Uint64(h[l.StrHeapLen:])
		at = binary.LittleEndian.Uint64(h[l.StrHeapPtr:])
		if at == 0 || at >= 1<<47 {
			return "", fmt.Errorf("string at %#x: bytes at %#x", addr, at)
		}
	} else {
		n = (fl >> l.StrEmbedShift) & l.StrEmbedMask
		at = addr + uint64(l.StrEmbedAry)
	}
	if n == 0 || n > uint64(limit) {
		return "", fmt.Errorf("string at %#x: %d bytes", addr, n)
	}
	b := make([]byte, n)
	if err := r.mem.ReadAt(b, at); err != nil {
		return "", fmt.Errorf("string at %#x: %w", addr, err)
	}
	return cleanString(b), nil
}

// Path reads an iseq's pathobj: a String, or an Array [path, realpath]
// whose realpath (absolute, where Ruby resolved it) is preferred to the
// path as given (relative to the directory the program started in).
func (r *Reader) Path(addr uint64) (string, error) {
	l := r.l
	if !okPtr(addr) {
		return "", fmt.Errorf("path at %#x: bad address", addr)
	}
	h := make([]byte, max(l.ArrEmbedAry+16, l.ArrHeapPtr+8, l.ArrHeapLen+8))
	if err := r.mem.ReadAt(h, addr); err != nil {
		return "", fmt.Errorf("path at %#x: %w", addr, err)
	}
	fl := binary.LittleEndian.Uint64(h)
	switch fl & tMask {
	case tString:
		return r.String(addr, maxPathBytes)
	case tArray:
	default:
		return "", fmt.Errorf("path at %#x: flags %#x", addr, fl)
	}
	var elems [2]uint64
	var n uint64
	if fl&l.ArrEmbed != 0 {
		n = min((fl>>l.ArrEmbedShift)&l.ArrEmbedMask, 2)
		elems[0] = binary.LittleEndian.Uint64(h[l.ArrEmbedAry:])
		elems[1] = binary.LittleEndian.Uint64(h[l.ArrEmbedAry+8:])
	} else {
		n = min(binary.LittleEndian.Uint64(h[l.ArrHeapLen:]), 2)
		p := binary.LittleEndian.Uint64(h[l.ArrHeapPtr:])
		if n > 0 {
			if !okPtr(p) {
				return "", fmt.Errorf("path at %#x: elements at %#x", addr, p)
			}
			b := make([]byte, 8*n)
			if err := r.mem.ReadAt(b, p); err != nil {
				return "", fmt.Errorf("path at %#x: %w", addr, err)
			}
			for i := range n {
				elems[i] = binary.LittleEndian.Uint64(b[8*i:])
			}
		}
	}
	if n == 0 {
		return "", fmt.Errorf("path at %#x: empty array", addr)
	}
	if n == 2 && okPtr(elems[1]) {
		if abs, err := r.String(elems[1], maxPathBytes); err == nil {
			return abs, nil
		}
	}
	return r.String(elems[0], maxPathBytes)
}

// cleanString makes a name from untrusted bytes: valid UTF-8 without NULs.
func cleanString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			b = b[:i]
			break
		}
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return string([]rune(string(b)))
}

// Line returns the line of the instruction pc (a frame's saved pc: the
// next instruction to run) is at in s, as the VM computes it
// (rb_vm_get_sourceline), or 0 where pc is not one of s's.
func (r *Reader) Line(s *Iseq, pc uint64) int64 {
	if pc < s.Encoded || pc > s.Encoded+s.Words*8 || (pc-s.Encoded)%8 != 0 || s.NInsns == 0 {
		return 0
	}
	pos := (pc - s.Encoded) / 8
	if pos > 0 {
		pos--
	}
	idx := uint64(0)
	if s.NInsns > 1 {
		rank, err := r.succRank(s.Succ, pos)
		if err != nil || rank == 0 || rank > s.NInsns {
			return 0
		}
		idx = rank - 1
	}
	var b [4]byte
	if r.mem.ReadAt(b[:], s.Insns+idx*uint64(r.l.InsnInfoSize)) != nil {
		return 0
	}
	line := int32(binary.LittleEndian.Uint32(b[:]))
	if line <= 0 {
		return 0
	}
	return int64(line)
}

// The succinct index (iseq.c's succ_index_table) that maps an instruction's
// position to the number of insns_info entries that start at or before it:
// the first immTable positions as 7-bit counts, 9 to a word, then blocks of
// 512 positions, each a 32-bit base count, seven 9-bit counts of its 64-bit
// words and the words of start bits.
const (
	immTable   = 54
	succBlock  = 8 + 8 + 64 // rank (padded), small_block_ranks, bits[8]
	succBlockN = 512
)

func (r *Reader) succRank(table, pos uint64) (uint64, error) {
	if pos < immTable {
		v, err := r.u64(table + pos/9*8)
		if err != nil {
			return 0, err
		}
		return (v >> (pos % 9 * 7)) & 0x7f, nil
	}
	x := pos - immTable
	blk := table + immTable/9*8 + x/succBlockN*succBlock
	bit := x % succBlockN
	small := bit / 64
	var b [succBlock]byte
	if err := r.mem.ReadAt(b[:], blk); err != nil {
		return 0, err
	}
	rank := uint64(binary.LittleEndian.Uint32(b[0:]))
	if small > 0 {
		rank += (binary.LittleEndian.Uint64(b[8:]) >> ((small - 1) * 9)) & 0x1ff
	}
	word := binary.LittleEndian.Uint64(b[16+small*8:])
	return rank + uint64(bits.OnesCount64(word<<(63-bit%64))), nil
}
