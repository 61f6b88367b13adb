package jvm

import (
	"encoding/binary"
	"errors"
	"strings"
	"unicode/utf8"
)

// Decoders of the JVM's compressed data. Their input is read from another
// process and may be anything: they bound every loop by the input's length
// and fail with errCorrupt, never panic.

var errCorrupt = errors.New("corrupt data")

// Bounds of what one frame's naming decodes.
const (
	maxLinePairs  = 1 << 16 // a method has at most 64 KiB of bytecodes
	maxScopeDepth = 64      // inlining depth (MaxInlineLevel is 15, C1 and JVMCI deeper)
	maxPcDescs    = 1 << 17
	maxScopesData = 8 << 20
	maxMetadata   = 1 << 16
	maxSymbol     = 1 << 16
)

// stream reads the JVM's CompressedReadStream: the UNSIGNED5 coding of
// Pack200, with the zero byte excluded from JDK 20 (JDK-8292758).
type stream struct {
	b         []byte
	pos       int
	unsigned5 bool
	err       error
}

func (s *stream) byte() byte {
	if s.pos >= len(s.b) {
		s.err = errCorrupt
		return 0
	}
	c := s.b[s.pos]
	s.pos++
	return c
}

// uint reads one unsigned value of one to five bytes.
func (s *stream) uint() uint32 {
	const lgH = 6
	x := uint32(0) // the excluded byte count
	if s.unsigned5 {
		x = 1
	}
	l := 256 - x - 64 // the count of "low" bytes that end a value
	b := uint32(s.byte())
	if b < x {
		s.err = errCorrupt
		return 0
	}
	sum := b - x
	if sum < l {
		return sum
	}
	shift := uint(lgH)
	for i := 1; i < 5; i++ {
		b := uint32(s.byte())
		if b < x {
			s.err = errCorrupt
			return 0
		}
		sum += (b - x) << shift
		if b < x+l {
			break
		}
		shift += lgH
	}
	return sum
}

// int reads a signed value: zigzag coded (the sign in the low bit).
func (s *stream) int() int32 {
	u := s.uint()
	return int32(u>>1) ^ -int32(u&1)
}

// linePair is one entry of a method's line number table.
type linePair struct{ bci, line int32 }

// decodeLines decodes a compressed line number table (the pairs follow a
// method's bytecodes in its ConstMethod, ended by a zero byte). A pair is
// one byte (bci delta << 3 | line delta) or 0xFF and two signed values.
func decodeLines(b []byte, unsigned5 bool) ([]linePair, error) {
	s := stream{b: b, unsigned5: unsigned5}
	var out []linePair
	var bci, line int32
	for {
		c := s.byte()
		if s.err != nil {
			return nil, s.err
		}
		if c == 0 {
			return out, nil
		}
		if c == 0xFF {
			bci += s.int()
			line += s.int()
		} else {
			bci += int32(c >> 3)
			line += int32(c & 7)
		}
		if s.err != nil || bci < 0 || bci > 0xFFFF || len(out) >= maxLinePairs {
			return nil, errCorrupt
		}
		out = append(out, linePair{bci, line})
	}
}

// lineAt is the line of bci as HotSpot's Method::line_number_from_bci
// says: the exact pair, else the one with the greatest bci below it; 0
// when the table says nothing.
func lineAt(pairs []linePair, bci int32) int64 {
	if bci < 0 {
		bci = 0
	}
	best, line := int32(-1), int64(0)
	for _, p := range pairs {
		if p.bci == bci {
			return int64(p.line)
		}
		if p.bci < bci && p.bci >= best {
			best, line = p.bci, int64(p.line)
		}
	}
	return line
}

// scope is the head of one ScopeDesc: the method (an index into the
// nmethod's metadata, 1-based, 0 for none), the bci, and the offset of
// the caller's scope (0 for none).
type scope struct {
	sender   int32
	metadata int32
	bci      int32
}

// decodeScope reads the scope at off of an nmethod's scopes data.
func decodeScope(data []byte, off int32, unsigned5 bool) (scope, error) {
	if off <= 0 || int(off) >= len(data) {
		return scope{}, errCorrupt
	}
	s := stream{b: data, pos: int(off), unsigned5: unsigned5}
	sc := scope{sender: int32(s.uint()), metadata: int32(s.uint()), bci: int32(s.uint()) - 1}
	if s.err != nil || sc.sender < 0 || sc.metadata < 0 || sc.bci < -1 || sc.bci > 0xFFFF {
		return scope{}, errCorrupt
	}
	return sc, nil
}

// pcDesc is one PcDesc: a pc offset from the code's begin and the offset
// of its innermost scope in the scopes data.
type pcDesc struct{ pc, scope int32 }

// decodePcDescs parses a table of PcDescs of size bytes each.
func decodePcDescs(b []byte, size, pcOff, scopeOff uint64) ([]pcDesc, error) {
	if size < 8 || size > 64 || pcOff+4 > size || scopeOff+4 > size || uint64(len(b))%size != 0 || uint64(len(b))/size > maxPcDescs {
		return nil, errCorrupt
	}
	out := make([]pcDesc, 0, uint64(len(b))/size)
	last := int32(-1 << 31)
	for i := uint64(0); i < uint64(len(b)); i += size {
		e := b[i : i+size]
		d := pcDesc{int32(binary.LittleEndian.Uint32(e[pcOff:])), int32(binary.LittleEndian.Uint32(e[scopeOff:]))}
		if d.pc < last {
			return nil, errCorrupt // HotSpot keeps them sorted
		}
		last = d.pc
		out = append(out, d)
	}
	return out, nil
}

// findPcDesc returns the first PcDesc whose pc is above after: the debug
// info at a pc describes the instructions before it.
func findPcDesc(pcs []pcDesc, after int32) (pcDesc, bool) {
	lo, hi := 0, len(pcs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if pcs[m].pc > after {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == len(pcs) {
		return pcDesc{}, false
	}
	return pcs[lo], true
}

// symbolString turns a Symbol's bytes (modified UTF-8) into a string;
// what is not valid UTF-8 becomes U+FFFD.
func symbolString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// externalClassName turns an internal class name (java/lang/String, a
// hidden class Foo$$Lambda+0x0800) into the Java one (java.lang.String,
// Foo$$Lambda/0x0800) and its package path (java/lang).
func externalClassName(internal string) (name, pkg string) {
	if i := strings.LastIndexByte(internal, '/'); i >= 0 {
		pkg = internal[:i]
	}
	name = strings.ReplaceAll(internal, "/", ".")
	name = strings.ReplaceAll(name, "+", "/")
	return name, pkg
}
