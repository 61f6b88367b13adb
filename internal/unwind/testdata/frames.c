// Fixture for the CFI oracle test: functions whose frames compilers describe
// in different ways (leaf, alloca with a frame pointer, large frames,
// variadic, many callee-saved registers, tail calls, a signal handler).
#include <alloca.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

volatile int sink;

__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }

__attribute__((noinline)) int with_alloca(int n) {
	char *p = alloca(n + 16);
	memset(p, n, n + 16);
	sink = p[n / 2];
	return leaf(p[0]);
}

__attribute__((noinline)) int big_frame(int n) {
	char buf[8192];
	memset(buf, n, sizeof buf);
	sink = buf[n & 1023];
	return with_alloca(n & 63) + buf[7];
}

__attribute__((noinline)) int sum(int n, ...) {
	va_list ap;
	va_start(ap, n);
	int s = 0;
	for (int i = 0; i < n; i++) s += va_arg(ap, int);
	va_end(ap);
	return s;
}

__attribute__((noinline)) long many_regs(long a, long b, long c, long d) {
	long x = a * b, y = c * d, z = a + d, w = b - c, v = a ^ c, u = b | d;
	for (int i = 0; i < (int)(a & 7); i++) {
		x += leaf((int)y);
		y += leaf((int)z);
		z += leaf((int)w);
		w += leaf((int)v);
		v += leaf((int)u);
		u += leaf((int)x);
	}
	return x + y + z + w + v + u;
}

__attribute__((noinline)) int recurse(int n) {
	if (n <= 0) return leaf(n);
	return recurse(n - 1) + big_frame(n);
}

static void on_signal(int sig) { sink = sig; }

int main(int argc, char **argv) {
	(void)argv;
	signal(SIGUSR1, on_signal);
	raise(SIGUSR1);
	printf("%d %d %ld\n", recurse(argc + 2), sum(3, 1, 2, argc), many_regs(argc, 2, 3, 4));
	return 0;
}
