// pingpong bounces one byte between two processes over two pipes for
// argv[1] seconds (default 10), then prints the round trips per second.
// Every round trip is two blocking reads: two context switches per side.
// With argv[2], both processes run on that CPU only: the rate then does not
// depend on whether the scheduler put them on one CPU or two.
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 10;
	if (argc > 2) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(atoi(argv[2]), &set);
		if (sched_setaffinity(0, sizeof(set), &set) != 0) {
			perror("sched_setaffinity");
			return 1;
		}
	}
	int ping[2], pong[2];
	if (pipe(ping) != 0 || pipe(pong) != 0)
		return 1;
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	char c = 'x';
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (;;) {
			if (read(ping[0], &c, 1) != 1 || write(pong[1], &c, 1) != 1)
				return 0;
		}
	}
	unsigned long trips = 0;
	double start = now(), end = start + seconds;
	for (;;) {
		if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1)
			return 1;
		trips++;
		if ((trips & 255) == 0 && now() >= end)
			break;
	}
	double took = now() - start;
	kill(pid, SIGKILL);
	printf("round-trips-per-second %.1f\n", trips / took);
	return 0;
}
