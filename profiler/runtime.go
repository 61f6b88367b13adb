//go:build linux

package profiler

import (
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/tracer"
)

// A langRuntime is one interpreter or JIT runtime (CPython, HotSpot) whose
// frames an eBPF walker (support/ebpf/<runtime>.h) reports and user space
// names. Each lives in its own file here and package internal/<runtime>;
// the preparer and the resolver hold them as a list and know none of them
// by name. Implementations are safe for concurrent use: the preparer and
// the resolver call them from their own goroutines.
type langRuntime interface {
	// id is the runtime's id in the frames its walker reports
	// (tracer.Runtime*).
	id() uint8
	// prepare examines proc and, if it runs this runtime in a version the
	// walker knows, sets the walker up for it. It reports whether proc is
	// set up (now or at an earlier call for the same image).
	prepare(proc *process.Process) bool
	// forgetImage lets the next prepare of pid examine it again: it
	// exec'd or exited (the kernel drops its walker entry itself).
	forgetImage(pid int)
	// forget lets go of what naming pid's frames holds: its exit has been
	// resolved, its samples with it.
	forget(pid int)
	// frame names a frame the walker reported: its kind, address and
	// second word as the tracer decoded them (tracer.RuntimeFrame), and
	// whether its PC was interrupted rather than a return address.
	frame(pid int, kind uint8, addr, word uint64, interrupted bool) profile.Frame
	// stats writes the runtime's counters into s.
	stats(s *Stats)
}

// runtimeSet is the runtimes by the id their walkers report.
type runtimeSet struct {
	list []langRuntime
	byID [16]langRuntime
}

func newRuntimeSet(rts ...langRuntime) *runtimeSet {
	s := &runtimeSet{list: rts}
	for _, rt := range rts {
		s.byID[rt.id()&15] = rt
	}
	return s
}

// frame names frame i of rec, which a runtime's walker reported.
func (s *runtimeSet) frame(pid int, rec *tracer.Record, i int) profile.Frame {
	ref := fileRef(rec, i)
	id, kind := tracer.RuntimeFrame(ref)
	rt := s.byID[id&15]
	if rt == nil {
		return profile.Frame{Address: rec.User[i]}
	}
	return rt.frame(pid, kind, rec.User[i], ref.Offset, rec.UserFlags[i]&tracer.FrameInterrupted != 0)
}
