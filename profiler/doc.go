// Package profiler is Sonde's profiler core, usable without the
// OpenTelemetry Collector: it samples every thread of a Linux host with
// eBPF, unwinds and names kernel, native and Go frames on the host, and
// emits one pprofile.Profiles per reporting interval.
//
//	p, err := profiler.New(profiler.DefaultOptions())
//	if err != nil { ... }          // what the host lacks, in one error
//	defer p.Close()
//	err = p.Run(ctx, func(ctx context.Context, pd pprofile.Profiles) error { ... })
//
// New loads the eBPF programs; Run runs the pipeline until its context ends
// and calls emit from its own goroutine with each interval that holds
// samples; Stats returns a snapshot of every counter and gauge; Close
// releases the kernel objects. The Collector receiver in package collector
// is a thin adapter over this package. The profiler runs on Linux only; on
// other systems only Options and their validation build.
//
// # Glossary
//
// The same file is named in several ways on its way from a sample to a
// profile, each cheaper or more durable than the next:
//
//   - File id (elfx.FileID): a file's identity by content, a hash of its
//     size and its two ends. Files with the same id share one unwind table
//     and one set of symbol data, whichever path or process maps them. It is
//     the mapping attribute process.executable.build_id.htlhash.
//   - File key: a file's identity as /proc/PID/maps states it (device,
//     inode, path), found without a system call; the resolver's cache from
//     a mapped file to its file id.
//   - Handle: the small number the unwinder gives a file id in the kernel's
//     maps. The eBPF side reports each user frame as (handle, file offset),
//     so the frame stays nameable after the process unmaps the file or
//     exits.
//   - Mapping: a range of a process's address space backed by one file at
//     one offset. process.Mapping is a line of /proc/PID/maps;
//     tracer.Mapping is its executable part as the kernel's per-process map
//     holds it (range, handle, load bias); profile.Mapping is the mapping of
//     the emitted profile.
//   - Table: the unwind table of one file id, built from its CFI
//     (.eh_frame, .debug_frame) or Go pclntab and loaded in a BPF map; it
//     stays loaded while any process maps the file, within
//     Options.UnwindTableBytes.
//   - Row: one entry of a table: from a file offset on, how to find the
//     canonical frame address, the return address and the caller's frame
//     pointer. The eBPF side binary-searches a table for the row that covers
//     a PC.
package profiler
