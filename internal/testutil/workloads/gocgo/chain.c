// The C half of gocgo. Every function is a real call (no inlining, no
// sibling calls) and none keeps a frame pointer: only CFI unwinds them.
#include "chain.h"
#include "_cgo_export.h"

volatile uint64_t c_sink;

__attribute__((noinline)) void c_leaf(void)
{
	for (uint64_t i = 0; i < 20000000; i++)
		c_sink += i * i;
}

__attribute__((noinline)) void c_middle(int mode)
{
	goCallback(mode);
	c_sink++;
}

__attribute__((noinline)) void c_outer(int mode)
{
	c_middle(mode);
	c_sink++;
}
