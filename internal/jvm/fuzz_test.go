package jvm

import (
	"encoding/binary"
	"testing"
)

func FuzzDecodeLines(f *testing.F) {
	f.Add(encodeLines([]linePair{{0, 10}, {4, 11}, {200, 40}, {210, 12}}, false), false)
	f.Add(encodeLines([]linePair{{0, 10}, {65535, 70000}}, true), true)
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, true)
	f.Fuzz(func(t *testing.T, b []byte, u5 bool) {
		pairs, err := decodeLines(b, u5)
		if err == nil && len(pairs) > len(b) {
			t.Fatalf("%d pairs from %d bytes", len(pairs), len(b))
		}
		lineAt(pairs, 7)
	})
}

func FuzzDecodeScope(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5}, int32(1), true)
	f.Add(writeUint(writeUint([]byte{0, 0}, 1<<20, false), 0xFFFFFFFF, false), int32(1), false)
	f.Fuzz(func(t *testing.T, b []byte, off int32, u5 bool) {
		sc, err := decodeScope(b, off, u5)
		if err == nil && (sc.bci < -1 || sc.sender < 0 || sc.metadata < 0) {
			t.Fatalf("scope %+v", sc)
		}
	})
}

func FuzzPcDescs(f *testing.F) {
	f.Add(make([]byte, 32), uint64(16), uint64(0), uint64(4), int32(3))
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0}, uint64(8), uint64(0), uint64(4), int32(0))
	f.Fuzz(func(t *testing.T, b []byte, size, pcOff, scopeOff uint64, after int32) {
		pcs, err := decodePcDescs(b, size, pcOff, scopeOff)
		if err != nil {
			return
		}
		if d, ok := findPcDesc(pcs, after); ok && d.pc <= after {
			t.Fatalf("pc desc %+v not after %d", d, after)
		}
	})
}

// FuzzFrame names frames of a mutated synthetic JVM image: no panic, no
// endless loop, errors that match ErrStale or ErrUnreadable.
func FuzzFrame(f *testing.F) {
	f.Add(synthImage(false), uint32(0x85), false, uint16(2), false)
	f.Add(synthImage(true), uint32(0x90), true, uint16(0), true)
	f.Fuzz(func(t *testing.T, img []byte, pc uint32, ret bool, bci uint16, u5 bool) {
		major := 17
		if u5 {
			major = 25
		}
		n := synthNamer(t, img, major)
		if _, err := n.Frame(1, FrameCompiled, imgBlob, uint64(imgID)<<32|uint64(pc), ret); err != nil {
			checkFrameErr(t, err)
		}
		if _, err := n.Frame(1, FrameInterpreted, imgMethod, imgMethod+0x100+48+uint64(bci), ret); err != nil {
			checkFrameErr(t, err)
		}
	})
}

func checkFrameErr(t *testing.T, err error) {
	t.Helper()
	if !isStaleOrUnreadable(err) {
		t.Fatalf("error %v matches neither ErrStale nor ErrUnreadable", err)
	}
}

// tableImage lays out vmStructs tables as HotSpot does, at base: the
// gHotSpot* variables, then the four tables, then their strings.
func tableImage(base uint64) ([]byte, symAddrs) {
	img := make([]byte, 0x2000)
	syms := symAddrs{}
	for i, s := range tableSymbols {
		syms[s] = base + 8*uint64(i)
	}
	put := func(a, v uint64) { binary.LittleEndian.PutUint64(img[a-base:], v) }
	strAt := base + 0x1000
	str := func(s string) uint64 {
		a := strAt
		copy(img[a-base:], s+"\x00")
		strAt += uint64(len(s)) + 1
		return a
	}
	vars := func(table uint64, stride uint64, offs ...uint64) []uint64 {
		return append([]uint64{table, stride}, offs...)
	}
	tables := [][]uint64{
		vars(base+0x200, 48, 0, 8, 16, 24, 32, 40),
		vars(base+0x600, 48, 0, 32),
		vars(base+0x900, 16, 0, 8),
		vars(base+0xA00, 16, 0, 8),
	}
	i := 0
	for _, tv := range tables {
		for _, v := range tv {
			put(syms[tableSymbols[i]], v)
			i++
		}
	}
	// Two struct entries, one static.
	e := base + 0x200
	put(e, str("CodeBlob"))
	put(e+8, str("_size"))
	put(e+16, str("int"))
	put(e+32, 8)
	e += 48
	put(e, str("CodeCache"))
	put(e+8, str("_low_bound"))
	put(e+16, str("address"))
	binary.LittleEndian.PutUint32(img[e+24-base:], 1)
	put(e+40, base+0x1F00)
	put(base+0x600, str("nmethod"))
	put(base+0x600+32, 352)
	put(base+0x900, str("InvocationEntryBci"))
	put(base+0x908, 0xFFFFFFFF)
	put(base+0xA00, str("markWord::age_shift"))
	put(base+0xA08, 3)
	return img, syms
}

func FuzzTables(f *testing.F) {
	const base = 0x40000
	img, syms := tableImage(base)
	f.Add(img)
	f.Fuzz(func(t *testing.T, img []byte) {
		mem := sliceMem{base: base, b: img}
		tb, err := readTables(mem, syms)
		if err != nil {
			return
		}
		if len(tb.fields) > maxEntries {
			t.Fatalf("%d fields", len(tb.fields))
		}
		_, _ = newVM(tb, mem)
	})
}
