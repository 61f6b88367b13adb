// shortburn burns CPU for argv[1] ms (300 by default) through
// main -> work -> burn, then exits: one of a loop of short processes.
#include <stdlib.h>
#include <time.h>

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

volatile unsigned long sink;

unsigned long burn(unsigned long x)
{
	for (int i = 0; i < 100000; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	return x;
}

void work(long ms)
{
	long end = now_ms() + ms;
	unsigned long x = 1;
	while (now_ms() < end)
		x = burn(x);
	sink = x;
}

int main(int argc, char **argv)
{
	work(argc > 1 ? atol(argv[1]) : 300);
	return 0;
}
