// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The HotSpot unwinder. User space tells it which processes run a JVM, where
// that JVM keeps its code cache and interpreter, and how its version lays
// out the few fields the walk reads (jvm_procs in maps.h, derived from the
// JVM's own vmStructs tables when the process is prepared, cleared at exec
// and exit). When the native unwinder meets a PC in the code cache it hands
// the frame to jvm_frame, which reports it and steps to its caller:
//
//   - the template interpreter keeps a frame pointer: the frame's Method*
//     and bytecode pointer are in slots below it, its caller's SP is the
//     sender SP slot;
//   - compiled code (C1, C2, native wrappers, runtime stubs) keeps none:
//     its code blob, found through the code heap's segment map, says how
//     big its frame is, and the return address and the caller's frame
//     pointer sit at the top of that frame;
//   - a blob without a frame size (the call stub and other buffer blobs)
//     keeps a frame pointer, or none at all when it is the leaf.
//
// Frames leave as (address | PC_FLAG_RUNTIME | JVM, word): an interpreted
// frame as (Method*, bcp), a blob's as (PC, compile id << 48 | method).
// User space names them and checks that what it reads is what was
// sampled (a freed nmethod's compile id no longer matches; its method
// still names it).
#pragma once

#include "record.h"

// Bounds of what is believed of a frame: a frame size past this many words
// is not a frame.
#define JVM_MAX_FRAME_WORDS (1 << 16)

// jvm_begin readies the JVM walk of the current stack of process tgid.
static __always_inline void jvm_begin(struct ustack_state *st, __u32 rt, __u32 tgid)
{
	st->jvm_active = 0;
	if (!HAS_RUNTIME(rt, RUNTIME_JVM))
		return;
	struct jvm_proc *jp = bpf_map_lookup_elem(&jvm_procs, &tgid);
	if (!jp)
		return;
	st->jvm = *jp;
	st->jvm_active = 1;
	count(COUNTER_JVM_SAMPLES);
}

// jvm_in_code says whether a PC is in the JVM's code cache.
static __always_inline bool jvm_in_code(struct ustack_state *st, __u64 pc)
{
	return st->jvm_active && pc >= st->jvm.code_low && pc < st->jvm.code_high;
}

// jvm_blob returns the start of the code blob holding pc, or 0.
static __always_inline __u64 jvm_blob(struct ustack_state *st, __u64 pc)
{
	struct jvm_heap *h = NULL;
	for (int i = 0; i < JVM_MAX_HEAPS; i++) {
		if (i < st->jvm.nheaps && pc >= st->jvm.heaps[i].low &&
		    pc < st->jvm.heaps[i].high) {
			h = &st->jvm.heaps[i];
			break;
		}
	}
	if (!h)
		return 0;
	__u32 shift = h->seg_shift & 31;
	__u64 seg = (pc - h->low) >> shift;
	for (int i = 0; i < JVM_SEGMAP_HOPS; i++) {
		__u8 hop = 0;
		if (bpf_probe_read_user(&hop, sizeof(hop), (void *)(h->segmap + seg)))
			return 0;
		if (hop == 0) {
			__u64 block = h->low + (seg << shift);
			__u8 used = 0;
			if (bpf_probe_read_user(&used, sizeof(used),
			                        (void *)(block + st->jvm.heap_block_used)) ||
			    !used)
				return 0; // a freed block keeps its marks
			return block + st->jvm.heap_block_size;
		}
		if (hop == 0xff || hop > seg)
			return 0; // free, or not a chain
		seg -= hop;
	}
	return 0;
}

// jvm_emit writes the frame (word0, word1) into slots stack[idx] and
// stack[idx + 1].
static __always_inline void jvm_emit(struct ustack_state *st, struct sample_record *s, __u32 idx,
                                     __u32 kind, __u64 addr, __u64 word)
{
	if (idx + 1 >= MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES)
		return;
	s->stack[idx] = (addr & PC_RUNTIME_ADDR_MASK) | PC_FLAG_RUNTIME |
	                ((__u64)RUNTIME_JVM << RUNTIME_SHIFT) |
	                ((__u64)kind << RUNTIME_KIND_SHIFT) | (st->adjust ? 0 : PC_FLAG_NO_ADJUST);
	s->stack[idx + 1] = word;
	s->user_len++;
	count(COUNTER_JVM_FRAMES);
}

// jvm_read reads a word of the stack; it counts a failure.
static __always_inline bool jvm_read(struct sample_record *s, __u64 *dst, __u64 addr)
{
	if (bpf_probe_read_user(dst, sizeof(*dst), (void *)addr)) {
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_JVM_READ_ERR);
		return false;
	}
	return true;
}

// jvm_slot returns the interpreter frame slot off bytes from the frame
// pointer, from st->jvm_slots, or 0 for one outside it.
static __always_inline __u64 jvm_slot(struct ustack_state *st, __s16 off)
{
	__s32 at = (__s32)off + JVM_INTERP_BELOW;
	if (at < 0)
		return 0;
	__u32 i = (__u32)at >> 3;
	if (i >= JVM_INTERP_WORDS)
		return 0;
	return st->jvm_slots[i];
}

// jvm_interpreted reports the interpreted frame at st->fp and steps to its
// caller: return address above the saved frame pointer, SP from the
// sender SP slot. The slots are read in one go.
static __always_inline bool jvm_interpreted(struct ustack_state *st, struct sample_record *s,
                                            __u32 idx)
{
	__u64 fp = st->fp;
	if (fp < JVM_INTERP_BELOW || fp < st->sp)
		return false;
	if (bpf_probe_read_user(st->jvm_slots, sizeof(st->jvm_slots),
	                        (void *)(fp - JVM_INTERP_BELOW))) {
		s->flags |= SAMPLE_USER_READ_ERR;
		count(COUNTER_JVM_READ_ERR);
		return false;
	}
	__u64 caller_fp = jvm_slot(st, 0), ra = jvm_slot(st, 8);
	__u64 sender_sp = jvm_slot(st, st->jvm.interp_sender_sp);
	jvm_emit(st, s, idx, JVM_FRAME_INTERPRETED, jvm_slot(st, st->jvm.interp_method),
	         jvm_slot(st, st->jvm.interp_bcp));
	if (ra >= USER_ADDR_END || sender_sp <= fp)
		return false;
	st->pc = ra;
	st->sp = sender_sp;
	st->fp = caller_fp;
	st->adjust = 1;
	return true;
}

// jvm_cached returns the CPU's cache entry for lookup, filled: the one
// found before if the blob still holds its compile id, else one found now
// through the segment map. NULL: no blob holds lookup.
static __always_inline struct jvm_blob_entry *jvm_cached(struct ustack_state *st, __u64 lookup)
{
	__u32 i = ((lookup >> 2) ^ (lookup >> 11) ^ st->jvm.gen) & (JVM_BLOB_CACHE - 1);
	struct jvm_blob_entry *e = &st->jvm_blobs[i];
	__s32 compile_id = 0;
	// A blob may be freed and its space given to another since: the
	// compile id read now (the only read of a hit) tells.
	if (e->pc == lookup && e->gen == st->jvm.gen &&
	    !bpf_probe_read_user(&compile_id, sizeof(compile_id),
	                         (void *)(e->blob + st->jvm.nmethod_compile_id)) &&
	    compile_id == e->compile_id)
		return e;
	e->pc = 0;
	__u64 blob = jvm_blob(st, lookup);
	if (blob == 0) {
		count(COUNTER_JVM_NO_BLOB);
		return NULL;
	}
	__s32 frame_words = 0;
	__u64 method = 0;
	if (bpf_probe_read_user(&frame_words, sizeof(frame_words),
	                        (void *)(blob + st->jvm.blob_frame_size))) {
		count(COUNTER_JVM_READ_ERR);
		return NULL;
	}
	// Failed reads leave 0s, which no nmethod has: user space then takes
	// the frame for a stub, or for one it cannot name. The method names
	// the frame even when its code is freed before user space reads it.
	compile_id = 0;
	bpf_probe_read_user(&compile_id, sizeof(compile_id),
	                    (void *)(blob + st->jvm.nmethod_compile_id));
	bpf_probe_read_user(&method, sizeof(method), (void *)(blob + st->jvm.nmethod_method));
	e->blob = blob;
	e->method = method;
	e->gen = st->jvm.gen;
	e->compile_id = compile_id;
	e->frame_words = frame_words;
	e->leaf = JVM_LEAF_UNKNOWN;
	e->pc = lookup;
	return e;
}

// jvm_leaf finds how the leaf's frame at pc, in blob, is stepped: it may be
// in its prologue, before the frame is built, or in its epilogue, once the
// frame is gone (at the pop of the frame pointer, at the return, or at
// the return's safepoint poll before it: cmp 0x..(%r15),%rsp; ja; ret).
static __always_inline __u8 jvm_leaf(struct ustack_state *st, __u64 blob, __u64 pc)
{
	__s32 complete = 0;
	__u64 begin = 0;
	if (st->jvm.code_begin_is_offset) {
		__s32 off = 0;
		bpf_probe_read_user(&off, sizeof(off), (void *)(blob + st->jvm.blob_code_begin));
		begin = blob + off;
	} else {
		bpf_probe_read_user(&begin, sizeof(begin),
		                    (void *)(blob + st->jvm.blob_code_begin));
	}
	if (st->jvm.frame_complete_short) {
		__s16 c16 = 0;
		bpf_probe_read_user(&c16, sizeof(c16),
		                    (void *)(blob + st->jvm.blob_frame_complete));
		complete = c16;
	} else {
		bpf_probe_read_user(&complete, sizeof(complete),
		                    (void *)(blob + st->jvm.blob_frame_complete));
	}
	if (complete > 0 && pc < begin + complete)
		return JVM_LEAF_TOP;
	__u8 op[16] = {};
	bpf_probe_read_user(op, sizeof(op), (void *)pc);
	if (op[0] == 0xc3 ||                                     // ret
	    (op[0] == 0x0f && op[1] == 0x87 && op[6] == 0xc3) || // ja; ret
	    (op[0] == 0x49 && op[1] == 0x3b && op[2] == 0xa7 && op[7] == 0x0f && op[8] == 0x87 &&
	     op[13] == 0xc3)) // cmp; ja; ret
		return JVM_LEAF_TOP;
	if (op[0] == 0x5d) // pop %rbp
		return JVM_LEAF_POP;
	return JVM_LEAF_BUILT;
}

// jvm_frame reports the frame at pc, which is in the code cache (lookup is
// pc, or pc - 1 for a return address), and steps to its caller. It returns
// false when the stack ends there.
static __always_inline bool jvm_frame(struct ustack_state *st, struct sample_record *s, __u32 idx,
                                      __u64 pc, __u64 lookup)
{
	st->have_mi = 0;
	if (lookup >= st->jvm.interp_start && lookup < st->jvm.interp_end)
		return jvm_interpreted(st, s, idx);
	struct jvm_blob_entry *e = jvm_cached(st, lookup);
	if (!e)
		return false;
	jvm_emit(st, s, idx, JVM_FRAME_COMPILED, pc,
	         (e->method & PC_RUNTIME_ADDR_MASK) | ((__u64)(__u16)e->compile_id << 48));

	__s32 frame_words = e->frame_words;
	__u64 ra = 0;
	if (frame_words <= 0 || frame_words > JVM_MAX_FRAME_WORDS) {
		if (st->adjust) {
			// A caller without a frame size (the call stub) keeps a frame
			// pointer.
			if (st->fp == 0 || st->fp < st->sp)
				return false;
			__u64 link[2];
			if (bpf_probe_read_user(link, sizeof(link), (void *)st->fp))
				return false;
			st->sp = st->fp + 16;
			st->fp = link[0];
			ra = link[1];
		} else {
			// An interrupted stub that builds no frame: its return address
			// is on top of the stack.
			if (!jvm_read(s, &ra, st->sp))
				return false;
			st->sp += 8;
		}
	} else {
		__u8 leaf = JVM_LEAF_BUILT;
		if (!st->adjust) {
			if (e->leaf == JVM_LEAF_UNKNOWN)
				e->leaf = jvm_leaf(st, e->blob, pc);
			leaf = e->leaf;
		}
		if (leaf == JVM_LEAF_POP) {
			if (!jvm_read(s, &st->fp, st->sp))
				return false;
			st->sp += 8;
			leaf = JVM_LEAF_TOP;
		}
		if (leaf == JVM_LEAF_TOP) {
			if (!jvm_read(s, &ra, st->sp))
				return false;
			st->sp += 8;
		} else {
			// The return address and the caller's frame pointer sit at
			// the top of the frame.
			__u64 caller_sp = st->sp + (__u64)frame_words * 8;
			__u64 link[2]; // saved rbp, return address
			if (bpf_probe_read_user(link, sizeof(link), (void *)(caller_sp - 16))) {
				s->flags |= SAMPLE_USER_READ_ERR;
				count(COUNTER_JVM_READ_ERR);
				return false;
			}
			st->sp = caller_sp;
			st->fp = link[0];
			ra = link[1];
		}
	}
	if (ra == 0 || ra >= USER_ADDR_END)
		return false;
	st->pc = ra;
	st->adjust = 1;
	return true;
}
