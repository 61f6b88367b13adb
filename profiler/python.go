//go:build linux

package profiler

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/tracer"
)

// pythonKernel is what the eBPF Python walker is told; the tracer is one.
type pythonKernel interface {
	SetPython(pid uint32, p tracer.PythonProc) error
}

// pythonProcs finds CPython in the processes the preparer prepares, sets
// the eBPF walker up for them, and names their Python frames for the
// resolver. Its methods are safe for concurrent use.
type pythonProcs struct {
	log    *zap.Logger
	kernel pythonKernel
	procfs string
	namer  *python.Namer
	// layouts are the CPython versions the walker knows (python.LayoutFor
	// but in tests).
	layouts python.LayoutFunc

	seen imageMemo // what prepare examined of each process
	logs onceLog   // unsupported versions and errors already logged

	found       atomic.Uint64 // processes set up for the Python walker
	unsupported atomic.Uint64 // CPython processes of a version without a layout
	failed      atomic.Uint64 // CPython processes that could not be set up
	// unknownVersions counts the versions without a layout reported so
	// far (each is logged once).
	unknownVersions atomic.Uint64
	unnamed         atomic.Uint64 // Python frames whose code object could not be read
}

func newPythonProcs(log *zap.Logger, k pythonKernel, procfs string, cacheBytes int64, layouts python.LayoutFunc) *pythonProcs {
	if layouts == nil {
		layouts = python.LayoutFor
	}
	return &pythonProcs{log: log, kernel: k, procfs: procfs, namer: python.NewNamer(procfs, cacheBytes),
		layouts: layouts, logs: onceLog{log: log}}
}

// prepare examines proc once per image and set of mapped files: if it
// runs a supported CPython, the walker gets its layout and the namer its
// memory. A process prepared at its exec has not mapped libpython yet (the
// dynamic loader maps it next), so it is examined again once its mappings
// have grown.
//
// It reports whether proc runs a CPython interpreter set up for the walker
// (now or at an earlier call for the same image).
func (pp *pythonProcs) prepare(proc *process.Process) (found bool) {
	if done, found := pp.seen.begin(proc); done {
		return found
	}
	settled := true
	defer func() { pp.seen.end(proc, settled, found) }()

	mem, err := python.OpenMem(pp.procfs, proc.PID)
	if err != nil {
		settled = false
		return false // gone, or not readable: stays native
	}
	in, err := python.FindWith(proc, mem, pp.layouts)
	_ = mem.Close() // read only
	switch {
	case errors.Is(err, python.ErrNotPython):
		settled = false // libpython may not be mapped yet
		return false
	case errors.Is(err, python.ErrUnknownVersion):
		pp.unsupported.Add(1)
		if pp.logOnce(err.Error(), "python version not supported: its processes keep native stacks",
			zap.Int("pid", proc.PID), zap.Error(err)) {
			pp.unknownVersions.Add(1)
		}
		return false
	case err != nil:
		pp.failed.Add(1)
		pp.logOnce(err.Error(), "cannot read the python interpreter: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	kp, err := kernelPython(in)
	if err == nil {
		err = pp.namer.Add(proc.PID, in)
	}
	if err == nil {
		err = pp.kernel.SetPython(uint32(proc.PID), kp)
	}
	if err != nil {
		pp.failed.Add(1)
		pp.log.Debug("cannot set up python unwinding", zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	pp.found.Add(1)
	if in.Layout.Untested {
		pp.logOnce(fmt.Sprintf("untested 3.%d", in.Minor), "python version supported from its published sources, untested",
			zap.Int("minor", in.Minor))
	}
	return true
}

// forgetImage lets the next prepare of pid examine it again (exec, exit);
// the kernel drops its walker entry itself.
func (pp *pythonProcs) forgetImage(pid int) { pp.seen.forget(pid) }

func (pp *pythonProcs) id() uint8 { return tracer.RuntimePython }

func (pp *pythonProcs) forget(pid int) { pp.namer.Forget(pid) }

func (pp *pythonProcs) close() { pp.namer.Close() }

func (pp *pythonProcs) stats(s *Stats) {
	ns := pp.namer.Stats()
	s.Python = PythonStats{Processes: pp.found.Load(), Unsupported: pp.unsupported.Load(),
		UnknownVersions: pp.unknownVersions.Load(), Failed: pp.failed.Load(),
		Unnamed: pp.unnamed.Load(), Named: ns.Named, CacheResets: ns.Resets, CacheBytes: ns.Bytes}
}

// frame names the Python frame (code, instr) of pid; CPython's walker
// reports one kind of frame.
func (pp *pythonProcs) frame(pid int, _ time.Time, _ uint8, code, instr uint64, _ bool) profile.Frame {
	f := profile.Frame{Type: profile.FrameCPython, Address: code}
	name, file, line, err := pp.namer.Name(pid, code, instr)
	if err != nil {
		pp.unnamed.Add(1)
		return f
	}
	f.Lines = []profile.Line{{Function: name, File: file, Line: line}}
	return f
}

// logOnce logs msg the first time key is seen and says whether it did.
func (pp *pythonProcs) logOnce(key, msg string, fields ...zap.Field) bool {
	return pp.logs.warn(key, msg, fields...)
}

// kernelPython is the walker's view of in.
func kernelPython(in *python.Interp) (tracer.PythonProc, error) {
	l := in.Layout
	var bad error
	u16 := func(v int64) uint16 {
		switch {
		case v < 0:
			return tracer.PythonNone
		case v >= tracer.PythonNone:
			bad = fmt.Errorf("python 3.%d: offset %d out of range", in.Minor, v)
		}
		return uint16(v)
	}
	p := tracer.PythonProc{
		InterpHead:        in.InterpHead,
		EvalStart:         in.Eval[0].Start,
		EvalEnd:           in.Eval[0].End,
		ColdStart:         in.Eval[1].Start,
		ColdEnd:           in.Eval[1].End,
		InterpThreadsHead: u16(l.InterpThreadsHead),
		ThreadNext:        u16(l.ThreadNext),
		ThreadId:          u16(l.ThreadID),
		ThreadFrame:       u16(l.ThreadFrame),
		CframeCurrent:     u16(l.CFrameCurrent),
		FrameBack:         u16(l.FrameBack),
		FrameCode:         u16(l.FrameCode),
		FrameInstr:        u16(l.FrameInstr),
		FrameOwner:        u16(l.FrameOwner),
		FrameIsEntry:      u16(l.FrameIsEntry),
		OwnerShimFrom:     0xff,
		ExecutableMask:    uint8(l.ExecutableMask),
	}
	if l.OwnerShimFrom >= 0 {
		p.OwnerShimFrom = uint8(l.OwnerShimFrom)
	}
	if !l.InstrIsPointer() {
		p.InstrIsInt = 1
	}
	for _, v := range []uint16{p.InterpThreadsHead, p.ThreadNext, p.ThreadId, p.ThreadFrame, p.FrameBack, p.FrameCode, p.FrameInstr} {
		if v == tracer.PythonNone {
			bad = fmt.Errorf("python 3.%d: layout incomplete", in.Minor)
		}
	}
	return p, bad
}
