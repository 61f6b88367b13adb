package ruby

import "golang.org/x/sys/unix"

// threadPointer is a stopped thread's fsbase.
func threadPointer(r *unix.PtraceRegs) (uint64, bool) { return r.Fs_base, true }
