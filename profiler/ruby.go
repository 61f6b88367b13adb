//go:build linux

package profiler

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/ruby"
	"github.com/sonde-dev/sonde/tracer"
)

// rubyKernel is what the eBPF Ruby walker is told; the tracer is one.
type rubyKernel interface {
	SetRuby(pid uint32, p tracer.RubyProc) error
	// CheckedMappings: the bpf_loop build of the unwinder, the one with
	// the Ruby walker, is loaded (5.17+).
	CheckedMappings() bool
}

// rubyProcs finds CRuby in the processes the preparer prepares, sets the
// eBPF walker up for them, and names their Ruby frames for the resolver.
// Its methods are safe for concurrent use.
type rubyProcs struct {
	log    *zap.Logger
	kernel rubyKernel
	procfs string
	namer  *ruby.Namer
	// layouts are the Ruby versions the walker knows (ruby.LayoutFor but
	// in tests).
	layouts ruby.LayoutFunc

	seen imageMemo
	logs onceLog

	// retries prepare a process again soon where it is not whole yet.
	retries retrier

	walked          sync.Map      // pid -> start time of the image set up for the walker
	found           atomic.Uint64 // processes set up for the Ruby walker
	unsupported     atomic.Uint64 // Rubies of a version without a layout (or a kernel without the walker)
	failed          atomic.Uint64 // Rubies that could not be set up
	unknownVersions atomic.Uint64 // versions without a layout reported so far (each logged once)
	unnamed         atomic.Uint64 // Ruby frames that could not be named
}

func newRubyProcs(log *zap.Logger, k rubyKernel, procfs string, cacheBytes int64, layouts ruby.LayoutFunc) *rubyProcs {
	if layouts == nil {
		layouts = ruby.LayoutFor
	}
	return &rubyProcs{log: log, kernel: k, procfs: procfs, namer: ruby.NewNamer(procfs, cacheBytes),
		layouts: layouts, logs: onceLog{log: log}}
}

func (rp *rubyProcs) id() uint8 { return tracer.RuntimeRuby }

// prepare examines proc once per image and set of mapped files: if it runs
// a Ruby whose version the table knows, the walker gets its layout and the
// namer its memory.
func (rp *rubyProcs) prepare(proc *process.Process) (found bool) {
	if done, found := rp.seen.begin(proc); done {
		return found
	}
	settled, again := true, false
	defer func() {
		rp.seen.end(proc, settled, found)
		if again {
			rp.seen.again(proc)
		}
	}()
	mem, err := python.OpenMem(rp.procfs, proc.PID)
	if err != nil {
		settled = false
		return false
	}
	in, err := ruby.FindWith(proc, mem, rp.layouts)
	_ = mem.Close() // read only
	switch {
	case errors.Is(err, ruby.ErrNotRuby):
		settled = false // an embedding process may map libruby later
		return false
	case errors.Is(err, ruby.ErrNotStarted):
		settled, again = false, true
		rp.retries.soon(proc.PID)
		return false
	case errors.Is(err, ruby.ErrUnknownVersion):
		rp.unsupported.Add(1)
		if rp.logs.warn(err.Error(), "ruby version not supported: its processes keep native stacks",
			zap.Int("pid", proc.PID), zap.Error(err)) {
			rp.unknownVersions.Add(1)
		}
		return false
	case err != nil:
		rp.failed.Add(1)
		rp.logs.warn(err.Error(), "cannot read the ruby vm: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if !rp.kernel.CheckedMappings() {
		rp.unsupported.Add(1)
		rp.logs.warn("no bpf_loop ruby", "ruby frames need Linux 5.17 or later (bpf_loop, bpf_find_vma): ruby processes keep native stacks",
			zap.Int("pid", proc.PID))
		return false
	}
	kp, err := kernelRuby(in)
	if err == nil && (!setUpBefore(&rp.walked, proc) || !rp.namer.Update(proc.PID, in)) {
		err = rp.namer.Add(proc.PID, in)
	}
	if err == nil {
		err = rp.kernel.SetRuby(uint32(proc.PID), kp)
	}
	if err != nil {
		rp.failed.Add(1)
		rp.logs.warn(err.Error(), "cannot set up ruby unwinding: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if prev, ok := rp.walked.Swap(proc.PID, proc.StartTime); !ok || prev != proc.StartTime {
		rp.found.Add(1)
		rp.log.Debug("ruby set up for the walker", zap.Int("pid", proc.PID), zap.String("version", in.Version))
	}
	if in.Layout.Untested {
		rp.logs.warn("untested ruby "+in.Version, "ruby version supported from its published sources, untested",
			zap.String("version", in.Version))
	}
	return true
}

func (rp *rubyProcs) forgetImage(pid int) {
	rp.seen.forget(pid)
	rp.walked.Delete(pid)
	rp.retries.forget(pid)
}

func (rp *rubyProcs) forget(pid int) { rp.namer.Forget(pid) }

func (rp *rubyProcs) close() { rp.namer.Close() }

// frame names a Ruby frame; one that cannot be named truthfully (its iseq
// freed or replaced since the sample) stays a ruby frame without a name,
// counted.
func (rp *rubyProcs) frame(pid int, _ time.Time, kind uint8, iseq, pc uint64, _ bool) profile.Frame {
	f := profile.Frame{Type: profile.FrameRuby, Address: iseq}
	rf, err := rp.namer.Name(pid, kind, iseq, pc)
	if err != nil {
		if n := rp.unnamed.Add(1); n <= 20 {
			rp.log.Debug("cannot name a ruby frame", zap.Int("pid", pid), zap.Error(err))
		}
		return f
	}
	f.Lines = []profile.Line{{Function: rf.Name, File: rf.File, Line: rf.Line}}
	return f
}

func (rp *rubyProcs) stats(s *Stats) {
	ns := rp.namer.Stats()
	s.Ruby = RubyStats{Processes: rp.found.Load(), Unsupported: rp.unsupported.Load(),
		UnknownVersions: rp.unknownVersions.Load(), Failed: rp.failed.Load(),
		Unnamed: rp.unnamed.Load(), Named: ns.Named, NoLine: ns.NoLine, Stale: ns.Stale,
		CacheEvictions: ns.Evictions, CacheBytes: ns.Bytes}
}

// kernelRuby is the walker's view of in.
func kernelRuby(in *ruby.Interp) (tracer.RubyProc, error) {
	l := in.Layout
	p := tracer.RubyProc{
		TlsOffset:     in.TLSOffset,
		CoreStart:     in.Core.Start,
		CoreEnd:       in.Core.End,
		EcVmStack:     uint16(l.ECVMStack),
		EcVmStackSize: uint16(l.ECVMStackSize),
		EcCfp:         uint16(l.ECCFP),
		CfpSize:       uint16(l.CFPSize),
		CfpPc:         uint16(l.CFPPC),
		CfpIseq:       uint16(l.CFPIseq),
		CfpEp:         uint16(l.CFPEP),
		IseqBody:      uint16(l.IseqBody),
		BodyEncoded:   uint16(l.BodyEncoded),
	}
	// The walker reads tracer.RubyCFPRead bytes of a control frame: its
	// fields must be in them, 8-aligned; the context's words 8-aligned.
	for _, c := range []struct {
		what  string
		off   int64
		block int64
	}{
		{"cfp pc", l.CFPPC, int64(tracer.RubyCFPRead)}, {"cfp iseq", l.CFPIseq, int64(tracer.RubyCFPRead)},
		{"cfp ep", l.CFPEP, int64(tracer.RubyCFPRead)},
		{"ec vm stack", l.ECVMStack, 1024}, {"ec vm stack size", l.ECVMStackSize, 1024}, {"ec cfp", l.ECCFP, 1024},
		{"iseq body", l.IseqBody, 1024}, {"body iseq_encoded", l.BodyEncoded, 1024},
	} {
		if c.off < 0 || c.off%8 != 0 || c.off+8 > c.block {
			return p, fmt.Errorf("ruby %s: %s at %d outside the walker's %d bytes", in.Version, c.what, c.off, c.block)
		}
	}
	if l.CFPSize <= 0 || l.CFPSize%8 != 0 || l.CFPSize > 1024 {
		return p, fmt.Errorf("ruby %s: control frames of %d bytes", in.Version, l.CFPSize)
	}
	if in.TLSOffset == 0 || in.TLSOffset > 1<<20 || in.Core.End <= in.Core.Start {
		return p, fmt.Errorf("ruby %s: tls offset %d, vm loop %#x..%#x", in.Version, in.TLSOffset, in.Core.Start, in.Core.End)
	}
	return p, nil
}
