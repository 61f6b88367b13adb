package v8

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"unicode/utf16"
)

// writeVLQ appends v zig-zag encoded as a VLQ.
func writeVLQ(b []byte, v int64) []byte {
	return writeUVLQ(b, uint64(v<<1)^uint64(v>>63))
}

func writeUVLQ(b []byte, u uint64) []byte {
	for u >= 0x80 {
		b = append(b, byte(u)|0x80)
		u >>= 7
	}
	return append(b, byte(u))
}

// encodePositions builds a source position table from entries, as V8
// up to 13 (flagged false) or 14 (flagged true) writes it.
func encodePositions(es []posEntry, flagged bool) []byte {
	var b []byte
	code, pos := int64(-1), int64(0)
	for _, e := range es {
		d := int64(e.codeOffset) - code
		switch {
		case flagged && e.statement:
			b = writeUVLQ(b, uint64(d)<<2|3)
		case flagged:
			b = writeUVLQ(b, uint64(d)<<2|2)
		case e.statement:
			b = writeVLQ(b, d)
		default:
			b = writeVLQ(b, -d-1)
		}
		b = writeVLQ(b, e.pos-pos)
		code, pos = int64(e.codeOffset), e.pos
	}
	return b
}

// rawPosition builds a SourcePosition's bits.
func rawPosition(scriptOffset, inliningID int32) int64 {
	return int64(uint64(scriptOffset+1)<<1 | uint64(inliningID+1)<<31)
}

func TestDecodePositionsV8(t *testing.T) {
	// The top-level function of testdata/burn.js under Node 20: entries
	// at the function's entry (-1), 0, 28 (main();) and 32 (the end).
	b := []byte{0x01, 0x04, 0x03, 0x00, 0x38, 0xa4, 0x10, 0x08, 0x1c}
	es, err := decodePositions(b, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []posEntry{
		{codeOffset: -1, pos: rawPosition(0, -1)},
		{codeOffset: 0, pos: rawPosition(0, -1)},
		{codeOffset: 28, pos: rawPosition(521, -1), statement: true},
		{codeOffset: 32, pos: rawPosition(528, -1), statement: true},
	}
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("decoded %+v, want %+v", es, want)
	}
	// main of testdata/burn.js under Node 26 (V8 14): its first entries.
	b = []byte{0x02, 0xc0, 0x0c, 0x07, 0x44, 0x0b, 0x14, 0x12, 0x20}
	es, err = decodePositions(b, true)
	if err != nil {
		t.Fatal(err)
	}
	want = []posEntry{
		{codeOffset: -1, pos: rawPosition(399, -1)},
		{codeOffset: 0, pos: rawPosition(416, -1), statement: true},
		{codeOffset: 2, pos: rawPosition(421, -1), statement: true},
		{codeOffset: 6, pos: rawPosition(429, -1)},
	}
	if !reflect.DeepEqual(es, want) {
		t.Fatalf("decoded %+v, want %+v", es, want)
	}
}

func TestDecodePositionsRoundTrip(t *testing.T) {
	es := []posEntry{
		{codeOffset: -1, pos: rawPosition(10, -1)},
		{codeOffset: 0, pos: rawPosition(12, -1), statement: true},
		{codeOffset: 300, pos: rawPosition(5, 2)},
		{codeOffset: 70000, pos: rawPosition(1<<20, 700), statement: true},
		{codeOffset: 70001, pos: rawPosition(3, -1)},
	}
	for _, flagged := range []bool{false, true} {
		got, err := decodePositions(encodePositions(es, flagged), flagged)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, es) {
			t.Fatalf("flagged %v: decoded %+v, want %+v", flagged, got, es)
		}
	}
	if p, ok := positionAt(es, 299); !ok || p != es[1].pos {
		t.Errorf("position at 299: %d %v", p, ok)
	}
	if p, ok := positionAt(es, 300); !ok || p != es[2].pos {
		t.Errorf("position at 300: %d %v", p, ok)
	}
	if _, ok := positionAt(es, -2); ok {
		t.Errorf("a position before the first entry")
	}
	sp := splitPosition(rawPosition(1<<20, 700))
	if sp.scriptOffset != 1<<20 || sp.inliningID != 700 || sp.external {
		t.Errorf("split %+v", sp)
	}
}

func TestDecodePositionsErrors(t *testing.T) {
	for _, b := range [][]byte{
		{0x80},             // a VLQ without its last byte
		{0x02},             // a code offset without a position
		{0x02, 0xff, 0xff}, // a truncated position
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00}, // longer than 64 bits
	} {
		if _, err := decodePositions(b, false); err == nil {
			t.Errorf("%x: no error", b)
		}
	}
}

func TestLineEnds(t *testing.T) {
	src := utf16.Encode([]rune("a\nbc\r\nd\re\u2028f"))
	ends := lineEnds(src)
	want := []int32{1, 5, 7, 9, 11}
	if !reflect.DeepEqual(ends, want) {
		t.Fatalf("line ends %v, want %v", ends, want)
	}
	for _, c := range []struct {
		off       int32
		line, col int64
	}{{0, 1, 1}, {1, 1, 2}, {2, 2, 1}, {6, 3, 1}, {8, 4, 1}, {10, 5, 1}} {
		if l, col := lineOf(ends, c.off); l != c.line || col != c.col {
			t.Errorf("offset %d: line %d col %d, want %d %d", c.off, l, col, c.line, c.col)
		}
	}
	if got := lineEnds(utf16.Encode([]rune("x\n"))); !reflect.DeepEqual(got, []int32{1}) {
		t.Errorf("a source ending in a newline: %v", got)
	}
}

// TestLineTable compares the compact line table with lineOf over the
// line ends of generated sources: short lines, lines of 254, 255 and more
// characters (kept aside), a first line at offset 0, and every offset from
// before the first character to past the end.
func TestLineTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := rng.IntN(3 * lineMark)
		var src []byte
		for range n {
			length := rng.IntN(40)
			switch rng.IntN(8) {
			case 0:
				length = 254 + rng.IntN(3) // around the byte's limit
			case 1:
				length = 300 + rng.IntN(3000)
			}
			src = append(src, bytes.Repeat([]byte{'x'}, length)...)
			src = append(src, '\n')
		}
		if round%2 == 0 {
			src = append(src, "tail"...) // a last line without a newline
		}
		ends := lineEndsOneByte(src)
		tab := newLineTable(ends)
		if tab.n != len(ends) || (len(ends) > 0 && tab.last != ends[len(ends)-1]) {
			t.Fatalf("round %d: table of %d lines ending at %d, want %d", round, tab.n, tab.last, len(ends))
		}
		long := 0
		for i := 1; i < len(ends); i++ {
			if i%lineMark != 0 && ends[i]-ends[i-1] >= lineLong {
				long++
			}
		}
		if want := int64(len(ends) + 4*((len(ends)+lineMark-1)/lineMark) + 8*long); tab.size() > want {
			t.Errorf("round %d: %d bytes for %d lines (%d long), want at most %d", round, tab.size(), len(ends), long, want)
		}
		for off := int32(-2); off <= int32(len(src))+2; off++ {
			l, c := tab.lineOf(off)
			wl, wc := lineOf(ends, off)
			if l != wl || c != wc {
				t.Fatalf("round %d, offset %d: line %d col %d, want %d %d", round, off, l, c, wl, wc)
			}
		}
	}
}

func TestBaselineBytecodeOffset(t *testing.T) {
	// Three bytecodes: 0x10 (size 2), Wide-prefixed 0x11 (size 3 at
	// scale 2), 0x12 (size 1); each takes 8 bytes of machine code after
	// a 16-byte prologue.
	sizes := make([]byte, 3*0x20)
	sizes[0x10], sizes[0x11], sizes[0x12] = 2, 2, 1
	sizes[0x20+0x11] = 3
	bytecodes := []byte{0x10, 0xaa, bytecodeWide, 0x11, 0xbb, 0xbb, 0x12}
	table := writeUVLQ(writeUVLQ(writeUVLQ(writeUVLQ(nil, 16), 8), 8), 8)
	for _, c := range []struct {
		pc   uint64
		want int
	}{{0, -1}, {16, -1}, {17, 0}, {24, 0}, {25, 2}, {32, 2}, {33, 6}, {40, 6}} {
		got, err := baselineBytecodeOffset(table, bytecodes, sizes, c.pc)
		if err != nil || got != c.want {
			t.Errorf("pc offset %d: bytecode %d %v, want %d", c.pc, got, err, c.want)
		}
	}
	if _, err := baselineBytecodeOffset(table, bytecodes, sizes, 41); err == nil {
		t.Errorf("pc offset past the table: no error")
	}
	if _, err := baselineBytecodeOffset(table, []byte{0x1f}, sizes, 20); err == nil {
		t.Errorf("a bytecode of size 0: no error")
	}
}

// lineEndsOneByte agrees with lineEnds on the same source widened.
func TestLineEndsOneByte(t *testing.T) {
	for _, src := range []string{"", "a", "a\n", "a\nb", "\r\n\r\n", "a\rb\r", "x\r\ny\rz\n\n", "\n"} {
		checkLineEnds(t, []byte(src))
	}
}

func FuzzLineEndsOneByte(f *testing.F) {
	f.Add([]byte("let a;\r\nf()\rg()\n"))
	f.Fuzz(checkLineEnds)
}

func checkLineEnds(t *testing.T, src []byte) {
	wide := make([]uint16, len(src))
	for i, c := range src {
		wide[i] = uint16(c)
	}
	if got, want := lineEndsOneByte(src), lineEnds(wide); !slices.Equal(got, want) {
		t.Errorf("%q: %v, want %v", src, got, want)
	}
}
