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
	v8 "github.com/sonde-dev/sonde/internal/v8"
	"github.com/sonde-dev/sonde/tracer"
)

// v8Kernel is what the eBPF V8 walker is told; the tracer is one.
type v8Kernel interface {
	SetV8(pid uint32, p tracer.V8Proc) error
	// CheckedMappings: the bpf_loop build of the unwinder, the one with
	// the V8 walker, is loaded (5.17+).
	CheckedMappings() bool
}

// v8Procs finds V8 (Node.js) in the processes the preparer prepares, sets
// the eBPF walker up for them, and names their JavaScript frames for the
// resolver. Its methods are safe for concurrent use.
type v8Procs struct {
	log    *zap.Logger
	kernel v8Kernel
	procfs string
	namer  *v8.Namer
	// find reads a process's V8 and its layout (v8.Find but in tests).
	find v8FindFunc

	seen imageMemo
	logs onceLog

	walked      sync.Map      // pid -> start time of the image set up for the walker
	found       atomic.Uint64 // processes set up for the V8 walker
	unsupported atomic.Uint64 // V8s whose layout is not supported: native stacks
	failed      atomic.Uint64 // V8s that could not be set up: native stacks
	// unknownVersions counts the versions without a layout reported so
	// far (each is logged once).
	unknownVersions atomic.Uint64
	unnamed         atomic.Uint64 // V8 frames that could not be named
}

func newV8Procs(log *zap.Logger, k v8Kernel, procfs string, cacheBytes int64, find v8FindFunc) *v8Procs {
	if find == nil {
		find = v8.Find
	}
	return &v8Procs{log: log, kernel: k, procfs: procfs, namer: v8.NewNamer(procfs, cacheBytes),
		logs: onceLog{log: log}, find: find}
}

func (vp *v8Procs) id() uint8 { return tracer.RuntimeV8 }

// prepare examines proc once per image and set of mapped files: if it runs
// a V8 whose layout its v8dbg_* metadata gives, the walker gets it and the
// namer its memory. A V8 found is examined again when its file mappings
// change: from Node 22 V8 maps a second copy of its builtins as it starts,
// and the walker must know both.
func (vp *v8Procs) prepare(proc *process.Process) (found bool) {
	if done, found := vp.seen.begin(proc); done {
		return found
	}
	settled := true
	defer func() { vp.seen.end(proc, settled, found) }()

	mem, err := python.OpenMem(vp.procfs, proc.PID)
	if err != nil {
		settled = false
		return false
	}
	vm, err := vp.find(proc, mem)
	_ = mem.Close() // read only
	switch {
	case errors.Is(err, v8.ErrNotV8):
		settled = false
		return false
	case errors.Is(err, v8.ErrUnknownVersion):
		vp.unsupported.Add(1)
		if vp.logs.warn(err.Error(), "v8 layout not supported: its processes keep native stacks",
			zap.Int("pid", proc.PID), zap.Error(err)) {
			vp.unknownVersions.Add(1)
		}
		return false
	case err != nil:
		settled = false
		vp.log.Debug("cannot read v8 yet", zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if !vp.kernel.CheckedMappings() {
		vp.unsupported.Add(1)
		vp.logs.warn("no bpf_loop v8", "javascript frames need Linux 5.17 or later (bpf_loop, bpf_find_vma): node processes keep native stacks",
			zap.Int("pid", proc.PID))
		return false
	}
	kp, err := kernelV8(vm, proc)
	if err == nil {
		err = vp.namer.Add(proc.PID, vm)
	}
	if err == nil {
		err = vp.kernel.SetV8(uint32(proc.PID), kp)
	}
	if err != nil {
		vp.failed.Add(1)
		vp.logs.warn(err.Error(), "cannot set up javascript unwinding: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	if prev, ok := vp.walked.Swap(proc.PID, proc.StartTime); !ok || prev != proc.StartTime {
		vp.found.Add(1)
	}
	settled = false // looked at again when its files change (see above)
	if vm.Untested {
		vp.logs.warn("untested v8 "+vm.V8, "v8 version supported from its metadata, untested",
			zap.String("v8", vm.V8), zap.String("node", vm.Node))
	}
	return true
}

func (vp *v8Procs) forgetImage(pid int) {
	vp.seen.forget(pid)
	vp.walked.Delete(pid)
}

func (vp *v8Procs) forget(pid int) { vp.namer.Forget(pid) }

func (vp *v8Procs) close() { vp.namer.Close() }

// frame names a V8 frame; one that cannot be named truthfully (its
// function or code moved or replaced since the sample) stays a v8js frame
// without a name, counted.
func (vp *v8Procs) frame(pid int, captured time.Time, kind uint8, addr, word uint64, interrupted bool) profile.Frame {
	f := profile.Frame{Type: profile.FrameV8JS, Address: addr}
	vf, err := vp.namer.FrameCaptured(captured, pid, v8.FrameKind(kind), addr, word, !interrupted)
	if err != nil {
		if n := vp.unnamed.Add(1); n <= 20 {
			vp.log.Debug("cannot name a v8 frame", zap.Int("pid", pid), zap.Bool("leaf", interrupted), zap.Error(err))
		}
		return f
	}
	f.Lines = vf.Lines
	f.Tier = vf.Tier
	return f
}

func (vp *v8Procs) stats(s *Stats) {
	ns := vp.namer.Stats()
	s.V8 = V8Stats{Processes: vp.found.Load(), Unsupported: vp.unsupported.Load(),
		UnknownVersions: vp.unknownVersions.Load(), Failed: vp.failed.Load(),
		Unnamed: vp.unnamed.Load(), Named: ns.Named, NoLine: ns.NoLine, Gone: ns.Gone, Stale: ns.Stale, Reused: ns.Reused,
		CacheEvictions: ns.Evictions, CacheBytes: ns.Bytes}
}

// kernelV8 is the walker's view of vm in proc.
func kernelV8(vm *v8.VM, proc *process.Process) (tracer.V8Proc, error) {
	k := vm.Kernel
	p := tracer.V8Proc{
		ReadStart:        k.FrameReadStart,
		FpMarker:         k.FPMarker,
		FpFunction:       k.FPFunction,
		FpBytecodeArray:  k.FPBytecodeArray,
		FpBytecodeOffset: k.FPBytecodeOffset,
		FunctionShared:   k.JSFunctionShared,
		HeapTag:          k.HeapObjectTag,
		HeapTagMask:      k.HeapObjectTagMask,
		SmiTagMask:       k.SmiTagMask,
		SmiShift:         k.SmiShift,
		MarkerShift:      k.MarkerShift,
	}
	// The walker reads one block of tracer.V8FrameRead bytes from
	// ReadStart: every slot and the caller's fp and return address must
	// be in it.
	end := int(k.FrameReadStart) + tracer.V8FrameRead
	for _, off := range []int16{k.FPMarker, k.FPFunction, k.FPBytecodeArray, k.FPBytecodeOffset, 8} {
		if int(off) < int(k.FrameReadStart) || int(off)+8 > end || off%8 != 0 {
			return p, fmt.Errorf("v8 %s: frame slot %d outside the walker's %d bytes from %d", vm.V8, off, tracer.V8FrameRead, k.FrameReadStart)
		}
	}
	if len(k.Builtins) == 0 || len(k.Builtins) > tracer.MaxV8Builtins {
		return p, fmt.Errorf("v8 %s: %d builtin ranges", vm.V8, len(k.Builtins))
	}
	for i, r := range k.Builtins {
		p.BuiltinStart[i], p.BuiltinEnd[i] = r.Start, r.End
	}
	p.Nbuiltins = uint32(len(k.Builtins))
	// The builtins by file offset too, from the binary's own mapping of
	// them: a copy mapped later is V8 code from its first sample.
	for _, m := range proc.Mappings {
		r := k.Builtins[0]
		if m.FileBacked() && m.Inode != 0 && r.Start >= m.Start && r.End <= m.End {
			p.BuiltinInode = m.Inode
			p.BuiltinOffStart = r.Start - m.Start + m.Offset
			p.BuiltinOffEnd = r.End - m.Start + m.Offset
			break
		}
	}
	return p, nil
}
