package unwind

import (
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// A table's build holds its rows two or three times over for a moment:
// 16 bytes a row, a million rows in a big Go binary or LLVM library. In the
// Go heap that is tens of megabytes of garbage at once, which also raises
// the collector's next goal, so the agent's resident memory grows by twice
// the build's peak and stays there until the scavenger returns it. The
// build's buffers therefore live outside the heap, unmapped as soon as the
// table is in the kernel.
//
// A big buffer (spillBytes and more expected), where the temporary
// directory is on disk, is a shared mapping of an unlinked file there
// (elfx.SpillFile): what the build wrote is page cache, and the build lets
// go of the pages it has passed (drop) every dropRows rows, so the process
// holds a few of them at a time, not the whole table. That costs each pass
// over the rows a fault per page (a big Go binary's build takes 10% more
// CPU), which a small table's few pages are not worth. Other buffers are
// anonymous memory, the process's own, and drop does nothing to them.
//
// A buffer is reserved at an upper bound of what it can hold (nothing is
// committed: a page is only backed once written), so appending never moves
// it. Should a bound ever be wrong, append moves the slice into the heap,
// which is correct, only dearer.

// dropRows is how many rows a build writes or reads between two drops:
// 64 KiB of them (with dropEvery, measured on the node-like host).
const dropRows = 1 << 12

// spillBytes is the least a buffer is expected to hold for it to be a
// file's mapping: 256k rows.
const spillBytes = 4 << 20

// reserve returns an empty slice of T with room for n elements, backed by
// a mapping outside the Go heap whose unmapping is added to r; hint is how
// many it is expected to hold, which says whether the mapping is a file's.
// T must hold no pointers. Once r runs, neither the slice nor any slice of
// its array may be used. Where no mapping can be made (a host that refuses
// to overcommit), the slice is a heap one with room for hint elements,
// which grows as any slice does.
func reserve[T any](r *releases, n, hint int) []T {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if n <= 0 || size == 0 || n > (1<<40)/size {
		return make([]T, 0, min(max(hint, 0), max(n, 0)))
	}
	b, ok := mapBuffer(n*size, min(max(hint, 0), n)*size >= spillBytes)
	if !ok {
		return make([]T, 0, min(max(hint, 0), n))
	}
	*r = append(*r, b)
	mappedBuffers.Add(1)
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b.mem))), n)[:0]
}

// buffer is one mapping of a build.
type buffer struct {
	mem  []byte
	file *os.File // the unlinked file mapped; nil: anonymous memory
}

// mapBuffer maps size bytes: with spill, of an unlinked file where the
// temporary directory can hold one on disk; else anonymous memory.
func mapBuffer(size int, spill bool) (buffer, bool) {
	if f := spillFile(spill); f != nil {
		if err := f.Truncate(int64(size)); err == nil {
			mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err == nil {
				return buffer{mem: mem, file: f}, true
			}
		}
		_ = f.Close()
	}
	mem, _, ok := elfx.Reserve(size) // run unmaps it
	return buffer{mem: mem}, ok
}

// spillFile returns a new unlinked file to map, or nil: without spill, or
// where the temporary directory cannot hold one on disk.
func spillFile(spill bool) *os.File {
	if !spill {
		return nil
	}
	return elfx.SpillFile()
}

// releases are a build's buffers outside the heap.
type releases []buffer

// mappedBuffers counts the build buffers mapped now, in every build.
var mappedBuffers atomic.Int64

// run unmaps every buffer, newest first; it may run again (to no effect),
// and r may be nil.
func (r *releases) run() {
	if r == nil {
		return
	}
	for i := len(*r) - 1; i >= 0; i-- {
		b := (*r)[i]
		_ = unix.Munmap(b.mem)
		if b.file != nil {
			_ = b.file.Close()
		}
		mappedBuffers.Add(-1)
	}
	*r = nil
}

// drop lets go of the pages of r's file-backed buffers: their contents stay
// in the file, and a later read maps them again from the page cache. r may
// be nil.
func (r *releases) drop() {
	if r == nil {
		return
	}
	for _, b := range *r {
		if b.file != nil {
			_ = unix.Madvise(b.mem, unix.MADV_DONTNEED)
		}
	}
}

// passed tells r that a step has passed row i (counting from 0): every
// dropRows rows it drops r's pages. r may be nil.
func (r *releases) passed(i int) {
	if i%dropRows == dropRows-1 {
		r.drop()
	}
}

// discardAfter gives back the pages of the buffer holding address at that
// lie wholly after it: what a build wrote there and no longer needs
// (kernelRows leaves its 8-byte rows in the first half of the 16-byte ones
// it read). Those pages read as zeros if touched again. It does nothing
// when at is in none of r's buffers (rows that moved into the heap).
func (r releases) discardAfter(at uintptr) {
	page := uintptr(unix.Getpagesize())
	for _, b := range r {
		start := uintptr(unsafe.Pointer(unsafe.SliceData(b.mem)))
		if at < start || at >= start+uintptr(len(b.mem)) {
			continue
		}
		from := (at - start + page - 1) &^ (page - 1)
		if from >= uintptr(len(b.mem)) {
			return
		}
		advice := unix.MADV_DONTNEED
		if b.file != nil {
			advice = unix.MADV_REMOVE // frees the file's pages too
		}
		_ = unix.Madvise(b.mem[from:], advice)
		return
	}
}
