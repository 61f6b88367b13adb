package pclntab

import (
	"debug/elf"
	"debug/gosym"
	"runtime"
	"testing"
)

// BenchmarkOpenLookup opens the go tool's pclntab and names 1000 PCs spread
// over its text, with this package and with debug/gosym. The section bytes
// are read once outside the timer; retained-B/op is the heap still held by
// the table afterwards, not counting those bytes.
func BenchmarkOpenLookup(b *testing.B) {
	bin := goToolBinary(b)
	f, err := elf.Open(bin)
	if err != nil {
		b.Fatal(err)
	}
	data, err := Section(f).Data()
	if err != nil {
		b.Fatal(err)
	}
	text := f.Section(".text")
	f.Close()
	pcs := make([]uint64, 1000)
	for i := range pcs {
		pcs[i] = text.Addr + uint64(i)*(text.Size/uint64(len(pcs)))
	}

	b.Run("pclntab", func(b *testing.B) {
		b.ReportAllocs()
		var frames []Frame
		var keep *Table
		for b.Loop() {
			tab, err := Open(data, text.Addr, data)
			if err != nil {
				b.Fatal(err)
			}
			for _, pc := range pcs {
				frames, _ = tab.Frames(pc, frames[:0])
			}
			keep = tab
		}
		b.ReportMetric(float64(retained(func() any { t, _ := Open(data, text.Addr, nil); return t })), "retained-B/op")
		_ = keep
	})
	b.Run("gosym", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
			if err != nil {
				b.Fatal(err)
			}
			for _, pc := range pcs {
				tab.PCToLine(pc)
			}
		}
		b.ReportMetric(float64(retained(func() any {
			t, _ := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
			return t
		})), "retained-B/op")
	})
}

// retained measures the live heap that build's result holds.
func retained(build func() any) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}
