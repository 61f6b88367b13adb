// dlswap alternates between two libraries (argv[1], argv[2]) loaded into the
// same process: each phase (argv[3] ms) dlopens one, burns CPU in it
// (main -> run -> <lib>_outer -> <lib>_inner) and dlcloses it, so the next
// library is usually mapped where the last one was.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) static void run(void (*outer)(void), double ms)
{
	double end = now_ms() + ms;
	while (now_ms() < end)
		outer();
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	const char *outers[2] = {"a_outer", "b_outer"};
	double ms = atof(argv[3]);
	for (int i = 0;; i ^= 1) {
		void *h = dlopen(argv[1 + i], RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			fprintf(stderr, "%s\n", dlerror());
			return 1;
		}
		void (*outer)(void) = (void (*)(void))dlsym(h, outers[i]);
		if (!outer)
			return 1;
		run(outer, ms);
		if (dlclose(h) != 0)
			return 1;
	}
}
