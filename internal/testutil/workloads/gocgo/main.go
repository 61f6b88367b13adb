// gocgo crosses cgo both ways on its hot path:
//
//	main.main -> main.goOuter -> (cgo) c_outer -> c_middle
//	  -> (export) main.goCallback -> main.goInner -> leaf
//
// where the leaf is the C function c_leaf (argument "c", the default),
// called through cgo again, or the Go function main.goLeaf (argument "go").
// Samples in the leaf thus carry C frames under Go frames under C frames
// under Go frames. testutil builds the C half at -O2 without frame pointers,
// inlining or sibling calls (CGO_CFLAGS): only CFI unwinds it.
package main

/*
#include "chain.h"
*/
import "C"

import (
	"os"
	"runtime"
)

var sink uint64

//go:noinline
func goLeaf() {
	var buf [64]uint64
	for i := range 20_000_000 {
		j := uint64(i) % uint64(len(buf))
		buf[j] += uint64(i) ^ buf[(j+7)%uint64(len(buf))]
	}
	sink += buf[sink%uint64(len(buf))]
}

//go:noinline
func goInner(mode C.int) {
	if mode == 0 {
		C.c_leaf()
		return
	}
	goLeaf()
}

//export goCallback
//go:noinline
func goCallback(mode C.int) { goInner(mode) }

//go:noinline
func goOuter(mode C.int) { C.c_outer(mode) }

// The tests count the samples of the main thread: the main goroutine stays
// on it, as it would not otherwise between two cgo calls.
func init() { runtime.LockOSThread() }

func main() {
	mode := C.int(0)
	if len(os.Args) > 1 && os.Args[1] == "go" {
		mode = 1
	}
	for {
		goOuter(mode)
	}
}
