// threads burns CPU in a second thread named after argv[1] while the main
// thread waits for it: thread start -> spin -> burn. Further arguments are
// ignored; tests pass them to see them in the command line.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <sys/prctl.h>

volatile uint64_t sink;

__attribute__((noinline)) void burn(void)
{
	for (uint64_t i = 0; i < 100000000; i++)
		sink += i * i;
}

__attribute__((noinline)) void *spin(void *name)
{
	prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0);
	for (;;)
		burn();
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th;

	if (argc < 2)
		return 2;
	if (pthread_create(&th, NULL, spin, argv[1]) != 0)
		return 1;
	pthread_join(th, NULL);
	return 0;
}
