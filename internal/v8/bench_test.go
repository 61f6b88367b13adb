package v8

import (
	"testing"
	"time"
)

// BenchmarkFrameReused names a compiled frame (an inlined function at the
// leaf: two lines) from objects a read after the sample checked: what each
// frame of a deep stack costs while the receiver is behind its samples,
// or for every sample of a batch after the first.
func BenchmarkFrameReused(b *testing.B) {
	sy := buildSynth()
	n := synthNamer(b, sy.img)
	pc := sy.instrs + uint64(sy.offInner) + 4
	captured := time.Now()
	if _, err := n.FrameCaptured(captured, 1, FrameCompiled, sy.sfiF, pc, false); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.FrameCaptured(captured, 1, FrameCompiled, sy.sfiF, pc, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFrameChecked names the same frame for a sample taken after the
// last check: each object it names is read again and compared, as for the
// first sample of each batch.
func BenchmarkFrameChecked(b *testing.B) {
	sy := buildSynth()
	n := synthNamer(b, sy.img)
	pc := sy.instrs + uint64(sy.offInner) + 4
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.FrameCaptured(time.Time{}, 1, FrameCompiled, sy.sfiF, pc, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInterpretedReused is BenchmarkFrameReused for an Ignition
// frame.
func BenchmarkInterpretedReused(b *testing.B) {
	sy := buildSynth()
	n := synthNamer(b, sy.img)
	word := uint64(uint32(54-1+sy.bcCall))<<32 | uint64(uint32(sy.bytecodeF))
	captured := time.Now()
	if _, err := n.FrameCaptured(captured, 1, FrameInterpreted, sy.sfiF, word, true); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.FrameCaptured(captured, 1, FrameInterpreted, sy.sfiF, word, true); err != nil {
			b.Fatal(err)
		}
	}
}
