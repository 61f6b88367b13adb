package v8

import (
	"encoding/binary"
	"fmt"
	"unicode/utf16"
)

// Reads of V8 heap objects from a process's memory. Every length read
// from the process is checked against a bound before it sizes a read.

const (
	maxStringLen  = 1 << 12 // characters of a function or script name
	maxSourceLen  = 8 << 20 // characters of a script's source, for its line ends
	maxConsDepth  = 64      // ConsString nodes followed for one string
	maxArrayLen   = 1 << 20 // elements of a FixedArray (line ends)
	maxByteArray  = 4 << 20 // bytes of a position table
	maxObjectRead = 256     // bytes of an object's fields read at once
)

// heap reads one process's V8 heap objects.
type heap struct {
	mem Memory
	l   *layout
}

func (h heap) u64(a uint64) (uint64, error) {
	var b [8]byte
	if err := h.mem.ReadAt(b[:], a); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// isTagged says whether v is a pointer to a heap object.
func (h heap) isTagged(v uint64) bool { return v&h.l.tagMask == h.l.tag && v > 4096 }

// isSmi says whether v is a small integer.
func (h heap) isSmi(v uint64) bool { return v&1 == 0 }

func (h heap) smi(v uint64) int64 { return int64(v) >> h.l.smiShift }

// field reads the 8-byte field at off of the tagged object o.
func (h heap) field(o, off uint64) (uint64, error) { return h.u64(o - h.l.tag + off) }

// fields reads n bytes of the tagged object o from its start.
func (h heap) fields(o uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	if err := h.mem.ReadAt(b, o-h.l.tag); err != nil {
		return nil, err
	}
	return b, nil
}

// typeOf returns the instance type of the tagged object o.
func (h heap) typeOf(o uint64) (int64, error) {
	if !h.isTagged(o) {
		return 0, fmt.Errorf("%#x: not a heap object: %w", o, ErrUnreadable)
	}
	m, err := h.u64(o - h.l.tag)
	if err != nil {
		return 0, err
	}
	if !h.isTagged(m) {
		return 0, fmt.Errorf("%#x: map %#x not a heap object: %w", o, m, ErrStale)
	}
	var b [2]byte
	if err := h.mem.ReadAt(b[:], m-h.l.tag+h.l.instanceType); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint16(b[:])), nil
}

// expect checks that o is a heap object of type t.
func (h heap) expect(o uint64, t int64, what string) error {
	got, err := h.typeOf(o)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if got != t {
		return fmt.Errorf("%s at %#x: instance type %d, not %d: %w", what, o, got, t, ErrStale)
	}
	return nil
}

// isString says whether instance type t is a string's.
func (h heap) isString(t int64) bool { return t >= 0 && uint64(t) < h.l.firstNonString }

// str reads the string o, at most limit characters (ErrUnreadable beyond).
func (h heap) str(o uint64, limit int) (string, error) {
	u, err := h.str16(o, limit)
	if err != nil {
		return "", err
	}
	return string(utf16.Decode(u)), nil
}

// str16 reads the string o as UTF-16 code units.
func (h heap) str16(o uint64, limit int) ([]uint16, error) {
	var out []uint16
	// Cons strings are trees: a stack of parts still to read, left first.
	type part struct {
		o        uint64
		from, to int // a slice of the string, in characters; to -1: all
	}
	stack := []part{{o, 0, -1}}
	for steps := 0; len(stack) > 0; steps++ {
		if steps > maxConsDepth*4 {
			return nil, fmt.Errorf("string at %#x: more than %d parts: %w", o, maxConsDepth*4, ErrUnreadable)
		}
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		t, err := h.typeOf(p.o)
		if err != nil {
			return nil, err
		}
		if !h.isString(t) {
			return nil, fmt.Errorf("string at %#x: instance type %d: %w", p.o, t, ErrStale)
		}
		var lb [4]byte
		if err := h.mem.ReadAt(lb[:], p.o-h.l.tag+h.l.strLength); err != nil {
			return nil, err
		}
		n := int(int32(binary.LittleEndian.Uint32(lb[:])))
		if n < 0 || n > limit {
			return nil, fmt.Errorf("string at %#x: %d characters: %w", p.o, n, ErrUnreadable)
		}
		from, to := p.from, p.to
		if to < 0 || to > n {
			to = n
		}
		if from > to {
			from = to
		}
		if len(out)+(to-from) > limit {
			return nil, fmt.Errorf("string at %#x: longer than %d: %w", o, limit, ErrUnreadable)
		}
		ut := uint64(t)
		switch ut & h.l.strReprMask {
		case h.l.seqTag:
			if ut&h.l.strEncMask == h.l.oneByte {
				b := make([]byte, to-from)
				if err := h.mem.ReadAt(b, p.o-h.l.tag+h.l.seqOneByte+uint64(from)); err != nil {
					return nil, err
				}
				for _, c := range b {
					out = append(out, uint16(c))
				}
			} else {
				b := make([]byte, 2*(to-from))
				if err := h.mem.ReadAt(b, p.o-h.l.tag+h.l.seqTwoByte+2*uint64(from)); err != nil {
					return nil, err
				}
				for i := 0; i < len(b); i += 2 {
					out = append(out, binary.LittleEndian.Uint16(b[i:]))
				}
			}
		case h.l.consTag:
			first, err := h.field(p.o, h.l.consFirst)
			if err != nil {
				return nil, err
			}
			second, err := h.field(p.o, h.l.consSecond)
			if err != nil {
				return nil, err
			}
			fb, err := h.u32(first - h.l.tag + h.l.strLength)
			if err != nil {
				return nil, err
			}
			fl := int(int32(fb))
			if fl < 0 || fl > n {
				return nil, fmt.Errorf("cons string at %#x: first part of %d characters: %w", p.o, fl, ErrUnreadable)
			}
			// Push the second part first: the first is read next.
			if to > fl {
				stack = append(stack, part{second, max(from-fl, 0), to - fl})
			}
			if from < fl {
				stack = append(stack, part{first, from, min(to, fl)})
			}
		case h.l.thinTag:
			a, err := h.field(p.o, h.l.thinActual)
			if err != nil {
				return nil, err
			}
			stack = append(stack, part{a, from, to})
		case h.l.slicedTag:
			parent, err := h.field(p.o, h.l.slicedParent)
			if err != nil {
				return nil, err
			}
			offv, err := h.field(p.o, h.l.slicedOffset)
			if err != nil {
				return nil, err
			}
			off := int(h.smi(offv))
			if off < 0 || off > maxSourceLen {
				return nil, fmt.Errorf("sliced string at %#x: offset %d: %w", p.o, off, ErrUnreadable)
			}
			stack = append(stack, part{parent, off + from, off + to})
		case h.l.externalTag:
			// The characters are behind a C++ resource (a source Node
			// keeps outside the heap: its own modules, a script read
			// from the compile cache); the string caches the pointer to
			// them after the resource's. An uncached one has only the
			// resource, whose characters only a virtual call finds.
			if h.l.externalResource == 0 || ut&uncachedExternal != 0 {
				return nil, fmt.Errorf("string at %#x: external without its characters' address: %w", p.o, ErrUnreadable)
			}
			chars, err := h.field(p.o, h.l.externalResource+8)
			if err != nil {
				return nil, err
			}
			if chars == 0 {
				return nil, fmt.Errorf("external string at %#x: no characters: %w", p.o, ErrUnreadable)
			}
			if ut&h.l.strEncMask == h.l.oneByte {
				b := make([]byte, to-from)
				if err := h.mem.ReadAt(b, chars+uint64(from)); err != nil {
					return nil, err
				}
				for _, c := range b {
					out = append(out, uint16(c))
				}
			} else {
				b := make([]byte, 2*(to-from))
				if err := h.mem.ReadAt(b, chars+2*uint64(from)); err != nil {
					return nil, err
				}
				for i := 0; i < len(b); i += 2 {
					out = append(out, binary.LittleEndian.Uint16(b[i:]))
				}
			}
		default:
			return nil, fmt.Errorf("string at %#x: representation %d not read: %w", p.o, ut&h.l.strReprMask, ErrUnreadable)
		}
	}
	return out, nil
}

// flatOneByte reads the characters of o when it is a flat one-byte string
// (sequential, or external with its characters' address cached), as
// bytes, at most limit; ok is false for any other string, which str16
// reads. A script's source is most often one: its line ends are then
// found without widening megabytes to UTF-16.
func (h heap) flatOneByte(o uint64, limit int) (b []byte, ok bool, err error) {
	t, err := h.typeOf(o)
	if err != nil || !h.isString(t) {
		return nil, false, err
	}
	ut := uint64(t)
	if ut&h.l.strEncMask != h.l.oneByte {
		return nil, false, nil
	}
	var at uint64
	switch ut & h.l.strReprMask {
	case h.l.seqTag:
		at = o - h.l.tag + h.l.seqOneByte
	case h.l.externalTag:
		if h.l.externalResource == 0 || ut&uncachedExternal != 0 {
			return nil, false, nil
		}
		if at, err = h.field(o, h.l.externalResource+8); err != nil || at == 0 {
			return nil, false, err
		}
	default:
		return nil, false, nil
	}
	n, err := h.u32(o - h.l.tag + h.l.strLength)
	if err != nil {
		return nil, false, err
	}
	if int(int32(n)) < 0 || int(int32(n)) > limit {
		return nil, false, fmt.Errorf("string at %#x: %d characters: %w", o, int32(n), ErrUnreadable)
	}
	b = make([]byte, n)
	if err := h.mem.ReadAt(b, at); err != nil {
		return nil, false, err
	}
	return b, true, nil
}

func (h heap) u32(a uint64) (uint32, error) {
	var b [4]byte
	if err := h.mem.ReadAt(b[:], a); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

// fixedArray reads the elements of the FixedArray-shaped object o (a map,
// a Smi length, then tagged elements), at most limit of them.
func (h heap) fixedArray(o uint64, limit int) ([]uint64, error) {
	lv, err := h.field(o, h.l.fixedArrayLength)
	if err != nil {
		return nil, err
	}
	n := h.smi(lv)
	if !h.isSmi(lv) || n < 0 || n > int64(limit) {
		return nil, fmt.Errorf("fixed array at %#x: length %d: %w", o, n, ErrUnreadable)
	}
	b := make([]byte, 8*n)
	if err := h.mem.ReadAt(b, o-h.l.tag+h.l.fixedArrayData); err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out, nil
}

// byteArray reads the bytes of the ByteArray-shaped object o (a map, a
// Smi length, then the bytes), at most limit.
func (h heap) byteArray(o uint64, limit int) ([]byte, error) {
	t, err := h.typeOf(o)
	if err != nil {
		return nil, err
	}
	if t != h.l.typeByteArray && t != h.l.typeTrustedByteArray {
		return nil, fmt.Errorf("byte array at %#x: instance type %d: %w", o, t, ErrStale)
	}
	lv, err := h.field(o, h.l.fixedArrayLength)
	if err != nil {
		return nil, err
	}
	n := h.smi(lv)
	if !h.isSmi(lv) || n < 0 || n > int64(limit) {
		return nil, fmt.Errorf("byte array at %#x: length %d: %w", o, n, ErrUnreadable)
	}
	b := make([]byte, n)
	if err := h.mem.ReadAt(b, o-h.l.tag+h.l.byteArrayData); err != nil {
		return nil, err
	}
	return b, nil
}

// maxBytecodeLen bounds the bytecodes read of one function.
const maxBytecodeLen = 1 << 20

// bytecodes reads the bytecodes of the BytecodeArray bc.
func (h heap) bytecodes(bc uint64) ([]byte, error) {
	lv, err := h.field(bc, h.l.bytecodeLength)
	if err != nil {
		return nil, err
	}
	n := h.smi(lv)
	if !h.isSmi(lv) || n <= 0 || n > maxBytecodeLen {
		return nil, fmt.Errorf("bytecode array at %#x: length %d: %w", bc, n, ErrUnreadable)
	}
	b := make([]byte, n)
	if err := h.mem.ReadAt(b, bc-h.l.tag+h.l.bytecodeData); err != nil {
		return nil, err
	}
	return b, nil
}
