// cchain burns CPU in a known call chain: main -> a -> b -> c.
// Built with frame pointers and without inlining so every frame is real.
#include <stdint.h>

volatile uint64_t sink;

__attribute__((noinline)) void c(void)
{
	for (uint64_t i = 0; i < 100000000; i++)
		sink += i * i;
}

__attribute__((noinline)) void b(void)
{
	c();
	sink++;
}

__attribute__((noinline)) void a(void)
{
	b();
	sink++;
}

int main(void)
{
	for (;;)
		a();
}
