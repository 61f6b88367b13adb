// gocall calls C from Go on its hot path, one way only:
//
//	main.main -> main.goOuter -> (cgo) c_outer -> c_leaf
//
// runtime.cgocall runs the C half on the thread's system stack
// (runtime.asmcgocall), so a sample in c_leaf reaches main.main only by
// crossing back to the goroutine's stack. testutil builds the C half
// without frame pointers, inlining or sibling calls (CGO_CFLAGS): only CFI
// unwinds it.
package main

/*
#include <stdint.h>

volatile uint64_t c_sink;

__attribute__((noinline)) void c_leaf(void)
{
	for (uint64_t i = 0; i < 20000000; i++)
		c_sink += i * i;
}

__attribute__((noinline)) void c_outer(void)
{
	c_leaf();
	c_sink++;
}
*/
import "C"

//go:noinline
func goOuter() { C.c_outer() }

func main() {
	for {
		goOuter()
	}
}
