// forkchild forks argv[1] children one after another, without exec: each
// names itself "forkchild-w" and burns CPU for argv[2] ms through
// main -> child_work -> burn, then exits; the parent waits for it.
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

volatile unsigned long sink;

unsigned long burn(unsigned long x)
{
	for (int i = 0; i < 100000; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	return x;
}

void child_work(long ms)
{
	long end = now_ms() + ms;
	unsigned long x = 1;
	while (now_ms() < end)
		x = burn(x);
	sink = x;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	long ms = argc > 2 ? atol(argv[2]) : 1000;
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();
		if (pid < 0)
			return 1;
		if (pid == 0) {
			prctl(PR_SET_NAME, "forkchild-w");
			child_work(ms);
			_exit(0);
		}
		int status;
		if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
			return 1;
	}
	return 0;
}
