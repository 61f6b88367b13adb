// offcpusleep blocks in a known call chain: main -> a -> b -> nanosleep, for
// 200 ms at a time, after burning a little CPU in spin (so it has on-CPU
// samples too). With a path argument it appends one line per sleep there:
// the CLOCK_REALTIME nanoseconds at which the sleep ended and how long it
// took by CLOCK_MONOTONIC, the workload's own account of its off-CPU time.
#include <stdint.h>
#include <stdio.h>
#include <time.h>

volatile uint64_t sink;

static uint64_t nanos(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void spin(void)
{
	for (uint64_t i = 0; i < 5000000; i++)
		sink += i * i;
}

__attribute__((noinline)) void b(FILE *log)
{
	struct timespec req = {.tv_sec = 0, .tv_nsec = 200000000};
	uint64_t start = nanos(CLOCK_MONOTONIC);
	nanosleep(&req, NULL);
	uint64_t slept = nanos(CLOCK_MONOTONIC) - start;
	if (log) {
		fprintf(log, "%llu %llu\n", (unsigned long long)nanos(CLOCK_REALTIME), (unsigned long long)slept);
		fflush(log);
	}
	sink++;
}

__attribute__((noinline)) void a(FILE *log)
{
	b(log);
	sink++;
}

int main(int argc, char **argv)
{
	FILE *log = NULL;
	if (argc > 1 && !(log = fopen(argv[1], "a"))) {
		perror(argv[1]);
		return 1;
	}
	for (;;) {
		spin();
		a(log);
	}
}
