// fixed runs a fixed amount of CPU-bound work and exits: the task whose
// slowdown under profiling the benchmark measures. argv[1] = iterations.
#include <stdint.h>
#include <stdlib.h>

volatile uint64_t sink;

__attribute__((noinline)) uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return x;
}

int main(int argc, char **argv)
{
	uint64_t n = argc > 1 ? strtoull(argv[1], 0, 10) : 100000000ULL;
	uint64_t acc = 0;
	for (uint64_t i = 0; i < n; i++)
		acc += mix(i);
	sink = acc;
	return 0;
}
