package unwind

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// A table's build holds its rows two or three times over for a moment:
// 16 bytes a row, a million rows in a big Go binary or LLVM library. In the
// Go heap that is tens of megabytes of garbage at once, which also raises
// the collector's next goal, so the agent's resident memory grows by twice
// the build's peak and stays there until the scavenger returns it. The
// build's buffers therefore live outside the heap, in anonymous mappings
// that are unmapped as soon as the table is in the kernel.
//
// A buffer is reserved at an upper bound of what it can hold (nothing is
// committed: a page is only backed once written), so appending never moves
// it. Should a bound ever be wrong, append moves the slice into the heap,
// which is correct, only dearer.

// reserve returns an empty slice of T with room for n elements, backed by
// an anonymous mapping outside the Go heap whose unmapping is added to r.
// T must hold no pointers. Once r runs, neither the slice nor any slice of
// its array may be used. Where the mapping cannot be made (a host that
// refuses to overcommit), the slice is a heap one with room for hint
// elements, which grows as any slice does.
func reserve[T any](r *releases, n, hint int) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if n <= 0 || size == 0 || n > (1<<40)/size {
		return make([]T, 0, min(max(hint, 0), max(n, 0)))
	}
	mem, err := unix.Mmap(-1, 0, n*size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return make([]T, 0, min(max(hint, 0), n))
	}
	*r = append(*r, mem)
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(mem))), n)[:0]
}

// releases are a build's buffers outside the heap.
type releases [][]byte

// run unmaps every buffer, newest first; it may run again (to no effect).
func (r *releases) run() {
	for i := len(*r) - 1; i >= 0; i-- {
		_ = unix.Munmap((*r)[i])
	}
	*r = nil
}

// discardAfter gives back to the kernel the pages of the buffer holding
// address at that lie wholly after it: what a build wrote there and no longer needs
// (kernelRows leaves its 8-byte rows in the first half of the 16-byte ones
// it read). Those pages read as zeros if touched again. It does nothing
// when at is in none of r's buffers (rows that moved into the heap).
func (r releases) discardAfter(at uintptr) {
	page := uintptr(unix.Getpagesize())
	for _, m := range r {
		start := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
		if at < start || at >= start+uintptr(len(m)) {
			continue
		}
		from := (at - start + page - 1) &^ (page - 1)
		if from < uintptr(len(m)) {
			_ = unix.Madvise(m[from:], unix.MADV_DONTNEED)
		}
		return
	}
}
