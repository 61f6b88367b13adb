// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Records and counters shared by Sonde's eBPF programs and its Go side. The Go
// types are generated from these definitions by bpf2go (-type), so a layout
// change here is a compile error there, not a silent mismatch.
#pragma once

// limits are the bounds the Go side shares (bpf2go -type limits).
enum limits {
	MAX_KERNEL_FRAMES = 127,
	MAX_USER_FRAMES = 256,
	// Unwind tables loaded at once; table ids are 1..MAX_TABLES-1.
	MAX_TABLES = 16384,
	// Rows of one table: the row search takes MAX_BSEARCH_STEPS steps.
	MAX_TABLE_ROWS = 1 << 24,
	// The most bytes of user stack a sample carries when its unwinding
	// met code whose table is not loaded yet (struct stack_snapshot), and
	// of the second region it may carry.
	SNAPSHOT_BYTES = 16384,
	SNAPSHOT_SECOND_BYTES = 4096,
};

// Where the kernel has no bpf_loop (before 5.17), the user-stack unwinder
// handles this many frames per program run and tail-calls itself for the
// next batch (tail calls keep 5.10 compatibility).
#define FRAMES_PER_RUN  8
#define MAX_UNWIND_RUNS (MAX_USER_FRAMES / FRAMES_PER_RUN)
// Rows per table are found by binary search in at most this many steps,
// enough for MAX_TABLE_ROWS rows.
#define MAX_BSEARCH_STEPS 24
_Static_assert(1 << MAX_BSEARCH_STEPS >= MAX_TABLE_ROWS, "row search too short for MAX_TABLE_ROWS");

// User PCs carry flags in bits the x86-64 user address space never uses.
enum pc_flags {
	// Found by the frame-pointer chain: no table covered the callee.
	PC_FLAG_FRAME_POINTER = 1ULL << 63,
	// An interrupted PC (the leaf, or after a signal frame), not a return
	// address.
	PC_FLAG_NO_ADJUST = 1ULL << 62,
	// A runtime's frame (an interpreter's or JIT's, not a native PC): the
	// PC word is an address the runtime's namer understands with this bit
	// set and the runtime and frame kind in bits RUNTIME_SHIFT and
	// RUNTIME_KIND_SHIFT; the file word is the runtime's own.
	// CPython (python.h), runtime 0: the code object's address; the file
	// word its instruction (f_lasti, or the instruction pointer from 3.11 on).
	// HotSpot (jvm.h), runtime 1: see enum jvm_frame_kind.
	PC_FLAG_RUNTIME = 1ULL << 61,
	PC_FLAGS_MASK = PC_FLAG_FRAME_POINTER | PC_FLAG_NO_ADJUST | PC_FLAG_RUNTIME,
	// A runtime frame's address: the low 48 bits.
	PC_RUNTIME_ADDR_MASK = (1ULL << 48) - 1,
};

// The runtime of a PC_FLAG_RUNTIME frame (4 bits at RUNTIME_SHIFT) and its
// kind of frame (4 bits at RUNTIME_KIND_SHIFT), both the runtime's own.
enum runtime_id {
	RUNTIME_SHIFT = 56,
	RUNTIME_KIND_SHIFT = 52,
	RUNTIME_PYTHON = 0,
	RUNTIME_JVM = 1,
	RUNTIME_V8 = 2,
	RUNTIME_PHP = 3,
	RUNTIME_PERL = 4,
	RUNTIME_RUBY = 5,
};

// The kinds of HotSpot frame jvm.h reports.
enum jvm_frame_kind {
	// An interpreted frame: the address is its Method*, the file word its
	// bytecode pointer (bcp), both read from the frame.
	JVM_FRAME_INTERPRETED = 1,
	// A frame of code in the code cache (compiled method, native wrapper,
	// stub): the address is its PC; the file word holds, read from the
	// PC's code blob at the sample, the blob's method pointer (low 48 bits)
	// and the low 16 bits of its compile id (high 16). For a stub both are
	// whatever its blob holds there.
	JVM_FRAME_COMPILED = 2,
};
// No user address reaches this, with 5-level page tables either: a return
// address read at or above it is data, not code, and would collide with the
// flags.
#define USER_ADDR_END (1ULL << 56)
#define TASK_COMM_LEN 16

enum record_type {
	RECORD_SAMPLE = 1,
	RECORD_EXEC = 2,
	RECORD_EXIT = 3,
	RECORD_UNKNOWN = 4,      // a sampled process or address has no unwind information yet
	RECORD_OFFCPU_START = 5, // a sample_record: a thread left the CPU to wait, with its stacks
	RECORD_OFFCPU_END = 6,   // an offcpu_end_record: that thread is back on a CPU
};

// sample_flags say how complete a sample's stacks are.
enum sample_flags {
	SAMPLE_KERNEL_STACK_ERR = 1 << 0, // bpf_get_stack failed for the kernel stack
	SAMPLE_USER_STACK_ERR = 1 << 1,   // the unwinder could not be started (failed tail call)
	SAMPLE_USER_TRUNCATED = 1 << 2,   // the user stack filled every slot
	SAMPLE_FRAME_POINTERS = 1 << 3, // at least one user frame came from the frame-pointer chain
	SAMPLE_USER_COMPLETE = 1 << 4,  // the unwinder reached the outermost frame (CFI says so)
	SAMPLE_USER_UNKNOWN_RULE = 1 << 5, // stopped at a PC whose CFI has no usable rule
	SAMPLE_USER_READ_ERR = 1 << 6,     // stopped: user memory could not be read
	// A struct stack_snapshot and the stack bytes it counts follow the
	// frames: user space finishes the unwinding from them.
	SAMPLE_SNAPSHOT = 1 << 7,
};

// stack_snapshot is what user space needs to unwind a stack on from the
// frame at which the eBPF unwinder met a file without a loaded table (a
// new program, a library just loaded, a table refused for want of budget):
// that frame's registers and a copy of the stack above its SP. Where the
// frame-pointer chain the eBPF side walked from there left that copy (a
// switch to another stack: cgo's system stack, a signal stack), a second
// region, from the first frame pointer outside it, is copied too. It
// follows the frames of a sample with SAMPLE_SNAPSHOT, the bytes of both
// regions right after it. The frames from user frame `frame` on are what
// the frame-pointer chain found, which user space replaces.
struct stack_snapshot {
	__u64 pc; // the frame's PC, with PC_FLAG_NO_ADJUST for an interrupted one
	__u64 sp;
	__u64 fp;
	__u64 sp2;   // where the second region starts (bytes2 0: none)
	__u16 frame; // index of the frame among the user frames
	__u16 pad;
	__u32 bytes;  // stack bytes copied from sp on
	__u32 bytes2; // stack bytes copied from sp2 on, after those
	__u32 pad2;
	__u64 lr; // aarch64: the link register where it holds the frame's return address; 0: not known
};

// Unwind rules, as internal/unwind derives them from CFI. The return
// address is at CFA - 8 for CFA_SP, CFA_FP and CFA_PLT (x86-64); aarch64's
// rules say where it is.
enum cfa_type {
	CFA_UNKNOWN = 0,
	CFA_SP = 1,
	CFA_FP = 2,
	CFA_PLT = 3,
	CFA_SIGNAL = 4,
	CFA_END = 5,
	// aarch64: CFA = SP + offset; the return address is still in the link
	// register (a leaf, a prologue before x30 is stored, a PLT stub).
	CFA_SP_LR = 6,
	// aarch64: CFA = SP (FP) + offset; the caller's x29 is at CFA + fp
	// offset and the return address right above it (a frame record).
	CFA_SP_RECORD = 7,
	CFA_FP_RECORD = 8,
	// aarch64: CFA = SP + offset; the return address is at CFA + fp offset
	// and the fp rule says what became of x29 (same, or unknown).
	CFA_SP_RA = 9,
	// aarch64 Go: CFA = SP + offset; the return address is at SP and the
	// caller's x29 right below it.
	CFA_SP_GO = 10,
	// aarch64 Go: runtime.asmcgocall's call of C on the system stack. At
	// SP are the goroutine's g (0 where it called from the system stack)
	// and its stack depth below g.stack.hi (with no g, the SP itself);
	// from the SP they give on, the frame is CFA_SP_GO's.
	CFA_GO_CGO = 11,
};

enum fp_rule {
	FP_SAME = 0,
	FP_OFFSET = 1,
	FP_UNKNOWN = 2,
};

// row_bits lay out unwind_row.rule: the cfa_type, the fp_rule, whether
// cfa_offset counts 8-byte words rather than bytes, and (aarch64 rules)
// whether fp_offset8 counts from the CFA's register rather than the CFA:
// GCC saves x29 and x30 at the bottom of a big frame, far below the CFA.
enum row_bits {
	ROW_CFA_TYPE_MASK = 0x0f,
	ROW_FP_RULE_SHIFT = 4,
	ROW_FP_RULE_MASK = 0x03,
	ROW_CFA_SCALED = 0x40,
	ROW_FP_FROM_BASE = 0x80,
};

// A table's rows are followed by its page index: entry p (two per row
// slot, the low 32 bits first) is the index of the row covering page p's
// first byte, pc p << ROW_PAGE_SHIFT, or ROW_PAGE_NONE past the index.
// Pages of 1 KiB: a row search is a chain of cold loads, and a page a
// quarter of 4 KiB takes two steps off it, for an index of 4 bytes per KiB
// of code (docs/performance.md: 1.8 µs of a 23 µs run on the node-like
// host, where a stack makes two or three searches).
enum row_page {
	ROW_PAGE_SHIFT = 10,
	ROW_PAGE_NONE = 0xffffffff,
};

// unwind_row covers [pc, next row's pc) of one file's table; pc is relative
// to the table's base (see mapping_info.bias). It takes 8 bytes, the
// smallest step of an array map's values: tables of big programs run to
// millions of rows. CFA = register + cfa_offset (times 8 with
// ROW_CFA_SCALED); the caller's RBP is at CFA + 8 * fp_offset8.
struct unwind_row {
	__u32 pc;
	__u16 cfa_offset;
	__s8 fp_offset8;
	__u8 rule;
};

// mapping_key finds the executable mapping covering addr in process pid in
// an LPM trie. prefixlen counts bits from pid on; addr is big-endian so that
// prefixes of the address are prefixes of the key.
struct mapping_key {
	__u32 prefixlen;
	__u32 pid;
	__u64 addr_be;
};

// mapping_info says how to unwind in one mapping, [start, end): row pc =
// addr - bias; table_id 0 means no table (yet): walk frame pointers. It also
// names the mapped file, so frames leave as (file, offset): file is user
// space's handle for the file (0: none), offset = addr - file_bias. inode is
// the file's, checked against the live mapping where the kernel allows, so a
// stale entry (dlclose, exec) is never trusted.
struct mapping_info {
	__u64 start;
	__u64 end;
	__u64 bias;
	__u64 file_bias;
	__u64 inode;
	__u32 table_id;
	__u32 rows;
	__u32 file;
	__u32 flags; // enum mapping_info_flags
	// The VMA a CPU last found this entry to describe, with its range
	// [vstart, vend) then (0: none yet). Written by the eBPF side, on the
	// entry itself: every CPU checks it with a few plain reads where it
	// would otherwise look the VMA up (vma_unchanged).
	__u64 vma;
	__u64 vstart;
	__u64 vend;
	// The VMA's vm_lock_seq then (kernels with per-VMA locks; 0: not
	// known): the kernel writes it at every change of the VMA, at its
	// reuse for another, so while it holds, the VMA's first cache line
	// says the VMA is unchanged, without the reads of its file.
	__u32 vseq;
	__u32 pad;
};

// known_proc is what the unwinder knows of a process user space has
// prepared (known_pids in maps.h).
struct known_proc {
	// A fingerprint of its address space (mm_fingerprint) taken at its
	// first stack after user space set its entries (0 until then; 1: an
	// entry was found stale). While it holds, the entries are trusted.
	__u64 fp;
	// Which setting of its entries this is: user space numbers each one.
	// A CPU's cached mappings of the process are of one generation.
	__u64 gen;
	// The runtimes user space found in it, a bit (1 << enum runtime_id)
	// each: only their maps are looked up at its stacks.
	__u32 runtimes;
	// The process this is the entry of: a slot of known_slots is pid's
	// only while it says so (0: a free slot).
	__u32 pid;
	// When a stack last asked user space about the process for a change
	// of its mappings: a hot copy of notified's entry, which stacks in
	// between need not look up.
	__u64 asked;
};

// RUNTIMES_ALL stands for a process user space has not prepared yet: every
// runtime's map is looked up, as its walker may have been set first.
#define RUNTIMES_ALL        0xffffffffU
#define HAS_RUNTIME(rt, id) (((rt) >> (id)) & 1)

// mapping_flags qualify a mapping_info.
enum mapping_info_flags {
	// The file will never have a table (no CFI, or its table cannot be
	// built): a stack that meets it takes no snapshot.
	MAPPING_NO_TABLE = 1 << 0,
	// Not user space's entry: a file mapped since the process's entries
	// were set, which a CPU keeps in its mapping cache meanwhile. Each
	// stack that uses it asks user space for the entries again (at the
	// pace notify_unknown allows).
	MAPPING_UNSET = 1 << 1,
};

// file_key names a mapped file as the kernel knows it: the device of its
// file system (kernel encoding) and its inode.
struct file_key {
	__u64 dev;
	__u64 inode;
};

// file_table says how to unwind in any mapping of one file, whichever
// process maps it: row pc = addr - (file_bias + delta), where file_bias is
// the mapping's start minus its file offset. Frames report file.
struct file_table {
	__s64 delta;
	__u32 table_id;
	__u32 rows;
	__u32 file;
	__u32 pad;
};

// pid_stats counts, per process, what sampling it cost: samples sent,
// samples dropped by the filters before any work, and user frames unwound.
struct pid_stats {
	__u64 samples;
	__u64 filtered;
	__u64 frames;
};

// sample_record is one on-CPU sample. Only the used part of stack[] is sent:
// kernel frames first (kernel_len PCs), then user frames (user_len), each
// leaf first. A user frame takes two words: its PC (with PC_FLAG_* bits), then
// its file word: the file's handle in the high 32 bits and the offset in that
// file in the low 32, or 0 when the frame's file is not known.
struct sample_record {
	__u32 type;
	__u32 pid; // thread group id as the host sees it
	__u32 tid;
	__u32 cpu;
	__u64 ktime; // bpf_ktime_get_ns (CLOCK_MONOTONIC)
	char comm[TASK_COMM_LEN];
	__u16 kernel_len;
	__u16 user_len;
	__u32 flags;
	__u64 stack[MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES];
};

// offcpu_end_flags qualify an offcpu_end_record.
enum offcpu_end_flags {
	// The wait was shorter than off_cpu_min_duration: user space drops its
	// start record rather than keeping it until it expires.
	OFFCPU_END_SHORT = 1 << 0,
};

// offcpu_end_record closes the off-CPU start record of thread tid whose
// ktime is start: the thread was off the CPU for duration nanoseconds.
struct offcpu_end_record {
	__u32 type;
	__u32 pid;
	__u32 tid;
	__u32 flags;
	__u64 start;
	__u64 duration;
};

// task_record tells user space a process exec'd or exited, or (RECORD_UNKNOWN)
// that it was sampled without unwind information.
struct task_record {
	__u32 type;
	__u32 pid;
	__u64 ktime;
	char comm[TASK_COMM_LEN];
};

// counter indexes the per-CPU counters map. Every drop has a counter.
enum counter {
	COUNTER_SAMPLES = 0,          // perf events that fired
	COUNTER_SAMPLES_SENT,         // sample records written to the ring buffer
	COUNTER_SAMPLES_LOST,         // ring buffer full: sample dropped
	COUNTER_IDLE_SKIPPED,         // the CPU was idle (pid 0)
	COUNTER_KERNEL_STACK_ERR,     // kernel stack could not be read
	COUNTER_TASK_EVENTS_SENT,     // exec/exit records written
	COUNTER_TASK_EVENTS_LOST,     // ring buffer full: exec/exit record dropped
	COUNTER_UNKNOWN_SENT,         // unknown-process notifications written
	COUNTER_UNKNOWN_LOST,         // ring buffer full: notification dropped
	COUNTER_FRAMES_CFI,           // user frames unwound with a CFI row
	COUNTER_FRAMES_FP,            // user frames unwound by frame pointers (no table)
	COUNTER_UNWIND_UNKNOWN_RULE,  // stacks stopped at a PC without a usable rule
	COUNTER_UNWIND_READ_ERR,      // stacks stopped because user memory was unreadable
	COUNTER_UNWIND_TAIL_CALL_ERR, // a tail call failed: stack cut short
	COUNTER_FILTERED,             // samples of processes the filters exclude: no work done
	COUNTER_KTHREAD_SKIPPED,      // samples of kernel threads (include_kernel_threads off)
	COUNTER_MAPPING_STALE,        // a mapping entry no longer matched the live mapping
	COUNTER_VMA_CHECK_BUSY,       // the live mapping could not be checked (lock busy)
	COUNTER_MAPPING_BY_FILE, // mappings unwound from their file's table, without a process entry
	COUNTER_OFFCPU_FILTERED, // selected threads of processes the filters exclude: no work done
	COUNTER_OFFCPU_STARTS_SENT, // off-CPU start records written
	COUNTER_OFFCPU_STARTS_LOST, // ring buffer full: off-CPU start record dropped
	COUNTER_OFFCPU_MAP_FULL,    // the start could not be remembered: its end is never sent
	COUNTER_OFFCPU_ENDS_SENT,   // off-CPU end records written (short ones included)
	COUNTER_OFFCPU_ENDS_LOST,   // ring buffer full: off-CPU end record dropped
	COUNTER_OFFCPU_SHORT, // waits shorter than off_cpu_min_duration (sent flagged, then dropped)
	COUNTER_PY_SAMPLES,   // user stacks of Python processes (python_procs)
	COUNTER_PY_FRAMES,    // Python frames emitted
	COUNTER_PY_NO_THREAD, // the sampled thread's state was not in the interpreter's first threads
	COUNTER_PY_READ_ERR,       // a Python frame chain could not be read: walk ended
	COUNTER_PY_BAD_FRAME,      // a Python frame held no code object: walk ended
	COUNTER_JVM_SAMPLES,       // user stacks of JVM processes (jvm_procs)
	COUNTER_JVM_FRAMES,        // Java frames emitted (interpreted and code blobs)
	COUNTER_JVM_NO_BLOB,       // a PC in the code cache with no code blob found: walk ended
	COUNTER_JVM_READ_ERR,      // a Java frame could not be read: walk ended
	COUNTER_V8_SAMPLES,        // user stacks of V8 processes (v8_procs)
	COUNTER_V8_FRAMES,         // V8 frames emitted (JavaScript and typed frames)
	COUNTER_V8_NOT_JS,         // a frame in V8 code with no JSFunction: unwound as native
	COUNTER_V8_READ_ERR,       // a V8 frame could not be read: walk ended
	COUNTER_SNAPSHOTS,         // samples sent with a stack snapshot
	COUNTER_SNAPSHOTS_SKIPPED, // snapshots not taken: the ring buffer was half full
	COUNTER_PHP_SAMPLES,       // user stacks of PHP processes (php_procs)
	COUNTER_PHP_FRAMES,        // PHP frames emitted
	COUNTER_PHP_READ_ERR,      // a PHP frame could not be read: walk ended
	COUNTER_PHP_BAD_FRAME,     // a PHP frame held no function the walker knows: walk ended
	COUNTER_RUBY_SAMPLES,      // user stacks of Ruby processes (ruby_procs)
	COUNTER_RUBY_FRAMES,       // Ruby frames emitted
	COUNTER_RUBY_READ_ERR,     // a Ruby context or frame could not be read: walk ended
	COUNTER_RUBY_BAD_FRAME,    // a Ruby context or frame made no sense: walk ended
	COUNTER_RUBY_NO_TABLE, // Ruby stacks left native: the VM's unwind table was not loaded yet
	COUNTER_PERL_SAMPLES,  // user stacks of Perl processes' main threads (perl_procs)
	COUNTER_PERL_FRAMES,   // Perl frames emitted
	COUNTER_PERL_READ_ERR, // a Perl context or statement could not be read: walk ended
	COUNTER_PERL_BAD_FRAME, // a Perl context made no sense (a bad pointer, too many skipped): walk ended
	COUNTER_MAX,
};

// The code heaps of one JVM the walker searches (JDK 9+ has up to three).
#define JVM_MAX_HEAPS 4
// Hops through a code heap's segment map to a blob's start; each hop goes
// back up to 254 segments.
#define JVM_SEGMAP_HOPS 24

// jvm_heap is one code heap: the blob holding pc is found from the byte of
// segment (pc - low) >> seg_shift in segmap (0: a block starts there; n:
// go back n segments; 0xff: free).
struct jvm_heap {
	__u64 low; // reserved [low, high)
	__u64 high;
	__u64 segmap;
	__u32 seg_shift;
	__u32 pad;
};

// jvm_proc tells the HotSpot walker (jvm.h) where one JVM keeps its code
// and how its version lays out what the walker reads; user space derives
// it from the JVM's own vmStructs tables. Offsets are in bytes.
struct jvm_proc {
	__u64 code_low; // the code cache: every code blob is in [code_low, code_high)
	__u64 code_high;
	__u64 interp_start; // the template interpreter's code
	__u64 interp_end;
	struct jvm_heap heaps[JVM_MAX_HEAPS];
	__u32 nheaps;
	__u16 heap_block_size;     // a blob starts this far after its heap block
	__u16 heap_block_used;     // HeapBlock::Header::_used (bool): a freed block keeps its marks
	__u16 blob_frame_size;     // CodeBlob::_frame_size (int, words)
	__u16 blob_frame_complete; // CodeBlob::_frame_complete_offset (from code begin)
	__u16 blob_code_begin;     // CodeBlob::_code_begin (pointer) or _code_offset (int)
	__u16 nmethod_compile_id;  // nmethod::_compile_id (int)
	__u16 nmethod_method;      // nmethod::_method (Method*)
	__u8 code_begin_is_offset;
	__u8 frame_complete_short; // _frame_complete_offset is an int16 (JDK 23+), else an int
	__s16 interp_method;       // interpreter frame slots, from its frame pointer
	__s16 interp_bcp;
	__s16 interp_sender_sp;
	// gen is unique to each setting of the entry (the tracer numbers
	// them): what a CPU cached of one JVM is never taken for another's.
	__u32 gen;
};

// The interpreter frame's slots are read in one go, from this far below
// its frame pointer up to its return address.
#define JVM_INTERP_BELOW 112
#define JVM_INTERP_WORDS ((JVM_INTERP_BELOW + 16) / 8)

// The embedded builtins' ranges of one V8 (v8.h).
#define V8_MAX_BUILTINS 4
// Bytes of a V8 frame read in one go, from v8_proc.read_start below its
// frame pointer: the slots the walker reads and the caller's fp and
// return address.
#define V8_FRAME_READ 64

// v8_proc tells the V8 walker (v8.h) where one process keeps V8's
// embedded builtins and how its version lays out frames and the
// JSFunction; user space derives it from V8's v8dbg_* metadata
// (internal/v8's Kernel, whose documentation is the walk's contract).
struct v8_proc {
	__u64 builtin_start[V8_MAX_BUILTINS]; // [start, end): embedded builtins code
	__u64 builtin_end[V8_MAX_BUILTINS];
	// The same code by file: a PC in a mapping of file builtin_inode
	// whose file offset is in [builtin_off_start, builtin_off_end), where
	// V8 maps the builtins again (Node 22 on) or the process maps the
	// binary anew. 0, 0: none.
	__u64 builtin_inode;
	__u64 builtin_off_start;
	__u64 builtin_off_end;
	__u32 nbuiltins;
	__s16 read_start; // the frame block: [fp + read_start, + V8_FRAME_READ)
	__s16 fp_marker;  // slots, from fp: context or frame type marker
	__s16 fp_function;
	__s16 fp_bytecode_array;
	__s16 fp_bytecode_offset;
	__u16 function_shared; // JSFunction's SharedFunctionInfo field
	__u8 heap_tag;         // a tagged pointer p: p & heap_tag_mask == heap_tag
	__u8 heap_tag_mask;
	__u8 smi_tag_mask; // a Smi (or frame marker) w: w & smi_tag_mask == 0
	__u8 smi_shift;    // a Smi's value is w >> smi_shift
	__u8 marker_shift; // a typed frame's type is marker >> marker_shift
	__u8 pad[3];
};

// How a V8 frame leaves (internal/v8's FrameKind).
enum v8_frame_kind {
	V8_FRAME_INTERPRETED = 1, // (sfi, offset slot << 32 | bytecode array's low half)
	V8_FRAME_COMPILED = 2,    // (sfi, pc)
	V8_FRAME_BUILTIN = 3,     // (sfi, pc)
	V8_FRAME_STUB = 4,        // (pc, frame type)
};

// Entries of a CPU's row cache (native.h); a power of two. They go in
// sets of ROW_CACHE_WAYS, one 64-byte cache line a set.
#define ROW_CACHE      2048
#define ROW_CACHE_WAYS 2

// How much of a user stack one read copies for the unwinder (native.h,
// stack_read): a power of two.
#define STACK_WINDOW 1024

// row_cache_entry is the row one CPU found for offset rel of the table
// table_id of file (a handle user space never reuses): it covers [row.pc,
// next) of the table. file 0: empty. older, in a set's first entry only,
// is the way a miss replaces: the one used less recently.
struct row_cache_entry {
	__u32 file;
	__u32 table_id;
	__u32 rel;
	__u32 older;
	__u64 next;
	struct unwind_row row;
};

// Entries of a CPU's code blob cache (jvm.h); a power of two.
#define JVM_BLOB_CACHE 128

// How the leaf's frame in a code blob is stepped, found once per PC.
enum jvm_leaf {
	JVM_LEAF_UNKNOWN = 0,
	JVM_LEAF_BUILT = 1, // the frame is built: step by the blob's frame size
	JVM_LEAF_TOP = 2,   // in a prologue or at a return: the return address is on top
	JVM_LEAF_POP = 3, // at pop %rbp: the saved frame pointer is on top, then the return address
};

// jvm_blob_entry is what one CPU found of the code blob holding a lookup
// PC of JVM gen: it is used again while the blob still holds compile_id.
struct jvm_blob_entry {
	__u64 pc; // the lookup PC; 0: empty
	__u64 blob;
	__u64 method;
	__u32 gen;
	__s32 compile_id;
	__s32 frame_words;
	__u8 leaf; // enum jvm_leaf: for the PC as a leaf
	__u8 pad[3];
};

// Bytes of a zend_execute_data and of a zend_function the PHP walker
// (php.h) reads in one go: every field it reads of each is in them.
#define PHP_EX_READ 56
#define PHP_FN_READ 112

// php_proc tells the PHP walker (php.h) where one PHP process (the Zend
// Engine, NTS) keeps its current frame and VM, and how its version lays
// out what the walker reads; user space derives it from the binary's
// symbols and internal/php's per-version table. Offsets are in bytes.
struct php_proc {
	__u64 current_ex; // &executor_globals.current_execute_data
	__u64 exec_start; // execute_ex: [exec_start, exec_end)
	__u64 exec_end;
	// opcache's JIT buffer, [jit_start, jit_end) (0, 0: none). Its code
	// runs on execute_ex's frame: a PC there is unwound as exec_body, a
	// PC of execute_ex's body.
	__u64 jit_start;
	__u64 jit_end;
	__u64 exec_body;
	__u32 call_code; // ZEND_CALL_CODE in the frame's call info
	__u32 call_top;  // ZEND_CALL_TOP: the frame's execute_ex returns with it
	__u16 ex_opline; // zend_execute_data fields (< PHP_EX_READ)
	__u16 ex_func;
	__u16 ex_call_info; // This.u1.type_info
	__u16 ex_prev;
	__u16 fn_type; // zend_function fields (< PHP_FN_READ)
	__u16 fn_name;
	__u16 op_last;
	__u16 op_opcodes;
	__u16 op_size; // sizeof(zend_op)
	__u16 op_lineno;
	__u16 op_filename; // zend_op_array.filename (read apart: code frames only)
	__u16 pad;
};

// How a PHP frame leaves (internal/php's Kind*). A function's: the address
// is its zend_function; the file word holds the line in its high 32 bits
// (0: none) and in its low 32 the low half of the function's opcodes (user
// code) or name (internal functions), which user space checks the
// function against. A file's top-level code (main, include, eval), whose
// op_array lives only while it runs: the address is its file name (a
// zend_string, interned for the process's life), the low 32 bits of the
// file word the low half of that address.
enum php_frame_kind {
	PHP_FRAME_FUNCTION = 1, // a user function or method
	PHP_FRAME_INTERNAL = 2, // a function of the engine or an extension
	PHP_FRAME_MAIN = 3,     // the script's top-level code
	PHP_FRAME_INCLUDE = 4,  // an included file's top-level code
	PHP_FRAME_EVAL = 5,     // eval'd code
};

// Bytes of a rb_control_frame_t the Ruby walker (ruby.h) reads in one go:
// every field it reads is in them.
#define RUBY_CFP_READ 64

// ruby_proc tells the Ruby walker (ruby.h) where one Ruby process keeps a
// thread's execution context and its VM loop, and how its version lays out
// what the walker reads; user space derives it from libruby's symbols and
// code and internal/ruby's per-version table. Offsets are in bytes.
struct ruby_proc {
	// A thread's ruby_current_ec is at its thread pointer minus tls_offset.
	__u64 tls_offset;
	__u64 core_start; // vm_exec_core: [core_start, core_end)
	__u64 core_end;
	__u16 ec_vm_stack; // rb_execution_context_t fields
	__u16 ec_vm_stack_size;
	__u16 ec_cfp;
	__u16 cfp_size; // sizeof(rb_control_frame_t)
	__u16 cfp_pc;   // rb_control_frame_t fields (< RUBY_CFP_READ, 8-aligned)
	__u16 cfp_iseq;
	__u16 cfp_ep;
	__u16 iseq_body;    // rb_iseq_t.body
	__u16 body_encoded; // rb_iseq_constant_body.iseq_encoded
	__u16 pad[3];
};

// How a Ruby frame leaves (internal/ruby's Kind*): the address is its
// instruction sequence (rb_iseq_t); the file word holds the pc's position
// in the iseq's instructions (words) in its high RUBY_POS_BITS (all ones:
// unknown), which user space turns into a line; then RUBY_CHECK_BITS of
// the iseq's body address from bit 4 (malloc'd: a freed iseq object reused
// by another has another body), which user space checks the iseq against;
// and in its low 32 bits a method frame's method entry (ep[-2]) as its
// signed distance from the iseq in words, which names the method's class
// (0: not a method frame, or too far).
#define RUBY_POS_BITS   16
#define RUBY_CHECK_BITS 16

enum ruby_frame_kind {
	RUBY_FRAME_ISEQ = 1, // a method, block, class body or file's top-level code
};

// Bytes of a context (PERL_CONTEXT), of a stack info (PERL_SI) and of a
// statement (COP) the Perl walker (perl.h) reads in one go: every field it
// reads of each is in them.
#define PERL_CX_READ  104
#define PERL_SI_READ  48
#define PERL_COP_READ 56

// perl_proc tells the Perl walker (perl.h) where one Perl process (a
// MULTIPLICITY build) keeps its interpreter and loop, and how its version
// lays out what the walker reads; user space derives it from the
// binary's symbols and internal/perl's per-version table. Offsets are in
// bytes.
struct perl_proc {
	__u64 cur_interp;   // &PL_curinterp: the main thread's interpreter
	__u64 runops_start; // Perl_runops_standard: [runops_start, runops_end)
	__u64 runops_end;
	__u32 op_require;       // OP_REQUIRE: an eval context's op type (blk_u16 >> 7) for require
	__u16 interp_curcop;    // PerlInterpreter.Icurcop
	__u16 interp_stackinfo; // .Icurstackinfo
	__u16 si_cxstack;       // PERL_SI fields (< PERL_SI_READ)
	__u16 si_prev;
	__u16 si_cxix;
	__u16 si_type;
	__u16 cx_size; // sizeof(PERL_CONTEXT)
	__u16 cx_type; // PERL_CONTEXT fields (< PERL_CX_READ)
	__u16 cx_u16;
	__u16 cx_oldcop;
	__u16 cx_retop; // blk_sub.retop = blk_eval.retop: NULL where C called it
	__u16 cx_sub_cv;
	__u16 cop_line; // COP fields (< PERL_COP_READ)
	__u16 cop_file;
};

// How a Perl frame leaves (internal/perl's Kind*). A sub's: the address is
// its CV; the file word holds the line of its current statement in its
// high 32 bits and in its low 32 the low half of the CV's body pointer
// (sv_any), which user space checks the CV against. The other frames
// (eval, require, the program's top level): the address is their current
// statement (COP), the low 32 bits of the file word the low half of its
// file name's pointer.
enum perl_frame_kind {
	PERL_FRAME_SUB = 1,     // a sub (or format)
	PERL_FRAME_EVAL = 2,    // an eval block or string
	PERL_FRAME_REQUIRE = 3, // a required file's top-level code
	PERL_FRAME_MAIN = 4,    // the program's top-level code
};

// A python_proc field a version does not have.
#define PY_NONE 0xffff

// python_proc tells the Python walker (python.h) where one CPython process
// keeps its interpreter state and how its version lays out the structures
// the walker follows; offsets are in bytes. Addresses are the process's.
struct python_proc {
	__u64 interp_head; // address of the pointer to the first PyInterpreterState
	__u64 eval_start;  // _PyEval_EvalFrameDefault: [eval_start, eval_end)
	__u64 eval_end;
	__u64 cold_start; // its cold part, where the symbol table names it (else 0, 0)
	__u64 cold_end;
	__u16 interp_threads_head;
	__u16 thread_next;
	__u16 thread_id;      // pthread_self(): the thread pointer (fsbase)
	__u16 thread_frame;   // frame, cframe or current_frame
	__u16 cframe_current; // _PyCFrame.current_frame (3.11, 3.12), else PY_NONE
	__u16 frame_back;
	__u16 frame_code;
	__u16 frame_instr;
	__u16 frame_owner;    // 3.11+, else PY_NONE
	__u16 frame_is_entry; // 3.11, else PY_NONE
	__u8 owner_shim_from; // owners from this value on are the C stack's shims
	__u8 instr_is_int;    // frame_instr is f_lasti (an int), not a pointer
	__u8 executable_mask; // tag bits of f_executable (3.14)
	__u8 pad;
};
