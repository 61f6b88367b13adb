// A library whose constructor burns CPU: ld.so runs it from _dl_init,
// which its entry code (_dl_start_user) calls before the program's own
// entry, so every sample's stack ends in ld.so's untyped entry labels.
#include <stdlib.h>

volatile unsigned long sink;

__attribute__((noinline)) static void ctor_spin(void) {
	const char *s = getenv("CTOR_SECONDS");
	unsigned long n = (s ? strtoul(s, 0, 10) : 3) * 400000000UL;
	for (unsigned long i = 0; i < n; i++)
		sink += i;
}

__attribute__((constructor)) static void ctor(void) { ctor_spin(); }

int ldso_ctor_lib(void) { return (int)sink; }
