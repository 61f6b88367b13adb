package pclntab

import (
	"bytes"
	"debug/elf"
	"os"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// FuzzOpen opens arbitrary bytes as a pclntab, with its own tail as the
// funcdata region, looks PCs up in it and lists its functions. Nothing may
// panic; work per lookup is bounded by the table's size and maxInlineDepth.
func FuzzOpen(f *testing.F) {
	for _, o := range []synthOpts{{}, {big: true}, {go118: true}} {
		data, gofunc := buildSynth(synthFuncs(), o)
		f.Add(data, uint16(gofunc))
	}
	for _, magic := range []uint32{0xfffffffb, 0xfffffffa, magic118, magic120} {
		f.Add(header(magic, 8, make([]byte, 128)), uint16(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, gofunc uint16) {
		var gf []byte
		if int(gofunc) < len(data) {
			gf = data[gofunc:]
		}
		tab, err := Open(data, synthText, gf)
		if err != nil {
			return
		}
		var frames []Frame
		for pc := uint64(synthText - 1); pc < synthText+0x80; pc += 3 {
			frames, _ = tab.Frames(pc, frames[:0])
			if len(frames) > maxInlineDepth+1 {
				t.Fatalf("Frames(%#x) gave %d frames", pc, len(frames))
			}
			if start, end, ok := tab.FuncRange(pc); ok && (pc < start || pc >= end) {
				t.Fatalf("FuncRange(%#x) = %#x, %#x", pc, start, end)
			}
			tab.SPDelta(pc)
		}
		var prev uint64
		// Garbage may end the walk with an error; what it yields until then
		// must be in order.
		_ = tab.Funcs(func(fn Func) bool {
			if fn.Entry >= fn.End || fn.Entry < prev {
				t.Fatalf("function [%#x, %#x) after %#x", fn.Entry, fn.End, prev)
			}
			prev = fn.End
			tab.FuncName(fn)
			return true
		})
	})
}

// FuzzOpenELFImage reads the pclntab of arbitrary bytes taken as a whole
// ELF file, in place (as from a mapping), and names a few PCs of its text.
// Sections outside the image must be refused, never read.
func FuzzOpenELFImage(f *testing.F) {
	seed, err := os.ReadFile(testutil.BuildGo(f, "inlprog", "testdata/inlprog", "-ldflags=-s -w"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/3])
	f.Fuzz(func(_ *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		tab, err := OpenELFImage(ef, data)
		if err != nil {
			return
		}
		var frames []Frame
		if text := ef.Section(".text"); text != nil {
			for pc := text.Addr; pc < text.Addr+min(text.Size, 4096); pc += 61 {
				frames, _ = tab.Frames(pc, frames[:0])
			}
		}
	})
}
