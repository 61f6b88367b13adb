/* burst: burns about 400 ms of CPU in named functions, then exits. */
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) void sonde_burst_leaf(void) {
	clock_t end = clock() + CLOCKS_PER_SEC * 2 / 5;
	while (clock() < end)
		for (int i = 0; i < 10000; i++)
			sink += i;
}

__attribute__((noinline)) void sonde_burst_mid(void) {
	sonde_burst_leaf();
	sink++;
}

int main(void) {
	sonde_burst_mid();
	return 0;
}
