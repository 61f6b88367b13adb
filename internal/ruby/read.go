package ruby

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"

	"github.com/sonde-dev/sonde/internal/cstr"
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
	Body      uint64 // the rb_iseq_constant_body's address
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

// threadPointer returns the thread pointer (thread_id, pthread_self())
// of the rb_thread_t at th: its own, or its native thread's. It is 0
// where the thread has none yet.
func (r *Reader) threadPointer(th uint64) (uint64, error) {
	at := th
	if r.l.ThreadNT != 0 {
		nt, err := r.ptr(th + uint64(r.l.ThreadNT))
		if err != nil || nt == 0 {
			return 0, err
		}
		at = nt
	}
	return r.ptr(at + uint64(r.l.ThreadID))
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
	s := &Iseq{hdr: hdr, Body: body,
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
	if l.FirstLineInt {
		if fl := int32(binary.LittleEndian.Uint32(b[l.BodyFirstLine:])); fl > 0 {
			s.FirstLine = int64(fl)
		}
	} else if fl := binary.LittleEndian.Uint64(b[l.BodyFirstLine:]); fl&1 == 1 && int64(fl) >= 0 {
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
	h := make([]byte, max(l.StrEmbedAry, l.StrHeapPtr+8, l.StrHeapLen+8, l.StrLen+8))
	if err := r.mem.ReadAt(h, addr); err != nil {
		return "", fmt.Errorf("string at %#x: %w", addr, err)
	}
	fl := binary.LittleEndian.Uint64(h)
	if fl&tMask != tString {
		return "", fmt.Errorf("string at %#x: flags %#x", addr, fl)
	}
	var n, at uint64
	noEmbed := fl&l.StrNoEmbed != 0
	switch {
	case l.StrLen != 0:
		n = binary.LittleEndian.Uint64(h[l.StrLen:])
	case noEmbed:
		n = binary.LittleEndian.Uint64(h[l.StrHeapLen:])
	default:
		n = (fl >> l.StrEmbedShift) & l.StrEmbedMask
	}
	if noEmbed {
		at = binary.LittleEndian.Uint64(h[l.StrHeapPtr:])
		if at == 0 || at >= 1<<47 {
			return "", fmt.Errorf("string at %#x: bytes at %#x", addr, at)
		}
	} else {
		at = addr + uint64(l.StrEmbedAry)
	}
	if n == 0 || n > uint64(limit) {
		return "", fmt.Errorf("string at %#x: %d bytes", addr, n)
	}
	b := make([]byte, n)
	if err := r.mem.ReadAt(b, at); err != nil {
		return "", fmt.Errorf("string at %#x: %w", addr, err)
	}
	if s := cstr.Clean(b); s != "" {
		return s, nil
	}
	return "", fmt.Errorf("string at %#x: starts with a NUL", addr)
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

// Line returns the line of the instruction pc (a frame's saved pc: the
// next instruction to run) is at in s, as the VM computes it
// (rb_vm_get_sourceline), or 0 where pc is not one of s's.
func (r *Reader) Line(s *Iseq, pc uint64) int64 {
	if pc < s.Encoded || pc > s.Encoded+s.Words*8 || (pc-s.Encoded)%8 != 0 {
		return 0
	}
	return r.LineAt(s, (pc-s.Encoded)/8)
}

// LineAt is Line of the pc at word pos of s's instructions.
func (r *Reader) LineAt(s *Iseq, pos uint64) int64 {
	if pos > s.Words || s.NInsns == 0 {
		return 0
	}
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
		return checkRank((v>>(pos%9*7))&0x7f, pos)
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
	return checkRank(rank+uint64(bits.OnesCount64(word<<(63-bit%64))), pos)
}

// checkRank rejects a rank no table can give: at most one entry starts at
// each of the positions 0..pos.
func checkRank(rank, pos uint64) (uint64, error) {
	if rank > pos+1 {
		return 0, fmt.Errorf("succ index: rank %d at position %d", rank, pos)
	}
	return rank, nil
}

// Bounds of a class's instance variables looked at for its name.
const maxIVars = 256

// ClassIDs are the IDs the VM keeps a class's name (__classpath__) and a
// singleton class's object (__attached__) under, as instance variables.
type ClassIDs struct{ ClassPath, Attached uint64 }

// ivar returns the instance variable id of the class or module cls, read
// from its iv_tbl (an st_table) entry by entry.
func (r *Reader) ivar(cls, id uint64) (uint64, bool, error) {
	l := r.l
	ext, err := r.ext(cls)
	if err != nil {
		return 0, false, err
	}
	tbl, err := r.ptr(ext + uint64(l.ExtIVTbl))
	if err != nil || tbl == 0 {
		return 0, false, err
	}
	h := make([]byte, max(l.StNum, l.StStart, l.StBound, l.StEntries)+8)
	if err := r.mem.ReadAt(h, tbl); err != nil {
		return 0, false, fmt.Errorf("class at %#x: ivars: %w", cls, err)
	}
	start := binary.LittleEndian.Uint64(h[l.StStart:])
	bound := binary.LittleEndian.Uint64(h[l.StBound:])
	ents := binary.LittleEndian.Uint64(h[l.StEntries:])
	if start > bound || bound-start > maxIVars || !okPtr(ents) {
		return 0, false, fmt.Errorf("class at %#x: ivars %d..%d at %#x", cls, start, bound, ents)
	}
	b := make([]byte, (bound-start)*uint64(l.StEntrySize))
	if err := r.mem.ReadAt(b, ents+start*uint64(l.StEntrySize)); err != nil {
		return 0, false, fmt.Errorf("class at %#x: ivars: %w", cls, err)
	}
	for i := 0; i+int(l.StEntrySize) <= len(b); i += int(l.StEntrySize) {
		if binary.LittleEndian.Uint64(b[i+8:]) == id {
			return binary.LittleEndian.Uint64(b[i+16:]), true, nil
		}
	}
	return 0, false, nil
}

// ext returns the address of the class or module cls's rb_classext_t.
func (r *Reader) ext(cls uint64) (uint64, error) {
	if r.l.ClassExtInline {
		return cls + uint64(r.l.ClassExt), nil
	}
	ext, err := r.ptr(cls + uint64(r.l.ClassExt))
	if err != nil {
		return 0, fmt.Errorf("class at %#x: ext: %w", cls, err)
	}
	if ext == 0 {
		return 0, fmt.Errorf("class at %#x: no ext", cls)
	}
	return ext, nil
}

// classValue returns what the class or module cls keeps as its name or,
// a singleton class, as its object: in its ext's field at off where the
// layout has one, or else in its instance variable id. ok is false where
// it has none.
func (r *Reader) classValue(cls uint64, off int64, id uint64) (v uint64, ok bool, err error) {
	switch {
	case off != 0:
		ext, err := r.ext(cls)
		if err != nil {
			return 0, false, err
		}
		v, err := r.u64(ext + uint64(off))
		if err != nil {
			return 0, false, fmt.Errorf("class at %#x: %w", cls, err)
		}
		return v, okPtr(v), nil
	case r.l.ExtIVTbl != 0:
		return r.ivar(cls, id)
	}
	return 0, false, fmt.Errorf("ruby %d.%d: class names not read", r.l.Major, r.l.Minor)
}

// FindClassIDs finds the IDs from class Object (rb_cObject's value): the
// key of its instance variable that holds the String "Object", and the
// key of its metaclass's that holds Object.
func (r *Reader) FindClassIDs(object uint64) (ClassIDs, error) {
	var ids ClassIDs
	if r.l.ExtIVTbl == 0 {
		return ids, fmt.Errorf("ruby %d.%d: classes keep no iv_tbl", r.l.Major, r.l.Minor)
	}
	find := func(cls uint64, match func(v uint64) bool) (uint64, error) {
		ext, err := r.ext(cls)
		if err != nil {
			return 0, err
		}
		tbl, err := r.ptr(ext + uint64(r.l.ExtIVTbl))
		if err != nil || tbl == 0 {
			return 0, fmt.Errorf("class at %#x: no ivars", cls)
		}
		ents, err := r.ptr(tbl + uint64(r.l.StEntries))
		if err != nil || ents == 0 {
			return 0, fmt.Errorf("class at %#x: no ivar entries", cls)
		}
		bound, err := r.u64(tbl + uint64(r.l.StBound))
		if err != nil || bound > maxIVars {
			return 0, fmt.Errorf("class at %#x: %d ivars", cls, bound)
		}
		for i := range bound {
			e := ents + i*uint64(r.l.StEntrySize)
			key, err1 := r.u64(e + 8)
			v, err2 := r.u64(e + 16)
			if err1 == nil && err2 == nil && key != 0 && match(v) {
				return key, nil
			}
		}
		return 0, fmt.Errorf("class at %#x: no such ivar", cls)
	}
	var err error
	if ids.ClassPath, err = find(object, func(v uint64) bool {
		s, err := r.String(v, 16)
		return err == nil && s == "Object"
	}); err != nil {
		return ids, fmt.Errorf("__classpath__: %w", err)
	}
	meta, err := r.ptr(object + uint64(r.l.BasicKlass))
	if err != nil {
		return ids, fmt.Errorf("metaclass of Object: %w", err)
	}
	if meta == 0 {
		return ids, errors.New("object has no metaclass")
	}
	if ids.Attached, err = find(meta, func(v uint64) bool { return v == object }); err != nil {
		return ids, fmt.Errorf("__attached__: %w", err)
	}
	return ids, nil
}

// Owner is the class part of a method's name: "Foo#" for an instance
// method of Foo, "Foo." for a singleton method of Foo.
type Owner struct {
	Prefix string
	hdr    []byte // the method entry's first words as read
}

func (o *Owner) memSize() int64 { return 96 + int64(len(o.Prefix)+len(o.hdr)) }

// Owner reads the method entry me and names its owner with ids.
func (r *Reader) Owner(me uint64, ids ClassIDs) (*Owner, error) {
	l := r.l
	if !okPtr(me) {
		return nil, fmt.Errorf("method entry at %#x: bad address", me)
	}
	hdr := make([]byte, l.MEOwner+8)
	if err := r.mem.ReadAt(hdr, me); err != nil {
		return nil, fmt.Errorf("method entry at %#x: %w", me, err)
	}
	fl := binary.LittleEndian.Uint64(hdr)
	if fl&tMask != tImemo || (fl>>l.ImemoTypeShift)&15 != imemoMent {
		return nil, fmt.Errorf("method entry at %#x: flags %#x", me, fl)
	}
	owner := binary.LittleEndian.Uint64(hdr[l.MEOwner:])
	if !okPtr(owner) {
		return nil, fmt.Errorf("method entry at %#x: owner %#x", me, owner)
	}
	cf, err := r.u64(owner)
	if err != nil {
		return nil, fmt.Errorf("method entry at %#x: owner: %w", me, err)
	}
	sep := "#"
	if cf&tMask == tClass && cf&l.Singleton != 0 {
		att, ok, err := r.classValue(owner, l.ExtAttached, ids.Attached)
		if err != nil || !ok || !okPtr(att) {
			return nil, fmt.Errorf("method entry at %#x: singleton class without its object", me)
		}
		owner, sep = att, "."
		if cf, err = r.u64(owner); err != nil {
			return nil, fmt.Errorf("method entry at %#x: owner: %w", me, err)
		}
	}
	if t := cf & tMask; t != tClass && t != tModule {
		return nil, fmt.Errorf("method entry at %#x: owner of type %#x", me, t)
	}
	path, ok, err := r.classValue(owner, l.ExtClassPath, ids.ClassPath)
	if err != nil || !ok {
		return nil, fmt.Errorf("method entry at %#x: anonymous owner", me)
	}
	name, err := r.String(path, maxNameBytes)
	if err != nil {
		return nil, fmt.Errorf("method entry at %#x: owner's name: %w", me, err)
	}
	return &Owner{Prefix: name + sep, hdr: hdr}, nil
}

// sameOwner is same for a method entry.
func (r *Reader) sameOwner(o *Owner, me uint64) (same, readable bool) {
	b := make([]byte, len(o.hdr))
	if err := r.mem.ReadAt(b, me); err != nil {
		return false, !errors.Is(err, io.EOF)
	}
	return string(b) == string(o.hdr), true
}
