// mapfiles dlopens argv[1] (a library with lib_outer, such as dlopenlib.so)
// and maps every further argument PROT_READ|PROT_EXEC, MAP_PRIVATE, whole,
// without touching its pages: a file truncated later must not fault. It
// prints "ready" once everything is mapped, waits for a line on stdin, then
// burns CPU in the library (main -> lib_outer -> lib_inner) for good.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void (*outer)(void) = (void (*)(void))dlsym(h, "lib_outer");
	if (!outer)
		return 1;
	for (int i = 2; i < argc; i++) {
		int fd = open(argv[i], O_RDONLY);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) != 0) {
			perror(argv[i]);
			return 1;
		}
		if (st.st_size > 0 &&
		    mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) {
			perror(argv[i]);
			return 1;
		}
		close(fd);
	}
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof line, stdin))
		return 1;
	for (;;)
		outer();
}
