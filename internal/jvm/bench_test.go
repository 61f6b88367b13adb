package jvm

import "testing"

// BenchmarkFrameCached is the cost of naming a frame the cache holds: a
// compiled frame with one inlined method and an interpreted frame.
func BenchmarkFrameCached(b *testing.B) {
	n := synthNamer(b, synthImage(false), 17)
	codeStart := uint64(imgMethod + 0x100 + 48)
	for b.Loop() {
		if _, err := n.Frame(1, FrameCompiled, imgBlob, uint64(imgID)<<32|0x85, false); err != nil {
			b.Fatal(err)
		}
		if _, err := n.Frame(1, FrameInterpreted, imgMethod, codeStart+2, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFrameUncached names a compiled frame with an empty cache: every
// structure is read from memory and decoded.
func BenchmarkFrameUncached(b *testing.B) {
	img := synthImage(false)
	for b.Loop() {
		n := synthNamer(b, img, 17)
		if _, err := n.Frame(1, FrameCompiled, imgBlob, uint64(imgID)<<32|0x85, false); err != nil {
			b.Fatal(err)
		}
	}
}
