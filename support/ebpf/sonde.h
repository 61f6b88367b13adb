// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Records and counters shared by Sonde's eBPF programs and its Go side. The Go
// types are generated from these definitions by bpf2go (-type), so a layout
// change here is a compile error there, not a silent mismatch.
#pragma once

#define MAX_KERNEL_FRAMES 127
#define MAX_USER_FRAMES 127
#define TASK_COMM_LEN 16

enum record_type {
	RECORD_SAMPLE = 1,
	RECORD_EXEC = 2,
	RECORD_EXIT = 3,
};

// sample_flags say how complete a sample's stacks are.
enum sample_flags {
	SAMPLE_KERNEL_STACK_ERR = 1 << 0, // bpf_get_stack failed for the kernel stack
	SAMPLE_USER_STACK_ERR = 1 << 1,   // bpf_get_stack failed for the user stack
	SAMPLE_USER_TRUNCATED = 1 << 2,   // the user stack filled every slot
	SAMPLE_FRAME_POINTERS = 1 << 3,   // the user stack came from the frame-pointer chain
};

// sample_record is one on-CPU sample. Only the used part of stack[] is sent:
// kernel frames first (kernel_len of them), then user frames (user_len), each
// leaf first.
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
	__u64 stack[MAX_KERNEL_FRAMES + MAX_USER_FRAMES];
};

// task_record tells user space a process exec'd or exited.
struct task_record {
	__u32 type;
	__u32 pid;
	__u64 ktime;
	char comm[TASK_COMM_LEN];
};

// counter indexes the per-CPU counters map. Every drop has a counter.
enum counter {
	COUNTER_SAMPLES = 0,         // perf events that fired
	COUNTER_SAMPLES_SENT,        // sample records written to the ring buffer
	COUNTER_SAMPLES_LOST,        // ring buffer full: sample dropped
	COUNTER_IDLE_SKIPPED,        // the CPU was idle (pid 0)
	COUNTER_KERNEL_STACK_ERR,    // kernel stack could not be read
	COUNTER_USER_STACK_ERR,      // user stack could not be read
	COUNTER_TASK_EVENTS_SENT,    // exec/exit records written
	COUNTER_TASK_EVENTS_LOST,    // ring buffer full: exec/exit record dropped
	COUNTER_MAX,
};
