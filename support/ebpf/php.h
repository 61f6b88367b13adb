// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The PHP unwinder (the Zend Engine of PHP 8, NTS builds). User space
// tells it which processes run PHP, where their executor globals and VM
// (execute_ex) are and how their version lays out a frame and a function
// (php_procs in maps.h; internal/php's Interp.Stack is the executable
// specification of this walk).
//
// PHP calls PHP without a native call: one execute_ex frame on the native
// stack runs every PHP frame from the current one up to the frame it was
// entered with, whose call info has ZEND_CALL_TOP. The frames are the
// chain from executor_globals.current_execute_data along
// prev_execute_data. As the native unwinder meets each frame of
// execute_ex, php_frame replaces it with the PHP frames of its run: the
// internal functions (C) the run called and its user frames up to the
// entry frame. The native frames of C that PHP called stay where they ran.
//
// The hybrid VM keeps the current frame in r14 and its opline in r15 and
// writes the frame's opline field only before calls: the frame r14 names
// takes its line from r15 (when r15 is one of its opcodes). opcache's JIT
// code runs on execute_ex's native frame, with the same registers: a PC in
// it is a run of PHP frames too, stepped over as execute_ex's body.
#pragma once

#include "record.h"

// Frames without a function (dummy frames) skipped in one step.
#define PHP_MAX_SKIP 4

// php_vm_regs reads r14 and r15 of the sampled thread, if the registers
// saved at its last entry into the kernel are those of the sample (the
// same pc): a perf event interrupting user mode saves them there too.
static __always_inline void php_vm_regs(struct ustack_state *st)
{
	st->php_r14 = 0;
	st->php_r15 = 0;
#if defined(__TARGET_ARCH_arm64)
	// The hybrid VM's registers are x86-64's: no PHP walk on aarch64 (user
	// space never registers a process for it there).
	return;
#else
	if (current_flags() & PF_KTHREAD)
		return;
	struct pt_regs *regs;
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)) {
		regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	} else {
		struct task_struct *task = (struct task_struct *)bpf_get_current_task();
		void *stack = BPF_CORE_READ(task, stack);
		regs = (struct pt_regs *)(stack + THREAD_SIZE) - 1;
	}
	__u64 ip = 0, r14 = 0, r15 = 0;
	if (bpf_probe_read_kernel(&ip, sizeof(ip), &regs->ip) || ip != st->pc ||
	    bpf_probe_read_kernel(&r14, sizeof(r14), &regs->r14) ||
	    bpf_probe_read_kernel(&r15, sizeof(r15), &regs->r15))
		return;
	st->php_r14 = r14;
	st->php_r15 = r15;
#endif
}

// php_begin readies the PHP walk of the current stack of process tgid:
// st->php_ex is its innermost PHP frame, or 0.
static __always_inline void php_begin(struct ustack_state *st, __u32 rt, __u32 tgid)
{
	st->php_active = 0;
	st->php_walking = 0;
	st->php_run = 0;
	st->php_ex = 0;
	if (!HAS_RUNTIME(rt, RUNTIME_PHP))
		return;
	struct php_proc *pp = bpf_map_lookup_elem(&php_procs, &tgid);
	if (!pp)
		return;
	st->php = *pp;
	st->php_active = 1;
	count(COUNTER_PHP_SAMPLES);
	if (bpf_probe_read_user(&st->php_ex, sizeof(st->php_ex), (void *)st->php.current_ex)) {
		st->php_ex = 0;
		count(COUNTER_PHP_READ_ERR);
		return;
	}
	php_vm_regs(st);
}

// php_in_exec says whether a native PC is in the VM.
static __always_inline bool php_in_exec(struct ustack_state *st, __u64 pc)
{
	return pc >= st->php.exec_start && pc < st->php.exec_end;
}

// php_in_jit says whether a native PC is in opcache's JIT code.
static __always_inline bool php_in_jit(struct ustack_state *st, __u64 pc)
{
	return pc >= st->php.jit_start && pc < st->php.jit_end;
}

// php_word returns the 8 bytes at byte off of a block read into words
// slots, or 0 for one outside it.
static __always_inline __u64 php_word(__u64 *slots, __u32 nwords, __u16 off)
{
	__u32 i = off >> 3;
	if (i >= nwords)
		return 0;
	return slots[i];
}

// php_u32 returns the 4 bytes at byte off (4-aligned) of such a block.
static __always_inline __u32 php_u32(__u64 *slots, __u32 nwords, __u16 off)
{
	return (__u32)(php_word(slots, nwords, off) >> ((off & 4) * 8));
}

// php_opline_in says whether opline is one of the opcodes of a function.
static __always_inline bool php_opline_in(struct ustack_state *st, __u64 opcodes, __u32 last,
                                          __u64 opline)
{
	__u64 size = st->php.op_size;
	return size != 0 && opline >= opcodes && opline < opcodes + (__u64)last * size &&
	       (opline - opcodes) % size == 0;
}

enum php_result {
	PHP_STOP, // nothing emitted: no (readable) PHP frame left
	PHP_MORE, // one frame emitted; the run goes on
	PHP_LAST, // one frame emitted; it was the run's entry frame
};

// php_frame emits the next PHP frame of the current run into slots
// stack[idx], stack[idx + 1] and moves st->php_ex to its caller. A chain
// that cannot be read, or holds no function the walker knows (read while
// it changed, or corrupt), ends the walk, counted: the remaining execute_ex
// frames show as native frames.
static __always_inline enum php_result php_frame(struct ustack_state *st, struct sample_record *s,
                                                 __u32 idx)
{
	__u64 ex = st->php_ex;
	for (int i = 0; i < PHP_MAX_SKIP; i++) {
		if (ex == 0)
			goto stop;
		if ((ex & 7) || ex >= USER_ADDR_END)
			goto bad;
		if (bpf_probe_read_user(st->php_ex_slots, sizeof(st->php_ex_slots), (void *)ex))
			goto read_err;
		__u64 *xs = st->php_ex_slots;
		const __u32 xn = PHP_EX_READ / 8;
		__u64 fn = php_word(xs, xn, st->php.ex_func);
		__u64 prev = php_word(xs, xn, st->php.ex_prev);
		if (fn == 0) {
			ex = prev; // a dummy frame
			continue;
		}
		if ((fn & 7) || fn >= USER_ADDR_END)
			goto bad;
		if (bpf_probe_read_user(st->php_fn_slots, sizeof(st->php_fn_slots), (void *)fn))
			goto read_err;
		__u64 *fs = st->php_fn_slots;
		const __u32 fnw = PHP_FN_READ / 8;
		__u32 info = php_u32(xs, xn, st->php.ex_call_info);
		__u8 type =
		        (__u8)(php_word(fs, fnw, st->php.fn_type) >> ((st->php.fn_type & 7) * 8));
		__u32 kind;
		__u64 word;
		if (type == 1) { // ZEND_INTERNAL_FUNCTION
			kind = PHP_FRAME_INTERNAL;
			word = (__u32)php_word(fs, fnw, st->php.fn_name);
		} else if (type == 2 || type == 4) { // ZEND_USER_FUNCTION, ZEND_EVAL_CODE
			kind = !(info & st->php.call_code) ? PHP_FRAME_FUNCTION
			       : type == 4                 ? PHP_FRAME_EVAL
			       : prev == 0                 ? PHP_FRAME_MAIN
			                                   : PHP_FRAME_INCLUDE;
			__u64 opcodes = php_word(fs, fnw, st->php.op_opcodes);
			__u32 last = php_u32(fs, fnw, st->php.op_last);
			if (opcodes == 0)
				goto bad;
			__u64 opline = php_word(xs, xn, st->php.ex_opline);
			if (ex == st->php_r14 && php_opline_in(st, opcodes, last, st->php_r15))
				opline = st->php_r15;
			__u32 line = 0;
			if (!php_opline_in(st, opcodes, last, opline) ||
			    bpf_probe_read_user(&line, sizeof(line),
			                        (void *)(opline + st->php.op_lineno)))
				line = 0;
			word = ((__u64)line << 32) | (__u32)opcodes;
			if (kind != PHP_FRAME_FUNCTION) {
				// Top-level code: named by its file, which outlives it.
				__u64 file = 0;
				if (bpf_probe_read_user(&file, sizeof(file),
				                        (void *)(fn + st->php.op_filename)))
					goto read_err;
				if (file == 0 || (file & 7) || file >= USER_ADDR_END)
					goto bad;
				fn = file;
				word = ((__u64)line << 32) | (__u32)file;
			}
		} else {
			goto bad;
		}
		if (idx + 1 < MAX_KERNEL_FRAMES + 2 * MAX_USER_FRAMES) {
			s->stack[idx] = (fn & PC_RUNTIME_ADDR_MASK) | PC_FLAG_RUNTIME |
			                ((__u64)RUNTIME_PHP << RUNTIME_SHIFT) |
			                ((__u64)kind << RUNTIME_KIND_SHIFT);
			s->stack[idx + 1] = word;
		}
		st->php_ex = prev;
		st->php_run++;
		count(COUNTER_PHP_FRAMES);
		// A user frame called from C ends the run; an internal one was
		// called by the run (or by C it called).
		return kind != PHP_FRAME_INTERNAL && (info & st->php.call_top) ? PHP_LAST
		                                                               : PHP_MORE;
	}
bad:
	count(COUNTER_PHP_BAD_FRAME);
stop:
	st->php_ex = 0;
	return PHP_STOP;
read_err:
	count(COUNTER_PHP_READ_ERR);
	st->php_ex = 0;
	return PHP_STOP;
}
