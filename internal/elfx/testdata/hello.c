// A small C program whose build id, symbols and layout the elfx tests check
// against readelf and objdump.
#include <stdio.h>

__attribute__((noinline)) int work(int n) {
	int s = 0;
	for (int i = 0; i < n; i++)
		s += i * i;
	return s;
}

int main(int argc, char **argv) {
	(void)argv;
	printf("%d\n", work(argc * 1000));
	return 0;
}
