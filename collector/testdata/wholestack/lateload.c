// lateload waits a second, then loads the library argv[1] and burns CPU in
// it for argv[2] ms: main -> lib_outer -> lib_middle -> lib_inner, all in
// the library.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	// The library comes a second into the process's life, well after the
	// profiler prepared the process itself.
	struct timespec second = {1, 0};
	nanosleep(&second, NULL);
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	unsigned long (*outer)(unsigned long) = (unsigned long (*)(unsigned long))dlsym(h, "lib_outer");
	long end = now_ms() + atol(argv[2]);
	unsigned long x = 1;
	while (now_ms() < end)
		x = outer(x);
	return (int)(x & 0);
}
