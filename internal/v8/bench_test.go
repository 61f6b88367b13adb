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
	benchFrame(b, FrameCompiled, compiledPC, false, true)
}

// BenchmarkFrameChecked names the same frame for a sample taken after the
// last check: each object it names is read again and compared, as for the
// first sample of each batch.
func BenchmarkFrameChecked(b *testing.B) {
	benchFrame(b, FrameCompiled, compiledPC, false, false)
}

// BenchmarkInterpretedReused is BenchmarkFrameReused for an Ignition
// frame.
func BenchmarkInterpretedReused(b *testing.B) {
	benchFrame(b, FrameInterpreted, func(sy synth) uint64 {
		return uint64(uint32(54-1+sy.bcCall))<<32 | uint64(uint32(sy.bytecodeF))
	}, true, true)
}

// compiledPC is a pc in the synthetic heap's optimized code, in the
// inlined function.
func compiledPC(sy synth) uint64 { return sy.instrs + uint64(sy.offInner) + 4 }

// benchFrame names one frame of sy's function, of kind with the word
// word(sy), again and again. With reused the frames are named for a sample
// taken before a first naming read the objects, which are then reused;
// otherwise for a sample of unknown time, after which they are checked.
func benchFrame(b *testing.B, kind FrameKind, word func(synth) uint64, returnAddr, reused bool) {
	sy := buildSynth()
	n := synthNamer(b, sy.img)
	w := word(sy)
	var captured time.Time
	if reused {
		captured = time.Now()
		if _, err := n.FrameCaptured(captured, 1, kind, sy.sfiF, w, returnAddr); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := n.FrameCaptured(captured, 1, kind, sy.sfiF, w, returnAddr); err != nil {
			b.Fatal(err)
		}
	}
}
