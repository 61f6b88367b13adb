// The leaf of fpwild, built into a library without unwind tables (its
// .eh_frame is empty), so the unwinder has only frame pointers there. It
// keeps no frame pointer of its own: it aims %rbp at the fake frame record
// it is given, as code that uses %rbp for data leaves it, and spins.
#include <stdint.h>

__attribute__((noreturn)) void spin(volatile uint64_t *record)
{
	__asm__ volatile("mov %0, %%rbp\n"
	                 "1: jmp 1b\n"
	                 :
	                 : "r"(record));
	__builtin_unreachable();
}
