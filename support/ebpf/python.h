// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The CPython unwinder. User space tells it which processes run CPython
// and how that version lays out its state (python_procs in maps.h, filled
// when a process is prepared, cleared at exec and exit). At the start of a
// user stack, py_begin finds the sampled thread's thread state in the
// interpreter's thread list by its thread pointer (fsbase, which pthread_self() returns and PyThreadState
// keeps as thread_id) and takes its innermost frame. Then, as the native
// unwinder meets each frame of _PyEval_EvalFrameDefault, py_frame
// replaces it with the Python frames that run of the eval loop executes:
// one on 3.6–3.10, every frame up to the run's entry on 3.11 and later.
// A Python frame leaves as (code object | PC_FLAG_RUNTIME, instruction);
// user space names it from the code object.
#pragma once

#include "record.h"

// Threads of one interpreter searched for the sampled thread's state.
#define PY_MAX_THREADS 32

static __always_inline long py_read(void *dst, __u32 size, __u64 addr)
{
	return bpf_probe_read_user(dst, size, (void *)addr);
}

// py_thread_state returns the address of the thread state whose thread_id
// is fsbase, or 0.
static __always_inline __u64 py_thread_state(struct python_proc *pp, __u32 tid, __u64 fsbase)
{
	__u64 id = 0, ts = 0, is = 0;
	__u64 *cached = bpf_map_lookup_elem(&python_threads, &tid);
	if (cached) {
		ts = *cached;
		if (!py_read(&id, sizeof(id), ts + pp->thread_id) && id == fsbase)
			return ts;
	}
	if (py_read(&is, sizeof(is), pp->interp_head) || is == 0 ||
	    py_read(&ts, sizeof(ts), is + pp->interp_threads_head))
		return 0;
	for (int i = 0; i < PY_MAX_THREADS && ts != 0; i++) {
		if (py_read(&id, sizeof(id), ts + pp->thread_id))
			return 0;
		if (id == fsbase) {
			bpf_map_update_elem(&python_threads, &tid, &ts, BPF_ANY);
			return ts;
		}
		if (py_read(&ts, sizeof(ts), ts + pp->thread_next))
			return 0;
	}
	return 0;
}

// py_begin readies the Python walk of the current thread of process tgid:
// st->py_frame is its innermost Python frame, or 0.
static __always_inline void py_begin(struct ustack_state *st, __u32 rt, __u32 tgid, __u32 tid)
{
	st->py_active = 0;
	st->py_walking = 0;
	st->py_run = 0;
	st->py_frame = 0;
	if (!HAS_RUNTIME(rt, RUNTIME_PYTHON))
		return;
	struct python_proc *pp = bpf_map_lookup_elem(&python_procs, &tgid);
	if (!pp)
		return;
	st->py = *pp;
	st->py_active = 1;
	count(COUNTER_PY_SAMPLES);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 fsbase = ARCH_THREAD_POINTER(task);
	__u64 ts = py_thread_state(&st->py, tid, fsbase);
	if (ts == 0) {
		count(COUNTER_PY_NO_THREAD);
		return;
	}
	__u64 f = 0;
	if (py_read(&f, sizeof(f), ts + st->py.thread_frame)) {
		count(COUNTER_PY_READ_ERR);
		return;
	}
	if (st->py.cframe_current != PY_NONE && f != 0 &&
	    py_read(&f, sizeof(f), f + st->py.cframe_current)) {
		count(COUNTER_PY_READ_ERR);
		return;
	}
	st->py_frame = f;
}

// py_in_eval says whether a native PC is in the eval loop.
static __always_inline bool py_in_eval(struct ustack_state *st, __u64 pc)
{
	return (pc >= st->py.eval_start && pc < st->py.eval_end) ||
	       (pc >= st->py.cold_start && pc < st->py.cold_end);
}

enum py_result {
	PY_STOP, // nothing emitted: no (readable) Python frame left
	PY_MORE, // one frame emitted; the run goes on
	PY_LAST, // one frame emitted; it was the run's entry frame
	PY_END,  // nothing emitted: the run's shim frame was passed
};

// py_frame emits the next Python frame of the current run into slots
// stack[idx], stack[idx + 1] and moves st->py_frame to its caller. A chain
// that cannot be read, or holds no code object, ends the walk (counted):
// the remaining eval frames show as native frames.
static __always_inline enum py_result py_frame(struct ustack_state *st, struct sample_record *s,
                                               __u32 idx)
{
	__u64 f = st->py_frame;
	if (f == 0)
		return PY_STOP;
	__u64 next = 0;
	if (py_read(&next, sizeof(next), f + st->py.frame_back))
		goto read_err;
	if (st->py.frame_owner != PY_NONE) {
		__u8 owner = 0;
		if (py_read(&owner, sizeof(owner), f + st->py.frame_owner))
			goto read_err;
		if (owner >= st->py.owner_shim_from) {
			st->py_frame = next;
			return PY_END;
		}
	}
	__u64 code = 0, instr = 0;
	if (py_read(&code, sizeof(code), f + st->py.frame_code))
		goto read_err;
	code &= ~(__u64)st->py.executable_mask;
	if (code == 0 || (code & 7) != 0 || code >= (1ULL << 47)) {
		count(COUNTER_PY_BAD_FRAME);
		st->py_frame = 0;
		return PY_STOP;
	}
	if (st->py.instr_is_int) {
		__u32 lasti = 0;
		if (py_read(&lasti, sizeof(lasti), f + st->py.frame_instr))
			goto read_err;
		instr = lasti;
	} else if (py_read(&instr, sizeof(instr), f + st->py.frame_instr)) {
		goto read_err;
	}
	enum py_result r = PY_MORE;
	if (st->py.frame_is_entry != PY_NONE) {
		__u8 entry = 0;
		if (py_read(&entry, sizeof(entry), f + st->py.frame_is_entry))
			goto read_err;
		if (entry)
			r = PY_LAST;
	} else if (st->py.frame_owner == PY_NONE) {
		r = PY_LAST; // one frame per run
	}
	if (idx + 1 < MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES) {
		s->stack[idx] = code | PC_FLAG_RUNTIME;
		s->stack[idx + 1] = instr;
	}
	st->py_frame = next;
	st->py_run++;
	count(COUNTER_PY_FRAMES);
	return r;
read_err:
	count(COUNTER_PY_READ_ERR);
	st->py_frame = 0;
	return PY_STOP;
}

// CPython's perf trampoline (-X perf, -X perf_jit, PYTHONPERFSUPPORT) runs
// every eval-loop call through a copy of Python/asm_trampoline.S in
// anonymous memory: "sub $8,%rsp; call *%rcx; add $8,%rsp; ret" on x86-64,
// with no frame pointer pushed and no CFI the kernel can see. At a return
// address into it (just after the call), its caller's return address is at
// sp + 8 and its caller's sp is sp + 16; rbp is untouched. py_trampoline_step
// takes that step when the code around pc is the trampoline's, and says
// whether it did.
static __always_inline bool py_trampoline_step(struct ustack_state *st, __u64 pc)
{
	__u64 code[2] = {};
	// The bytes from pc - 6: sub $8,%rsp; call *%rcx | add $8,%rsp; ret.
	if (py_read(code, 11, pc - 6) || code[0] != 0x8348d1ff08ec8348ULL || code[1] != 0xc308c4ULL)
		return false;
	__u64 ra = 0;
	if (py_read(&ra, sizeof(ra), st->sp + 8) || ra == 0)
		return false;
	st->sp += 16;
	st->pc = ra;
	st->adjust = 1;
	return true;
}
