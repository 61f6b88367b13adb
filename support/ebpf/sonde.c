// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

// Sonde's sampler: a perf-event program run on every CPU at the configured
// frequency, and BTF tracepoints that report exec and exit. Everything leaves
// through one BPF ring buffer; everything dropped is counted.

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "sonde.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Unused pointers that make these types reach BTF, so bpf2go generates their Go
// constants; they live in .bss and cost nothing.
const enum counter *unused_counter __attribute__((unused));
const enum record_type *unused_record_type __attribute__((unused));
const enum sample_flags *unused_sample_flags __attribute__((unused));
const struct task_record *unused_task_record __attribute__((unused));
const struct mapping_key *unused_mapping_key __attribute__((unused));
const struct mapping_info *unused_mapping_info __attribute__((unused));
const struct unwind_row *unused_unwind_row __attribute__((unused));
const enum cfa_type *unused_cfa_type __attribute__((unused));
const enum fp_rule *unused_fp_rule __attribute__((unused));

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

// Wake the reader only once this much data waits; it also polls on a
// deadline, so nothing waits long. One wake-up per record would cost the
// reader a context switch per sample. Set by the loader.
volatile const __u64 wakeup_bytes = 0;

static __always_inline __u64 wakeup_flags(void)
{
	if (wakeup_bytes == 0 || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1;
}

// Per-CPU state of the user-stack unwinder between its tail calls.
struct ustack_state {
	__u64 pc;
	__u64 sp;
	__u64 fp;
	__u32 runs;
	__u32 adjust; // the current pc is a return address: look up pc - 1
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ustack_state);
} unwind_scratch SEC(".maps");

// Executable mappings of every prepared process: (pid, address) -> how to
// unwind there. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536); // resized by the loader
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mapping_key);
	__type(value, struct mapping_info);
} mappings SEC(".maps");

// Processes user space has prepared (their mappings are in `mappings`).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); // resized by the loader
	__type(key, __u32);
	__type(value, __u32);
} known_pids SEC(".maps");

// When each process was last reported as unknown: notifications are
// rate-limited to one per process per second.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, __u64);
} notified SEC(".maps");

// One inner array of rows per file, sized to that file's table.
struct table_rows {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP);
	__type(key, __u32);
	__type(value, struct unwind_row);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__array(values, struct table_rows);
} tables SEC(".maps");

// The unwinder tail-calls itself through this array (index 0).
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} unwinders SEC(".maps");

// Kernel stack size, for finding user registers on kernels without
// bpf_task_pt_regs (before 5.15); set by the loader.
volatile const __u64 thread_size = 16384;

// Offsets in the signal frame __restore_rt returns through: the ucontext
// sits at the stack pointer; its mcontext starts 40 bytes in.
#define UC_MCONTEXT 40
#define SC_RBP 80
#define SC_RSP 120
#define SC_RIP 128

static __always_inline void send_sample(struct sample_record *s)
{
	__u64 size = __builtin_offsetof(struct sample_record, stack) +
		     (__u64)(s->kernel_len + s->user_len) * sizeof(__u64);
	if (size > sizeof(*s))
		size = sizeof(*s);
	if (bpf_ringbuf_output(&events, s, size, wakeup_flags()) == 0)
		count(COUNTER_SAMPLES_SENT);
	else
		count(COUNTER_SAMPLES_LOST);
}

// notify_unknown asks user space, at most once a second per process, to
// prepare the unwind information of pid.
static __always_inline void notify_unknown(__u32 pid)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 *last = bpf_map_lookup_elem(&notified, &pid);
	if (last && now - *last < 1000000000ULL)
		return;
	bpf_map_update_elem(&notified, &pid, &now, BPF_ANY);
	struct task_record *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count(COUNTER_UNKNOWN_LOST);
		return;
	}
	r->type = RECORD_UNKNOWN;
	r->pid = pid;
	r->ktime = now;
	bpf_get_current_comm(r->comm, sizeof(r->comm));
	bpf_ringbuf_submit(r, wakeup_flags());
	count(COUNTER_UNKNOWN_SENT);
}

// user_regs finds the user-mode registers of the interrupted task: the
// perf event's own when it interrupted user mode, else those saved on
// kernel entry. Kernel threads have none.
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, struct ustack_state *st)
{
	if ((ctx->regs.csx & 3) == 3) {
		st->pc = ctx->regs.ip;
		st->sp = ctx->regs.sp;
		st->fp = ctx->regs.bp;
		return 0;
	}
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(task, flags) & 0x00200000 /* PF_KTHREAD */)
		return -1;
	struct pt_regs *regs;
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)) {
		regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	} else {
		void *stack = BPF_CORE_READ(task, stack);
		regs = (struct pt_regs *)(stack + thread_size) - 1;
	}
	if (bpf_probe_read_kernel(&st->pc, sizeof(st->pc), &regs->ip) ||
	    bpf_probe_read_kernel(&st->sp, sizeof(st->sp), &regs->sp) ||
	    bpf_probe_read_kernel(&st->fp, sizeof(st->fp), &regs->bp))
		return -1;
	return 0;
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
	struct ustack_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!s || !st)
		return 0;

	s->type = RECORD_SAMPLE;
	s->pid = tgid;
	s->tid = (__u32)pid_tgid;
	s->cpu = bpf_get_smp_processor_id();
	s->ktime = bpf_ktime_get_ns();
	s->flags = 0;
	s->user_len = 0;
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
	s->kernel_len = klen;

	if (tgid == 0 || user_regs(ctx, st) != 0) {
		send_sample(s);
		return 0;
	}
	if (!bpf_map_lookup_elem(&known_pids, &tgid))
		notify_unknown(tgid);
	st->runs = 0;
	st->adjust = 0;
	bpf_tail_call(ctx, &unwinders, 0);
	// Only reached when the tail call failed.
	count(COUNTER_UNWIND_TAIL_CALL_ERR);
	s->flags |= SAMPLE_USER_STACK_ERR;
	send_sample(s);
	return 0;
}

enum step_result {
	STEP_CONTINUE,
	STEP_DONE,
};

// find_row returns the row of the inner table covering rel, or NULL.
static __always_inline struct unwind_row *find_row(void *rows, __u32 nrows, __u32 rel)
{
	__u32 lo = 0, hi = nrows;
	if (nrows == 0)
		return NULL;
	struct unwind_row *row = bpf_map_lookup_elem(rows, &lo);
	if (!row || row->pc > rel)
		return NULL;
	// Invariant: rows[lo].pc <= rel < rows[hi].pc (hi == nrows: past the end).
	for (int i = 0; i < MAX_BSEARCH_STEPS; i++) {
		if (hi - lo <= 1)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		row = bpf_map_lookup_elem(rows, &mid);
		if (!row)
			return NULL;
		if (row->pc <= rel)
			lo = mid;
		else
			hi = mid;
	}
	return bpf_map_lookup_elem(rows, &lo);
}

// fp_step walks one frame-pointer link.
static __always_inline enum step_result fp_step(struct ustack_state *st, struct sample_record *s)
{
	__u64 link[2]; // saved rbp, return address
	if (st->fp == 0 || st->fp < st->sp)
		return STEP_DONE;
	if (bpf_probe_read_user(link, sizeof(link), (void *)st->fp)) {
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_UNWIND_READ_ERR);
		return STEP_DONE;
	}
	st->sp = st->fp + 16;
	st->fp = link[0];
	st->pc = link[1] | PC_FLAG_FRAME_POINTER;
	s->flags |= SAMPLE_FRAME_POINTERS;
	count(COUNTER_FRAMES_FP);
	return STEP_CONTINUE;
}

// step unwinds one frame: from (pc, sp, fp) of a frame to its caller's.
static __always_inline enum step_result step(struct ustack_state *st, struct sample_record *s, __u32 pid)
{
	__u64 pc = st->pc & ~PC_FLAGS_MASK;
	__u64 lookup = st->adjust ? pc - 1 : pc;
	struct mapping_key key = {.prefixlen = 96, .pid = pid, .addr_be = bpf_cpu_to_be64(lookup)};
	struct mapping_info *mi = bpf_map_lookup_elem(&mappings, &key);
	if (!mi || mi->table_id == 0) {
		if (!mi)
			notify_unknown(pid);
		return fp_step(st, s);
	}
	__u64 rel = lookup - mi->bias;
	__u32 table_id = mi->table_id;
	void *rows = bpf_map_lookup_elem(&tables, &table_id);
	if (!rows || rel > 0xffffffffULL)
		return fp_step(st, s);
	struct unwind_row *row = find_row(rows, mi->rows, (__u32)rel);
	if (!row)
		return fp_step(st, s);

	__u64 cfa;
	switch (row->cfa_type) {
	case CFA_SP:
		cfa = st->sp + (__s64)row->cfa_offset;
		break;
	case CFA_FP:
		cfa = st->fp + (__s64)row->cfa_offset;
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + ((pc & 15) >= 11 ? 8 : 0);
		break;
	case CFA_SIGNAL: {
		__u64 regs[3];
		void *mc = (void *)(st->sp + UC_MCONTEXT);
		if (bpf_probe_read_user(&regs[0], 8, mc + SC_RBP) ||
		    bpf_probe_read_user(&regs[1], 8, mc + SC_RSP) ||
		    bpf_probe_read_user(&regs[2], 8, mc + SC_RIP)) {
			s->flags |= SAMPLE_USER_READ_ERR;
			count(COUNTER_UNWIND_READ_ERR);
			return STEP_DONE;
		}
		st->fp = regs[0];
		st->sp = regs[1];
		st->pc = regs[2] | PC_FLAG_NO_ADJUST;
		st->adjust = 0;
		count(COUNTER_FRAMES_CFI);
		return STEP_CONTINUE;
	}
	case CFA_END:
		s->flags |= SAMPLE_USER_COMPLETE;
		return STEP_DONE;
	default:
		s->flags |= SAMPLE_USER_UNKNOWN_RULE;
		count(COUNTER_UNWIND_UNKNOWN_RULE);
		return STEP_DONE;
	}

	__u64 ra;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8))) {
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_UNWIND_READ_ERR);
		return STEP_DONE;
	}
	if (row->fp_type == FP_OFFSET) {
		if (bpf_probe_read_user(&st->fp, sizeof(st->fp), (void *)(cfa + (__s64)row->fp_offset))) {
			s->flags |= SAMPLE_USER_READ_ERR;
			count(COUNTER_UNWIND_READ_ERR);
			return STEP_DONE;
		}
	} else if (row->fp_type == FP_UNKNOWN) {
		st->fp = 0;
	}
	st->sp = cfa;
	st->pc = ra;
	st->adjust = 1;
	count(COUNTER_FRAMES_CFI);
	return STEP_CONTINUE;
}

SEC("perf_event")
int unwind_user(struct bpf_perf_event_data *ctx)
{
	__u32 zero = 0;
	struct sample_record *s = bpf_map_lookup_elem(&scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!s || !st)
		return 0;

	for (int i = 0; i < FRAMES_PER_RUN; i++) {
		__u32 ulen = s->user_len;
		__u32 idx = s->kernel_len + ulen;
		if (ulen >= MAX_USER_FRAMES || idx >= MAX_KERNEL_FRAMES + MAX_USER_FRAMES) {
			s->flags |= SAMPLE_USER_TRUNCATED;
			goto out;
		}
		if ((st->pc & ~PC_FLAGS_MASK) == 0)
			goto out;
		s->stack[idx] = st->pc | (st->adjust ? 0 : PC_FLAG_NO_ADJUST);
		s->user_len = ulen + 1;
		if (step(st, s, s->pid) == STEP_DONE)
			goto out;
	}
	if (st->runs < MAX_UNWIND_RUNS - 1) {
		st->runs++;
		bpf_tail_call(ctx, &unwinders, 0);
		count(COUNTER_UNWIND_TAIL_CALL_ERR);
	}
	s->flags |= SAMPLE_USER_TRUNCATED;
out:
	send_sample(s);
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
	bpf_ringbuf_submit(r, wakeup_flags());
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
