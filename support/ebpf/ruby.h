// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The Ruby unwinder (CRuby 3.x, the YARV VM). User space tells it which
// processes run Ruby, where a thread's execution context is (the
// thread-local ruby_current_ec, at a fixed distance below the thread
// pointer), where the VM loop (vm_exec_core) is and how the version lays
// out a context and a control frame (ruby_procs in maps.h;
// internal/ruby's Interp.Stack is the executable specification of this
// walk).
//
// Ruby calls Ruby without a native call: one vm_exec_core frame on the
// native stack runs every control frame from the current one up to the
// first with VM_FRAME_FLAG_FINISH. Control frames are an array at the top
// of the context's VM stack, the innermost at ec->cfp, callers above it up
// to the stack's end. As the native unwinder meets each frame of
// vm_exec_core, ruby_frame replaces it with the Ruby frames of its run,
// each reported as its instruction sequence, the pc's position in it and,
// for a method, its method entry (which names its class). C functions' control
// frames are skipped: their code runs as native frames, which stay where
// they ran.
#pragma once

#include "record.h"

// Control frames without an iseq (C functions, dummy frames) skipped in
// one step.
#define RUBY_MAX_SKIP 4

// Frame flags in ep[0] (the same in every 3.x).
#define RUBY_FRAME_MAGIC_MASK 0x7fff0001ULL
#define RUBY_MAGIC_CFUNC      0x55550001ULL
#define RUBY_MAGIC_IFUNC      0x66660001ULL
#define RUBY_MAGIC_DUMMY      0x79990001ULL
#define RUBY_MAGIC_METHOD     0x11110001ULL
#define RUBY_FLAG_FINISH      0x0020ULL
#define RUBY_FLAG_CFRAME      0x0080ULL

// ruby_begin readies the Ruby walk of the current stack of process tgid:
// st->rb_cfp is the thread's innermost control frame, or 0.
static __always_inline void ruby_begin(struct ustack_state *st, __u32 rt, __u32 tgid)
{
	st->rb_active = 0;
	st->rb_walking = 0;
	st->rb_run = 0;
	st->rb_any = 0;
	st->rb_cfp = 0;
	st->rb_end = 0;
	if (!HAS_RUNTIME(rt, RUNTIME_RUBY))
		return;
	struct ruby_proc *rp = bpf_map_lookup_elem(&ruby_procs, &tgid);
	if (!rp)
		return;
	st->rb = *rp;
	st->rb_active = 1;
	count(COUNTER_RUBY_SAMPLES);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 tp = ARCH_THREAD_POINTER(task);
	__u64 ec = 0;
	if (tp <= st->rb.tls_offset ||
	    bpf_probe_read_user(&ec, sizeof(ec), (void *)(tp - st->rb.tls_offset))) {
		count(COUNTER_RUBY_READ_ERR);
		return;
	}
	if (ec == 0)
		return; // a thread that runs no Ruby
	if ((ec & 7) || ec >= USER_ADDR_END) {
		count(COUNTER_RUBY_BAD_FRAME);
		return;
	}
	__u64 w[3] = {};
	if (bpf_probe_read_user(&w[0], sizeof(w[0]), (void *)(ec + st->rb.ec_vm_stack)) ||
	    bpf_probe_read_user(&w[1], sizeof(w[1]), (void *)(ec + st->rb.ec_vm_stack_size)) ||
	    bpf_probe_read_user(&w[2], sizeof(w[2]), (void *)(ec + st->rb.ec_cfp))) {
		count(COUNTER_RUBY_READ_ERR);
		return;
	}
	__u64 end = w[0] + w[1] * 8;
	if (w[1] > (1ULL << 28) || w[2] < w[0] || w[2] > end || st->rb.cfp_size == 0) {
		count(COUNTER_RUBY_BAD_FRAME);
		return;
	}
	st->rb_cfp = w[2];
	st->rb_end = end;
}

// ruby_in_core says whether a native PC is in the VM loop.
static __always_inline bool ruby_in_core(struct ustack_state *st, __u64 pc)
{
	return pc >= st->rb.core_start && pc < st->rb.core_end;
}

enum ruby_result {
	RUBY_STOP, // nothing emitted: no (readable) Ruby frame left
	RUBY_MORE, // one frame emitted; the run goes on
	RUBY_LAST, // one frame emitted; it was the run's first (FINISH)
};

// ruby_frame emits the next Ruby frame of the current run into slots
// stack[idx], stack[idx + 1] and moves st->rb_cfp to its caller. A frame
// that cannot be read, or makes no sense (read while it changed, or
// corrupt), ends the walk, counted: the remaining vm_exec_core frames show
// as native frames.
static __always_inline enum ruby_result ruby_frame(struct ustack_state *st, struct sample_record *s,
                                                   __u32 idx)
{
	__u64 cfp = st->rb_cfp;
	for (int i = 0; i < RUBY_MAX_SKIP; i++) {
		if (cfp == 0 || cfp >= st->rb_end)
			goto stop;
		if ((cfp & 7) || cfp >= USER_ADDR_END)
			goto bad;
		if (bpf_probe_read_user(st->rb_cfp_slots, sizeof(st->rb_cfp_slots), (void *)cfp))
			goto read_err;
		__u64 next = cfp + st->rb.cfp_size;
		__u64 *cs = st->rb_cfp_slots;
		const __u32 cn = RUBY_CFP_READ / 8;
		__u32 ipc = st->rb.cfp_pc >> 3, iiseq = st->rb.cfp_iseq >> 3,
		      iep = st->rb.cfp_ep >> 3;
		if (ipc >= cn || iiseq >= cn || iep >= cn)
			goto bad;
		__u64 pc = cs[ipc], iseq = cs[iiseq], ep = cs[iep];
		if (ep == 0 || (ep & 7) || ep >= USER_ADDR_END)
			goto bad;
		__u64 flags = 0;
		if (bpf_probe_read_user(&flags, sizeof(flags), (void *)ep))
			goto read_err;
		__u64 magic = flags & RUBY_FRAME_MAGIC_MASK;
		if ((flags & RUBY_FLAG_CFRAME) || magic == RUBY_MAGIC_CFUNC ||
		    magic == RUBY_MAGIC_IFUNC || magic == RUBY_MAGIC_DUMMY || iseq == 0 ||
		    pc == 0) {
			cfp = next; // a C function's or a dummy frame
			continue;
		}
		if ((iseq & 7) || iseq >= USER_ADDR_END)
			goto bad;
		// The pc's position in the iseq's instructions, and a method
		// frame's method entry.
		__u64 body = 0, encoded = 0, me = 0;
		if (bpf_probe_read_user(&body, sizeof(body), (void *)(iseq + st->rb.iseq_body)))
			goto read_err;
		if (body == 0 || (body & 7) || body >= USER_ADDR_END)
			goto bad;
		if (bpf_probe_read_user(&encoded, sizeof(encoded),
		                        (void *)(body + st->rb.body_encoded)))
			goto read_err;
		const __u64 unknown = (1ULL << RUBY_POS_BITS) - 1;
		__u64 pos = unknown;
		if (pc >= encoded && (pc - encoded) / 8 < unknown)
			pos = (pc - encoded) / 8;
		__u64 delta = 0; // the method entry's distance from the iseq, in words
		if (magic == RUBY_MAGIC_METHOD &&
		    !bpf_probe_read_user(&me, sizeof(me), (void *)(ep - 16)) && me != 0 &&
		    !(me & 7)) {
			__s64 d = ((__s64)me - (__s64)iseq) / 8;
			if (d >= -(1LL << 31) && d < (1LL << 31))
				delta = (__u32)(__s32)d;
		}
		if (idx + 1 < MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES) {
			s->stack[idx] = (iseq & PC_RUNTIME_ADDR_MASK) | PC_FLAG_RUNTIME |
			                ((__u64)RUNTIME_RUBY << RUNTIME_SHIFT) |
			                ((__u64)RUBY_FRAME_ISEQ << RUNTIME_KIND_SHIFT);
			s->stack[idx + 1] =
			        (pos << (64 - RUBY_POS_BITS)) |
			        (((body >> 4) & ((1ULL << RUBY_CHECK_BITS) - 1)) << 32) | delta;
		}
		st->rb_cfp = next;
		st->rb_run++;
		st->rb_any = 1;
		count(COUNTER_RUBY_FRAMES);
		return (flags & RUBY_FLAG_FINISH) ? RUBY_LAST : RUBY_MORE;
	}
	// More frames without an iseq than one step skips: end the run here
	// rather than guess.
	goto stop;
bad:
	count(COUNTER_RUBY_BAD_FRAME);
stop:
	st->rb_cfp = 0;
	return RUBY_STOP;
read_err:
	count(COUNTER_RUBY_READ_ERR);
	st->rb_cfp = 0;
	return RUBY_STOP;
}
