package jvm

import (
	"errors"
	"fmt"
	"testing"
)

// writeUint encodes v as the JVM's CompressedWriteStream does (x: the
// excluded byte count, 0 before JDK 20, 1 after).
func writeUint(b []byte, v uint32, unsigned5 bool) []byte {
	x := uint32(0)
	if unsigned5 {
		x = 1
	}
	l := 256 - x - 64
	sum := v
	for i := 0; ; i++ {
		if sum < l || i == 4 {
			return append(b, byte(x+sum))
		}
		sum -= l
		b = append(b, byte(x+l+sum%64))
		sum >>= 6
	}
}

func writeInt(b []byte, v int32, unsigned5 bool) []byte {
	return writeUint(b, uint32(v<<1)^uint32(v>>31), unsigned5)
}

func TestStreamRoundTrip(t *testing.T) {
	for _, u5 := range []bool{false, true} {
		for _, v := range []uint32{0, 1, 190, 191, 192, 255, 256, 0x307E, 0x307F, 0xC207E, 0xC207F, 1 << 30, 0xFFFFFFFF} {
			b := writeUint(nil, v, u5)
			s := stream{b: b, unsigned5: u5}
			if got := s.uint(); got != v || s.err != nil || s.pos != len(b) {
				t.Errorf("unsigned5 %v: %d coded %x read back %d (pos %d, %v)", u5, v, b, got, s.pos, s.err)
			}
			if u5 {
				for _, c := range b {
					if c == 0 {
						t.Errorf("%d coded %x: a zero byte", v, b)
					}
				}
			}
		}
		for _, v := range []int32{0, -1, 1, -1000, 1000, 1<<31 - 1, -1 << 31} {
			b := writeInt(nil, v, u5)
			s := stream{b: b, unsigned5: u5}
			if got := s.int(); got != v || s.err != nil {
				t.Errorf("unsigned5 %v: %d read back %d (%v)", u5, v, got, s.err)
			}
		}
	}
	// The bytes of JDK 17's and 25's streams differ: 0 is a value before
	// JDK 20, the excluded byte after.
	if b := writeUint(nil, 0, false); b[0] != 0 {
		t.Errorf("0 before JDK 20: %x", b)
	}
	if b := writeUint(nil, 0, true); b[0] != 1 {
		t.Errorf("0 from JDK 20: %x", b)
	}
	s := stream{b: []byte{0}, unsigned5: true}
	if s.uint(); s.err == nil {
		t.Error("the excluded byte read as a value")
	}
	s = stream{b: []byte{0xFF, 0xFF}}
	if s.uint(); s.err == nil {
		t.Error("a truncated value read")
	}
}

// encodeLines writes a line number table as CompressedLineNumberWriteStream
// does.
func encodeLines(pairs []linePair, unsigned5 bool) []byte {
	var b []byte
	var bci, line int32
	for _, p := range pairs {
		db, dl := p.bci-bci, p.line-line
		if db >= 0 && db <= 0x1F && dl >= 0 && dl <= 7 && (db != 0x1F || dl != 7) {
			b = append(b, byte(db<<3|dl))
		} else {
			b = append(b, 0xFF)
			b = writeInt(b, db, unsigned5)
			b = writeInt(b, dl, unsigned5)
		}
		bci, line = p.bci, p.line
	}
	return append(b, 0)
}

func TestDecodeLines(t *testing.T) {
	pairs := []linePair{{0, 10}, {4, 11}, {9, 11}, {200, 40}, {210, 12}, {65535, 70000}}
	for _, u5 := range []bool{false, true} {
		got, err := decodeLines(encodeLines(pairs, u5), u5)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(pairs) {
			t.Errorf("unsigned5 %v: %v, want %v", u5, got, pairs)
		}
	}
	for _, c := range []struct {
		bci  int32
		want int64
	}{{-1, 10}, {0, 10}, {3, 10}, {4, 11}, {100, 11}, {205, 40}, {210, 12}, {70000, 70000}} {
		if got := lineAt(pairs, c.bci); got != c.want {
			t.Errorf("line at %d: %d, want %d", c.bci, got, c.want)
		}
	}
	if got := lineAt(nil, 3); got != 0 {
		t.Errorf("no table: line %d", got)
	}
	for _, bad := range [][]byte{nil, {0x08}, {0xFF, 0x02}, {0xFF, 0x03, 0x02, 0x00}} {
		if _, err := decodeLines(bad, false); !errors.Is(err, errCorrupt) {
			t.Errorf("%x: %v, want corrupt", bad, err)
		}
	}
}

func TestDecodeScope(t *testing.T) {
	for _, u5 := range []bool{false, true} {
		// A pad byte, then the caller's scope at 1, then the callee's.
		data := []byte{0}
		data = writeUint(data, 0, u5)  // no sender
		data = writeUint(data, 3, u5)  // metadata index
		data = writeUint(data, 18, u5) // bci 17
		callee := int32(len(data))
		data = writeUint(data, 1, u5)
		data = writeUint(data, 5, u5)
		data = writeUint(data, 0, u5) // InvocationEntryBci
		sc, err := decodeScope(data, callee, u5)
		if err != nil || sc != (scope{sender: 1, metadata: 5, bci: -1}) {
			t.Errorf("callee %+v %v", sc, err)
		}
		sc, err = decodeScope(data, sc.sender, u5)
		if err != nil || sc != (scope{sender: 0, metadata: 3, bci: 17}) {
			t.Errorf("caller %+v %v", sc, err)
		}
		for _, off := range []int32{0, -1, int32(len(data)), int32(len(data)) - 1} {
			if _, err := decodeScope(data, off, u5); err == nil {
				t.Errorf("scope at %d decoded", off)
			}
		}
	}
}

func TestPcDescs(t *testing.T) {
	var b []byte
	for _, d := range []pcDesc{{-1, 0}, {10, 5}, {10, 9}, {40, 20}} {
		e := make([]byte, 16)
		e[0], e[1], e[2], e[3] = byte(d.pc), byte(d.pc>>8), byte(d.pc>>16), byte(d.pc>>24)
		e[4] = byte(d.scope)
		b = append(b, e...)
	}
	pcs, err := decodePcDescs(b, 16, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		after int32
		want  pcDesc
		ok    bool
	}{{-2, pcDesc{-1, 0}, true}, {-1, pcDesc{10, 5}, true}, {9, pcDesc{10, 5}, true}, {10, pcDesc{40, 20}, true}, {39, pcDesc{40, 20}, true}, {40, pcDesc{}, false}} {
		got, ok := findPcDesc(pcs, c.after)
		if got != c.want || ok != c.ok {
			t.Errorf("after %d: %+v %v, want %+v %v", c.after, got, ok, c.want, c.ok)
		}
	}
	if _, err := decodePcDescs(b[:20], 16, 0, 4); err == nil {
		t.Error("a partial PcDesc decoded")
	}
	unsorted := append(append([]byte{}, b[32:48]...), b[:16]...)
	if _, err := decodePcDescs(unsorted, 16, 0, 4); err == nil {
		t.Error("unsorted PcDescs decoded")
	}
}

func TestExternalClassName(t *testing.T) {
	for _, c := range []struct{ in, name, pkg string }{
		{"java/lang/String", "java.lang.String", "java/lang"},
		{"JBurn$Mix", "JBurn$Mix", ""},
		{"com/example/Foo$$Lambda+0x0000000801001234", "com.example.Foo$$Lambda/0x0000000801001234", "com/example"},
	} {
		name, pkg := externalClassName(c.in)
		if name != c.name || pkg != c.pkg {
			t.Errorf("%s: %s %s, want %s %s", c.in, name, pkg, c.name, c.pkg)
		}
	}
}

func isStaleOrUnreadable(err error) bool {
	return errors.Is(err, ErrStale) || errors.Is(err, ErrUnreadable)
}

func TestReadTables(t *testing.T) {
	const base = 0x40000
	img, syms := tableImage(base)
	tb, err := readTables(sliceMem{base: base, b: img}, syms)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]field{
		"CodeBlob::_size":       {typ: "int", offset: 8},
		"CodeCache::_low_bound": {typ: "address", static: true, address: base + 0x1F00},
	}
	if fmt.Sprint(tb.fields) != fmt.Sprint(want) {
		t.Errorf("fields %+v, want %+v", tb.fields, want)
	}
	if tb.sizes["nmethod"] != 352 || tb.ints["InvocationEntryBci"] != -1 || tb.longs["markWord::age_shift"] != 3 {
		t.Errorf("sizes %v ints %v longs %v", tb.sizes, tb.ints, tb.longs)
	}
	delete(syms, "gHotSpotVMTypes")
	if _, err := readTables(sliceMem{base: base, b: img}, syms); !errors.Is(err, ErrUnknownVersion) {
		t.Errorf("without gHotSpotVMTypes: %v, want ErrUnknownVersion", err)
	}
}
