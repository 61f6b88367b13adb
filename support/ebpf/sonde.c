// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

// Sonde's eBPF programs: a perf-event program run on every CPU at the
// configured frequency, BTF tracepoints that report exec and exit, and (when
// off-CPU profiling is on) a BTF tracepoint on every context switch.
// Everything leaves through one BPF ring buffer; everything dropped is
// counted. This file only declares the programs; their code is in the
// headers, one per concern:
//
//   sonde.h        records, enums and table layouts shared with Go (bpf2go -type)
//   maps.h         maps, load-time constants, counters
//   record.h       building and sending records, unknown-process requests
//   native.h       the native user-stack unwinder (tables, frame pointers)
//   python.h       the CPython unwinder, hooked into native.h's frame loop
//   jvm.h          the HotSpot unwinder, likewise
//   sampler.h      the on-CPU sampler (perf event)
//   offcpu.h       off-CPU tracing (sched_switch)
//   task_events.h  exec and exit
//
// Test programs (testrun.c) include the same headers and run their
// functions with BPF_PROG_TEST_RUN.
#include "sampler.h"
#include "offcpu.h"
#include "task_events.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Unused pointers that make these types reach BTF, so bpf2go generates their Go
// constants; they live in .bss and cost nothing.
const enum counter *unused_counter __attribute__((unused));
const enum record_type *unused_record_type __attribute__((unused));
const enum sample_flags *unused_sample_flags __attribute__((unused));
const struct task_record *unused_task_record __attribute__((unused));
const struct mapping_key *unused_mapping_key __attribute__((unused));
const struct mapping_info *unused_mapping_info __attribute__((unused));
const struct unwind_row *unused_unwind_row __attribute__((unused));
const enum row_bits *unused_row_bits __attribute__((unused));
const enum cfa_type *unused_cfa_type __attribute__((unused));
const enum fp_rule *unused_fp_rule __attribute__((unused));
const struct pid_stats *unused_pid_stats __attribute__((unused));
const struct file_key *unused_file_key __attribute__((unused));
const struct file_table *unused_file_table __attribute__((unused));
const struct offcpu_end_record *unused_offcpu_end_record __attribute__((unused));
const enum offcpu_end_flags *unused_offcpu_end_flags __attribute__((unused));
const struct python_proc *unused_python_proc __attribute__((unused));
const struct jvm_proc *unused_jvm_proc __attribute__((unused));
const struct jvm_heap *unused_jvm_heap __attribute__((unused));
const enum runtime_id *unused_runtime_id __attribute__((unused));
const enum jvm_frame_kind *unused_jvm_frame_kind __attribute__((unused));
const enum v8_frame_kind *unused_v8_frame_kind __attribute__((unused));
const enum php_frame_kind *unused_php_frame_kind __attribute__((unused));
const struct perl_proc *unused_perl_proc __attribute__((unused));
const enum perl_frame_kind *unused_perl_frame_kind __attribute__((unused));
const struct ruby_proc *unused_ruby_proc __attribute__((unused));
const enum ruby_frame_kind *unused_ruby_frame_kind __attribute__((unused));
const enum limits *unused_limits __attribute__((unused));
const enum pc_flags *unused_pc_flags __attribute__((unused));
const struct stack_snapshot *unused_stack_snapshot __attribute__((unused));
const enum mapping_info_flags *unused_mapping_info_flags __attribute__((unused));
const enum row_page *unused_row_page __attribute__((unused));

SEC("perf_event")
int sample_cpu(struct bpf_perf_event_data *ctx)
{
	return sample_cpu_run(ctx);
}

// Two builds of the unwinder: the loader installs the first where the kernel
// has bpf_find_vma (5.17+), the second elsewhere; only one is loaded.
SEC("perf_event")
int unwind_user(struct bpf_perf_event_data *ctx)
{
	return unwind_run(ctx, true, false);
}

SEC("perf_event")
int unwind_user_unchecked(struct bpf_perf_event_data *ctx)
{
	return unwind_run(ctx, false, false);
}

// The same two builds for the off-CPU path. They are never attached: they
// only run as tail calls of off_cpu, and declare its attach point because
// the kernel (6.12+) refuses tail calls between tracing programs of
// different hooks.
SEC("tp_btf/sched_switch")
int off_cpu_unwind_user(void *ctx)
{
	return unwind_run(ctx, true, true);
}

SEC("tp_btf/sched_switch")
int off_cpu_unwind_user_unchecked(void *ctx)
{
	return unwind_run(ctx, false, true);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(off_cpu, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return off_cpu_run(ctx, preempt, prev, next);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *task, pid_t old_pid, struct linux_binprm *bprm)
{
	task_exec(task);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task)
{
	task_exit(task);
	return 0;
}
