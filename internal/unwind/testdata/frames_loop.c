// Runs the frames.c fixture (compiled with -Dmain=frames_main) once, then
// stays alive without burning CPU, so a test can find the binary's mappings.
#include <unistd.h>

// The build renames main with -Dmain=frames_main, for frames.c; not here.
#undef main

int frames_main(int argc, char **argv);

int main(int argc, char **argv)
{
	frames_main(argc, argv);
	for (;;)
		pause();
}
