// sleeper is the workload of the real-/proc tests: it names a worker thread
// after argv[1], prints the addresses of main and of libc's getpid and the
// worker's thread id, then waits to be killed.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_barrier_t started;
static long worker_tid;

static void *worker(void *name) {
	prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
	worker_tid = syscall(SYS_gettid);
	pthread_barrier_wait(&started);
	for (;;)
		pause();
	return NULL;
}

int main(int argc, char **argv) {
	pthread_t th;
	pid_t (*volatile gp)(void) = getpid;

	if (argc < 2)
		return 2;
	pthread_barrier_init(&started, NULL, 2);
	if (pthread_create(&th, NULL, worker, argv[1]) != 0)
		return 1;
	pthread_barrier_wait(&started);
	printf("main=%p getpid=%p tid=%ld\n", (void *)main, (void *)gp, worker_tid);
	fflush(stdout);
	for (;;)
		pause();
}
