// pipewait blocks reading a pipe: main -> reader -> read. A child process
// writes one byte every 100 ms, so each read blocks, then returns.
#include <stdlib.h>
#include <sys/prctl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void reader(int fd)
{
	char c;
	if (read(fd, &c, 1) != 1)
		exit(1);
	sink += c;
}

int main(void)
{
	int fds[2];
	if (pipe(fds) != 0)
		return 1;
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		// The writer dies with the reader.
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(fds[0]);
		struct timespec gap = {.tv_sec = 0, .tv_nsec = 100000000};
		for (;;) {
			nanosleep(&gap, NULL);
			if (write(fds[1], "x", 1) != 1)
				return 0;
		}
	}
	close(fds[1]);
	for (;;)
		reader(fds[0]);
}
