//go:build linux

package profiler

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/perl"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/tracer"
)

// perlKernel is what the eBPF Perl walker is told; the tracer is one.
type perlKernel interface {
	SetPerl(pid uint32, p tracer.PerlProc) error
	// CheckedMappings: the bpf_loop build of the unwinder, the one with
	// the Perl walker, is loaded (5.17+).
	CheckedMappings() bool
}

// perlProcs finds Perl 5 in the processes the preparer prepares, sets the
// eBPF walker up for them, and names their Perl frames for the resolver.
// Its methods are safe for concurrent use.
type perlProcs struct {
	log    *zap.Logger
	kernel perlKernel
	procfs string
	namer  *perl.Namer
	// layouts are the Perl versions the walker knows (perl.LayoutFor but
	// in tests).
	layouts perl.LayoutFunc

	seen imageMemo
	logs onceLog

	walked      sync.Map      // pid -> start time of the image set up for the walker
	found       atomic.Uint64 // processes set up for the Perl walker
	unsupported atomic.Uint64 // Perls of a version without a layout (or a kernel without the walker)
	failed      atomic.Uint64 // Perls that could not be set up
	// unknownVersions counts the versions without a layout reported so
	// far (each is logged once).
	unknownVersions atomic.Uint64
	unnamed         atomic.Uint64 // Perl frames that could not be named
}

func newPerlProcs(log *zap.Logger, k perlKernel, procfs string, cacheBytes int64, layouts perl.LayoutFunc) *perlProcs {
	if layouts == nil {
		layouts = perl.LayoutFor
	}
	return &perlProcs{log: log, kernel: k, procfs: procfs, namer: perl.NewNamer(procfs, cacheBytes),
		layouts: layouts, logs: onceLog{log: log}}
}

func (pp *perlProcs) id() uint8 { return tracer.RuntimePerl }

// prepare examines proc once per image and set of mapped files: if it runs
// a Perl whose version the table knows, the walker gets its layout and the
// namer its memory.
func (pp *perlProcs) prepare(proc *process.Process) (found bool) {
	if done, found := pp.seen.begin(proc); done {
		return found
	}
	settled := true
	defer func() { pp.seen.end(proc, settled, found) }()

	in, err := perl.FindWith(proc, pp.layouts)
	switch {
	case errors.Is(err, perl.ErrNotPerl):
		settled = false // an embedding process may map libperl later
		return false
	case errors.Is(err, perl.ErrUnknownVersion), errors.Is(err, perl.ErrNoMultiplicity):
		pp.unsupported.Add(1)
		if pp.logs.warn(err.Error(), "perl version not supported: its processes keep native stacks",
			zap.Int("pid", proc.PID), zap.Error(err)) {
			pp.unknownVersions.Add(1)
		}
		return false
	case err != nil:
		pp.failed.Add(1)
		pp.logs.warn(err.Error(), "cannot read the perl interpreter: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if !pp.kernel.CheckedMappings() {
		pp.unsupported.Add(1)
		pp.logs.warn("no bpf_loop perl", "perl frames need Linux 5.17 or later (bpf_loop, bpf_find_vma): perl processes keep native stacks",
			zap.Int("pid", proc.PID))
		return false
	}
	kp, err := kernelPerl(in)
	if err == nil && (!setUpBefore(&pp.walked, proc) || !pp.namer.Known(proc.PID)) {
		err = pp.namer.Add(proc.PID, in)
	}
	if err == nil {
		err = pp.kernel.SetPerl(uint32(proc.PID), kp)
	}
	if err != nil {
		pp.failed.Add(1)
		pp.logs.warn(err.Error(), "cannot set up perl unwinding: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if prev, ok := pp.walked.Swap(proc.PID, proc.StartTime); !ok || prev != proc.StartTime {
		pp.found.Add(1)
		pp.log.Debug("perl set up for the walker", zap.Int("pid", proc.PID), zap.String("version", in.Version))
	}
	if in.Layout.Untested {
		pp.logs.warn("untested perl "+in.Version, "perl version supported from its published sources, untested",
			zap.String("version", in.Version))
	}
	return true
}

func (pp *perlProcs) forgetImage(pid int) {
	pp.seen.forget(pid)
	pp.walked.Delete(pid)
}

func (pp *perlProcs) forget(pid int) { pp.namer.Forget(pid) }

func (pp *perlProcs) close() { pp.namer.Close() }

// frame names a Perl frame; one that cannot be named truthfully (its sub
// or statement freed or replaced since the sample) stays a perl frame
// without a name, counted.
func (pp *perlProcs) frame(pid int, _ time.Time, kind uint8, addr, word uint64, _ bool) profile.Frame {
	f := profile.Frame{Type: profile.FramePerl, Address: addr}
	pf, err := pp.namer.Name(pid, kind, addr, word)
	if err != nil {
		if n := pp.unnamed.Add(1); n <= 20 {
			pp.log.Debug("cannot name a perl frame", zap.Int("pid", pid), zap.Error(err))
		}
		return f
	}
	f.Lines = []profile.Line{{Function: pf.Name, File: pf.File, Line: pf.Line}}
	return f
}

func (pp *perlProcs) stats(s *Stats) {
	ns := pp.namer.Stats()
	s.Perl = PerlStats{Processes: pp.found.Load(), Unsupported: pp.unsupported.Load(),
		UnknownVersions: pp.unknownVersions.Load(), Failed: pp.failed.Load(),
		Unnamed: pp.unnamed.Load(), Named: ns.Named, NoLine: ns.NoLine, Gone: ns.Gone, Stale: ns.Stale,
		CacheEvictions: ns.Evictions, CacheBytes: ns.Bytes}
}

// kernelPerl is the walker's view of in.
func kernelPerl(in *perl.Interp) (tracer.PerlProc, error) {
	l := in.Layout
	p := tracer.PerlProc{
		CurInterp:       in.CurInterp,
		RunopsStart:     in.Runops.Start,
		RunopsEnd:       in.Runops.End,
		OpRequire:       uint32(l.OpRequire),
		InterpCurcop:    uint16(l.InterpCurcop),
		InterpStackinfo: uint16(l.InterpCurstackinfo),
		SiCxstack:       uint16(l.SICxstack),
		SiPrev:          uint16(l.SIPrev),
		SiCxix:          uint16(l.SICxix),
		SiType:          uint16(l.SIType),
		CxSize:          uint16(l.CxSize),
		CxType:          uint16(l.CxType),
		CxU16:           uint16(l.CxU16),
		CxOldcop:        uint16(l.CxOldcop),
		CxRetop:         uint16(l.CxRetop),
		CxSubCv:         uint16(l.CxSubCV),
		CopLine:         uint16(l.CopLine),
		CopFile:         uint16(l.CopFile),
	}
	// The walker reads tracer.PerlCxRead bytes of a context,
	// tracer.PerlSIRead of a stack info and tracer.PerlCopRead of a
	// statement: every field must be in them, words 8-aligned, 32-bit
	// fields 4-aligned (a byte or 16-bit field within its word).
	for _, c := range []struct {
		what      string
		off, size int64
		block     int
	}{
		{"si_cxstack", l.SICxstack, 8, tracer.PerlSIRead}, {"si_prev", l.SIPrev, 8, tracer.PerlSIRead},
		{"si_cxix", l.SICxix, 4, tracer.PerlSIRead}, {"si_type", l.SIType, 4, tracer.PerlSIRead},
		{"blk_type", l.CxType, 1, tracer.PerlCxRead}, {"blk_u16", l.CxU16, 2, tracer.PerlCxRead},
		{"blk_oldcop", l.CxOldcop, 8, tracer.PerlCxRead}, {"retop", l.CxRetop, 8, tracer.PerlCxRead},
		{"cv", l.CxSubCV, 8, tracer.PerlCxRead},
		{"cop_line", l.CopLine, 4, tracer.PerlCopRead}, {"cop_file", l.CopFile, 8, tracer.PerlCopRead},
	} {
		if c.off < 0 || int(c.off)+int(c.size) > c.block || c.off%c.size != 0 || c.off/8 != (c.off+c.size-1)/8 {
			return p, fmt.Errorf("perl %s: %s at %d outside the walker's %d bytes", in.Version, c.what, c.off, c.block)
		}
	}
	if l.CxSize <= 0 || l.CxSize > 4096 || l.InterpCurcop > 1<<15 || l.InterpCurstackinfo > 1<<15 {
		return p, fmt.Errorf("perl %s: context of %d bytes, interpreter fields at %d, %d", in.Version, l.CxSize, l.InterpCurcop, l.InterpCurstackinfo)
	}
	return p, nil
}
