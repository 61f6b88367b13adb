// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

// Sonde's sampler: a perf-event program run on every CPU at the configured
// frequency, BTF tracepoints that report exec and exit, and (when off-CPU
// profiling is on) a BTF tracepoint on every context switch. Everything
// leaves through one BPF ring buffer; everything dropped is counted.

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
const struct pid_stats *unused_pid_stats __attribute__((unused));
const struct file_key *unused_file_key __attribute__((unused));
const struct file_table *unused_file_table __attribute__((unused));
const struct offcpu_end_record *unused_offcpu_end_record __attribute__((unused));
const enum offcpu_end_flags *unused_offcpu_end_flags __attribute__((unused));

// Set by the loader before the programs are loaded.
volatile const bool include_idle = false;
volatile const bool include_kernel_threads = false;
// With filters on, a process that execs is not sampled for this long (or
// until user space decides about its new image, if sooner); 0: filters off.
volatile const __u64 filter_pending_ns = 0;

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
	__u32 adjust;  // the current pc is a return address: look up pc - 1
	__u32 have_mi; // mi holds the last mapping used (checked live): frames in it skip the trie
	__u32 trust;   // the process's mappings did not change since its entries were set
	struct mapping_info mi;
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

// Processes user space has prepared (their mappings are in `mappings`), with
// a fingerprint of their address space (mm_fingerprint) taken at the first
// stack after user space set the entries (0 until then). While it holds,
// the entries are trusted without looking at the live VMAs, which costs a
// deferred unlock (an IPI) per look.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); // resized by the loader
	__type(key, __u32);
	__type(value, __u64);
} known_pids SEC(".maps");

// Filter decisions, made once per process by user space: samples of pid are
// dropped before any work while bpf_ktime_get_ns() < the value (U64_MAX:
// always; a process too young to profile gets the time it comes of age).
// Cleared at exec and exit, so a new image or a reused PID is decided anew.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); // resized by the loader
	__type(key, __u32);
	__type(value, __u64);
} pid_filter SEC(".maps");

// What sampling cost each recently sampled process.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pid_stats);
} pid_costs SEC(".maps");

// The table of every file user space has loaded one for, by the file's
// kernel identity: a mapping the process's entries do not cover yet (a new
// process, a library just loaded, one swapped under an old entry) unwinds
// from it at once, where the kernel can look up VMAs (bpf_find_vma).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct file_key);
	__type(value, struct file_table);
} file_tables SEC(".maps");

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

// Off-CPU tracing. A tail call only reaches a program of the caller's type
// (and, since 6.12, of its attach point), so the off-CPU path has its own
// build of the unwinder, its own program array, and its own per-CPU scratch
// slots: it never shares a half-built record with the on-CPU sampler.

// Set by the loader: a switch is traced when bpf_get_prandom_u32() is below
// offcpu_threshold (1 << 32: every switch); waits shorter than offcpu_min_ns
// are dropped.
volatile const __u64 offcpu_threshold = 0;
volatile const __u64 offcpu_min_ns = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_record);
} offcpu_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ustack_state);
} offcpu_unwind_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} offcpu_unwinders SEC(".maps");

// When each traced thread left the CPU (tid -> ktime of its start record).
// Bounded: a thread that never comes back (or not before this many newer
// waits) is evicted, and user space expires its start record.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, __u64);
} offcpu_starts SEC(".maps");

// Kernel stack size, for finding user registers on kernels without
// bpf_task_pt_regs (before 5.15); set by the loader.
volatile const __u64 thread_size = 16384;

// Offsets in the signal frame __restore_rt returns through: the ucontext
// sits at the stack pointer; its mcontext starts 40 bytes in.
#define UC_MCONTEXT 40
#define SC_RBP 80
#define SC_RSP 120
#define SC_RIP 128

#define PF_KTHREAD 0x00200000

// uapi_regs is struct pt_regs as x86-64's UAPI lays it out
// (asm/ptrace.h), which is what a perf event program's context holds. It is
// declared without CO-RE (after vmlinux.h's preserve_access_index pragma
// ends), so reads are plain context loads at fixed offsets.
struct uapi_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	unsigned long ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

// add_cost adds to pid's cost counters.
static __always_inline void add_cost(__u32 pid, __u64 samples, __u64 filtered, __u64 frames)
{
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

static __always_inline int output_sample(struct sample_record *s)
{
	__u64 size = __builtin_offsetof(struct sample_record, stack) +
		     (__u64)(s->kernel_len + 2 * s->user_len) * sizeof(__u64);
	if (size > sizeof(*s))
		size = sizeof(*s);
	return bpf_ringbuf_output(&events, s, size, wakeup_flags());
}

static __always_inline void send_sample(struct sample_record *s)
{
	if (output_sample(s) == 0)
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
	if (output_sample(s) != 0) {
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
// (dlclose, then dlopen at the same place) sooner, as its entries are wrong.
#define NOTIFY_GAP_NS 1000000000ULL
#define NOTIFY_STALE_GAP_NS 50000000ULL

// notify_unknown asks user space, at most once per gap per process, to
// prepare the unwind information of pid.
static __always_inline void notify_unknown(__u32 pid, __u64 gap)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 *last = bpf_map_lookup_elem(&notified, &pid);
	if (last && now - *last < gap)
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
	// Rare (rate-limited) and urgent: until user space acts, the process
	// is unwound by frame pointers only.
	bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	count(COUNTER_UNKNOWN_SENT);
}

// saved_user_regs finds the user-mode registers the current task saved on
// its last entry into the kernel. Kernel threads have none.
static __always_inline int saved_user_regs(struct ustack_state *st)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(task, flags) & PF_KTHREAD)
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

// begin_sample fills the header of s for the current task and takes its
// kernel stack; the user stack is left to the unwinder.
static __always_inline void begin_sample(void *ctx, struct sample_record *s, __u32 type, __u64 pid_tgid, __u64 now)
{
	s->type = type;
	s->pid = pid_tgid >> 32;
	s->tid = (__u32)pid_tgid;
	s->cpu = bpf_get_smp_processor_id();
	s->ktime = now;
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
}

// mm_fingerprint is the current process's mm_lock_seq, which every change
// of its mappings (mmap, munmap, mprotect, brk) advances; 0 where the kernel
// has none (before 6.13, whose counter has another type, or without per-VMA
// locks): there the entries are checked on every stack.
static __always_inline __u64 mm_fingerprint(void)
{
	if (!bpf_core_field_exists(((struct mm_struct *)0)->mm_lock_seq))
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u32 seq = BPF_CORE_READ(task, mm, mm_lock_seq.sequence);
	return (__u64)seq | (1ULL << 63);
}

// begin_unwind prepares the unwinder's state for a new user stack, asking
// user space for the process's unwind information if it has none yet, or
// again if its mappings changed since.
static __always_inline void begin_unwind(struct ustack_state *st, __u32 tgid)
{
	st->runs = 0;
	st->adjust = 0;
	st->have_mi = 0;
	st->trust = 0;
	__u64 *known = bpf_map_lookup_elem(&known_pids, &tgid);
	if (!known) {
		notify_unknown(tgid, NOTIFY_GAP_NS);
		return;
	}
	__u64 fp = mm_fingerprint();
	if (fp == 0)
		return;
	if (*known == fp)
		st->trust = 1;
	else if (*known == 0)
		*known = fp; // the first stack since the entries were set: checked, not trusted
	else
		notify_unknown(tgid, NOTIFY_GAP_NS); // the mappings changed since, or an entry was stale: ask again
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
	if (tgid != 0 && !include_kernel_threads) {
		struct task_struct *task = (struct task_struct *)bpf_get_current_task();
		if (BPF_CORE_READ(task, flags) & PF_KTHREAD) {
			count(COUNTER_KTHREAD_SKIPPED);
			return 0;
		}
	}
	__u64 *until = bpf_map_lookup_elem(&pid_filter, &tgid);
	if (until && bpf_ktime_get_ns() < *until) {
		count(COUNTER_FILTERED);
		add_cost(tgid, 0, 1, 0);
		return 0;
	}

	struct sample_record *s = bpf_map_lookup_elem(&scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!s || !st)
		return 0;

	begin_sample(ctx, s, RECORD_SAMPLE, pid_tgid, bpf_ktime_get_ns());
	if (tgid == 0 || user_regs(ctx, st) != 0) {
		send_sample(s);
		return 0;
	}
	begin_unwind(st, tgid);
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
	st->adjust = 1; // a return address, like the ones CFI finds
	s->flags |= SAMPLE_FRAME_POINTERS;
	count(COUNTER_FRAMES_FP);
	return STEP_CONTINUE;
}

// vma_info is what read_vma finds of the VMA covering an address.
struct vma_info {
	__u64 start;
	__u64 end;
	__u64 file_bias; // start - file offset
	__u64 inode;
	__u64 dev;
	bool file;
};

static long read_vma(struct task_struct *task, struct vm_area_struct *vma, struct vma_info *v)
{
	v->start = BPF_CORE_READ(vma, vm_start);
	v->end = BPF_CORE_READ(vma, vm_end);
	struct file *f = BPF_CORE_READ(vma, vm_file);
	if (!f)
		return 0;
	v->file = true;
	v->file_bias = v->start - (BPF_CORE_READ(vma, vm_pgoff) << 12);
	v->inode = BPF_CORE_READ(f, f_inode, i_ino);
	v->dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	return 0;
}

// use_mapping caches mi in st for the next frames and returns the copy.
static __always_inline struct mapping_info *use_mapping(struct ustack_state *st, struct mapping_info *mi)
{
	st->mi = *mi;
	st->have_mi = 1;
	return &st->mi;
}

// find_mapping returns the mapping of pid covering addr: the one cached in
// st when addr is in it, else the process's entry in the trie. Where the
// kernel lets us look at the live VMA (vma true: bpf_find_vma, 5.17+), the
// entry is used only if it still describes it; an entry missing or stale
// (dlclose then dlopen at the same place, exec) is replaced by the file's
// own table when user space has loaded one, and user space is asked to
// bring the process's entries up to date. NULL: no file mapping there.
static __always_inline struct mapping_info *find_mapping(struct ustack_state *st, __u32 pid, __u64 addr, bool vma)
{
	if (st->have_mi && addr >= st->mi.start && addr < st->mi.end)
		return &st->mi;
	st->have_mi = 0;
	struct mapping_key key = {.prefixlen = 96, .pid = pid, .addr_be = bpf_cpu_to_be64(addr)};
	struct mapping_info *mi = bpf_map_lookup_elem(&mappings, &key);
	if (!vma) {
		// A stale entry is trusted until user space replaces it.
		if (!mi) {
			notify_unknown(pid, NOTIFY_GAP_NS);
			return NULL;
		}
		return use_mapping(st, mi);
	}
	if (mi && st->trust)
		return use_mapping(st, mi);
	struct vma_info v = {};
	long err = bpf_find_vma(bpf_get_current_task_btf(), addr, read_vma, &v, 0);
	if (err == -16 /* EBUSY: the mm lock is taken; trust the entry */) {
		count(COUNTER_VMA_CHECK_BUSY);
		if (!mi) {
			notify_unknown(pid, NOTIFY_GAP_NS);
			return NULL;
		}
		return use_mapping(st, mi);
	}
	if (err)
		return NULL;
	if (mi && mi->inode == v.inode && mi->file_bias == v.file_bias && v.file)
		return use_mapping(st, mi);
	if (mi) {
		count(COUNTER_MAPPING_STALE);
		// No trust in these entries until user space has set them again
		// (1 matches no fingerprint, and is not 0, which asks for one).
		__u64 stale = 1;
		bpf_map_update_elem(&known_pids, &pid, &stale, BPF_EXIST);
		notify_unknown(pid, NOTIFY_STALE_GAP_NS);
	} else if (v.file) {
		notify_unknown(pid, NOTIFY_GAP_NS);
	}
	// The VMA's range is known: the frames in it go without another look.
	struct mapping_info *c = &st->mi;
	__builtin_memset(c, 0, sizeof(*c));
	c->start = v.start;
	c->end = v.end;
	st->have_mi = 1;
	if (!v.file)
		return c; // anonymous (JIT) code: frame pointers, no file
	c->file_bias = v.file_bias;
	c->inode = v.inode;
	struct file_key fk = {.dev = v.dev, .inode = v.inode};
	struct file_table *ft = bpf_map_lookup_elem(&file_tables, &fk);
	if (ft) {
		c->bias = v.file_bias + ft->delta;
		c->table_id = ft->table_id;
		c->rows = ft->rows;
		c->file = ft->file;
		count(COUNTER_MAPPING_BY_FILE);
	}
	return c;
}

// step unwinds one frame, in mapping mi (NULL: none known), from (pc, sp,
// fp) of a frame to its caller's.
static __always_inline enum step_result step(struct ustack_state *st, struct sample_record *s,
					     struct mapping_info *mi, __u64 pc, __u64 lookup)
{
	if (!mi || mi->table_id == 0)
		return fp_step(st, s);
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

// unwind_frames unwinds up to FRAMES_PER_RUN frames into s. It returns true
// when the stack needs another run.
static __always_inline bool unwind_frames(struct sample_record *s, struct ustack_state *st, bool vma)
{
	for (int i = 0; i < FRAMES_PER_RUN; i++) {
		__u32 ulen = s->user_len;
		__u32 idx = s->kernel_len + 2 * ulen;
		if (ulen >= MAX_USER_FRAMES || idx + 1 >= MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES) {
			s->flags |= SAMPLE_USER_TRUNCATED;
			return false;
		}
		__u64 pc = st->pc & ~PC_FLAGS_MASK;
		if (pc == 0)
			return false;
		__u64 lookup = st->adjust ? pc - 1 : pc;
		struct mapping_info *mi = find_mapping(st, s->pid, lookup, vma);
		__u64 file_word = 0;
		if (mi && mi->file != 0 && pc - mi->file_bias <= 0xffffffffULL)
			file_word = ((__u64)mi->file << 32) | (pc - mi->file_bias);
		s->stack[idx] = st->pc | (st->adjust ? 0 : PC_FLAG_NO_ADJUST);
		s->stack[idx + 1] = file_word;
		s->user_len = ulen + 1;
		if (step(st, s, mi, pc, lookup) == STEP_DONE)
			return false;
	}
	return true;
}

// unwind_run is one run of the user-stack unwinder; it tail-calls the next.
// offcpu picks the off-CPU path's scratch slots, program array and record;
// it is a constant at every call, so each build refers only to its own maps.
static __always_inline int unwind_run(void *ctx, bool vma, bool offcpu)
{
	__u32 zero = 0;
	struct sample_record *s = bpf_map_lookup_elem(offcpu ? (void *)&offcpu_scratch : (void *)&scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(offcpu ? (void *)&offcpu_unwind_scratch : (void *)&unwind_scratch, &zero);
	if (!s || !st)
		return 0;
	if (unwind_frames(s, st, vma)) {
		if (st->runs < MAX_UNWIND_RUNS - 1) {
			st->runs++;
			if (offcpu)
				bpf_tail_call(ctx, &offcpu_unwinders, 0);
			else
				bpf_tail_call(ctx, &unwinders, 0);
			count(COUNTER_UNWIND_TAIL_CALL_ERR);
		}
		s->flags |= SAMPLE_USER_TRUNCATED;
	}
	if (offcpu)
		send_offcpu_start(s);
	else
		send_sample(s);
	return 0;
}

// Two builds of the unwinder: the loader installs the first where the kernel
// has bpf_find_vma (5.17+), the second elsewhere; only one is loaded.
SEC("perf_event")
int unwind_user(struct bpf_perf_event_data *ctx)
{
	return unwind_run(ctx, true, false);
}

SEC("perf_event")
int unwind_user_unchecked(struct bpf_perf_event_data *ctx)
{
	return unwind_run(ctx, false, false);
}

// The same two builds for the off-CPU path. They are never attached: they
// only run as tail calls of off_cpu, and declare its attach point because
// the kernel (6.12+) refuses tail calls between tracing programs of
// different hooks.
SEC("tp_btf/sched_switch")
int off_cpu_unwind_user(void *ctx)
{
	return unwind_run(ctx, true, true);
}

SEC("tp_btf/sched_switch")
int off_cpu_unwind_user_unchecked(void *ctx)
{
	return unwind_run(ctx, false, true);
}

#define TASK_RUNNING 0
#define TASK_DEAD 0x80

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

// off_cpu runs at every context switch, on the CPU being switched, with
// current == prev. It closes the wait of next if it was traced, then
// decides whether prev's wait is traced: if so it records prev's stacks as
// an off-CPU start record (the user stack by the unwinder's off-CPU build,
// from the registers prev saved when it entered the kernel).
//
// Only blocking is traced: a thread preempted while runnable (preempt, or
// still TASK_RUNNING as after sched_yield) waits for a CPU, not for an
// event; that time is CPU contention, which the on-CPU profile already
// shows, and tracing it would fill the off-CPU profile with every busy
// thread's time slices. Exiting threads (TASK_DEAD) never come back.
SEC("tp_btf/sched_switch")
int BPF_PROG(off_cpu, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	count(COUNTER_OFFCPU_SWITCHES);
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
	__u64 *until = bpf_map_lookup_elem(&pid_filter, &tgid);
	if (until && now < *until) {
		count(COUNTER_OFFCPU_FILTERED);
		return 0;
	}

	__u32 zero = 0;
	struct sample_record *s = bpf_map_lookup_elem(&offcpu_scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(&offcpu_unwind_scratch, &zero);
	if (!s || !st)
		return 0;
	// prev is current here, so the current-task helpers read prev.
	begin_sample(ctx, s, RECORD_OFFCPU_START, bpf_get_current_pid_tgid(), now);
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

// forget_task drops what was decided for the process: a new image or a
// reused PID is prepared and filtered anew.
static __always_inline void forget_task(struct task_struct *task)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	bpf_map_delete_elem(&known_pids, &tgid);
	bpf_map_delete_elem(&pid_filter, &tgid);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	forget_task(task);
	// Costs are per image: what the forked copy cost is not the new program's.
	__u32 pid = BPF_CORE_READ(task, tgid);
	bpf_map_delete_elem(&pid_costs, &pid);
	if (filter_pending_ns) {
		// Not sampled until user space has filtered the new image, so an
		// excluded program costs nothing from its first instruction.
		__u32 tgid = BPF_CORE_READ(task, tgid);
		__u64 until = bpf_ktime_get_ns() + filter_pending_ns;
		bpf_map_update_elem(&pid_filter, &tgid, &until, BPF_ANY);
	}
	task_event(RECORD_EXEC, task);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task)
{
	// One record per process, not per thread: only the group leader counts.
	if (BPF_CORE_READ(task, pid) != BPF_CORE_READ(task, tgid))
		return 0;
	forget_task(task);
	__u32 tgid = BPF_CORE_READ(task, tgid);
	bpf_map_delete_elem(&pid_costs, &tgid);
	task_event(RECORD_EXIT, task);
	return 0;
}
