// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Building and sending records: the header and kernel stack of a sample,
// the ring-buffer output, per-process costs and the rate-limited requests
// for a process's unwind information.
#pragma once

#include "maps.h"

#define PF_KTHREAD 0x00200000

// current_flags returns the current task's flags: a plain load where the
// kernel has bpf_get_current_task_btf (5.11+), else a helper call.
static __always_inline unsigned int current_flags(void)
{
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf))
		return bpf_get_current_task_btf()->flags;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	return BPF_CORE_READ(task, flags);
}

// current_has_mm says whether the current task still has its user address
// space. An exiting task lets go of it (exit_mm) before the kernel unmaps
// it (exit_mmap, often in the same task): from then on its saved user
// registers point into code and a stack that are going away.
static __always_inline bool current_has_mm(void)
{
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf))
		return bpf_get_current_task_btf()->mm != NULL;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	return BPF_CORE_READ(task, mm) != NULL;
}

// add_cost adds to pid's cost counters.
static __always_inline void add_cost(__u32 pid, __u64 samples, __u64 filtered, __u64 frames)
{
	if (!count_costs)
		return;
	struct pid_stats *ps = bpf_map_lookup_elem(&pid_costs, &pid);
	if (!ps) {
		struct pid_stats init = {};
		bpf_map_update_elem(&pid_costs, &pid, &init, BPF_NOEXIST);
		ps = bpf_map_lookup_elem(&pid_costs, &pid);
		if (!ps)
			return;
	}
	__sync_fetch_and_add(&ps->samples, samples);
	__sync_fetch_and_add(&ps->filtered, filtered);
	__sync_fetch_and_add(&ps->frames, frames);
}

// output_sample writes the used part of s to the ring buffer: its header,
// its frames, and the extra bytes after them (a stack snapshot; 0 for
// none, and always 0 for a record that is not in a struct sample_scratch).
static __always_inline int output_sample(struct sample_record *s, __u32 extra)
{
	__u64 size = __builtin_offsetof(struct sample_record, stack) +
	             (__u64)(s->kernel_len + 2 * s->user_len) * sizeof(__u64);
	if (size > sizeof(*s))
		size = sizeof(*s);
	if (extra) {
		size += extra;
		if (size > sizeof(struct sample_scratch))
			size = sizeof(struct sample_scratch);
	}
	return bpf_ringbuf_output(&events, s, size, wakeup_flags());
}

// copy_stack copies user memory from src to dst a page at a time, up to
// limit bytes or the first page that cannot be read (the end of a stack),
// and returns how many bytes it copied. limit is a constant at each call:
// the verifier bounds the copy by it (and one page more, which the
// scratch's slack holds).
static __always_inline __u32 copy_stack(__u8 *dst, __u64 src, __u32 limit)
{
	__u32 copied = 0;
	__u32 len = 4096 - (src & 4095);
	for (int i = 0; i <= SNAPSHOT_BYTES / 4096; i++) {
		if (copied >= limit)
			break;
		if (len > limit - copied)
			len = limit - copied;
		if (bpf_probe_read_user(dst + copied, len, (void *)(src + copied)))
			break;
		copied += len;
		len = 4096;
	}
	return copied;
}

// take_snapshot writes the snapshot st marked (snap_set) after the frames of
// s, which must be the record of a struct sample_scratch: its registers,
// then the stack from its SP on, up to SNAPSHOT_BYTES, and the second
// region, if any, up to SNAPSHOT_SECOND_BYTES (copy_stack). It returns the
// bytes it added, 0 when it took none: the ring buffer is half full already
// (a burst of new programs must not crowd out samples), or the stack cannot
// be read.
static __always_inline __u32 take_snapshot(struct sample_record *s, struct ustack_state *st)
{
	__u64 ring = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > ring / 2) {
		count(COUNTER_SNAPSHOTS_SKIPPED);
		return 0;
	}
	__u32 words = s->kernel_len + 2 * s->user_len;
	if (words > MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES)
		return 0;
	struct stack_snapshot *h = (void *)s->stack + words * sizeof(__u64);
	__u8 *dst = (__u8 *)(h + 1);
	__u32 copied = copy_stack(dst, st->snap_sp, SNAPSHOT_BYTES);
	if (copied == 0 || copied > SNAPSHOT_BYTES)
		return 0;
	__u32 copied2 = 0;
	if (st->snap2_set)
		copied2 = copy_stack(dst + copied, st->snap2_sp, SNAPSHOT_SECOND_BYTES);
	h->pc = st->snap_pc;
	h->sp = st->snap_sp;
	h->fp = st->snap_fp;
	h->sp2 = copied2 ? st->snap2_sp : 0;
	h->frame = st->snap_frame;
	h->pad = 0;
	h->bytes = copied;
	h->bytes2 = copied2;
	h->pad2 = 0;
	h->lr = st->snap_lr;
	s->flags |= SAMPLE_SNAPSHOT;
	count(COUNTER_SNAPSHOTS);
	return sizeof(*h) + copied + copied2;
}

// send_sample sends s with extra bytes after its frames (take_snapshot's).
static __always_inline void send_sample(struct sample_record *s, __u32 extra)
{
	if (output_sample(s, extra) == 0)
		count(COUNTER_SAMPLES_SENT);
	else
		count(COUNTER_SAMPLES_LOST);
	if (s->pid != 0)
		add_cost(s->pid, 1, 0, s->user_len);
}

// send_offcpu_start sends an off-CPU start record and, once user space has
// it, remembers when the thread left so its return can close it. The thread
// cannot run anywhere before this program ends (it is still on this CPU), so
// the end can never overtake the start.
static __always_inline void send_offcpu_start(struct sample_record *s)
{
	if (output_sample(s, 0) != 0) {
		count(COUNTER_OFFCPU_STARTS_LOST);
		return;
	}
	count(COUNTER_OFFCPU_STARTS_SENT);
	__u32 tid = s->tid;
	__u64 start = s->ktime;
	if (bpf_map_update_elem(&offcpu_starts, &tid, &start, BPF_ANY) != 0)
		count(COUNTER_OFFCPU_MAP_FULL);
}

// Least time between two notifications for one process: a process that is
// new or maps code we have no entry for (JIT code never has one) is asked
// about once a second; one whose mapping was replaced under an entry
// (dlclose, then dlopen at the same place) sooner, as its entries are wrong,
// unless the new file's own table unwinds it meanwhile; so is a V8 process
// that maps its builtins again (native.h, find_mapping).
#define NOTIFY_GAP_NS       1000000000ULL
#define NOTIFY_STALE_GAP_NS 50000000ULL
// A runtime's process (which takes no snapshots) meeting a file whose
// table is not loaded asks at most this often.
#define NOTIFY_TABLE_GAP_NS 200000000ULL

// notify_unknown asks user space, at most once per gap per process, to
// prepare the unwind information of pid.
static __always_inline void notify_unknown(__u32 pid, __u64 gap)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 *last = bpf_map_lookup_elem(&notified, &pid);
	if (last && now - *last < gap)
		return;
	bpf_map_update_elem(&notified, &pid, &now, BPF_ANY);
	struct task_record *r = bpf_ringbuf_reserve(&notices, sizeof(*r), 0);
	if (!r) {
		count(COUNTER_UNKNOWN_LOST);
		return;
	}
	r->type = RECORD_UNKNOWN;
	r->pid = pid;
	r->ktime = now;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	// Rare (rate-limited) and urgent: until user space acts, the process
	// is unwound by frame pointers only.
	bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	count(COUNTER_UNKNOWN_SENT);
}

// begin_sample fills the header of s for the current task and takes its
// kernel stack; the user stack is left to the unwinder.
// in_kernel false says the sample interrupted user mode: there is no kernel
// stack to take, and asking for it costs a helper call that finds none.
static __always_inline void begin_sample(void *ctx, struct sample_record *s, __u32 type,
                                         __u64 pid_tgid, __u64 now, bool in_kernel)
{
	s->type = type;
	s->pid = pid_tgid >> 32;
	s->tid = (__u32)pid_tgid;
	s->cpu = bpf_get_smp_processor_id();
	s->ktime = now;
	s->flags = 0;
	s->user_len = 0;
	bpf_get_current_comm(s->comm, sizeof(s->comm));

	long n = in_kernel ? bpf_get_stack(ctx, s->stack, MAX_KERNEL_FRAMES * sizeof(__u64), 0) : 0;
	__u32 klen = 0;
	if (n > 0) {
		klen = (__u64)n / sizeof(__u64);
	} else if (n < 0 && n != -14 /* EFAULT: no kernel part */) {
		s->flags |= SAMPLE_KERNEL_STACK_ERR;
		count(COUNTER_KERNEL_STACK_ERR);
	}
	if (klen > MAX_KERNEL_FRAMES)
		klen = MAX_KERNEL_FRAMES;
	s->kernel_len = klen;
}
