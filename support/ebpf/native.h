// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The native user-stack unwinder: from a thread's user registers it walks
// the stack frame by frame with the unwind tables user space loaded (CFI and
// Go pclntab rows), falling back to the frame-pointer chain where no table
// covers a PC. unwind_frame is one step of the frame loop: another
// unwinder (an interpreter's) hooks in there, keeping its per-stack state in
// struct ustack_state (maps.h).
#pragma once

#include "record.h"
#include "python.h"
#include "jvm.h"
#include "v8.h"
#include "php.h"
#include "perl.h"
#include "ruby.h"

// saved_user_regs finds the user-mode registers the current task saved on
// its last entry into the kernel. Kernel threads have none, nor has, for
// unwinding, a task without an address space: one exiting, whose memory
// the kernel may be unmapping under the walk (current_has_mm).
static __always_inline int saved_user_regs(struct ustack_state *st)
{
	if ((current_flags() & PF_KTHREAD) || !current_has_mm())
		return -1;
	struct pt_regs *regs;
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)) {
		regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	} else {
		struct task_struct *task = (struct task_struct *)bpf_get_current_task();
		void *stack = BPF_CORE_READ(task, stack);
		regs = (struct pt_regs *)(stack + THREAD_SIZE) - 1;
	}
#if ARCH_HAS_LR
	// The kernel's pt_regs starts with the user registers (user_pt_regs)
	// on every aarch64 kernel; the one below the stack's top is found by
	// its size, which has changed between versions.
	if (!bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs))
		regs = (struct pt_regs *)((void *)(regs + 1) - bpf_core_type_size(struct pt_regs));
	struct uapi_regs u;
	if (bpf_probe_read_kernel(&u, sizeof(u), regs))
		return -1;
	st->pc = ARCH_PC(&u);
	st->sp = ARCH_SP(&u);
	st->fp = ARCH_FP(&u);
	st->lr = ARCH_LR(&u);
	st->lr_valid = 1;
#else
	if (bpf_probe_read_kernel(&st->pc, sizeof(st->pc), &regs->ip) ||
	    bpf_probe_read_kernel(&st->sp, sizeof(st->sp), &regs->sp) ||
	    bpf_probe_read_kernel(&st->fp, sizeof(st->fp), &regs->bp))
		return -1;
#endif
	return 0;
}

// mm_fingerprint is the current process's mm_lock_seq, which every change
// of its mappings (mmap, munmap, mprotect, brk) advances; 0 where the kernel
// has none (before 6.13, whose counter has another type, or without per-VMA
// locks): there the entries are checked on every stack.
static __always_inline __u64 mm_fingerprint(void)
{
	if (!bpf_core_field_exists(((struct mm_struct *)0)->mm_lock_seq))
		return 0;
	// Kernels with this counter (6.13+) have bpf_get_current_task_btf:
	// plain loads, no helper calls.
	__u32 seq = bpf_get_current_task_btf()->mm->mm_lock_seq.sequence;
	return (__u64)seq | (1ULL << 63);
}

// begin_unwind prepares the unwinder's state for a new user stack, asking
// user space for the process's unwind information if it has none yet, or
// again if its mappings changed since.
static __always_inline void begin_unwind(struct ustack_state *st, __u32 tgid)
{
	// One look-up says which runtimes' maps to look in: each is a cold
	// cache line at 19 Hz, and most processes run none.
	struct known_proc *known = known_entry(tgid);
	__u32 rt = known ? known->runtimes : RUNTIMES_ALL;
	st->runtimes = rt;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	py_begin(st, rt, tgid, tid);
	jvm_begin(st, rt, tgid);
	v8_begin(st, rt, tgid);
	perl_begin(st, rt, tgid, tid);
	php_begin(st, rt, tgid);
	ruby_begin(st, rt, tgid);
	st->runs = 0;
	st->adjust = 0;
	st->win_len = 0;
	st->have_mi = 0;
	st->trust = 0;
	st->frames_cfi = 0;
	st->frames_fp = 0;
	st->last_table = 0;
	st->snap_set = 0;
	st->snap2_set = 0;
	if (snapshot_all && !st->py_active && !st->jvm_active && !st->v8_active &&
	    !st->php_active && !st->rb_active && !st->perl_active) {
		st->snap_set = 1;
		st->snap_frame = 0;
		st->snap_pc = st->pc | PC_FLAG_NO_ADJUST;
		st->snap_sp = st->sp;
		st->snap_fp = st->fp;
		st->snap_lr = st->lr_valid ? st->lr : 0;
	}
	st->gen = 0;
	st->mm = 0;
	if (!known) {
		notify_unknown(tgid, NOTIFY_GAP_NS);
		return;
	}
	st->gen = known->gen;
	__u64 fp = mm_fingerprint();
	if (fp == 0)
		return;
	if (known->fp == fp) {
		st->trust = 1;
	} else if (known->fp == 0) {
		// The first stack since the entries were set: checked, not
		// trusted. What the CPUs cached of the old ones is of another
		// generation.
		known->fp = fp;
	} else { // the mappings changed since, or an entry was stale: ask again
		// At most once per gap, as notify_unknown would, without a look
		// in its map at every stack meanwhile.
		__u64 now = bpf_ktime_get_ns();
		if (now - known->asked >= NOTIFY_GAP_NS) {
			known->asked = now;
			notify_unknown(tgid, NOTIFY_GAP_NS);
		}
	}
}

enum step_result {
	STEP_CONTINUE,
	STEP_DONE,
};

// page_entry returns entry p of the page index that follows a table's
// nrows rows (two entries per row slot), or ROW_PAGE_NONE where there is
// none (past the index, or a table without one).
static __always_inline __u32 page_entry(void *rows, __u32 nrows, __u32 p)
{
	__u32 slot = nrows + p / 2;
	__u32 *w = bpf_map_lookup_elem(rows, &slot);
	if (!w)
		return ROW_PAGE_NONE;
	return w[p & 1];
}

// find_row returns the row of the inner table covering rel, or NULL. The
// page index narrows the search to the rows of rel's page (1 KiB): two
// lookups and a few steps, not a search of the whole table, whose steps
// would each touch a distant cache line.
static __always_inline struct unwind_row *find_row(void *rows, __u32 nrows, __u32 rel, __u64 *next)
{
	__u32 lo = 0, hi = nrows;
	if (nrows == 0)
		return NULL;
	__u32 p = rel >> ROW_PAGE_SHIFT;
	__u32 first = page_entry(rows, nrows, p);
	if (first < nrows) {
		lo = first;
		__u32 last = page_entry(rows, nrows, p + 1);
		if (last < nrows) {
			// rows[last + 1] starts past the page: the row found covers
			// at least up to the page's end.
			hi = last + 1;
			*next = (__u64)(p + 1) << ROW_PAGE_SHIFT;
		}
	}
	struct unwind_row *found = bpf_map_lookup_elem(rows, &lo);
	if (!found || found->pc > rel)
		return NULL;
	// Invariant: rows[lo].pc <= rel < rows[hi].pc (hi == nrows: past the
	// end), and found is rows[lo].
	for (int i = 0; i < MAX_BSEARCH_STEPS; i++) {
		if (hi - lo <= 1)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		struct unwind_row *row = bpf_map_lookup_elem(rows, &mid);
		if (!row)
			return NULL;
		if (row->pc <= rel) {
			lo = mid;
			found = row;
		} else {
			hi = mid;
			*next = row->pc;
		}
	}
	return found;
}

// table_row returns the row of mapping mi's table that covers the PC
// lookup, or NULL: no mapping or table, the table is gone, or lookup is
// outside it (below its first row, or 4 GiB past its base). The row covers
// [its pc, *next) of the table (*next is 1 << 32 for the last row).
static __always_inline struct unwind_row *table_row(struct mapping_info *mi, __u64 lookup,
                                                    __u64 *next)
{
	*next = 1ULL << 32;
	if (!mi || mi->table_id == 0)
		return NULL;
	__u64 rel = lookup - mi->bias;
	__u32 table_id = mi->table_id;
	void *rows = bpf_map_lookup_elem(&tables, &table_id);
	if (!rows || rel > 0xffffffffULL)
		return NULL;
	return find_row(rows, mi->rows, (__u32)rel, next);
}

// row_cached says whether the cache entry c holds the row of offset rel
// of mapping mi's table.
static __always_inline bool row_cached(struct row_cache_entry *c, struct mapping_info *mi,
                                       __u64 rel)
{
	return c->file == mi->file && c->table_id == mi->table_id && c->rel == rel;
}

// keep_row makes row, of table table_id and covering offsets up to next,
// the stack's last row, and returns the stack's copy of it.
static __always_inline struct unwind_row *keep_row(struct ustack_state *st, __u32 table_id,
                                                   struct unwind_row *row, __u64 next)
{
	st->last_table = table_id;
	st->last_row = *row;
	st->last_next = next;
	return &st->last_row;
}

// cached_row returns the row of mapping mi's table covering lookup, from
// the CPU's row cache or else found by table_row and cached, and makes it
// the stack's last row. NULL: none. Either way of the set may hold it; a
// miss replaces the way used less recently, so two return addresses that
// share a set (a loop calling two functions) both stay. A mapping without
// a file handle, or an offset past 4 GiB, is searched and not cached.
static __always_inline struct unwind_row *cached_row(struct ustack_state *st,
                                                     struct mapping_info *mi, __u64 lookup)
{
	__u64 rel = lookup - mi->bias;
	__u32 set = ((__u32)rel ^ ((__u32)rel >> 11) ^ (mi->file * 0x9e3779b1)) &
	            (ROW_CACHE / ROW_CACHE_WAYS - 1);
	__u32 i = st->row_base + set * ROW_CACHE_WAYS;
	struct row_cache_entry *first = bpf_map_lookup_elem(&row_cache, &i);
	i++;
	struct row_cache_entry *second = bpf_map_lookup_elem(&row_cache, &i);
	if (!first || !second)
		return NULL;
	bool cacheable = mi->file != 0 && rel <= 0xffffffffULL;
	struct row_cache_entry *c;
	if (cacheable && row_cached(first, mi, rel)) {
		c = first;
		first->older = 1;
	} else if (cacheable && row_cached(second, mi, rel)) {
		c = second;
		first->older = 0;
	} else {
		__u64 next;
		struct unwind_row *row = table_row(mi, lookup, &next);
		if (!row)
			return NULL;
		if (!cacheable)
			return keep_row(st, mi->table_id, row, next);
		__u32 way = first->older;
		c = way ? second : first;
		c->file = 0;
		c->table_id = mi->table_id;
		c->rel = rel;
		c->next = next;
		c->row = *row;
		c->file = mi->file;
		first->older = !way;
	}
	return keep_row(st, c->table_id, &c->row, c->next);
}

// stack_read copies size bytes (8 or 16) of the user stack at addr into
// dst, from the stack's window when it holds them, else from a new window
// read at addr: STACK_WINDOW bytes, or up to the end of addr's page where
// the next one cannot be read (a stack's top). Frames lie next to each
// other, so one read serves several. 0 on success, as the helper.
static __always_inline long stack_read(struct ustack_state *st, void *dst, __u32 size, __u64 addr)
{
	__u64 off = addr - st->win_base;
	if (st->win_len == 0 || off > STACK_WINDOW - 16 || off + size > st->win_len) {
		st->win_len = 0;
		if (bpf_probe_read_user(st->win, STACK_WINDOW, (void *)addr) == 0) {
			st->win_len = STACK_WINDOW;
		} else {
			__u32 n = 4096 - (addr & 4095);
			if (n < 16 || n > STACK_WINDOW)
				return bpf_probe_read_user(dst, size, (void *)addr);
			if (bpf_probe_read_user(st->win, n, (void *)addr))
				return bpf_probe_read_user(dst, size, (void *)addr);
			st->win_len = n;
		}
		st->win_base = addr;
		off = 0;
	}
	off &= STACK_WINDOW - 1;
	if (off > STACK_WINDOW - 16)
		return -1;
	if (size == 16)
		__builtin_memcpy(dst, &st->win[off], 16);
	else
		__builtin_memcpy(dst, &st->win[off], 8);
	return 0;
}

// fp_step walks one frame-pointer link.
static __always_inline enum step_result fp_step(struct ustack_state *st, struct sample_record *s)
{
	__u64 link[2]; // saved rbp, return address
	// A frame pointer outside the snapshot's stack (a switch to another
	// stack): its memory there is copied too, for user space's walk,
	// whether or not this chain can follow it (a goroutine's stack lies
	// below the system stack cgo calls C on).
	if (st->snap_set && !st->snap2_set && st->fp != 0 &&
	    (st->fp < st->snap_sp || st->fp - st->snap_sp >= SNAPSHOT_BYTES)) {
		st->snap2_set = 1;
		st->snap2_sp = st->fp;
	}
	if (st->fp == 0 || st->fp < st->sp)
		return STEP_DONE;
	if (stack_read(st, link, sizeof(link), st->fp)) {
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_UNWIND_READ_ERR);
		return STEP_DONE;
	}
	// A frame pointer chain that walked into data ends here rather than
	// emitting a word of it as a caller.
	link[1] = arch_strip_ra(link[1]);
	if (link[1] >= USER_ADDR_END)
		return STEP_DONE;
	// On aarch64 the frame record is at the bottom of the callee's frame:
	// fp + 16 is only a lower bound of the caller's SP there (its fp,
	// which rows based on x29 use, is exact).
	st->sp = st->fp + 16;
	st->lr_valid = 0;
	st->fp = link[0];
	st->pc = link[1] | PC_FLAG_FRAME_POINTER;
	st->adjust = 1; // a return address, like the ones CFI finds
	s->flags |= SAMPLE_FRAME_POINTERS;
	st->frames_fp++;
	return STEP_CONTINUE;
}

// vma_info is what read_vma finds of the VMA covering an address.
struct vma_info {
	__u64 vma; // the struct vm_area_struct
	__u64 start;
	__u64 end;
	__u64 file_bias; // start - file offset
	__u64 inode;
	__u64 dev;
	__u32 seq; // vm_lock_seq (0: the kernel has none)
	bool file;
};

// VMA_SEQ_NONE is vm_lock_seq's value in a VMA no writer has locked since
// it was set up (UINT_MAX): a VMA freed and set up again for another
// mapping reads the same, so it proves nothing.
#define VMA_SEQ_NONE 0xffffffffU

// vma_seq is the VMA's vm_lock_seq, or 0 where the kernel has none (before
// 6.4, or built without per-VMA locks). Every change of a VMA (its range,
// file, offset; its removal; a free VMA set up for another mapping) is made
// under a write lock of the VMA, which sets it to the address space's
// sequence of that write (mm_lock_seq, which only grows), and a new VMA is
// write-locked as it is linked. So a VMA whose value read under the mmap
// lock (bpf_find_vma) is still there, and was not VMA_SEQ_NONE, is as it
// was then.
static __always_inline __u32 vma_seq(struct vm_area_struct *vma)
{
	if (!bpf_core_field_exists(vma->vm_lock_seq))
		return 0;
	return BPF_CORE_READ(vma, vm_lock_seq);
}

static long read_vma(struct task_struct *task, struct vm_area_struct *vma, struct vma_info *v)
{
	v->vma = (__u64)vma;
	v->start = BPF_CORE_READ(vma, vm_start);
	v->end = BPF_CORE_READ(vma, vm_end);
	v->seq = vma_seq(vma);
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
static __always_inline struct mapping_info *use_mapping(struct ustack_state *st,
                                                        struct mapping_info *mi)
{
	st->mi = *mi;
	st->have_mi = 1;
	return &st->mi;
}

// cache_mapping is use_mapping for a trusted entry of the trie (checked
// false), or one whose vma, vstart and vend were found to describe the
// live VMA (checked true), which it also keeps in the CPU's mapping cache.
static __always_inline struct mapping_info *cache_mapping(struct ustack_state *st, __u32 pid,
                                                          struct mapping_info *mi, bool checked)
{
	__u32 i = st->cache_next & (MAPPING_CACHE - 1);
	st->cache_next = i + 1;
	st->cache_pid[i] = pid;
	st->cache_gen[i] = st->gen;
	st->cache_start[i] = mi->start;
	st->cache_end[i] = mi->end;
	st->cache_mi[i] = *mi;
	if (!checked)
		st->cache_mi[i].vma = 0;
	return use_mapping(st, mi);
}

// vma_holds says whether the VMA at address at, found to span [vstart,
// vend) for mapping mi with vm_lock_seq seq, still describes it: the same
// range of the same process's address space, the same file at the same
// offset (none for anonymous memory). It reads the VMA without the mm
// lock, the lock bpf_find_vma takes and must hand to an IPI to let go of:
// a VMA freed since is read all the same (its memory stays a VMA, or is
// read as one without a fault), and anything it holds now other than what
// was found there fails the test. Where its vm_lock_seq is still seq
// (vma_seq) the VMA's first cache line is all it reads; else its file and
// offset are compared, two and three cold lines more.
static __always_inline bool vma_holds(struct ustack_state *st, __u64 at, __u64 vstart, __u64 vend,
                                      __u32 seq, struct mapping_info *mi)
{
	struct vm_area_struct *vma = (struct vm_area_struct *)at;
	if (!vma)
		return false;
	if (!st->mm)
		st->mm = (__u64)BPF_CORE_READ((struct task_struct *)bpf_get_current_task(), mm);
	if ((__u64)BPF_CORE_READ(vma, vm_mm) != st->mm || BPF_CORE_READ(vma, vm_start) != vstart ||
	    BPF_CORE_READ(vma, vm_end) != vend)
		return false;
	if (seq != 0 && seq != VMA_SEQ_NONE && vma_seq(vma) == seq)
		return true;
	struct file *f = BPF_CORE_READ(vma, vm_file);
	if (!f)
		return mi->inode == 0;
	return mi->inode != 0 && BPF_CORE_READ(f, f_inode, i_ino) == mi->inode &&
	       vstart - (BPF_CORE_READ(vma, vm_pgoff) << 12) == mi->file_bias;
}

// vma_unchanged is vma_holds for the VMA cache entry i was found in.
static __always_inline bool vma_unchanged(struct ustack_state *st, int i)
{
	struct mapping_info *mi = &st->cache_mi[i & (MAPPING_CACHE - 1)];
	return vma_holds(st, mi->vma, mi->vstart, mi->vend, mi->vseq, mi);
}

// cache_find returns the CPU's mapping cache entry of pid's current
// generation covering addr, or -1. The caller checks the one entry found
// (vma_unchanged), once, outside the loop: the verifier walks that check
// once, not once for every entry.
static __always_inline int cache_find(struct ustack_state *st, __u32 pid, __u64 addr)
{
	for (int i = 0; i < MAPPING_CACHE; i++) {
		if (st->cache_pid[i] == pid && st->cache_gen[i] == st->gen &&
		    addr >= st->cache_start[i] && addr < st->cache_end[i])
			return i;
	}
	return -1;
}

static __always_inline bool cached_anon_code(struct ustack_state *st, __u32 pid, __u64 addr)
{
	int i = cache_find(st, pid, addr);
	if (i < 0)
		return false;
	return st->cache_mi[i & (MAPPING_CACHE - 1)].inode == 0 &&
	       (st->trust || vma_unchanged(st, i));
}

// forked_entry returns the entry covering addr of the process the current
// one was forked from, or NULL. A child forked without exec runs in a copy
// of its parent's address space: until user space has set the child's own
// entries, where the live mapping cannot be looked at (the VMA check is
// busy: it runs once per stack; or the kernel has no bpf_find_vma), the
// parent's entries are as good as the child's own would be. Only while
// neither has exec'd since the fork, and the parent runs the same program
// (a reaper that adopted an orphan does not).
static __always_inline struct mapping_info *forked_entry(__u64 addr)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	struct task_struct *parent = BPF_CORE_READ(leader, real_parent);
	// self_exec_id moves at every exec; parent_exec_id is the parent's at
	// the fork.
	__u64 forked_at = BPF_CORE_READ(leader, parent_exec_id);
	if (!parent || BPF_CORE_READ(leader, self_exec_id) != forked_at ||
	    BPF_CORE_READ(parent, self_exec_id) != forked_at)
		return NULL;
	__u64 ino = BPF_CORE_READ(leader, mm, exe_file, f_inode, i_ino);
	if (ino == 0 || ino != BPF_CORE_READ(parent, mm, exe_file, f_inode, i_ino))
		return NULL;
	struct mapping_key key = {
	        .prefixlen = 96,
	        .pid = BPF_CORE_READ(parent, tgid),
	        .addr_be = bpf_cpu_to_be64(addr),
	};
	return bpf_map_lookup_elem(&mappings, &key);
}

// notify_mapped_since asks user space for the entries of pid, which maps
// mi since they were set. V8 maps its builtins a second time as it starts,
// just after the exec that had user space read the process: until user
// space knows that mapping, its frames in a stack that has had its one look
// at a VMA are taken for compiled code, and cannot be named. It is asked
// for as soon as a stale entry is, not once a second.
static __always_inline void notify_mapped_since(struct ustack_state *st, __u32 pid,
                                                struct mapping_info *mi)
{
	bool v8_copy = st->v8_active && mi->inode != 0 && mi->inode == st->v8.builtin_inode;
	notify_unknown(pid, v8_copy ? NOTIFY_STALE_GAP_NS : NOTIFY_GAP_NS);
}

// find_mapping returns the mapping of pid covering addr: the one cached in
// st when addr is in it, else the process's entry in the trie. Where the
// kernel lets us look at the live VMA (vma true: bpf_find_vma, 5.17+), the
// entry is used only if it still describes it; an entry missing or stale
// (dlclose then dlopen at the same place, exec) is replaced by the file's
// own table when user space has loaded one, and user space is asked to
// bring the process's entries up to date. NULL: no file mapping there.
static __always_inline struct mapping_info *find_mapping(struct ustack_state *st, __u32 pid,
                                                         __u64 addr, bool vma)
{
	st->unplaced = 0;
	if (st->have_mi && addr >= st->mi.start && addr < st->mi.end)
		return &st->mi;
	st->have_mi = 0;
	// The tail-call build keeps only trusted entries (it cannot look at a
	// VMA), and looks through them only for a trusted process.
	if (vma || st->trust) {
		int i = cache_find(st, pid, addr);
		if (i >= 0 && (st->trust || (vma && vma_unchanged(st, i)))) {
			struct mapping_info *c =
			        use_mapping(st, &st->cache_mi[i & (MAPPING_CACHE - 1)]);
			if (c->flags & MAPPING_UNSET)
				notify_mapped_since(st, pid, c);
			return c;
		}
	}
	struct mapping_key key = {.prefixlen = 96, .pid = pid, .addr_be = bpf_cpu_to_be64(addr)};
	struct mapping_info *mi = bpf_map_lookup_elem(&mappings, &key);
	if (!vma) {
		// A stale entry is trusted until user space replaces it.
		if (!mi) {
			notify_unknown(pid, NOTIFY_GAP_NS);
			mi = forked_entry(addr);
			if (!mi) {
				st->unplaced = 1;
				return NULL;
			}
		}
		return use_mapping(st, mi);
	}
	if (mi && st->trust)
		return cache_mapping(st, pid, mi, false);
	// The VMA a CPU found this entry in before, still as it was: the
	// entry holds without a look-up, whose unlock is an IPI.
	if (mi && mi->vma && vma_holds(st, mi->vma, mi->vstart, mi->vend, mi->vseq, mi))
		return cache_mapping(st, pid, mi, true);
	struct vma_info v = {};
	long err = bpf_find_vma(bpf_get_current_task_btf(), addr, read_vma, &v, 0);
	if (err == -16 /* EBUSY: the mm lock is taken, or this stack looked already */) {
		count(COUNTER_VMA_CHECK_BUSY);
		if (!mi) {
			notify_unknown(pid, NOTIFY_GAP_NS);
			mi = forked_entry(addr);
			if (!mi) {
				st->unplaced = 1;
				return NULL;
			}
		}
		return use_mapping(st, mi);
	}
	if (err)
		return NULL;
	if (mi && mi->inode == v.inode && mi->file_bias == v.file_bias && v.file) {
		mi->vma = v.vma;
		mi->vstart = v.start;
		mi->vend = v.end;
		mi->vseq = v.seq;
		return cache_mapping(st, pid, mi, true);
	}
	if (!mi && !v.file) {
		// Anonymous memory (JIT code): frame pointers, or the runtime's
		// walker.
		struct mapping_info anon = {.start = v.start,
		                            .end = v.end,
		                            .vma = v.vma,
		                            .vstart = v.start,
		                            .vend = v.end,
		                            .vseq = v.seq};
		return cache_mapping(st, pid, &anon, true);
	}
	// The VMA's range is known: the frames in it go without another look.
	struct mapping_info *c = &st->mi;
	__builtin_memset(c, 0, sizeof(*c));
	c->start = v.start;
	c->end = v.end;
	c->vma = v.vma;
	c->vstart = v.start;
	c->vend = v.end;
	c->vseq = v.seq;
	st->have_mi = 1;
	struct file_table *ft = NULL;
	if (v.file) {
		c->file_bias = v.file_bias;
		c->inode = v.inode;
		struct file_key fk = {.dev = v.dev, .inode = v.inode};
		ft = bpf_map_lookup_elem(&file_tables, &fk);
		if (ft) {
			c->bias = v.file_bias + ft->delta;
			c->table_id = ft->table_id;
			c->rows = ft->rows;
			c->file = ft->file;
			count(COUNTER_MAPPING_BY_FILE);
		}
	}
	if (mi) {
		count(COUNTER_MAPPING_STALE);
		// No trust in these entries until user space has set them again
		// (1 matches no fingerprint, and is not 0, which asks for one).
		struct known_proc *known = known_entry(pid);
		if (known && known->gen == st->gen)
			known->fp = 1;
		// Its file's own table unwinds it meanwhile: user space is asked
		// at the usual pace, not at once (a process that loads and
		// unloads libraries all the time would be read again each time).
		notify_unknown(pid, ft ? NOTIFY_GAP_NS : NOTIFY_STALE_GAP_NS);
		return c;
	}
	// A file mapped since user space set the process's entries (a library
	// just loaded, V8's second mapping of its builtins): the CPU keeps it
	// until they are set again, checked as any other.
	c->flags = MAPPING_UNSET;
	notify_mapped_since(st, pid, c);
	return cache_mapping(st, pid, c, true);
}

// want_snapshot marks the current frame, which is in mapping mi (NULL: not
// placed) where no table is loaded, as the one user space is to unwind on
// from, with a snapshot of the stack (take_snapshot): once per stack, where
// a table may come (a file without one yet, or a mapping find_mapping
// could not place), and not in CPython or JVM processes, whose walkers
// need the eBPF side's frames.
static __always_inline void want_snapshot(struct ustack_state *st, struct sample_record *s,
                                          struct mapping_info *mi, __u64 pc)
{
	// A PHP stack whose PHP frames are all reported (php_ex 0) is native
	// from here on: it may take one.
	if (st->py_active || st->jvm_active || st->v8_active ||
	    (st->php_active && (st->php_ex != 0 || st->php_walking)) ||
	    (st->rb_active && (st->rb_cfp != 0 || st->rb_walking)) ||
	    (st->perl_active && (st->perl_si != 0 || st->perl_walking))) {
		// No snapshot: a file mapped since the process was prepared (a
		// JNI library, a C extension) is unwound by frame pointers until
		// its table comes, so it is asked for sooner than the usual pace.
		if (mi && mi->inode != 0 && mi->table_id == 0 && !(mi->flags & MAPPING_NO_TABLE))
			notify_unknown(s->pid, NOTIFY_TABLE_GAP_NS);
		return;
	}
	if (st->snap_set)
		return;
	if (mi ? mi->inode == 0 || (mi->flags & MAPPING_NO_TABLE) : !st->unplaced)
		return;
	st->snap_set = 1;
	st->snap_frame = s->user_len - 1;
	st->snap_pc = pc | (st->adjust ? 0 : PC_FLAG_NO_ADJUST);
	st->snap_sp = st->sp;
	st->snap_fp = st->fp;
	st->snap_lr = st->lr_valid ? st->lr : 0;
}

// signal_step steps from a signal trampoline's frame, at whose stack pointer
// the kernel's signal frame lies, to the frame the signal interrupted, with
// the registers saved there.
static __always_inline enum step_result signal_step(struct ustack_state *st,
                                                    struct sample_record *s)
{
	__u64 regs[3];
	void *mc = (void *)(st->sp + SIG_MCONTEXT);
	if (bpf_probe_read_user(&regs[0], 8, mc + SIG_FP) ||
	    bpf_probe_read_user(&regs[1], 8, mc + SIG_SP) ||
	    bpf_probe_read_user(&regs[2], 8, mc + SIG_PC)) {
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_UNWIND_READ_ERR);
		return STEP_DONE;
	}
#if ARCH_HAS_LR
	st->lr_valid = !bpf_probe_read_user(&st->lr, 8, mc + SIG_LR);
#endif
	st->fp = regs[0];
	st->sp = regs[1];
	st->pc = regs[2] | PC_FLAG_NO_ADJUST;
	st->adjust = 0;
	st->frames_cfi++;
	return STEP_CONTINUE;
}

#if ARCH_HAS_LR
// ARCH_SIGRETURN is aarch64's signal trampoline, two instructions:
// "mov x8, #139 (__NR_rt_sigreturn); svc #0", as one little-endian word.
// The kernel's vDSO has it as __kernel_rt_sigreturn, the return address of
// every handler glibc installs (it sets no sa_restorer on aarch64), and
// gives neither it nor anything else of the vDSO unwind information since
// Linux 5.8 (its CFI is commented out in sigreturn.S; the vDSO is built
// without .eh_frame): debuggers and libgcc recognise the code, and so does
// the unwinder.
#define ARCH_SIGRETURN 0xd4000001d2801168ULL

// at_sigreturn says whether pc, in code no row describes (anonymous code,
// or a table's gap or unknown rule), is the start of the signal trampoline. A
// handler's return address is that start: the kernel sets x30 to it (or to
// the sa_restorer a C library gives, such as musl's __restore_rt, the same
// two instructions without CFI).
static __always_inline bool at_sigreturn(__u64 pc)
{
	__u64 code = 0;
	return !bpf_probe_read_user(&code, sizeof(code), (void *)pc) && code == ARCH_SIGRETURN;
}

// VDSO_TEXT_MAX bounds the vDSO's code from its base (two 4 KiB pages:
// Linux's arm64 vDSO is about 5 KiB); a PC past it is not taken for the
// vDSO's.
#define VDSO_TEXT_MAX 8192

// in_vdso says whether addr is in the vDSO at base, the current process's
// (the kernel keeps it in mm->context.vdso; 0: none).
static __always_inline bool in_vdso(__u64 base, __u64 addr)
{
	return base != 0 && addr >= base && addr - base < VDSO_TEXT_MAX;
}

// vdso_leaf_step unwinds a frame of the vDSO's functions (clock_gettime,
// gettimeofday, getrandom), which have no unwind table: Linux builds them
// with the compiler's default for aarch64, leaf functions without a frame
// record, so their return address is still in x30 and SP is their
// caller's. A frame-pointer step would skip the caller (glibc's
// __clock_gettime, Go's runtime.nanotime1). Only the interrupted frame has
// x30, and only where x30 leads out of the vDSO.
static __always_inline bool vdso_leaf_step(struct ustack_state *st, __u64 pc)
{
	if (!st->lr_valid)
		return false;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 base = (__u64)BPF_CORE_READ(task, mm, context.vdso);
	if (!in_vdso(base, pc))
		return false;
	__u64 ra = arch_strip_ra(st->lr);
	if (ra == 0 || ra >= USER_ADDR_END || in_vdso(base, ra))
		return false;
	st->pc = ra;
	st->adjust = 1;
	st->lr_valid = 0;
	st->frames_cfi++;
	return true;
}
#endif

// step unwinds one frame, in mapping mi (NULL: none known), from (pc, sp,
// fp) of a frame to its caller's.
static __always_inline enum step_result step(struct ustack_state *st, struct sample_record *s,
                                             struct mapping_info *mi, __u64 pc, __u64 lookup)
{
	if (!mi || mi->table_id == 0) {
		// No table (anonymous code, or a mapping not known yet: the
		// VMA check may be busy): CPython's perf trampoline (python.h) is
		// recognised by its code, the rest is frame pointers.
		if (st->py_active && py_trampoline_step(st, pc))
			return STEP_CONTINUE;
#if ARCH_HAS_LR
		// The vDSO, anonymous memory to the unwinder, has no table:
		// its signal trampoline is known by its code.
		if ((!mi || mi->inode == 0) && at_sigreturn(pc))
			return signal_step(st, s);
		if ((!mi || mi->inode == 0) && vdso_leaf_step(st, pc))
			return STEP_CONTINUE;
#endif
		want_snapshot(st, s, mi, pc);
		return fp_step(st, s);
	}
	// Frames of one function (recursion) or of one stretch of code share
	// a row: the last one found in this stack is reused while it covers
	// the PC, without a search.
	__u64 rel = lookup - mi->bias;
	struct unwind_row *row = &st->last_row;
	if (mi->table_id != st->last_table || rel < st->last_row.pc || rel >= st->last_next) {
		row = cached_row(st, mi, lookup);
		if (!row) {
#if ARCH_HAS_LR
			if (at_sigreturn(pc))
				return signal_step(st, s);
#endif
			return fp_step(st, s);
		}
	}

	__u8 rule = row->rule;
	__u64 cfa_offset = row->cfa_offset;
	if (rule & ROW_CFA_SCALED)
		cfa_offset <<= 3;
	__u8 fp_rule = (rule >> ROW_FP_RULE_SHIFT) & ROW_FP_RULE_MASK;
	__s64 fp_offset = (__s64)row->fp_offset8 * 8;
#if ARCH_HAS_LR
	if (rule & ROW_FP_FROM_BASE)
		fp_offset -= cfa_offset;
#endif
	__u8 cfa_type = rule & ROW_CFA_TYPE_MASK;
	__u64 cfa;
	// Where the return address is: at CFA - 8 (x86-64's call), else as
	// the aarch64 rules say (ra_at).
	__u64 ra_at = 0;
	switch (cfa_type) {
	case CFA_SP:
		cfa = st->sp + cfa_offset;
		ra_at = cfa - 8;
		break;
	case CFA_FP:
		cfa = st->fp + cfa_offset;
		ra_at = cfa - 8;
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + ((pc & 15) >= 11 ? 8 : 0);
		ra_at = cfa - 8;
		break;
#if ARCH_HAS_LR
	case CFA_SP_LR:
		cfa = st->sp + cfa_offset;
		break;
	case CFA_SP_RECORD:
		cfa = st->sp + cfa_offset;
		ra_at = cfa + fp_offset + 8;
		break;
	case CFA_FP_RECORD:
		cfa = st->fp + cfa_offset;
		ra_at = cfa + fp_offset + 8;
		break;
	case CFA_SP_RA:
		cfa = st->sp + cfa_offset;
		ra_at = cfa + fp_offset;
		break;
	case CFA_SP_GO:
		cfa = st->sp + cfa_offset;
		ra_at = st->sp;
		break;
	case CFA_GO_CGO: {
		// The goroutine's frame is found from the two words asmcgocall
		// saved at the system stack's SP: its g, whose first field is
		// g.stack {lo, hi}, and the depth of the frame below hi; or 0
		// and the frame's SP.
		__u64 saved[2];
		if (bpf_probe_read_user(saved, sizeof(saved), (void *)st->sp)) {
			s->flags |= SAMPLE_USER_READ_ERR;
			count(COUNTER_UNWIND_READ_ERR);
			return STEP_DONE;
		}
		__u64 frame_sp = saved[1];
		if (saved[0]) {
			__u64 hi;
			if (bpf_probe_read_user(&hi, sizeof(hi), (void *)(saved[0] + 8))) {
				s->flags |= SAMPLE_USER_READ_ERR;
				count(COUNTER_UNWIND_READ_ERR);
				return STEP_DONE;
			}
			frame_sp = hi - saved[1];
		}
		cfa = frame_sp + cfa_offset;
		ra_at = frame_sp;
		break;
	}
#endif
	case CFA_SIGNAL:
		return signal_step(st, s);
	case CFA_END:
		s->flags |= SAMPLE_USER_COMPLETE;
		return STEP_DONE;
	default:
#if ARCH_HAS_LR
		// A trampoline the file's CFI leaves out (musl's __restore_rt).
		if (at_sigreturn(pc))
			return signal_step(st, s);
#endif
		s->flags |= SAMPLE_USER_UNKNOWN_RULE;
		count(COUNTER_UNWIND_UNKNOWN_RULE);
		return STEP_DONE;
	}

	__u64 ra;
	if (ARCH_HAS_LR && cfa_type == CFA_SP_LR) {
		// The return address is still in x30: known only where the frame
		// was interrupted (the leaf, or the frame a signal interrupted).
		if (!st->lr_valid) {
			s->flags |= SAMPLE_USER_UNKNOWN_RULE;
			count(COUNTER_UNWIND_UNKNOWN_RULE);
			return STEP_DONE;
		}
		ra = st->lr;
	} else if (stack_read(st, &ra, sizeof(ra), ra_at)) {
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_UNWIND_READ_ERR);
		return STEP_DONE;
	}
	ra = arch_strip_ra(ra);
	if (ra >= USER_ADDR_END)
		return STEP_DONE; // not a return address: a wrong row or a smashed stack
	if (ARCH_HAS_LR && (cfa_type == CFA_SP_GO || cfa_type == CFA_GO_CGO)) {
		// Go saves the caller's x29 right below its return address.
		if (stack_read(st, &st->fp, sizeof(st->fp), ra_at - 8)) {
			s->flags |= SAMPLE_USER_READ_ERR;
			count(COUNTER_UNWIND_READ_ERR);
			return STEP_DONE;
		}
	} else if (fp_rule == FP_OFFSET) {
		if (stack_read(st, &st->fp, sizeof(st->fp), cfa + fp_offset)) {
			s->flags |= SAMPLE_USER_READ_ERR;
			count(COUNTER_UNWIND_READ_ERR);
			return STEP_DONE;
		}
	} else if (fp_rule == FP_UNKNOWN) {
		st->fp = 0;
	}
	st->sp = cfa;
	st->pc = ra;
	st->adjust = 1;
	st->lr_valid = 0;
	st->frames_cfi++;
	return STEP_CONTINUE;
}

enum frame_result {
	FRAME_NEXT, // go on with the caller's frame
	FRAME_STOP, // the stack is done (or cannot go on)
};

// unwind_frame reports the current frame into s (or the Python frames it
// ran) and steps to its caller.
static __always_inline enum frame_result unwind_frame(struct sample_record *s,
                                                      struct ustack_state *st, bool vma)
{
	__u32 ulen = s->user_len;
	__u32 idx = s->kernel_len + 2 * ulen;
	if (ulen >= MAX_USER_FRAMES || idx + 1 >= MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES) {
		s->flags |= SAMPLE_USER_TRUNCATED;
		return FRAME_STOP;
	}
	__u64 pc = st->pc & ~PC_FLAGS_MASK;
	if (pc == 0)
		return FRAME_STOP;
	__u64 lookup = st->adjust ? pc - 1 : pc;
	// The JVM walker is in the bpf_loop build alone (vma: 5.17+): the
	// tail-call build, whose frames the verifier checks one by one, has
	// no room for it.
	if (vma && jvm_in_code(st, lookup))
		return jvm_frame(st, s, idx, pc, lookup) ? FRAME_NEXT : FRAME_STOP;
	// So is the V8 walker. V8's code is its builtins and the code no file
	// backs.
	if (vma && v8_in_builtins(st, lookup))
		return v8_frame(st, s, idx, pc, lookup, true, false) == V8_NEXT ? FRAME_NEXT
		                                                                : FRAME_STOP;
	struct mapping_info *mi = find_mapping(st, s->pid, lookup, vma);
#if !defined(__TARGET_ARCH_arm64)
	// A leaf in compiled V8 code whose frame is not built yet.
	if (vma && st->v8_active && !st->adjust && mi && mi->inode == 0 &&
	    v8_prologue(st, s, idx, pc))
		return FRAME_NEXT;
#endif
	if (vma && v8_code(st, mi, lookup)) {
		int r = v8_frame(st, s, idx, pc, lookup, mi && mi->inode != 0, !mi && st->unplaced);
		if (r != V8_NOT_V8)
			return r == V8_NEXT ? FRAME_NEXT : FRAME_STOP;
	}
	// So is the PHP walker: an execute_ex frame shows as the PHP frames
	// it runs (php.h).
	if (vma && st->php_active &&
	    (st->php_walking || php_in_exec(st, lookup) || php_in_jit(st, lookup))) {
		if (!st->php_walking) {
			st->php_walking = 1;
			st->php_run = 0;
		}
		enum php_result r = php_frame(st, s, idx);
		if (r == PHP_MORE) {
			s->user_len = ulen + 1;
			return FRAME_NEXT;
		}
		st->php_walking = 0;
		if (r == PHP_LAST)
			s->user_len = ulen + 1;
		if (php_in_jit(st, lookup)) {
			// JIT code runs on execute_ex's frame: unwound from its body.
			st->pc = pc = lookup = st->php.exec_body;
			st->adjust = 0;
			mi = find_mapping(st, s->pid, lookup, vma);
		}
		// Where the VM has no table yet (a process just started) and no
		// PHP frame is left, it shows as a native frame too: the stack's
		// snapshot is unwound on from it in user space.
		if ((r == PHP_LAST || st->php_run > 0) &&
		    (st->php_ex != 0 || (mi && mi->table_id != 0)))
			return step(st, s, mi, pc, lookup) == STEP_DONE ? FRAME_STOP : FRAME_NEXT;
		if (r == PHP_LAST)
			return FRAME_NEXT; // the native frame takes the next slot
	}
	// So is the Ruby walker: a vm_exec_core frame shows as the Ruby
	// frames it runs (ruby.h).
	if (vma && st->rb_active && !st->rb_walking && !st->rb_any && ruby_in_core(st, lookup) &&
	    !(mi && mi->table_id != 0)) {
		// The VM's unwind table is not in the kernel yet (a process just
		// set up): its frames could not be stepped over, and a stack cut
		// after the first run would be worse than none. This stack stays
		// native, with a snapshot user space unwinds on from.
		count(COUNTER_RUBY_NO_TABLE);
		st->rb_active = 0;
		st->rb_cfp = 0;
	}
	if (vma && st->rb_active && (st->rb_walking || ruby_in_core(st, lookup))) {
		if (!st->rb_walking) {
			st->rb_walking = 1;
			st->rb_run = 0;
		}
		enum ruby_result r = ruby_frame(st, s, idx);
		if (r == RUBY_MORE) {
			s->user_len = ulen + 1;
			return FRAME_NEXT;
		}
		st->rb_walking = 0;
		if (r == RUBY_LAST)
			s->user_len = ulen + 1;
		// Where the VM has no table yet (a process just started) and no
		// Ruby frame is left, it shows as a native frame too: the stack's
		// snapshot is unwound on from it in user space.
		if ((r == RUBY_LAST || st->rb_run > 0) &&
		    (st->rb_cfp != 0 || (mi && mi->table_id != 0)))
			return step(st, s, mi, pc, lookup) == STEP_DONE ? FRAME_STOP : FRAME_NEXT;
		if (r == RUBY_LAST)
			return FRAME_NEXT; // the native frame takes the next slot
	}
	// So is the Perl walker: a runops frame shows as the Perl frames it
	// runs (perl.h).
	if (vma && st->perl_active && (st->perl_walking || perl_in_runops(st, lookup))) {
		if (!st->perl_walking) {
			st->perl_walking = 1;
			st->perl_run = 0;
		}
		enum perl_result r = perl_frame(st, s, idx);
		if (r == PERL_SKIP)
			return FRAME_NEXT; // the same native frame again: its next context
		if (r == PERL_MORE) {
			s->user_len = ulen + 1;
			return FRAME_NEXT;
		}
		st->perl_walking = 0;
		if (r == PERL_LAST)
			s->user_len = ulen + 1;
		// Where the loop has no table yet and no Perl frame is left, it
		// shows as a native frame too (see the PHP walker's).
		if ((r == PERL_LAST || st->perl_run > 0) &&
		    (st->perl_si != 0 || (mi && mi->table_id != 0)))
			return step(st, s, mi, pc, lookup) == STEP_DONE ? FRAME_STOP : FRAME_NEXT;
		if (r == PERL_LAST)
			return FRAME_NEXT; // the native frame takes the next slot
	}
	if (st->py_active && (st->py_walking || py_in_eval(st, lookup))) {
		if (!st->py_walking) {
			st->py_walking = 1;
			st->py_run = 0;
		}
		enum py_result r = py_frame(st, s, idx);
		if (r == PY_MORE) {
			s->user_len = ulen + 1;
			return FRAME_NEXT;
		}
		st->py_walking = 0;
		if (r == PY_LAST)
			s->user_len = ulen + 1;
		if (r == PY_LAST || st->py_run > 0) {
			// The eval-loop frame is shown as the Python frames it
			// ran: step past it.
			return step(st, s, mi, pc, lookup) == STEP_DONE ? FRAME_STOP : FRAME_NEXT;
		}
		// A run without Python frames: the eval-loop frame shows as a
		// native frame.
	}
	__u64 file_word = 0;
	if (mi && mi->file != 0 && pc - mi->file_bias <= 0xffffffffULL)
		file_word = ((__u64)mi->file << 32) | (pc - mi->file_bias);
	s->stack[idx] = st->pc | (st->adjust ? 0 : PC_FLAG_NO_ADJUST);
	s->stack[idx + 1] = file_word;
	s->user_len = ulen + 1;
	return step(st, s, mi, pc, lookup) == STEP_DONE ? FRAME_STOP : FRAME_NEXT;
}

// unwind_frames unwinds up to FRAMES_PER_RUN frames into s. It returns true
// when the stack needs another run.
static __always_inline bool unwind_frames(struct sample_record *s, struct ustack_state *st,
                                          bool vma)
{
	for (int i = 0; i < FRAMES_PER_RUN; i++) {
		if (unwind_frame(s, st, vma) == FRAME_STOP)
			return false;
	}
	return true;
}

// frame_loop is what bpf_loop hands each call of unwind_frame_checked.
struct frame_loop {
	struct sample_record *s;
	struct ustack_state *st;
	bool more; // the loop ended before the stack did
};

// unwind_frame_checked is one frame of the bpf_loop unwinder (5.17+, the
// kernels with bpf_find_vma): the verifier checks this body once for every
// frame, where the tail-call build's unrolled frames cost it a copy each.
static long unwind_frame_checked(__u32 i, void *data)
{
	struct frame_loop *l = data;
	if (unwind_frame(l->s, l->st, true) == FRAME_NEXT)
		return 0;
	l->more = false;
	return 1;
}

// send_stack counts the stack's frames and sends its record.
static __always_inline void send_stack(struct sample_record *s, struct ustack_state *st,
                                       bool offcpu)
{
	// Frames are counted once per stack, not per frame.
	if (st->frames_cfi)
		count_n(COUNTER_FRAMES_CFI, st->frames_cfi);
	if (st->frames_fp)
		count_n(COUNTER_FRAMES_FP, st->frames_fp);
	if (offcpu)
		send_offcpu_start(s);
	else
		send_sample(s, st->snap_set ? take_snapshot(s, st) : 0);
}

// unwind_run is the user-stack unwinder. Where the kernel has bpf_find_vma
// and bpf_loop (vma, 5.17+) one run unwinds the whole stack in a bpf_loop;
// elsewhere each run unwinds FRAMES_PER_RUN frames and tail-calls the next.
// offcpu picks the off-CPU path's scratch slots, program array and record;
// it is a constant at every call, so each build refers only to its own maps.
static __always_inline int unwind_run(void *ctx, bool vma, bool offcpu)
{
	__u32 zero = 0;
	struct sample_record *s =
	        bpf_map_lookup_elem(offcpu ? (void *)&offcpu_scratch : (void *)&scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(
	        offcpu ? (void *)&offcpu_unwind_scratch : (void *)&unwind_scratch, &zero);
	if (!s || !st)
		return 0;
	st->row_base = bpf_get_smp_processor_id() * row_cache_stride + (offcpu ? ROW_CACHE : 0);
	if (vma) {
		struct frame_loop l = {.s = s, .st = st, .more = true};
		bpf_loop(MAX_USER_FRAMES, unwind_frame_checked, &l, 0);
		if (l.more)
			s->flags |= SAMPLE_USER_TRUNCATED;
		send_stack(s, st, offcpu);
		return 0;
	}
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
	send_stack(s, st, offcpu);
	return 0;
}
