// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

// Test programs for BPF_PROG_TEST_RUN: they run the native unwinder's own
// functions (native.h) on tables and stacks a test crafts. The sampler's
// programs are perf-event programs, which the kernel cannot test-run; these
// are XDP programs, which it can (also repeatedly, for a per-call cost),
// and which run in the calling thread: bpf_probe_read_user reads the test
// process's memory. The packet carries one struct testrun_io: the inputs,
// and the outputs the program writes back.
#include "native.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// testrun_io is the packet of both programs.
struct testrun_io {
	// In: the frame and the mapping it is in.
	__u64 pc;     // the frame's PC (no flags)
	__u64 lookup; // the PC its row is looked up for: pc, or pc - 1 for a return address
	__u64 sp;
	__u64 fp;
	__u64 bias;     // row pc = lookup - bias
	__u32 table_id; // 0: no table
	__u32 rows;     // rows the mapping says its table has
	// Out.
	__u32 found;  // find_row_test: a row covers lookup
	__u32 result; // step_test: enum step_result
	struct unwind_row row;
	__u64 next;   // find_row_test: the row covers [row.pc, next)
	__u64 out_pc; // step_test: the caller's registers
	__u64 out_sp;
	__u64 out_fp;
	__u32 adjust;     // the caller's PC is a return address
	__u32 flags;      // enum sample_flags the step set
	__u32 frames_cfi; // frames counted by kind
	__u32 frames_fp;
	// snapshot_test: in, the user frames the record holds (its snapshot
	// follows them); out, the bytes take_snapshot added, the header it
	// wrote, and the first and last words of the stack it copied.
	__u32 snap_frames;
	__u32 snap_added;
	struct stack_snapshot snap;
	__u64 snap_first;
	__u64 snap_last;
	__u64 snap2_in;    // in: where a second region starts (0: none)
	__u64 snap2_first; // out: the first word of the second region copied
	__u64 lr;          // step_test, in: aarch64's link register (0: not known)
	__u32 file;        // row_cache_test, in: the mapping's file handle
	__u32 file_pad;
};

const struct testrun_io *unused_testrun_io __attribute__((unused));

static __always_inline struct testrun_io *io_of(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (data + sizeof(struct testrun_io) > end)
		return NULL;
	return data;
}

static __always_inline void mapping_of(struct testrun_io *io, struct mapping_info *mi)
{
	__builtin_memset(mi, 0, sizeof(*mi));
	mi->start = 0;
	mi->end = ~0ULL;
	mi->bias = io->bias;
	mi->table_id = io->table_id;
	mi->rows = io->rows;
}

// find_row_test looks up the row covering io->lookup, as step does.
SEC("xdp")
int find_row_test(struct xdp_md *ctx)
{
	struct testrun_io *io = io_of(ctx);
	if (!io)
		return XDP_ABORTED;
	struct mapping_info mi;
	mapping_of(io, &mi);
	struct unwind_row *row = table_row(&mi, io->lookup, &io->next);
	io->found = row != NULL;
	if (row)
		io->row = *row;
	return XDP_PASS;
}

// row_cache_test looks up the row covering io->lookup of the mapping of
// file io->file through the CPU's row cache (the first CPU's), as step does
// where the stack's last row does not cover it: found, row and next as
// find_row_test's.
SEC("xdp")
int row_cache_test(struct xdp_md *ctx)
{
	struct testrun_io *io = io_of(ctx);
	if (!io)
		return XDP_ABORTED;
	__u32 zero = 0;
	struct ustack_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!st)
		return XDP_ABORTED;
	st->row_base = 0;
	struct mapping_info mi;
	mapping_of(io, &mi);
	mi.file = io->file;
	struct unwind_row *row = cached_row(st, &mi, io->lookup);
	io->found = row != NULL;
	if (row) {
		io->row = *row;
		io->next = st->last_next;
	}
	return XDP_PASS;
}

// step_test unwinds one frame from (pc, sp, fp) with step, the unwinder's
// per-frame step, through the same per-CPU state the sampler uses.
SEC("xdp")
int step_test(struct xdp_md *ctx)
{
	struct testrun_io *io = io_of(ctx);
	if (!io)
		return XDP_ABORTED;
	__u32 zero = 0;
	struct sample_record *s = bpf_map_lookup_elem(&scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!s || !st)
		return XDP_ABORTED;
	s->flags = 0;
	st->pc = io->pc;
	st->sp = io->sp;
	st->fp = io->fp;
	st->lr = io->lr;
	st->lr_valid = io->lr != 0;
	st->adjust = io->lookup != io->pc;
	st->frames_cfi = 0;
	st->frames_fp = 0;
	st->last_table = 0; // a new stack, as begin_unwind makes it
	st->win_len = 0;
	struct mapping_info mi;
	mapping_of(io, &mi);
	io->result = step(st, s, &mi, io->pc, io->lookup);
	io->out_pc = st->pc;
	io->out_sp = st->sp;
	io->out_fp = st->fp;
	io->adjust = st->adjust;
	io->flags = s->flags;
	io->frames_cfi = st->frames_cfi;
	io->frames_fp = st->frames_fp;
	return XDP_PASS;
}

// snapshot_test takes the snapshot of the stack at (pc, sp, fp), frame 0 of
// a record of snap_frames user frames, as the sampler does when a stack
// ends (take_snapshot), and reports what it wrote.
SEC("xdp")
int snapshot_test(struct xdp_md *ctx)
{
	struct testrun_io *io = io_of(ctx);
	if (!io)
		return XDP_ABORTED;
	__u32 zero = 0;
	struct sample_record *s = bpf_map_lookup_elem(&scratch, &zero);
	struct ustack_state *st = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!s || !st || io->snap_frames > MAX_USER_FRAMES)
		return XDP_ABORTED;
	s->flags = 0;
	s->kernel_len = 0;
	s->user_len = io->snap_frames;
	st->snap_set = 1;
	st->snap_frame = 0;
	st->snap_pc = io->pc;
	st->snap_sp = io->sp;
	st->snap_fp = io->fp;
	st->snap2_set = io->snap2_in != 0;
	st->snap2_sp = io->snap2_in;
	__u32 added = take_snapshot(s, st);
	io->snap_added = added;
	io->flags = s->flags;
	__u32 words = s->kernel_len + 2 * s->user_len;
	if (added == 0 || words > MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES)
		return XDP_PASS;
	struct stack_snapshot *h = (void *)s->stack + words * sizeof(__u64);
	io->snap = *h;
	__u8 *bytes = (__u8 *)(h + 1);
	__u32 n = h->bytes;
	if (n < 8 || n > SNAPSHOT_BYTES)
		return XDP_PASS;
	io->snap_first = *(__u64 *)bytes;
	io->snap_last = *(__u64 *)(bytes + ((n - 8) & (SNAPSHOT_BYTES - 1)));
	if (h->bytes2 >= 8)
		io->snap2_first = *(__u64 *)(bytes + (n & (SNAPSHOT_BYTES * 2 - 1)));
	return XDP_PASS;
}
