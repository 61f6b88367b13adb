// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What the programs read of a CPU's registers, per architecture: the same
// sources build for x86-64 (__TARGET_ARCH_x86, bpf2go -target amd64) and
// aarch64 (__TARGET_ARCH_arm64, -target arm64). Everything architectural the
// unwinder touches goes through these few macros, so native.h and the
// sampler read as one program for both.
//
//   ARCH_USER_MODE(r)       the perf event's registers r interrupted user mode
//   ARCH_PC/SP/FP/LR(r)     the user PC, stack pointer, frame pointer (rbp,
//                           x29) and link register (x30; 0 on x86-64) of r
//   arch_task_regs(st, r)   reads those of the kernel's struct pt_regs r
//   arch_strip_ra(ra)       a return address with its authentication code
//                           (aarch64 PAC) taken off
//   SIG_*                   where a signal frame keeps the interrupted registers
#pragma once

#if defined(__TARGET_ARCH_arm64)

// struct user_pt_regs (asm/ptrace.h), what a perf event program's context
// holds, and also the start of the kernel's struct pt_regs on every kernel.
struct uapi_regs {
	unsigned long regs[31]; // x0..x30
	unsigned long sp, pc, pstate;
};

#define ARCH_USER_MODE(r) (((r)->pstate & 0xf) == 0 /* PSR_MODE_EL0t */)
#define ARCH_PC(r)        ((r)->pc)
#define ARCH_SP(r)        ((r)->sp)
#define ARCH_FP(r)        ((r)->regs[29])
#define ARCH_LR(r)        ((r)->regs[30])
#define ARCH_HAS_LR       1

// User addresses have 48 bits (the kernels Sonde supports map user space
// below 2^48 unless a program asks for 52-bit addresses, which no runtime
// here does); a return address signed with pointer authentication carries
// its code in the bits above (up to bit 54, and the tag byte with TBI).
#define ARCH_USER_VA_MASK ((1ULL << 48) - 1)

static __always_inline __u64 arch_strip_ra(__u64 ra)
{
	return ra & ARCH_USER_VA_MASK;
}

// The signal frame (struct rt_sigframe, arch/arm64/kernel/signal.c) sits at
// the stack pointer that __kernel_rt_sigreturn runs with: siginfo (128
// bytes), then the ucontext, whose mcontext (struct sigcontext:
// fault_address, regs[31], sp, pc) starts 176 bytes in.
#define SIG_MCONTEXT (128 + 176)
#define SIG_FP       (8 + 29 * 8)
#define SIG_LR       (8 + 30 * 8)
#define SIG_SP       (8 + 31 * 8)
#define SIG_PC       (8 + 32 * 8)

// The thread pointer CPython's walker would match; that walker is not
// enabled on aarch64 (user space never registers a process for it).
#define ARCH_THREAD_POINTER(task) ((void)(task), 0ULL)

#else // x86-64

// struct pt_regs as x86-64's UAPI lays it out (asm/ptrace.h), which is what
// a perf event program's context holds. It is declared without CO-RE
// (after vmlinux.h's preserve_access_index pragma ends), so reads are
// plain context loads at fixed offsets.
struct uapi_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

#define ARCH_USER_MODE(r) (((r)->cs & 3) == 3)
#define ARCH_PC(r)        ((r)->ip)
#define ARCH_SP(r)        ((r)->sp)
#define ARCH_FP(r)        ((r)->bp)
#define ARCH_LR(r)        0
#define ARCH_HAS_LR       0

static __always_inline __u64 arch_strip_ra(__u64 ra)
{
	return ra;
}

// Offsets in the signal frame __restore_rt returns through: the ucontext
// sits at the stack pointer; its mcontext starts 40 bytes in.
#define SIG_MCONTEXT      40
#define SIG_FP            80
#define SIG_SP            120
#define SIG_PC            128

#define ARCH_THREAD_POINTER(task) BPF_CORE_READ(task, thread.fsbase)

#endif
