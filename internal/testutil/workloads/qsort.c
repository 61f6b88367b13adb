// qsort spends its time in a comparison callback that glibc's qsort calls:
// main -> b -> qsort -> (libc internals) -> c.
#include <stdlib.h>

volatile unsigned long sink;

__attribute__((noinline)) int c(const void *x, const void *y)
{
	for (int i = 0; i < 2000; i++)
		sink += i;
	return *(const int *)x - *(const int *)y;
}

__attribute__((noinline)) void b(int *v, int n)
{
	for (int i = 0; i < n; i++)
		v[i] = (i * 7919) % n;
	qsort(v, n, sizeof(int), c);
}

int main(void)
{
	static int v[512];
	for (;;)
		b(v, 512);
}
