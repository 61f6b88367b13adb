// dlopen loads a library after start (argv[1]) and burns CPU in it:
// main -> lib_outer -> lib_inner, both in the library.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void (*outer)(void) = (void (*)(void))dlsym(h, "lib_outer");
	for (;;)
		outer();
}
