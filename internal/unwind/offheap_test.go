package unwind

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// discardAfter gives back the whole pages after an address in a build's
// buffer, which then read as zeros, and keeps everything before it; an
// address outside the buffers changes nothing.
func TestDiscardAfter(t *testing.T) {
	var r releases
	defer r.run()
	const n = 4 << 20 / 8 // 4 MiB of words
	words := reserve[uint64](&r, n, 0)[:n]
	if len(r) != 1 {
		t.Fatal("the buffer is not in an anonymous mapping")
	}
	for i := range words {
		words[i] = uint64(i) + 1
	}
	page := unix.Getpagesize() / 8
	cut := 3*page + 5 // mid-page: that page is kept whole
	r.discardAfter(uintptr(unsafe.Pointer(&words[0])) + uintptr(cut)*8)
	for i, w := range words {
		kept := i < 4*page
		if kept && w != uint64(i)+1 {
			t.Fatalf("word %d = %d after discarding from word %d, want %d", i, w, cut, i+1)
		}
		if !kept && w != 0 {
			t.Fatalf("word %d = %d after discarding from word %d, want 0 (page given back)", i, w, cut)
		}
	}

	heap := make([]uint64, n)
	for i := range heap {
		heap[i] = 7
	}
	r.discardAfter(uintptr(unsafe.Pointer(&heap[0])))
	for i, w := range heap {
		if w != 7 {
			t.Fatalf("heap word %d = %d: discardAfter touched memory outside its buffers", i, w)
		}
	}
}
