// mixed burns CPU in three shapes that need more than frame pointers to
// unwind, in turn: qsort's comparison callback called from inside glibc
// (main -> sort_phase -> qsort -> ... -> compare), the bottom of a 150-deep
// recursion (main -> recurse_phase -> rec x 150 -> burn), and a SIGPROF
// handler that interrupts either, every 10 ms of CPU.
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

volatile unsigned long sink;

__attribute__((noinline)) void on_prof(int sig)
{
	for (int i = 0; i < 200000; i++)
		sink += i ^ sig;
}

__attribute__((noinline)) int compare(const void *x, const void *y)
{
	for (int i = 0; i < 300; i++)
		sink += i;
	return *(const int *)x - *(const int *)y;
}

__attribute__((noinline)) void sort_phase(int *v, int n)
{
	for (int i = 0; i < n; i++)
		v[i] = (i * 7919) % n;
	qsort(v, n, sizeof(int), compare);
}

__attribute__((noinline)) void burn(void)
{
	for (int i = 0; i < 20000000; i++)
		sink += i;
}

__attribute__((noinline)) void rec(int depth)
{
	if (depth == 0)
		burn();
	else
		rec(depth - 1);
	sink++; // keeps the call from being a tail call
}

__attribute__((noinline)) void recurse_phase(void)
{
	rec(149);
}

int main(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_prof;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGPROF, &sa, 0);
	struct itimerval it = {{0, 10000}, {0, 10000}};
	setitimer(ITIMER_PROF, &it, 0);
	static int v[4096];
	for (;;) {
		sort_phase(v, 4096);
		recurse_phase();
	}
}
