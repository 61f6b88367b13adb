// layout: main -> a -> b -> c, where c burns CPU. The tests link it with
// every linker and segment layout; it first prints the run-time address of
// each function ("a 0x..."), then runs the chain forever, or with the
// argument "wait" sleeps instead.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

int main(int argc, char **argv)
{
	printf("main %p\na %p\nb %p\nc %p\n", (void *)main, (void *)a, (void *)b, (void *)c);
	fflush(stdout);
	if (argc > 1 && strcmp(argv[1], "wait") == 0)
		for (;;)
			pause();
	for (;;)
		a();
}
