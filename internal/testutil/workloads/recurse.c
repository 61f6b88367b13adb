// recurse burns CPU at the bottom of a 200-deep recursion:
// main -> rec x 200 -> burn; or as deep as its argument says.
#include <stdlib.h>

volatile unsigned long sink;

__attribute__((noinline)) void burn(void)
{
	for (int i = 0; i < 10000000; i++)
		sink += i;
}

__attribute__((noinline)) void rec(int depth)
{
	if (depth == 0)
		burn();
	else
		rec(depth - 1);
	sink++; // keeps the call from being a tail call
}

int main(int argc, char **argv)
{
	int depth = argc > 1 ? atoi(argv[1]) : 200;
	for (;;)
		rec(depth - 1);
}
