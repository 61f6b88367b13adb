// fpwild calls spin (fpwild_spin.c) with a fake frame record on its stack:
// the record's saved-%rbp link is 0 and its "return address" is the word
// given as argv[1], text (the bytes "/bin/li") or an address where nothing
// is mapped. A frame-pointer walk from spin reads that word as its caller.
#include <stdint.h>
#include <stdlib.h>

void spin(volatile uint64_t *record) __attribute__((noreturn));

int main(int argc, char **argv)
{
	volatile uint64_t record[2] = {0, 0x696c2f6e69622fULL};
	if (argc > 1)
		record[1] = strtoull(argv[1], NULL, 0);
	spin(record);
}
