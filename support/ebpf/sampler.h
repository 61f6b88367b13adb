// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The on-CPU sampler: what runs when a CPU's perf event fires. It filters,
// records the kernel stack and hands the user stack to the native unwinder
// (native.h) by tail call.
#pragma once

#include "native.h"

// user_regs finds the user-mode registers of the interrupted task: the
// perf event's own when it interrupted user mode, else those saved on
// kernel entry.
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, struct ustack_state *st)
{
	// The context's registers have the UAPI layout (arch.h), the same on
	// every kernel; vmlinux.h's kernel pt_regs renamed cs (csx since 6.9),
	// and a CO-RE relocation on it fails to load on older kernels.
	struct uapi_regs *regs = (struct uapi_regs *)&ctx->regs;
	if (ARCH_USER_MODE(regs)) {
		st->pc = ARCH_PC(regs);
		st->sp = ARCH_SP(regs);
		st->fp = ARCH_FP(regs);
		st->lr = ARCH_LR(regs);
		st->lr_valid = ARCH_HAS_LR;
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

	bool in_kernel = !ARCH_USER_MODE((struct uapi_regs *)&ctx->regs);
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
