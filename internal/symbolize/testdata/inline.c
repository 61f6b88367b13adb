// A C workload for the inline-chain tests: static inline helpers that GCC
// inlines at -O2, two levels deep, called from several places.
#include <stdio.h>
#include <stdlib.h>

static inline long mix(long x) {
	return (x * 2654435761L) ^ (x >> 7);
}

static inline long step(long s, long i) {
	long m = mix(s + i);
	if (m & 1) {
		m = mix(m);
	}
	return s + m;
}

__attribute__((noinline)) long walk(long n) {
	long s = 0;
	for (long i = 0; i < n; i++) {
		s = step(s, i);
	}
	return s;
}

__attribute__((noinline)) long twice(long n) {
	return step(walk(n), n) + step(n, 3);
}

int main(int argc, char **argv) {
	long n = argc > 1 ? atol(argv[1]) : 1000;
	printf("%ld %ld\n", walk(n), twice(n));
	return 0;
}
