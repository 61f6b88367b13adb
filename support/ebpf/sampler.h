// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The on-CPU sampler: what runs when a CPU's perf event fires. It filters,
// records the kernel stack and hands the user stack to the native unwinder
// (native.h) by tail call.
#pragma once

#include "native.h"

// uapi_regs is struct pt_regs as x86-64's UAPI lays it out
// (asm/ptrace.h), which is what a perf event program's context holds. It is
// declared without CO-RE (after vmlinux.h's preserve_access_index pragma
// ends), so reads are plain context loads at fixed offsets.
struct uapi_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

// user_regs finds the user-mode registers of the interrupted task: the
// perf event's own when it interrupted user mode, else those saved on
// kernel entry.
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, struct ustack_state *st)
{
	// The context's registers have the UAPI layout, the same on every
	// kernel; vmlinux.h's kernel pt_regs renamed cs (csx since 6.9), and a
	// CO-RE relocation on it fails to load on older kernels.
	struct uapi_regs *regs = (struct uapi_regs *)&ctx->regs;
	if ((regs->cs & 3) == 3) {
		st->pc = regs->ip;
		st->sp = regs->sp;
		st->fp = regs->bp;
		return 0;
	}
	return saved_user_regs(st);
}

// sample_cpu_run is the body of the perf-event program sample_cpu.
static __always_inline int sample_cpu_run(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 zero = 0;

	count(COUNTER_SAMPLES);
	if (tgid == 0 && !include_idle) {
		count(COUNTER_IDLE_SKIPPED);
		return 0;
	}
	if (tgid != 0 && !include_kernel_threads && (current_flags() & PF_KTHREAD)) {
		count(COUNTER_KTHREAD_SKIPPED);
		return 0;
	}
	if (filtering()) {
		__u64 *until = bpf_map_lookup_elem(&pid_filter, &tgid);
		if (until && bpf_ktime_get_ns() < *until) {
			count(COUNTER_FILTERED);
			add_cost(tgid, 0, 1, 0);
			return 0;
		}
	}

	struct sample_record *s = bpf_map_lookup_elem(&scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!s || !st)
		return 0;

	bool in_kernel = (((struct uapi_regs *)&ctx->regs)->cs & 3) != 3;
	begin_sample(ctx, s, RECORD_SAMPLE, pid_tgid, bpf_ktime_get_ns(), in_kernel);
	if (tgid == 0 || user_regs(ctx, st) != 0) {
		send_sample(s, 0);
		return 0;
	}
	begin_unwind(st, tgid);
	bpf_tail_call(ctx, &unwinders, 0);
	// Only reached when the tail call failed.
	count(COUNTER_UNWIND_TAIL_CALL_ERR);
	s->flags |= SAMPLE_USER_STACK_ERR;
	send_sample(s, 0);
	return 0;
}
