// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

// Sonde's sampler: a perf-event program run on every CPU at the configured
// frequency, and BTF tracepoints that report exec and exit. Everything leaves
// through one BPF ring buffer; everything dropped is counted.

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "sonde.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Unused pointers that make these types reach BTF, so bpf2go generates their Go
// constants; they live in .bss and cost nothing.
const enum counter *unused_counter __attribute__((unused));
const enum record_type *unused_record_type __attribute__((unused));
const enum sample_flags *unused_sample_flags __attribute__((unused));
const struct task_record *unused_task_record __attribute__((unused));

// Set by the loader before the programs are loaded.
volatile const bool include_idle = false;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20); // resized by the loader (limits.ring_buffer_bytes)
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// A sample is built here, then only its used part is copied to the ring buffer.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_record);
} scratch SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1;
}

SEC("perf_event")
int sample_cpu(struct bpf_perf_event_data *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	__u32 zero = 0;

	count(COUNTER_SAMPLES);
	if (tgid == 0 && !include_idle) {
		count(COUNTER_IDLE_SKIPPED);
		return 0;
	}

	struct sample_record *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;

	s->type = RECORD_SAMPLE;
	s->pid = tgid;
	s->tid = (__u32)pid_tgid;
	s->cpu = bpf_get_smp_processor_id();
	s->ktime = bpf_ktime_get_ns();
	s->flags = SAMPLE_FRAME_POINTERS;
	bpf_get_current_comm(s->comm, sizeof(s->comm));

	// The kernel stack is empty when the sample interrupted user mode.
	long n = bpf_get_stack(ctx, s->stack, MAX_KERNEL_FRAMES * sizeof(__u64), 0);
	__u32 klen = 0;
	if (n > 0) {
		klen = (__u64)n / sizeof(__u64);
	} else if (n < 0 && n != -14 /* EFAULT: no kernel part */) {
		s->flags |= SAMPLE_KERNEL_STACK_ERR;
		count(COUNTER_KERNEL_STACK_ERR);
	}
	if (klen > MAX_KERNEL_FRAMES)
		klen = MAX_KERNEL_FRAMES;

	__u32 ulen = 0;
	if (tgid != 0) {
		n = bpf_get_stack(ctx, &s->stack[klen], MAX_USER_FRAMES * sizeof(__u64),
				  BPF_F_USER_STACK);
		if (n > 0) {
			ulen = (__u64)n / sizeof(__u64);
		} else if (n < 0) {
			s->flags |= SAMPLE_USER_STACK_ERR;
			count(COUNTER_USER_STACK_ERR);
		}
	}
	if (ulen > MAX_USER_FRAMES)
		ulen = MAX_USER_FRAMES;
	if (ulen == MAX_USER_FRAMES)
		s->flags |= SAMPLE_USER_TRUNCATED;

	s->kernel_len = klen;
	s->user_len = ulen;

	__u64 size = __builtin_offsetof(struct sample_record, stack) + (__u64)(klen + ulen) * sizeof(__u64);
	if (size > sizeof(*s))
		size = sizeof(*s);
	if (bpf_ringbuf_output(&events, s, size, 0) == 0)
		count(COUNTER_SAMPLES_SENT);
	else
		count(COUNTER_SAMPLES_LOST);
	return 0;
}

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
	bpf_ringbuf_submit(r, 0);
	count(COUNTER_TASK_EVENTS_SENT);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	task_event(RECORD_EXEC, task);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task)
{
	// One record per process, not per thread: only the group leader counts.
	if (BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid))
		return 0;
	task_event(RECORD_EXIT, task);
	return 0;
}
