// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Task events: exec and exit of processes, reported to user space, and what
// the kernel side forgets about a process when it happens.
#pragma once

#include "record.h"

// task_event tells user space that task's process exec'd or exited.
static __always_inline void task_event(__u32 type, struct task_struct *task)
{
	struct task_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count(COUNTER_TASK_EVENTS_LOST);
		return;
	}
	r->type = type;
	r->pid = BPF_CORE_READ(task, tgid);
	r->ktime = bpf_ktime_get_ns();
	BPF_CORE_READ_STR_INTO(&r->comm, task, comm);
	// An exec wakes the reader at once: user space reads the new image
	// while it runs, however short its life, and however seldom the
	// reader polls.
	bpf_ringbuf_submit(r, type == RECORD_EXEC ? BPF_RB_FORCE_WAKEUP : wakeup_flags());
	count(COUNTER_TASK_EVENTS_SENT);
}

// forget_task drops what was decided for the process: a new image or a
// reused PID is prepared and filtered anew.
static __always_inline void forget_task(struct task_struct *task)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	forget_known(tgid);
	bpf_map_delete_elem(&pid_filter, &tgid);
	bpf_map_delete_elem(&python_procs, &tgid);
	bpf_map_delete_elem(&jvm_procs, &tgid);
	bpf_map_delete_elem(&v8_procs, &tgid);
	bpf_map_delete_elem(&php_procs, &tgid);
	bpf_map_delete_elem(&perl_procs, &tgid);
	bpf_map_delete_elem(&ruby_procs, &tgid);
	// A new image asks for its tables at its first sample, even if the
	// forked copy it replaces asked a moment ago.
	bpf_map_delete_elem(&notified, &tgid);
}

// task_exec runs when task's process has exec'd a new image.
static __always_inline void task_exec(struct task_struct *task)
{
	forget_task(task);
	// Costs are per image: what the forked copy cost is not the new program's.
	__u32 pid = BPF_CORE_READ(task, tgid);
	if (count_costs)
		bpf_map_delete_elem(&pid_costs, &pid);
	if (filter_pending_ns) {
		// Not sampled until user space has filtered the new image, so an
		// excluded program costs nothing from its first instruction.
		__u32 tgid = BPF_CORE_READ(task, tgid);
		__u64 until = bpf_ktime_get_ns() + filter_pending_ns;
		bpf_map_update_elem(&pid_filter, &tgid, &until, BPF_ANY);
	}
	task_event(RECORD_EXEC, task);
}

// task_exit runs when a thread of task's process exits.
static __always_inline void task_exit(struct task_struct *task)
{
	// One record per process, not per thread: only the group leader counts.
	if (BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid))
		return;
	forget_task(task);
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (count_costs)
		bpf_map_delete_elem(&pid_costs, &tgid);
	task_event(RECORD_EXIT, task);
}
