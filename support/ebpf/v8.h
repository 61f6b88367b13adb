// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The V8 unwinder (Node.js). User space tells it which processes run V8,
// where their embedded builtins are and how their version lays out a
// frame and a JSFunction (v8_procs in maps.h, derived from V8's v8dbg_*
// metadata; internal/v8's Kernel documents the walk and Kernel.Walk is
// its executable specification). V8 keeps a frame pointer in all its
// code, so each frame is one read of a block below its frame pointer:
//
//   - a typed frame (entry, exit, stub, ...) holds a Smi marker where a
//     JavaScript frame holds its context: it leaves as (pc, frame type);
//   - a JavaScript frame holds its JSFunction: a second read finds the
//     function's SharedFunctionInfo, and the frame leaves as (sfi, the
//     bytecode offset slot and bytecode array) when the interpreter runs
//     it, else as (sfi, pc) for user space to find the code holding pc.
//     At the leaf, a builtin that builds no frame leaves its caller's
//     frame at fp: where the word on top of the stack returns into code
//     it knows, it leaves as the builtin (pc) and its caller (sfi, that
//     return address). Compiled code in the prologue that builds its
//     frame leaves as (0, pc) before the frames at fp (v8_prologue).
//
// Every frame steps to its caller the same way: the caller's frame
// pointer and return address sit at fp and fp + 8. A caller outside V8
// code (C++ that called JavaScript, at an entry frame) is the native
// unwinder's again.
#pragma once

#include "record.h"

// v8_begin readies the V8 walk of the current stack of process tgid.
static __always_inline void v8_begin(struct ustack_state *st, __u32 rt, __u32 tgid)
{
	st->v8_active = 0;
	if (!HAS_RUNTIME(rt, RUNTIME_V8))
		return;
	struct v8_proc *vp = bpf_map_lookup_elem(&v8_procs, &tgid);
	if (!vp)
		return;
	st->v8 = *vp;
	st->v8_active = 1;
	count(COUNTER_V8_SAMPLES);
}

// v8_in_builtins says whether a PC is in V8's embedded builtins.
static __always_inline bool v8_in_builtins(struct ustack_state *st, __u64 pc)
{
	if (!st->v8_active)
		return false;
	for (int i = 0; i < V8_MAX_BUILTINS; i++) {
		if (i < st->v8.nbuiltins && pc >= st->v8.builtin_start[i] &&
		    pc < st->v8.builtin_end[i])
			return true;
	}
	return false;
}

// v8_code says whether a PC in mapping mi (NULL: none found) is V8 code:
// builtins mapped from the binary anywhere (by file offset), or code no
// file backs. A PC find_mapping could not place (no entry, and the live
// VMA could not be looked at again in this stack) is tried as V8 code too:
// in a V8 process every file mapping has its entry, so it is most likely
// code no file backs. v8_frame takes it strictly: a JavaScript frame, or
// else the native unwinder's.
static __always_inline bool v8_code(struct ustack_state *st, struct mapping_info *mi, __u64 lookup)
{
	if (!st->v8_active)
		return false;
	if (!mi)
		return true;
	if (mi->inode == 0)
		return true;
	__u64 off = lookup - mi->file_bias;
	return mi->inode == st->v8.builtin_inode && off >= st->v8.builtin_off_start &&
	       off < st->v8.builtin_off_end;
}

// v8_slot returns the frame slot off bytes from the frame pointer, from
// st->v8_slots, or 0 for one outside the block read.
static __always_inline __u64 v8_slot(struct ustack_state *st, __s16 off)
{
	__s32 at = (__s32)off - st->v8.read_start;
	if (at < 0)
		return 0;
	__u32 i = (__u32)at >> 3;
	if (i >= V8_FRAME_READ / 8)
		return 0;
	return st->v8_slots[i];
}

// v8_emit writes the frame (addr, word) into slots stack[idx] and
// stack[idx + 1].
static __always_inline void v8_emit(struct ustack_state *st, struct sample_record *s, __u32 idx,
                                    __u32 kind, __u64 addr, __u64 word)
{
	// Bounded on the register that indexes: the compiler must not fold
	// the test into one its caller made on another (older verifiers
	// would not see it).
	asm volatile("" : "+r"(idx));
	if (idx >= MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES - 1)
		return;
	s->stack[idx] = (addr & PC_RUNTIME_ADDR_MASK) | PC_FLAG_RUNTIME |
	                ((__u64)RUNTIME_V8 << RUNTIME_SHIFT) | ((__u64)kind << RUNTIME_KIND_SHIFT) |
	                (st->adjust ? 0 : PC_FLAG_NO_ADJUST);
	s->stack[idx + 1] = word;
	s->user_len++;
	count(COUNTER_V8_FRAMES);
}

// cached_anon_code says whether addr is in anonymous executable memory of
// process pid (V8's code space) by the CPU's mapping cache alone (native.h).
static __always_inline bool cached_anon_code(struct ustack_state *st, __u32 pid, __u64 addr);

// v8_frameless_caller reads the word on top of the stack at a leaf in a
// builtin (the third read of the walk): a builtin that builds no frame of
// its own, called by compiled code, leaves its return address there and
// the caller's frame at fp. It says whether the word is an address in
// V8's code space the CPU has seen already; elsewhere the leaf stays a
// builtin frame of the caller.
static __always_inline bool v8_frameless_caller(struct ustack_state *st, __u32 pid, __u64 *ra)
{
	if (st->adjust || bpf_probe_read_user(ra, sizeof(*ra), (void *)st->sp))
		return false;
	return *ra != 0 && *ra < USER_ADDR_END && !v8_in_builtins(st, *ra - 1) &&
	       cached_anon_code(st, pid, *ra - 1);
}

#if !defined(__TARGET_ARCH_arm64)
// V8_FRAME_PROLOGUE is push rbp; mov rbp, rsp (55 48 89 e5) as a
// little-endian u32: how Maglev and TurboFan code starts.
#define V8_FRAME_PROLOGUE 0xe5894855U

// v8_prologue reports a leaf at pc, in V8's code space, that is in the
// prologue building its frame (the walk's step 0 in internal/v8): the
// function is not in a frame yet, and leaves as (0, pc) for user space to
// take from the code. It reads the 16 bytes of code at pc - 8; then:
//   - at the push rbp, or just after it, fp is still the caller's: the
//     return address is at sp (sp + 8 after the push), and the walk goes
//     on with it at fp;
//   - just after the mov rbp, rsp (or the push rsi after it), fp is the
//     frame's own but its function slot is not written: the walk steps to
//     the caller by the u64s at fp and fp + 8.
// It says whether it reported the frame and stepped.
static __always_inline bool v8_prologue(struct ustack_state *st, struct sample_record *s, __u32 idx,
                                        __u64 pc)
{
	__u64 code[2];
	if (pc < 8 || bpf_probe_read_user(code, sizeof(code), (void *)(pc - 8)))
		return false;
	__u64 lo = code[0], hi = code[1];
	__u64 next[2];
	if ((__u32)hi == V8_FRAME_PROLOGUE ||
	    (__u32)((lo >> 56) | (hi << 8)) == V8_FRAME_PROLOGUE) {
		// The return address, at sp (at the push) or sp + 8.
		__u64 at = st->sp + ((__u32)hi == V8_FRAME_PROLOGUE ? 0 : 8);
		if (bpf_probe_read_user(&next[1], sizeof(next[1]), (void *)at) || next[1] == 0 ||
		    next[1] >= USER_ADDR_END)
			return false;
		v8_emit(st, s, idx, V8_FRAME_COMPILED, 0, pc);
		st->pc = next[1];
		st->sp = at + 8;
		st->adjust = 1;
		return true;
	}
	if ((__u32)(lo >> 32) == V8_FRAME_PROLOGUE ||
	    ((__u32)(lo >> 24) == V8_FRAME_PROLOGUE && (lo >> 56) == 0x56)) {
		__u64 fp = st->fp;
		if (fp == 0 || (fp & 7) || fp < st->sp ||
		    bpf_probe_read_user(next, sizeof(next), (void *)fp) || next[1] == 0 ||
		    next[1] >= USER_ADDR_END || (next[0] != 0 && next[0] <= fp))
			return false;
		v8_emit(st, s, idx, V8_FRAME_COMPILED, 0, pc);
		st->pc = next[1];
		st->sp = fp + 16;
		st->fp = next[0];
		st->adjust = 1;
		return true;
	}
	return false;
}
#endif

// v8_tagged says whether w is a tagged heap object pointer.
static __always_inline bool v8_tagged(struct ustack_state *st, __u64 w)
{
	return (w & st->v8.heap_tag_mask) == st->v8.heap_tag;
}

// What v8_frame did with a frame.
enum v8_step {
	V8_STOP = 0,   // the stack ends there
	V8_NEXT = 1,   // reported, and stepped to its caller
	V8_NOT_V8 = 2, // strict: no JavaScript frame there; nothing done
};

// v8_frame reports the frame at pc, which is V8 code (in the builtins, or
// in memory no file backs), and steps to its caller (V8_NEXT), or says the
// stack ends there (V8_STOP). strict: pc is in no known mapping, and only
// a JavaScript frame is taken there (else V8_NOT_V8, nothing done).
static __always_inline int v8_frame(struct ustack_state *st, struct sample_record *s, __u32 idx,
                                    __u64 pc, __u64 lookup, bool in_builtins, bool strict)
{
	__u64 fp = st->fp;
	if (fp == 0 || (fp & 7) || fp < st->sp)
		return strict ? V8_NOT_V8 : V8_STOP;
	if (bpf_probe_read_user(st->v8_slots, sizeof(st->v8_slots),
	                        (void *)(fp + (__s64)st->v8.read_start))) {
		if (strict)
			return V8_NOT_V8;
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_V8_READ_ERR);
		return V8_STOP;
	}
	__u64 marker = v8_slot(st, st->v8.fp_marker), ra_top = 0;
	__u64 caller_fp = v8_slot(st, 0), ra = v8_slot(st, 8);
	if (strict) {
		// A PC in no known mapping: a JavaScript frame only (a context,
		// a tagged JSFunction whose SharedFunctionInfo is tagged), else
		// the native unwinder's, as any other unplaced frame.
		__u64 fn = v8_slot(st, st->v8.fp_function), sfi = 0;
		if ((marker & st->v8.smi_tag_mask) == 0 || !v8_tagged(st, fn) ||
		    bpf_probe_read_user(&sfi, sizeof(sfi),
		                        (void *)(fn - st->v8.heap_tag + st->v8.function_shared)) ||
		    !v8_tagged(st, sfi))
			return V8_NOT_V8;
	}
	if ((marker & st->v8.smi_tag_mask) == 0) {
		v8_emit(st, s, idx, V8_FRAME_STUB, pc, marker >> (st->v8.marker_shift & 63));
	} else {
		__u64 fn = v8_slot(st, st->v8.fp_function), sfi = 0;
		if (!v8_tagged(st, fn) ||
		    bpf_probe_read_user(&sfi, sizeof(sfi),
		                        (void *)(fn - st->v8.heap_tag + st->v8.function_shared)) ||
		    !v8_tagged(st, sfi)) {
			// No JavaScript function here (a leaf in a prologue, a
			// frame of another kind): a native frame, stepped by its
			// frame pointer all the same.
			count(COUNTER_V8_NOT_JS);
			s->stack[idx] = st->pc | (st->adjust ? 0 : PC_FLAG_NO_ADJUST);
			s->stack[idx + 1] = 0;
			s->user_len++;
		} else if (in_builtins) {
			__u64 off = v8_slot(st, st->v8.fp_bytecode_offset);
			__u64 bc = v8_slot(st, st->v8.fp_bytecode_array);
			__u64 smi_low = (1ULL << (st->v8.smi_shift & 63)) - 1;
			if ((off & smi_low) == 0 && v8_tagged(st, bc))
				v8_emit(st, s, idx, V8_FRAME_INTERPRETED, sfi,
				        ((__u64)(__u32)(off >> (st->v8.smi_shift & 63)) << 32) |
				                (__u32)bc);
			else if (idx + 3 < MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES &&
			         v8_frameless_caller(st, s->pid, &ra_top)) {
				// The builtin, named by its pc, then the compiled
				// frame that called it, at the return address.
				v8_emit(st, s, idx, V8_FRAME_STUB, pc, 0);
				st->adjust = 1;
				v8_emit(st, s, idx + 2, V8_FRAME_COMPILED, sfi, ra_top);
			} else
				v8_emit(st, s, idx, V8_FRAME_BUILTIN, sfi, pc);
		} else {
			v8_emit(st, s, idx, V8_FRAME_COMPILED, sfi, pc);
		}
	}
	if (ra == 0 || ra >= USER_ADDR_END || (caller_fp != 0 && caller_fp <= fp))
		return V8_STOP;
	st->pc = ra;
	st->sp = fp + 16;
	st->fp = caller_fp;
	st->adjust = 1;
	return V8_NEXT;
}
