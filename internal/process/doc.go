// Package process is the profiler's view of the processes on the host.
//
// The eBPF side reports samples by (pid, tid) and tells user space when a
// process execs or exits. This package keeps, per process, what user space
// needs to turn those samples into attributed stacks: the executable, the
// executable memory mappings (user PC to file and file offset), the cgroup and
// container id, the service name and selected variables of the initial
// environment, optionally the command line, the PID inside the process's own
// PID namespace, and a way to open mapped files through the process's own
// root, which is how files inside containers are reached.
//
// Everything is read from a procfs tree whose root is configurable ("/proc" on
// a host, a host mount such as "/host/proc" in a container, a fake tree in
// tests). The parsers of procfs files (ParseMaps, ContainerIDFromCgroup, the
// stat, status, environ and cmdline parsers) treat their input as untrusted:
// reads are bounded, and they never panic.
//
// Table is the cache the sampling path consults. Get is cheap for a known pid
// (a read-locked map lookup, no system call); loads, reloads after exec and
// rate-limited refreshes read procfs. Process values handed out are immutable
// snapshots: a reload publishes a new *Process and never mutates an old one,
// so callers may keep and share them without locks.
package process
