// exitmm maps and touches the MiB of anonymous memory its argument asks
// for, in small pages, says "ready" on stdout, and spins in main -> a -> b
// until it is killed. Its exit then spends a while unmapping that memory
// (exit_mmap), after the task has let go of its address space.
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((noinline)) static void b(volatile unsigned long *n)
{
	for (;;)
		(*n)++;
}

__attribute__((noinline)) static void a(volatile unsigned long *n)
{
	b(n);
	(*n)--;
}

int main(int argc, char **argv)
{
	size_t bytes = (size_t)(argc > 1 ? atol(argv[1]) : 512) << 20;
	char *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	// Small pages: many of them to unmap, not a few huge ones.
	madvise(mem, bytes, MADV_NOHUGEPAGE);
	for (size_t off = 0; off < bytes; off += 4096)
		mem[off] = 1;
	if (write(1, "ready\n", 6) != 6)
		return 1;
	volatile unsigned long n = 0;
	a(&n);
	return (int)n;
}
