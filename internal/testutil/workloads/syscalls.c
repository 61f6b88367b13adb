// syscalls spends its time in the kernel: main -> spin_syscalls -> getppid.
// The syscall instruction is issued inline, not through libc's syscall(),
// so the user leaf is spin_syscalls itself whatever libc was built with.
#include <sys/syscall.h>

__attribute__((noinline)) void spin_syscalls(void)
{
	for (int i = 0; i < 1000000; i++) {
		long ret;
		__asm__ volatile("syscall" : "=a"(ret) : "a"(SYS_getppid) : "rcx", "r11", "memory");
	}
}

int main(void)
{
	for (;;)
		spin_syscalls();
}
