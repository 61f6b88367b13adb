package v8

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
)

// errTruncated is a table that ends inside an entry.
var errTruncated = errors.New("truncated")

// posEntry is one entry of a source position table: from codeOffset on
// (a bytecode offset, or an offset in machine code), the source position.
type posEntry struct {
	codeOffset int32
	pos        int64 // a SourcePosition's raw bits
	statement  bool
}

// maxPositions bounds the entries decoded from one table.
const maxPositions = 1 << 20

// readVLQ reads one variable-length quantity at b[*i] (see readUVLQ),
// zig-zag decoded (the low bit is the sign).
func readVLQ(b []byte, i *int) (int64, error) {
	u, err := readUVLQ(b, i)
	return int64(u>>1) ^ -int64(u&1), err
}

// readUVLQ reads one variable-length quantity at b[*i]: seven bits a
// byte, least significant first, the high bit set on every byte but the
// last.
func readUVLQ(b []byte, i *int) (uint64, error) {
	var u uint64
	for shift := uint(0); ; shift += 7 {
		if *i >= len(b) {
			return 0, errTruncated
		}
		c := b[*i]
		*i++
		if shift >= 64 {
			return 0, fmt.Errorf("vlq longer than 64 bits at %d", *i)
		}
		u |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			break
		}
	}
	return u, nil
}

// decodePositions decodes a source position table: a sequence of (code
// offset delta, position delta) pairs, each a VLQ, the position delta
// zig-zag decoded. Up to V8 13 the code offset is zig-zag decoded too: a
// negative value v stands for an expression position at delta -v-1, a
// non-negative one for a statement position at delta v. From V8 14
// (flagged) it is unsigned: the delta shifted left by two, the low bit
// set for a statement. Offsets start at -1 (the function's entry) and
// positions at 0.
func decodePositions(b []byte, flagged bool) ([]posEntry, error) {
	var out []posEntry
	code, pos := int64(-1), int64(0)
	for i := 0; i < len(b); {
		if len(out) >= maxPositions {
			return nil, fmt.Errorf("more than %d source positions", maxPositions)
		}
		var c int64
		var stmt bool
		if flagged {
			u, err := readUVLQ(b, &i)
			if err != nil {
				return nil, fmt.Errorf("code offset: %w", err)
			}
			c, stmt = int64(u>>2), u&1 != 0
		} else {
			v, err := readVLQ(b, &i)
			if err != nil {
				return nil, fmt.Errorf("code offset: %w", err)
			}
			c, stmt = v, v >= 0
			if !stmt {
				c = -v - 1
			}
		}
		d, err := readVLQ(b, &i)
		if err != nil {
			return nil, fmt.Errorf("source position: %w", err)
		}
		code += c
		pos += d
		if c < 0 || code > 1<<31-1 || code < -1 {
			return nil, fmt.Errorf("code offset %d out of range", code)
		}
		out = append(out, posEntry{codeOffset: int32(code), pos: pos, statement: stmt})
	}
	return out, nil
}

// positionAt returns the position of the last entry at or before off.
func positionAt(es []posEntry, off int32) (int64, bool) {
	i := sort.Search(len(es), func(i int) bool { return es[i].codeOffset > off })
	if i == 0 {
		return 0, false
	}
	return es[i-1].pos, true
}

// sourcePosition is a SourcePosition's raw bits taken apart: bit 0 says
// external (a line in another file, which V8 uses for its own builtins,
// never for scripts), bits 1..30 hold the script offset plus one, bits
// 31..46 the inlining id plus one.
type sourcePosition struct {
	external     bool
	scriptOffset int32 // -1: none
	inliningID   int32 // -1: not inlined
}

func splitPosition(raw int64) sourcePosition {
	u := uint64(raw)
	return sourcePosition{
		external:     u&1 != 0,
		scriptOffset: int32((u>>1)&(1<<30-1)) - 1,
		inliningID:   int32((u>>31)&0xffff) - 1,
	}
}

// lineOf is the 1-based line of offset in a script whose line ends (the
// offsets of its '\n' characters, and of its end) are ends, and the
// 1-based column.
func lineOf(ends []int32, offset int32) (line, col int64) {
	i := sort.Search(len(ends), func(i int) bool { return ends[i] >= offset })
	start := int32(0)
	if i > 0 {
		start = ends[i-1] + 1
	}
	return int64(i) + 1, int64(offset-start) + 1
}

// lineEnds returns the offsets of the line ends of src as V8 counts them:
// each line terminator ('\n', a '\r' not followed by '\n', U+2028,
// U+2029), then the end of a last line without one.
// lineEndsOneByte is lineEnds of a one-byte (Latin-1) source, which holds
// no U+2028 or U+2029.
func lineEndsOneByte(src []byte) []int32 {
	out := make([]int32, 0, bytes.Count(src, []byte{'\n'})+1)
	for i := 0; i < len(src); {
		j := bytes.IndexAny(src[i:], "\n\r")
		if j < 0 {
			break
		}
		i += j
		if src[i] == '\n' || i+1 == len(src) || src[i+1] != '\n' {
			out = append(out, int32(i))
		}
		i++
	}
	if len(src) == 0 || src[len(src)-1] != '\n' {
		out = append(out, int32(len(src)))
	}
	return out
}

func lineEnds(src []uint16) []int32 {
	var out []int32
	for i, c := range src {
		switch {
		case c == '\n', c == 0x2028, c == 0x2029,
			c == '\r' && (i+1 == len(src) || src[i+1] != '\n'):
			out = append(out, int32(i))
		}
	}
	if len(src) == 0 || src[len(src)-1] != '\n' {
		out = append(out, int32(len(src)))
	}
	return out
}

// Ignition's prefix bytecodes: the operands of the next bytecode are
// twice (Wide) or four times (ExtraWide) as wide.
const (
	bytecodeWide      = 0
	bytecodeExtraWide = 1
)

// maxBytecodes bounds the bytecodes stepped through for one lookup.
const maxBytecodes = 1 << 20

// baselineBytecodeOffset maps an offset in baseline (Sparkplug) code to
// the bytecode it runs: table holds, for the function's entry and then
// each bytecode in order, the size of its machine code (unsigned VLQs);
// a pc offset belongs to the first entry whose code ends at or after it.
// sizes is Bytecodes::kBytecodeSizes, bytecodes the function's bytecode.
// The function's entry is -1.
func baselineBytecodeOffset(table, bytecodes, sizes []byte, pcOff uint64) (int, error) {
	n := len(sizes) / 3
	if n == 0 {
		return 0, fmt.Errorf("no bytecode sizes")
	}
	i := 0
	end, err := readUVLQ(table, &i)
	if err != nil {
		return 0, fmt.Errorf("bytecode offset table: %w", err)
	}
	cur, next := -1, 0
	for steps := 0; end < pcOff; steps++ {
		if steps > maxBytecodes || next >= len(bytecodes) {
			return 0, fmt.Errorf("pc offset %#x past the bytecodes", pcOff)
		}
		d, err := readUVLQ(table, &i)
		if err != nil {
			return 0, fmt.Errorf("bytecode offset table: %w", err)
		}
		end += d
		cur = next
		// Step over the bytecode at next, with its prefix.
		scale, at := 0, next
		switch bytecodes[at] {
		case bytecodeWide:
			scale, at = 1, at+1
		case bytecodeExtraWide:
			scale, at = 2, at+1
		}
		if at >= len(bytecodes) || int(bytecodes[at]) >= n {
			return 0, fmt.Errorf("bytecode %d at %d: not one of %d", bytecodes[min(at, len(bytecodes)-1)], at, n)
		}
		size := int(sizes[scale*n+int(bytecodes[at])])
		if size == 0 {
			return 0, fmt.Errorf("bytecode %d at %d: size 0", bytecodes[at], at)
		}
		next = at + size
	}
	return cur, nil
}

// lineTable holds a script's line ends (as lineEnds gives them) in about a
// byte a line instead of four: the end of every lineMark-th line, and each
// other line's end as the difference from the previous one in a byte; a
// difference that does not fit (a line of 255 characters or more, or line
// ends out of order, read from a heap that changed) is kept aside, sorted
// by line. A big script's lines (TypeScript's compiler: 134,465) are then
// 150 KB of the namer's cache rather than 540.
type lineTable struct {
	n       int
	last    int32   // the last line's end
	marks   []int32 // marks[k]: the end of line k*lineMark
	steps   []uint8 // steps[i]: the end of line i minus that of line i-1, or lineLong
	longAt  []int32 // lines whose step is lineLong, ascending
	longLen []int32 // their steps
}

const (
	lineMark = 64
	lineLong = 255
)

func newLineTable(ends []int32) *lineTable {
	t := &lineTable{n: len(ends), steps: make([]uint8, len(ends)),
		marks: make([]int32, 0, (len(ends)+lineMark-1)/lineMark)}
	for i, e := range ends {
		if i%lineMark == 0 {
			t.marks = append(t.marks, e)
			continue
		}
		d := int64(e) - int64(ends[i-1])
		if d >= 0 && d < lineLong {
			t.steps[i] = uint8(d)
			continue
		}
		t.steps[i] = lineLong
		t.longAt = append(t.longAt, int32(i))
		t.longLen = append(t.longLen, e-ends[i-1])
	}
	if len(ends) > 0 {
		t.last = ends[len(ends)-1]
	}
	return t
}

// size is about what t holds, in bytes.
func (t *lineTable) size() int64 {
	return int64(len(t.steps) + 4*len(t.marks) + 8*len(t.longAt))
}

// step is the end of line i (not a marked one) minus that of line i-1.
func (t *lineTable) step(i int) int32 {
	if s := t.steps[i]; s != lineLong {
		return int32(s)
	}
	j, _ := slices.BinarySearch(t.longAt, int32(i))
	return t.longLen[j]
}

// lineOf is lineOf(ends, offset) for the ends t was made of.
func (t *lineTable) lineOf(offset int32) (line, col int64) {
	// The last marked line ending before offset: the line sought is one
	// of the lineMark lines after it, or the next marked one.
	k := sort.Search(len(t.marks), func(k int) bool { return t.marks[k] >= offset }) - 1
	if k < 0 {
		return 1, int64(offset) + 1
	}
	i, end := k*lineMark, t.marks[k]
	stop := min(i+lineMark, t.n)
	for i++; i < stop; i++ {
		next := end + t.step(i)
		if next >= offset {
			break
		}
		end = next
	}
	return int64(i) + 1, int64(offset-(end+1)) + 1
}
