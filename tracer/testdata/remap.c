// remap maps the page of its own executable that holds spin a second time,
// executable, as V8 maps its builtins again next to its code space, prints
// the copy's address, and once a line comes on stdin runs spin from the
// copy until it is killed. spin calls nothing, so its code runs anywhere.
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

__attribute__((noinline)) static void spin(volatile unsigned long *n)
{
	for (;;)
		(*n)++;
}

// file_offset is the offset in the executable of the page at addr.
static int file_offset(uintptr_t addr, uint64_t *off)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return -1;
	char line[512];
	int found = -1;
	while (fgets(line, sizeof line, f)) {
		uintptr_t start, end;
		uint64_t offset;
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %" SCNx64, &start, &end, &offset) == 3 &&
		    addr >= start && addr < end) {
			*off = offset + (addr - start);
			found = 0;
			break;
		}
	}
	fclose(f);
	return found;
}

int main(void)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t at = (uintptr_t)spin & ~(page - 1);
	uint64_t off;
	int fd = open("/proc/self/exe", O_RDONLY);
	if (fd < 0 || file_offset(at, &off) != 0) {
		perror("remap");
		return 1;
	}
	// Two pages: spin may cross into the next.
	char *copy = mmap(NULL, 2 * page, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, (off_t)off);
	if (copy == MAP_FAILED) {
		perror("remap: mmap");
		return 1;
	}
	printf("%" PRIxPTR "\nready\n", (uintptr_t)copy);
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof line, stdin))
		return 1;
	void (*run)(volatile unsigned long *) =
	        (void (*)(volatile unsigned long *))(copy + ((uintptr_t)spin - at));
	volatile unsigned long n = 0;
	run(&n);
	return 0;
}
