// A C workload for the symbolize tests: main calls a, a calls b, b calls c.
// Built with -O0 -g (and variants) by the tests; names and lines are checked
// against addr2line.
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long c(long n) {
	long s = 0;
	for (long i = 0; i < n; i++) {
		s += i ^ (s >> 3);
	}
	return s;
}

__attribute__((noinline)) long b(long n) {
	long s = c(n);
	s += c(n / 2);
	return s;
}

__attribute__((noinline)) long a(long n) {
	long s = 0;
	for (int i = 0; i < 3; i++) {
		s += b(n + i);
	}
	return s;
}

int main(int argc, char **argv) {
	long n = argc > 1 ? atol(argv[1]) : 1000;
	printf("%ld\n", a(n));
	return 0;
}
