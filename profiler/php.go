//go:build linux

package profiler

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/php"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/tracer"
)

// phpKernel is what the eBPF PHP walker is told; the tracer is one.
type phpKernel interface {
	SetPHP(pid uint32, p tracer.PHPProc) error
	// CheckedMappings: the bpf_loop build of the unwinder, the one with
	// the PHP walker, is loaded (5.17+).
	CheckedMappings() bool
}

// phpProcs finds PHP (the Zend Engine) in the processes the preparer
// prepares, sets the eBPF walker up for them, and names their PHP frames
// for the resolver. Its methods are safe for concurrent use.
type phpProcs struct {
	log    *zap.Logger
	kernel phpKernel
	procfs string
	namer  *php.Namer
	// layouts are the PHP versions the walker knows (php.LayoutFor but
	// in tests).
	layouts php.LayoutFunc

	seen imageMemo
	logs onceLog

	// retries prepare a process again soon where it is not whole yet.
	retries retrier

	walked      sync.Map      // pid -> start time of the image set up for the walker
	found       atomic.Uint64 // processes set up for the PHP walker
	unsupported atomic.Uint64 // PHPs of a version without a layout (or a kernel without the walker)
	failed      atomic.Uint64 // PHPs that could not be set up
	// unknownVersions counts the versions without a layout reported so
	// far (each is logged once).
	unknownVersions atomic.Uint64
	unnamed         atomic.Uint64 // PHP frames that could not be named
}

func newPHPProcs(log *zap.Logger, k phpKernel, procfs string, cacheBytes int64, layouts php.LayoutFunc) *phpProcs {
	if layouts == nil {
		layouts = php.LayoutFor
	}
	return &phpProcs{log: log, kernel: k, procfs: procfs, namer: php.NewNamer(procfs, cacheBytes),
		layouts: layouts, logs: onceLog{log: log}}
}

func (pp *phpProcs) id() uint8 { return tracer.RuntimePHP }

// prepare examines proc once per image and set of mapped files: if it runs
// a PHP whose version the table knows, the walker gets its layout and the
// namer its memory. PHP-FPM's workers are forks of its master: each is
// prepared as its own process.
func (pp *phpProcs) prepare(proc *process.Process) (found bool) {
	if done, found := pp.seen.begin(proc); done {
		return found
	}
	settled, again := true, false
	defer func() {
		pp.seen.end(proc, settled, found)
		if again {
			pp.seen.again(proc)
		}
	}()

	mem, err := python.OpenMem(pp.procfs, proc.PID)
	if err != nil {
		settled = false
		return false
	}
	if !mapsJIT(proc) {
		// The process table's mappings may predate opcache's JIT buffer.
		proc = pp.fresh(proc)
	}
	in, err := php.FindWith(proc, mem, pp.layouts)
	_ = mem.Close() // read only
	switch {
	case errors.Is(err, php.ErrNotPHP):
		settled = false // an embedding process may map libphp later
		return false
	case errors.Is(err, php.ErrUnknownVersion), errors.Is(err, php.ErrZTS):
		pp.unsupported.Add(1)
		if pp.logs.warn(err.Error(), "php version not supported: its processes keep native stacks",
			zap.Int("pid", proc.PID), zap.Error(err)) {
			pp.unknownVersions.Add(1)
		}
		return false
	case err != nil:
		pp.failed.Add(1)
		pp.logs.warn(err.Error(), "cannot read the php engine: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if !pp.kernel.CheckedMappings() {
		pp.unsupported.Add(1)
		pp.logs.warn("no bpf_loop php", "php frames need Linux 5.17 or later (bpf_loop, bpf_find_vma): php processes keep native stacks",
			zap.Int("pid", proc.PID))
		return false
	}
	kp, err := kernelPHP(in)
	if err == nil && (!setUpBefore(&pp.walked, proc) || !pp.namer.Known(proc.PID)) {
		err = pp.namer.Add(proc.PID, in)
	}
	if err == nil {
		err = pp.kernel.SetPHP(uint32(proc.PID), kp)
	}
	if err != nil {
		pp.failed.Add(1)
		pp.logs.warn(err.Error(), "cannot set up php unwinding: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if prev, ok := pp.walked.Swap(proc.PID, proc.StartTime); !ok || prev != proc.StartTime || in.JIT.End != 0 {
		if !ok || prev != proc.StartTime {
			pp.found.Add(1)
		}
		pp.log.Debug("php set up for the walker", zap.Int("pid", proc.PID), zap.String("version", in.Version),
			zap.Bool("jit", in.JIT.End != 0))
	}
	// Examined again until opcache's JIT buffer is found, when its files
	// change and for its first seconds (retries.soon): a process prepared at
	// its exec maps it later, if it runs the JIT.
	settled = in.JIT.End != 0
	if !settled {
		again = true
		pp.retries.soon(proc.PID)
	}
	if in.Layout.Untested {
		pp.logs.warn("untested php "+in.Version, "php version supported from its published sources, untested",
			zap.String("version", in.Version))
	}
	return true
}

func (pp *phpProcs) forgetImage(pid int) {
	pp.seen.forget(pid)
	pp.walked.Delete(pid)
	pp.retries.forget(pid)
}

// mapsJIT says whether proc maps executable shared memory (opcache's JIT
// buffer shows as a deleted /dev/zero).
func mapsJIT(proc *process.Process) bool {
	for _, m := range proc.Mappings {
		if m.Path == "/dev/zero" && m.Deleted && m.Executable() {
			return true
		}
	}
	return false
}

// fresh returns proc with its mappings read again from procfs, or proc
// where they cannot be.
func (pp *phpProcs) fresh(proc *process.Process) *process.Process {
	f, err := os.Open(fmt.Sprintf("%s/%d/maps", pp.procfs, proc.PID))
	if err != nil {
		return proc
	}
	defer f.Close()
	ms, err := process.ParseMaps(f)
	if err != nil {
		return proc
	}
	np := *proc
	np.Mappings = ms
	return &np
}

func (pp *phpProcs) forget(pid int) { pp.namer.Forget(pid) }

func (pp *phpProcs) close() { pp.namer.Close() }

// frame names a PHP frame; one that cannot be named truthfully (its
// function freed or replaced since the sample) stays a php frame without
// a name, counted.
func (pp *phpProcs) frame(pid int, _ time.Time, kind uint8, fn, word uint64, _ bool) profile.Frame {
	f := profile.Frame{Type: profile.FramePHP, Address: fn}
	pf, err := pp.namer.Name(pid, kind, fn, word)
	if err != nil {
		if n := pp.unnamed.Add(1); n <= 20 {
			pp.log.Debug("cannot name a php frame", zap.Int("pid", pid), zap.Error(err))
		}
		return f
	}
	f.Lines = []profile.Line{{Function: pf.Name, File: pf.File, Line: pf.Line}}
	return f
}

func (pp *phpProcs) stats(s *Stats) {
	ns := pp.namer.Stats()
	s.PHP = PHPStats{Processes: pp.found.Load(), Unsupported: pp.unsupported.Load(),
		UnknownVersions: pp.unknownVersions.Load(), Failed: pp.failed.Load(),
		Unnamed: pp.unnamed.Load(), Named: ns.Named, NoLine: ns.NoLine, Gone: ns.Gone, ByCode: ns.ByCode, Stale: ns.Stale,
		CacheEvictions: ns.Evictions, CacheBytes: ns.Bytes}
}

// kernelPHP is the walker's view of in.
func kernelPHP(in *php.Interp) (tracer.PHPProc, error) {
	l := in.Layout
	p := tracer.PHPProc{
		CurrentEx:  in.CurrentEx,
		ExecStart:  in.Exec.Start,
		ExecEnd:    in.Exec.End,
		JitStart:   in.JIT.Start,
		JitEnd:     in.JIT.End,
		ExecBody:   in.ExecBody,
		CallCode:   l.CallCode,
		CallTop:    l.CallTop,
		ExOpline:   uint16(l.ExOpline),
		ExFunc:     uint16(l.ExFunc),
		ExCallInfo: uint16(l.ExCallInfo),
		ExPrev:     uint16(l.ExPrev),
		FnType:     uint16(l.FnType),
		FnName:     uint16(l.FnName),
		OpLast:     uint16(l.OpLast),
		OpOpcodes:  uint16(l.OpOpcodes),
		OpSize:     uint16(l.OpSize),
		OpLineno:   uint16(l.OpLineno),
		OpFilename: uint16(l.OpFilename),
	}
	// The walker reads tracer.PHPExRead bytes of a frame and
	// tracer.PHPFnRead of a function: every field must be in them, words
	// 8-aligned, 32-bit fields 4-aligned.
	check := func(what string, off, size int64, block int) error {
		if off < 0 || int(off)+int(size) > block || off%size != 0 {
			return fmt.Errorf("php %s: %s at %d outside the walker's %d bytes", in.Version, what, off, block)
		}
		return nil
	}
	for _, c := range []struct {
		what      string
		off, size int64
		block     int
	}{
		{"opline", l.ExOpline, 8, tracer.PHPExRead}, {"func", l.ExFunc, 8, tracer.PHPExRead},
		{"call info", l.ExCallInfo, 4, tracer.PHPExRead}, {"prev", l.ExPrev, 8, tracer.PHPExRead},
		{"type", l.FnType, 1, tracer.PHPFnRead}, {"name", l.FnName, 8, tracer.PHPFnRead},
		{"last", l.OpLast, 4, tracer.PHPFnRead}, {"opcodes", l.OpOpcodes, 8, tracer.PHPFnRead},
	} {
		if err := check(c.what, c.off, c.size, c.block); err != nil {
			return p, err
		}
	}
	if l.OpFilename < 0 || l.OpFilename%8 != 0 || l.OpFilename > 1024 {
		return p, fmt.Errorf("php %s: file name at %d", in.Version, l.OpFilename)
	}
	if l.OpSize <= 0 || l.OpLineno < 0 || l.OpLineno+4 > l.OpSize {
		return p, fmt.Errorf("php %s: zend_op of %d bytes, line at %d", in.Version, l.OpSize, l.OpLineno)
	}
	return p, nil
}
