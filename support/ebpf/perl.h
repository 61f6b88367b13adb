// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The Perl 5 unwinder (MULTIPLICITY builds, the main thread's
// interpreter). User space tells it which processes run Perl, where
// PL_curinterp and the interpreter loop (Perl_runops_standard) are and how
// their version lays out the interpreter, a stack info, a context and a
// statement (perl_procs in maps.h; internal/perl's Interp.Stack is the
// executable specification of this walk).
//
// Perl calls Perl without a native call: one runops frame on the native
// stack runs every sub, eval and required file's code pushed on the
// context stack since C entered it. The frames are the interpreter's
// contexts (PL_curstackinfo->si_cxstack[si_cxix] down to 0, then the
// stack infos it was pushed on, along si_prev) whose type is a sub, a
// format or an eval; loops and blocks are part of the frame they are in.
// A frame's line is its current statement's: PL_curcop for the innermost,
// else the statement it called the next inner frame from (that frame's
// blk_oldcop). The program's top-level code is the main stack info's
// bottom. A context whose return op is NULL was entered from C (call_sv):
// it is the last frame of its runops frame's run. As the native unwinder
// meets each runops frame, perl_frame replaces it with the Perl frames of
// its run; native frames above it (the ops' C functions, XS) stay.
#pragma once

#include "record.h"

// Context types (CXt_*, the low 4 bits of blk_type) and flags; the same in
// every Perl 5 the table knows.
#define PERL_CXT_MASK      0x0f
#define PERL_CXT_SUB       9
#define PERL_CXT_FORMAT    10
#define PERL_CXT_EVAL      11
#define PERL_CXP_EVALBLOCK 0x40
#define PERL_SI_MAIN       1 // PERLSI_MAIN

// perl_word returns the 8 bytes at byte off of a block read into words
// slots, or 0 for one outside it.
static __always_inline __u64 perl_word(__u64 *slots, __u32 nwords, __u16 off)
{
	__u32 i = off >> 3;
	if (i >= nwords)
		return 0;
	return slots[i];
}

// perl_u32 returns the 4 bytes at byte off (4-aligned) of such a block.
static __always_inline __u32 perl_u32(__u64 *slots, __u32 nwords, __u16 off)
{
	return (__u32)(perl_word(slots, nwords, off) >> ((off & 4) * 8));
}

// perl_load_si makes si the stack info the walk is in: its contexts, its
// innermost context and its type. False where it cannot be read.
static __always_inline bool perl_load_si(struct ustack_state *st, __u64 si)
{
	if ((si & 7) || si >= USER_ADDR_END)
		return false;
	if (bpf_probe_read_user(st->perl_si_slots, sizeof(st->perl_si_slots), (void *)si))
		return false;
	__u64 *w = st->perl_si_slots;
	const __u32 n = PERL_SI_READ / 8;
	st->perl_si = si;
	st->perl_cxstack = perl_word(w, n, st->perl.si_cxstack);
	st->perl_cxix = (__s32)perl_u32(w, n, st->perl.si_cxix);
	st->perl_si_type = perl_u32(w, n, st->perl.si_type);
	return true;
}

// perl_begin readies the Perl walk of the current stack of thread pid of
// process tgid: st->perl_si is its innermost stack info, or 0. Only the
// main thread's stack is walked: PL_curinterp is its interpreter (other
// threads' interpreters are their own, in thread-local storage).
static __always_inline void perl_begin(struct ustack_state *st, __u32 rt, __u32 tgid, __u32 pid)
{
	st->perl_active = 0;
	st->perl_walking = 0;
	st->perl_run = 0;
	st->perl_si = 0;
	if (!HAS_RUNTIME(rt, RUNTIME_PERL))
		return;
	struct perl_proc *pp = bpf_map_lookup_elem(&perl_procs, &tgid);
	if (!pp || pid != tgid)
		return;
	st->perl = *pp;
	st->perl_active = 1;
	count(COUNTER_PERL_SAMPLES);
	__u64 interp = 0, si = 0, cop = 0;
	if (bpf_probe_read_user(&interp, sizeof(interp), (void *)st->perl.cur_interp))
		goto read_err;
	if (interp == 0)
		return; // not started yet
	if (bpf_probe_read_user(&si, sizeof(si), (void *)(interp + st->perl.interp_stackinfo)) ||
	    bpf_probe_read_user(&cop, sizeof(cop), (void *)(interp + st->perl.interp_curcop)))
		goto read_err;
	if (si == 0)
		return;
	if (!perl_load_si(st, si))
		goto read_err;
	st->perl_cop = cop;
	return;
read_err:
	st->perl_si = 0;
	count(COUNTER_PERL_READ_ERR);
}

// perl_in_runops says whether a native PC is in the interpreter loop.
static __always_inline bool perl_in_runops(struct ustack_state *st, __u64 pc)
{
	return pc >= st->perl.runops_start && pc < st->perl.runops_end;
}

enum perl_result {
	PERL_STOP, // nothing emitted: no (readable) Perl frame left
	PERL_MORE, // one frame emitted; the run goes on
	PERL_LAST, // one frame emitted; it was the run's entry frame
	PERL_SKIP, // nothing emitted: a context that is no frame, or a stack info, stepped over
};

// perl_frame looks at the next context of the walk: where it is a frame it
// emits it into slots stack[idx], stack[idx + 1] and moves the walk to its
// caller; a loop or block context, or the end of a stack info pushed by C,
// is stepped over (PERL_SKIP: the caller calls again, within its bounded
// loop). One context per call keeps the verifier's work small. Contexts or
// statements that cannot be read, or make no sense (read while they
// changed, or corrupt), end the walk, counted: the remaining runops frames
// show as native frames.
static __always_inline enum perl_result perl_frame(struct ustack_state *st, struct sample_record *s,
                                                   __u32 idx)
{
	__u64 *cx = st->perl_cx_slots;
	const __u32 cxn = PERL_CX_READ / 8;
	__u32 kind;
	__u64 addr, retop = 0, oldcop = 0;
	if (st->perl_si == 0)
		return PERL_STOP;
	if (st->perl_cxix < 0) {
		if (st->perl_si_type != PERL_SI_MAIN) {
			// A stack info pushed by C (sort, a signal handler, tie,
			// DESTROY): go on in the one it was pushed on.
			__u64 prev = 0;
			if (bpf_probe_read_user(&prev, sizeof(prev),
			                        (void *)(st->perl_si + st->perl.si_prev)))
				goto read_err;
			if (prev == 0)
				goto stop;
			if (!perl_load_si(st, prev))
				goto read_err;
			return PERL_SKIP;
		}
		kind = PERL_FRAME_MAIN;
		addr = st->perl_cop;
	} else {
		__u64 at = st->perl_cxstack + (__u64)(__u32)st->perl_cxix * st->perl.cx_size;
		if ((st->perl_cxstack & 7) || at >= USER_ADDR_END)
			goto bad;
		if (bpf_probe_read_user(cx, sizeof(st->perl_cx_slots), (void *)at))
			goto read_err;
		st->perl_cxix--;
		__u8 type = (__u8)(perl_word(cx, cxn, st->perl.cx_type) >>
		                   ((st->perl.cx_type & 7) * 8));
		__u32 t = type & PERL_CXT_MASK;
		if (t == PERL_CXT_SUB || t == PERL_CXT_FORMAT) {
			kind = PERL_FRAME_SUB;
			addr = perl_word(cx, cxn, st->perl.cx_sub_cv);
		} else if (t == PERL_CXT_EVAL) {
			__u16 u16 = (__u16)(perl_word(cx, cxn, st->perl.cx_u16) >>
			                    ((st->perl.cx_u16 & 7) * 8));
			kind = !(type & PERL_CXP_EVALBLOCK) && (u16 >> 7) == st->perl.op_require
			               ? PERL_FRAME_REQUIRE
			               : PERL_FRAME_EVAL;
			addr = st->perl_cop;
		} else {
			return PERL_SKIP; // a loop, a block: part of the frame it is in
		}
		retop = perl_word(cx, cxn, st->perl.cx_retop);
		oldcop = perl_word(cx, cxn, st->perl.cx_oldcop);
	}
	__u64 cop = st->perl_cop;
	if (cop == 0 || (cop & 7) || cop >= USER_ADDR_END || addr == 0 || (addr & 7) ||
	    addr >= USER_ADDR_END)
		goto bad;
	if (bpf_probe_read_user(st->perl_cop_slots, sizeof(st->perl_cop_slots), (void *)cop))
		goto read_err;
	const __u32 copn = PERL_COP_READ / 8;
	__u32 line = perl_u32(st->perl_cop_slots, copn, st->perl.cop_line);
	__u32 check = (__u32)perl_word(st->perl_cop_slots, copn, st->perl.cop_file);
	if (kind == PERL_FRAME_SUB) {
		__u64 body = 0;
		if (bpf_probe_read_user(&body, sizeof(body), (void *)addr))
			goto read_err;
		check = (__u32)body;
	}
	if (idx + 1 < MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES) {
		s->stack[idx] = (addr & PC_RUNTIME_ADDR_MASK) | PC_FLAG_RUNTIME |
		                ((__u64)RUNTIME_PERL << RUNTIME_SHIFT) |
		                ((__u64)kind << RUNTIME_KIND_SHIFT);
		s->stack[idx + 1] = ((__u64)line << 32) | check;
	}
	st->perl_run++;
	count(COUNTER_PERL_FRAMES);
	if (kind == PERL_FRAME_MAIN) {
		st->perl_si = 0;
		return PERL_LAST;
	}
	st->perl_cop = oldcop;
	return retop == 0 ? PERL_LAST : PERL_MORE;
bad:
	count(COUNTER_PERL_BAD_FRAME);
stop:
	st->perl_si = 0;
	return PERL_STOP;
read_err:
	count(COUNTER_PERL_READ_ERR);
	st->perl_si = 0;
	return PERL_STOP;
}
