package pclntab

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A synthetic pclntab, built by the tests to exercise layouts the local
// toolchain does not emit (big-endian, Go 1.18) and to seed the fuzzer.

// pcv is one row of a pcvalue table: val holds up to (not including) end,
// an offset from the function entry.
type pcv struct {
	end uint32
	val int32
}

type synthInl struct {
	name     string
	parentPC uint32
}

type synthFunc struct {
	name           string
	size           uint32
	file, line, sp []pcv // file values index the synthetic file table
	inlIndex       []pcv
	inl            []synthInl
}

type synthOpts struct {
	big, go118 bool
}

var synthFiles = []string{"a.go", "b/b.go"}

const synthText = 0x1000

func synthFuncs() []synthFunc {
	return []synthFunc{
		{name: "main.f", size: 0x20,
			file: []pcv{{0x20, 0}}, line: []pcv{{0x10, 10}, {0x20, 11}},
			sp: []pcv{{0x4, 0}, {0x1c, 0x18}, {0x20, 0}}},
		{name: "main.g", size: 0x40,
			file: []pcv{{0x10, 0}, {0x30, 1}, {0x40, 0}},
			line: []pcv{{0x10, 20}, {0x20, 5}, {0x30, 7}, {0x40, 21}},
			sp:   []pcv{{0x40, 8}},
			// 0x10..0x20 is h inlined at g:20 (pc 0x8), 0x20..0x30 is k
			// inlined into h at b.go:5 (pc 0x18).
			inlIndex: []pcv{{0x10, -1}, {0x20, 0}, {0x30, 1}, {0x40, -1}},
			inl:      []synthInl{{"main.h", 0x8}, {"main.k", 0x18}}},
	}
}

func header(magic uint32, ptr byte, rest []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, magic)
	return append(append(b, 0, 0, 1, ptr), rest...)
}

func appendPCValue(b []byte, rows []pcv) []byte {
	pc, prev := uint32(0), int32(-1)
	for _, r := range rows {
		d := r.val - prev
		b = binary.AppendUvarint(b, uint64(uint32(d<<1^d>>31)))
		b = binary.AppendUvarint(b, uint64(r.end-pc))
		pc, prev = r.end, r.val
	}
	return append(b, 0)
}

// buildSynth lays out a pclntab for funcs, code starting at synthText; the
// funcdata region follows the table in the same slice, from gofunc on.
func buildSynth(funcs []synthFunc, o synthOpts) (data []byte, gofunc int) {
	var bo interface {
		binary.ByteOrder
		binary.AppendByteOrder
	} = binary.LittleEndian
	if o.big {
		bo = binary.BigEndian
	}
	magic := uint32(magic120)
	funcSize := funcSize120
	if o.go118 {
		magic, funcSize = magic118, funcSize118
	}
	var names, files, pctab, gof []byte
	nameOff := map[string]uint32{}
	addName := func(s string) uint32 {
		if off, ok := nameOff[s]; ok {
			return off
		}
		nameOff[s] = uint32(len(names))
		names = append(append(names, s...), 0)
		return nameOff[s]
	}
	var cutab []byte
	for _, f := range synthFiles {
		cutab = bo.AppendUint32(cutab, uint32(len(files)))
		files = append(append(files, f...), 0)
	}
	pctab = []byte{0} // offset 0 means no table
	addTable := func(rows []pcv) uint32 {
		if rows == nil {
			return 0
		}
		off := uint32(len(pctab))
		pctab = appendPCValue(pctab, rows)
		return off
	}
	// Function table, then the records.
	ftab := make([]byte, len(funcs)*8+4)
	var recs []byte
	entry := uint32(0)
	for i, f := range funcs {
		bo.PutUint32(ftab[i*8:], entry)
		bo.PutUint32(ftab[i*8+4:], uint32(len(ftab)+len(recs)))
		rec := make([]byte, funcSize)
		bo.PutUint32(rec[0:], entry)
		bo.PutUint32(rec[4:], addName(f.name))
		bo.PutUint32(rec[16:], addTable(f.sp))
		bo.PutUint32(rec[20:], addTable(f.file))
		bo.PutUint32(rec[24:], addTable(f.line))
		bo.PutUint32(rec[28:], 3) // npcdata
		rec[funcSize-1] = 4       // nfuncdata
		rec = bo.AppendUint32(rec, 0)
		rec = bo.AppendUint32(rec, 0)
		rec = bo.AppendUint32(rec, addTable(f.inlIndex))
		for range 3 {
			rec = bo.AppendUint32(rec, noFuncdata)
		}
		if f.inl == nil {
			rec = bo.AppendUint32(rec, noFuncdata)
		} else {
			rec = bo.AppendUint32(rec, uint32(len(gof)))
			for _, c := range f.inl {
				e := make([]byte, 16)
				name, parent := 4, 8
				if o.go118 {
					e, name, parent = make([]byte, 20), 12, 16
				}
				bo.PutUint32(e[name:], addName(c.name))
				bo.PutUint32(e[parent:], c.parentPC)
				gof = append(gof, e...)
			}
		}
		recs = append(recs, rec...)
		entry += f.size
	}
	bo.PutUint32(ftab[len(funcs)*8:], entry)

	const hdr = 8 + 8*8
	data = bo.AppendUint32(nil, magic)
	data = append(data, 0, 0, 1, 8)
	off := uint64(hdr)
	for _, w := range []uint64{uint64(len(funcs)), uint64(len(synthFiles)), 0} {
		data = bo.AppendUint64(data, w)
	}
	for _, part := range [][]byte{names, cutab, files, pctab} {
		data = bo.AppendUint64(data, off)
		off += uint64(len(part))
	}
	data = bo.AppendUint64(data, off)
	for _, part := range [][]byte{names, cutab, files, pctab, ftab, recs} {
		data = append(data, part...)
	}
	gofunc = len(data)
	return append(data, gof...), gofunc
}

func buildTable(tb testing.TB, funcs []synthFunc) []byte {
	tb.Helper()
	data, _ := buildSynth(funcs, synthOpts{})
	return data
}

func TestSynthetic(t *testing.T) {
	for _, o := range []synthOpts{{}, {big: true}, {go118: true}, {big: true, go118: true}} {
		data, gofunc := buildSynth(synthFuncs(), o)
		tab, err := Open(data, synthText, data[gofunc:])
		if err != nil {
			t.Fatalf("%+v: Open: %v", o, err)
		}
		frames := []struct {
			pc   uint64
			want []Frame
		}{
			{0xfff, nil},
			{0x1000, []Frame{{"main.f", "a.go", 10}}},
			{0x101f, []Frame{{"main.f", "a.go", 11}}},
			{0x1020, []Frame{{"main.g", "a.go", 20}}},
			{0x1035, []Frame{{"main.h", "b/b.go", 5}, {"main.g", "a.go", 20}}},
			{0x1045, []Frame{{"main.k", "b/b.go", 7}, {"main.h", "b/b.go", 5}, {"main.g", "a.go", 20}}},
			{0x105f, []Frame{{"main.g", "a.go", 21}}},
			{0x1060, nil},
		}
		for _, tt := range frames {
			got, err := tab.Frames(tt.pc, nil)
			if err != nil {
				t.Fatalf("%+v: Frames(%#x): %v", o, tt.pc, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("%+v: Frames(%#x) (-want +got):\n%s", o, tt.pc, diff)
			}
		}
		sp := []struct {
			pc   uint64
			want int32
			ok   bool
		}{{0x1000, 0, true}, {0x1004, 0x18, true}, {0x101c, 0, true}, {0x1030, 8, true}, {0x2000, 0, false}}
		for _, tt := range sp {
			if got, ok := tab.SPDelta(tt.pc); got != tt.want || ok != tt.ok {
				t.Errorf("%+v: SPDelta(%#x) = %d, %v; want %d, %v", o, tt.pc, got, ok, tt.want, tt.ok)
			}
		}
		if s, e, ok := tab.FuncRange(0x1030); s != 0x1020 || e != 0x1060 || !ok {
			t.Errorf("%+v: FuncRange(0x1030) = %#x, %#x, %v", o, s, e, ok)
		}
		// Without the funcdata region, inlined PCs name the physical function.
		noInl, err := Open(data, synthText, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := noInl.Frames(0x1045, nil)
		if diff := cmp.Diff([]Frame{{"main.g", "b/b.go", 7}}, got); diff != "" {
			t.Errorf("%+v: Frames without gofunc (-want +got):\n%s", o, diff)
		}
	}
}
