// vdsoloop spends its time in the vDSO's clock_gettime: main -> loop ->
// tick -> clock_gettime (libc) -> the vDSO.
#include <time.h>

static volatile long sink;

__attribute__((noinline)) void tick(void)
{
	struct timespec ts;
	for (int i = 0; i < 1000; i++) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		sink += ts.tv_nsec;
	}
}

__attribute__((noinline)) void loop(void)
{
	for (;;)
		tick();
}

int main(void)
{
	loop();
}
