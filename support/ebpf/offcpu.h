// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Off-CPU tracing: at every context switch, the end of a traced wait of the
// thread coming back, and the start (with its stacks) of the wait of the
// thread leaving, sampled by offcpu_threshold.
#pragma once

#include "native.h"

#define TASK_RUNNING 0
#define TASK_DEAD    0x80

// task_struct before 5.14 named its state field `state`.
struct task_struct___pre514 {
	long state;
} __attribute__((preserve_access_index));

// The task pointers of a BTF tracepoint are trusted: their fields are
// read by plain (CO-RE relocated) loads, without a helper call.
static __always_inline long task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return ((struct task_struct___pre514 *)t)->state;
}

// offcpu_end closes the wait of next, if it was traced: the thread is back
// on a CPU now.
static __always_inline void offcpu_end(struct task_struct *next)
{
	__u32 tid = next->pid;
	if (tid == 0)
		return;
	__u64 *startp = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (!startp)
		return;
	__u64 now = bpf_ktime_get_ns();
	__u64 start = *startp;
	bpf_map_delete_elem(&offcpu_starts, &tid);
	__u64 duration = now > start ? now - start : 0;
	__u32 flags = 0;
	if (duration < offcpu_min_ns) {
		// Still sent, as 32 bytes, so user space frees the start record
		// now instead of keeping it until it expires.
		flags |= OFFCPU_END_SHORT;
		count(COUNTER_OFFCPU_SHORT);
	}
	struct offcpu_end_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count(COUNTER_OFFCPU_ENDS_LOST);
		return;
	}
	r->type = RECORD_OFFCPU_END;
	r->pid = next->tgid;
	r->tid = tid;
	r->flags = flags;
	r->start = start;
	r->duration = duration;
	bpf_ringbuf_submit(r, wakeup_flags());
	count(COUNTER_OFFCPU_ENDS_SENT);
}

// off_cpu_run is the body of the program off_cpu, which runs at every
// context switch, on the CPU being switched, with current == prev. It closes the wait of next if it was traced, then
// decides whether prev's wait is traced: if so it records prev's stacks as
// an off-CPU start record (the user stack by the unwinder's off-CPU build,
// from the registers prev saved when it entered the kernel).
//
// Only blocking is traced: a thread preempted while runnable (preempt, or
// still TASK_RUNNING as after sched_yield) waits for a CPU, not for an
// event; that time is CPU contention, which the on-CPU profile already
// shows, and tracing it would fill the off-CPU profile with every busy
// thread's time slices. Exiting threads (TASK_DEAD) never come back.
static __always_inline int off_cpu_run(void *ctx, bool preempt, struct task_struct *prev,
                                       struct task_struct *next)
{
	offcpu_end(next);

	// Cheapest and most selective first: this runs at every switch.
	if (preempt || (__u64)bpf_get_prandom_u32() >= offcpu_threshold)
		return 0;
	__u32 tgid = prev->tgid;
	if (tgid == 0 || (prev->flags & PF_KTHREAD))
		return 0;
	long state = task_state(prev);
	if (state == TASK_RUNNING || (state & TASK_DEAD))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	if (filtering()) {
		__u64 *until = bpf_map_lookup_elem(&pid_filter, &tgid);
		if (until && now < *until) {
			count(COUNTER_OFFCPU_FILTERED);
			return 0;
		}
	}

	__u32 zero = 0;
	struct sample_record *s = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(&offcpu_unwind_scratch, &zero);
	if (!s || !st)
		return 0;
	// prev is current here, so the current-task helpers read prev.
	begin_sample(ctx, s, RECORD_OFFCPU_START, bpf_get_current_pid_tgid(), now, true);
	if (saved_user_regs(st) != 0) {
		send_offcpu_start(s);
		return 0;
	}
	begin_unwind(st, tgid);
	bpf_tail_call(ctx, &offcpu_unwinders, 0);
	// Only reached when the tail call failed.
	count(COUNTER_UNWIND_TAIL_CALL_ERR);
	s->flags |= SAMPLE_USER_STACK_ERR;
	send_offcpu_start(s);
	return 0;
}
