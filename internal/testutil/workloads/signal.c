// signal burns CPU in a signal handler that interrupts main -> a -> b: the
// stack of a sample in the handler crosses the signal frame back into the
// interrupted code. A profiling timer fires every millisecond of CPU time.
#include <signal.h>
#include <string.h>
#include <sys/time.h>

volatile unsigned long sink;

__attribute__((noinline)) void handler(int sig)
{
	for (int i = 0; i < 300000; i++)
		sink += i ^ sig;
}

__attribute__((noinline)) void b(void)
{
	for (int i = 0; i < 1000; i++)
		sink += i;
}

__attribute__((noinline)) void a(void)
{
	b();
	sink++;
}

int main(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGPROF, &sa, 0);
	struct itimerval it = {{0, 1000}, {0, 1000}};
	setitimer(ITIMER_PROF, &it, 0);
	for (;;)
		a();
}
