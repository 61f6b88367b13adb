// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Maps and load-time constants of every program, and the per-CPU counters.
// Every program file includes it first (sonde.c, the test programs); each
// object gets its own copies of the maps.
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "sonde.h"
#include "arch.h"

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

// Requests for unwind information (RECORD_UNKNOWN) have a ring of their
// own: user space reads it apart from the samples, so a resolver slow to
// name frames (a big file's symbols) never holds back the tables that new
// processes and libraries need to be unwound at all.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 10);
} notices SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// sample_scratch is where the sampler builds a record. Past the deepest
// record's frames there is room for a stack snapshot (record.h,
// take_snapshot): its header, its two regions, and one page more, which
// the verifier's bounds on the page-by-page copy need. A per-CPU value
// holds at most 32 KiB: that bounds the regions.
struct sample_scratch {
	struct sample_record rec;
	struct stack_snapshot snap;
	__u8 bytes[SNAPSHOT_BYTES + SNAPSHOT_SECOND_BYTES + 4096];
};

// A sample is built here, then only its used part is copied to the ring buffer.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sample_scratch);
} scratch SEC(".maps");

// Tests only: every on-CPU stack carries a snapshot from its first frame,
// so that user space can unwind the same stack again and compare.
volatile const bool snapshot_all = false;

// Wake the reader only once this much data waits; it also polls on a
// deadline, so nothing waits long. One wake-up per record would cost the
// reader a context switch per sample. Set by the loader.
volatile const __u64 wakeup_bytes = 0;

// Mapping entries a CPU's recent stacks used, kept across stacks: a frame
// whose mapping is here skips the trie, whose lookup costs microseconds
// (its nodes are scattered in memory, each one a cache miss), and the look
// at the live VMA (bpf_find_vma), which costs a deferred unlock, a
// self-IPI: 10 µs and more in a virtual machine. An entry is of one
// generation of its process's entries (struct known_proc.gen) and is a
// trusted entry of the trie, or one bpf_find_vma found to describe the
// live VMA, or an anonymous VMA (JIT code) no entry covers. While the
// process's fingerprint holds (struct ustack_state.trust) its entries
// serve as they are. After its address space changed, an entry found by
// bpf_find_vma serves while the VMA it was found in still describes it:
// a few plain reads of the VMA (vma_unchanged) in place of the look. So
// an entry found stale needs no dropping: its process is no longer trusted
// (struct known_proc.fp), and the VMA it was cached with no longer holds.
#define MAPPING_CACHE 16

// Per-CPU state of the user-stack unwinder between its tail calls. What
// every stack reads or writes comes first, in about 3 KiB: the registers,
// the walkers' flags, the mapping cache and the stack's window. At 19 Hz
// all of it is cold, and a stack waits less the fewer cache lines and
// pages it spans. Each walker's own part, and the JVM's code blob cache,
// come after it.
struct ustack_state {
	__u64 pc;
	__u64 sp;
	__u64 fp;
	// aarch64: the link register (x30), which holds the frame's return
	// address where its row says so; valid (lr_valid) only in the frame
	// the sample or a signal interrupted.
	__u64 lr;
	__u32 lr_valid;
	__u32 lr_pad;
	__u32 runs;
	__u32 adjust;   // the current pc is a return address: look up pc - 1
	__u32 have_mi;  // mi holds the last mapping used (checked live): frames in it skip the trie
	__u32 trust;    // the process's mappings did not change since its entries were set
	__u32 row_base; // this unwinder's first entry in row_cache: its CPU's, and its half
	__u32 runtimes; // the process's runtimes (struct known_proc), RUNTIMES_ALL if not known
	__u64 gen;      // the generation of the process's entries (struct known_proc)
	__u64 mm;       // the process's struct mm_struct, once a cached VMA needed it
	__u32 frames_cfi; // frames of this stack unwound by a table row, counted at its end
	__u32 frames_fp;  // frames of this stack found by frame pointers, counted at its end
	// find_mapping found no entry for the current frame and could not
	// look at its VMA: it may be in a file user space knows nothing of.
	__u32 unplaced;
	// snap_set: the stack is to carry a snapshot from user frame
	// snap_frame on, whose registers follow (record.h, take_snapshot).
	__u32 snap_set;
	__u32 snap_frame;
	__u32 snap_pad;
	__u64 snap_pc; // with PC_FLAG_NO_ADJUST for an interrupted PC
	__u64 snap_sp;
	__u64 snap_fp;
	__u64 snap_lr; // the link register where it is the frame's return address (lr_valid), else 0
	// The second region (snap2_set): from the first frame pointer the
	// chain followed outside [snap_sp, snap_sp + SNAPSHOT_BYTES).
	__u64 snap2_sp;
	__u32 snap2_set;
	__u32 snap2_pad;
	struct mapping_info mi;
	// The last row step found in this stack: row last_row of table
	// last_table (0: none) covers [last_row.pc, last_next).
	__u32 last_table;
	__u32 last_pad;
	__u64 last_next;
	struct unwind_row last_row;
	// Each walker's per-stack state, side by side: begin_unwind sets it
	// at every stack and every frame reads it.
	__u64 py_frame;     // the next Python frame to report; 0: none
	__u64 php_ex;       // the next PHP frame (zend_execute_data) to report; 0: none
	__u64 perl_si;      // the stack info of the next Perl frame; 0: none left
	__u64 rb_cfp;       // the next Ruby control frame to report; 0: none
	__u64 rb_end;       // the end of the context's control frames (its VM stack's end)
	__u32 py_active;    // the process runs CPython: eval-loop frames are replaced
	__u32 py_walking;   // reporting the Python frames of one eval-loop frame
	__u32 py_run;       // Python frames reported for that eval-loop frame
	__u32 jvm_active;   // the process runs a JVM: code cache PCs are Java frames
	__u32 v8_active;    // the process runs V8: its code is walked by frame pointers
	__u32 php_active;   // the process runs PHP: execute_ex frames are replaced
	__u32 php_walking;  // reporting the PHP frames of one execute_ex frame
	__u32 php_run;      // PHP frames reported for that execute_ex frame
	__u32 perl_active;  // the process runs Perl: runops frames are replaced
	__u32 perl_walking; // reporting the Perl frames of one runops frame
	__u32 perl_run;     // Perl frames reported for that runops frame
	__u32 rb_active;    // the process runs Ruby: vm_exec_core frames are replaced
	__u32 rb_walking;   // reporting the Ruby frames of one vm_exec_core frame
	__u32 rb_run;       // Ruby frames reported for that vm_exec_core frame
	__u32 rb_any;       // Ruby frames reported in this stack
	__u32 walkers_pad;
	// The mapping cache (kept across stacks): entry i is mapping
	// cache_mi[i] of process cache_pid[i] (0: empty) in [cache_start[i],
	// cache_end[i]), of generation cache_gen[i]. cache_mi[i].vma is the
	// VMA it was found to describe, then [vstart, vend) (0: a trusted
	// entry, not looked at).
	__u32 cache_next; // the entry replaced next
	__u32 cache_pad;
	__u32 cache_pid[MAPPING_CACHE];
	__u64 cache_start[MAPPING_CACHE];
	__u64 cache_end[MAPPING_CACHE];
	__u64 cache_gen[MAPPING_CACHE];
	struct mapping_info cache_mi[MAPPING_CACHE];
	// A copy of the stack being walked, from win_base for win_len bytes
	// (0: none): the frames' return addresses and saved frame pointers are
	// read from it, one helper call for several frames (stack_read).
	__u64 win_base;
	__u32 win_len;
	__u32 win_pad;
	__u8 win[STACK_WINDOW];
	// The Python walker's state (python.h).
	struct python_proc py;
	// The HotSpot walker's state (jvm.h).
	struct jvm_proc jvm;
	__u64 jvm_slots[JVM_INTERP_WORDS]; // an interpreter frame's slots, as read
	// The V8 walker's state (v8.h).
	struct v8_proc v8;
	__u64 v8_slots[V8_FRAME_READ / 8]; // a V8 frame's block, as read
	// The PHP walker's state (php.h).
	__u64 php_r14; // the VM's registers at the sample: its frame and opline
	__u64 php_r15;
	struct php_proc php;
	__u64 php_ex_slots[PHP_EX_READ / 8]; // a zend_execute_data, as read
	__u64 php_fn_slots[PHP_FN_READ / 8]; // a zend_function, as read
	// The Perl walker's state (perl.h).
	__u64 perl_cxstack; // its contexts
	__u64 perl_cop;     // the next frame's current statement
	__s32 perl_cxix;    // the next context to look at (-1: the stack info's bottom)
	__u32 perl_si_type; // the stack info's PERLSI_* type
	struct perl_proc perl;
	__u64 perl_cx_slots[PERL_CX_READ / 8];   // a context, as read
	__u64 perl_cop_slots[PERL_COP_READ / 8]; // a statement, as read
	__u64 perl_si_slots[PERL_SI_READ / 8];   // a stack info, as read
	// The Ruby walker's state (ruby.h).
	struct ruby_proc rb;
	__u64 rb_cfp_slots[RUBY_CFP_READ / 8]; // a control frame, as read
	// The CPU's code blob cache (kept across stacks), direct-mapped by PC.
	struct jvm_blob_entry jvm_blobs[JVM_BLOB_CACHE];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ustack_state);
} unwind_scratch SEC(".maps");

// The CPUs' row caches (kept across stacks), two-way by file and offset:
// a return address seen before costs no search. A map of their own, as
// they outgrow a per-CPU value: a compile's deep stacks return to
// thousands of places, and each miss is a search of cold memory. A plain
// array, row_cache_stride entries a CPU, CPU after CPU (the loader sizes
// it by the possible CPUs): a look is one cache line, where a per-CPU
// array's is two, its pointer to the entry and the entry, each cold at the
// sampling rate. That line holds both ways of the set because the array is
// mappable: its values then start on a page, where a plain array's follow
// its header (at byte 312 on 6.18), which put every other entry across two
// lines. A CPU's on-CPU unwinder's entries are its first ROW_CACHE, the
// off-CPU one's the next (ustack_state.row_base): a sample can interrupt an
// off-CPU unwind on its CPU halfway through an entry.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 2 * ROW_CACHE); // resized by the loader
	__type(key, __u32);
	__type(value, struct row_cache_entry);
} row_cache SEC(".maps");

// row_cache_stride is the row cache's entries per CPU: ROW_CACHE, or twice
// that with off-CPU profiling on. Set by the loader.
volatile const __u32 row_cache_stride = 2 * ROW_CACHE;

// Executable mappings of every prepared process: (pid, address) -> how to
// unwind there. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536); // resized by the loader
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mapping_key);
	__type(value, struct mapping_info);
} mappings SEC(".maps");

// Processes user space has prepared (their mappings are in `mappings`): a
// fingerprint of their address space (mm_fingerprint) taken at the first
// stack after user space set the entries, and the entries' generation.
// While the fingerprint holds, the entries are trusted without looking at
// the live VMAs, which costs a deferred unlock (an IPI) per look.
//
// A process's entry is in known_slots, at slot pid & known_slot_mask,
// where that slot was free when user space set it; else (two live pids
// that share a slot) in known_pids. Every stack looks its process up, and
// at the sampling rate each look is cold: a slot is one cache line, where
// a hash look reads the map's header, a bucket and an element (on the
// node-like host of docs/performance.md, 0.67 µs a look against 1.68,
// about 0.9 µs of a 20 µs sampler run). Mappable,
// so that its values start on a page and no slot spans two lines (see
// row_cache).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 65536); // resized by the loader: a power of two
	__type(key, __u32);
	__type(value, struct known_proc);
} known_slots SEC(".maps");

// known_slot_mask is known_slots' entries less one. Set by the loader.
volatile const __u32 known_slot_mask = 65535;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); // resized by the loader
	__type(key, __u32);
	__type(value, struct known_proc);
} known_pids SEC(".maps");

// known_entry returns the entry of process tgid (not 0), or NULL where user
// space has not prepared it.
static __always_inline struct known_proc *known_entry(__u32 tgid)
{
	__u32 slot = tgid & known_slot_mask;
	struct known_proc *k = bpf_map_lookup_elem(&known_slots, &slot);
	if (k && k->pid == tgid)
		return k;
	return bpf_map_lookup_elem(&known_pids, &tgid);
}

// forget_known drops the entry of process tgid (not 0). A stack that holds
// the slot meanwhile may still write its fingerprint there: user space
// writes a slot whole when it takes it.
static __always_inline void forget_known(__u32 tgid)
{
	__u32 slot = tgid & known_slot_mask;
	struct known_proc *k = bpf_map_lookup_elem(&known_slots, &slot);
	if (k && k->pid == tgid)
		k->pid = 0;
	bpf_map_delete_elem(&known_pids, &tgid);
}

// filtering says whether the filters are on; without them pid_filter stays
// empty, and samples skip its lookup.
static __always_inline bool filtering(void)
{
	return filter_pending_ns != 0;
}

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

// What sampling cost each recently sampled process: kept only when the
// loader sets count_costs (tests read it), as it costs every sample an LRU
// lookup and three atomic adds.
volatile const bool count_costs = false;

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

// One inner array of rows per file, sized to that file's table. User space
// writes the rows through a mapping of the array (BPF_F_MMAPABLE), not an
// update per row: a big C++ binary's table has half a million.
struct table_rows {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP | BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct unwind_row);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_TABLES);
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

// x86-64's and aarch64's THREAD_SIZE (16 KiB) for finding the user registers at the top
// of a task's kernel stack on kernels without bpf_task_pt_regs (before 5.15).
// A kernel built with KASAN doubles it; there the registers read are wrong
// and the user stack is cut short, as no kernel of that age says its size.
#define THREAD_SIZE 16384

static __always_inline __u64 wakeup_flags(void)
{
	if (wakeup_bytes == 0 || bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

static __always_inline void count_n(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += n;
}

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1;
}

// Python processes and how to walk them. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct python_proc);
} python_procs SEC(".maps");

// JVM processes and how to walk them. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct jvm_proc);
} jvm_procs SEC(".maps");

// V8 processes and how to walk them. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct v8_proc);
} v8_procs SEC(".maps");

// PHP processes and how to walk them. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct php_proc);
} php_procs SEC(".maps");

// Ruby processes and how to walk them. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct ruby_proc);
} ruby_procs SEC(".maps");

// Perl processes and how to walk them. Filled by user space.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct perl_proc);
} perl_procs SEC(".maps");

// The thread state last found for a thread (host tid). Checked against
// the thread pointer on every use: a thread that exited and whose state
// was freed is looked up again.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} python_threads SEC(".maps");
