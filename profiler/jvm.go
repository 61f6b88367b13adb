//go:build linux

package profiler

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/jvm"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/tracer"
)

// jvmKernel is what the eBPF HotSpot walker is told; the tracer is one.
type jvmKernel interface {
	SetJVM(pid uint32, p tracer.JVMProc) error
	// CheckedMappings: the bpf_loop build of the unwinder, the one with
	// the JVM walker, is loaded (5.17+).
	CheckedMappings() bool
}

// jvmProcs finds HotSpot JVMs in the processes the preparer prepares, sets
// the eBPF walker up for them, and names their Java frames for the
// resolver. Its methods are safe for concurrent use.
type jvmProcs struct {
	log    *zap.Logger
	kernel jvmKernel
	procfs string
	namer  *jvm.Namer

	seen imageMemo
	logs onceLog

	// retries prepare a process again soon where it is not whole yet.
	retries retrier

	found       atomic.Uint64 // processes set up for the JVM walker
	unsupported atomic.Uint64 // JVMs whose layout is not supported: native stacks
	failed      atomic.Uint64 // JVMs that could not be set up: native stacks
	// unknownVersions counts the releases without a layout reported so far
	// (each is logged once).
	unknownVersions atomic.Uint64
	unnamed         atomic.Uint64 // Java frames that could not be named
}

func newJVMProcs(log *zap.Logger, k jvmKernel, procfs string, cacheBytes int64) *jvmProcs {
	return &jvmProcs{log: log, kernel: k, procfs: procfs, namer: jvm.NewNamer(procfs, cacheBytes),
		logs: onceLog{log: log}}
}

func (jp *jvmProcs) id() uint8 { return tracer.RuntimeJVM }

// prepare examines proc once per image and set of mapped files: if it runs
// a HotSpot JVM whose layout its vmStructs tables give, the walker gets it
// and the namer its memory. A JVM prepared before libjvm.so is mapped, or
// before its code cache and interpreter exist, is examined again when its
// mappings have changed (it maps more files as it starts).
func (jp *jvmProcs) prepare(proc *process.Process) (found bool) {
	if done, found := jp.seen.begin(proc); done {
		return found
	}
	settled, again := true, false
	defer func() {
		jp.seen.end(proc, settled, found)
		if again {
			jp.seen.again(proc)
		}
	}()

	mem, err := python.OpenMem(jp.procfs, proc.PID)
	if err != nil {
		settled = false
		return false
	}
	vm, err := jvm.Find(proc, mem)
	_ = mem.Close() // read only
	switch {
	case errors.Is(err, jvm.ErrNotJVM):
		settled = false
		return false
	case errors.Is(err, jvm.ErrUnknownVersion):
		jp.unsupported.Add(1)
		if jp.logs.warn(err.Error(), "jvm layout not supported: its processes keep native stacks",
			zap.Int("pid", proc.PID), zap.Error(err)) {
			jp.unknownVersions.Add(1)
		}
		return false
	case err != nil:
		// A JVM still starting has no code cache or interpreter yet
		// (ErrNotReady), or was read while it set them up: it is read
		// again at its next request, mapped files changed or not, and
		// asks for one soon.
		settled, again = false, true
		jp.log.Debug("cannot read the jvm yet", zap.Int("pid", proc.PID), zap.Error(err))
		jp.retries.soon(proc.PID)
		return false
	}
	if !jp.kernel.CheckedMappings() {
		jp.unsupported.Add(1)
		jp.logs.warn("no bpf_loop", "java frames need Linux 5.17 or later (bpf_loop, bpf_find_vma): jvm processes keep native stacks",
			zap.Int("pid", proc.PID))
		return false
	}
	kp, err := kernelJVM(vm)
	if err == nil {
		err = jp.namer.Add(proc.PID, vm)
	}
	if err == nil {
		err = jp.kernel.SetJVM(uint32(proc.PID), kp)
	}
	if err != nil {
		jp.failed.Add(1)
		jp.logs.warn(err.Error(), "cannot set up java unwinding: its process keeps native stacks",
			zap.Int("pid", proc.PID), zap.Error(err))
		return false
	}
	jp.found.Add(1)
	if vm.Untested {
		jp.logs.warn(fmt.Sprintf("untested jdk %d", vm.Major), "jvm version supported from its published sources, untested",
			zap.Int("major", vm.Major), zap.String("release", vm.Release))
	}
	return true
}

// starting reports whether pid was found to run a JVM still starting:
// prepare asked to read it again.
func (jp *jvmProcs) starting(pid int) bool { return jp.retries.asked(pid) }

func (jp *jvmProcs) forgetImage(pid int) {
	jp.seen.forget(pid)
	jp.retries.forget(pid)
}

func (jp *jvmProcs) forget(pid int) { jp.namer.Forget(pid) }

func (jp *jvmProcs) close() { jp.namer.Close() }

// frame names a Java frame; one that cannot be named truthfully (its code
// freed or its method replaced since the sample) stays a jvm frame without
// a name, counted.
func (jp *jvmProcs) frame(pid int, _ time.Time, kind uint8, addr, word uint64, interrupted bool) profile.Frame {
	f := profile.Frame{Type: profile.FrameJVM, Address: addr}
	var jf jvm.Frame
	var err error
	if jvm.FrameKind(kind) == jvm.FrameCompiled {
		// The walker reports the PC and what its blob held at the sample:
		// the method (low 48 bits) and the compile id's low 16 bits.
		jf, err = jp.namer.CompiledFrame(pid, addr, uint16(word>>48), word&(1<<48-1), !interrupted)
	} else {
		jf, err = jp.namer.Frame(pid, jvm.FrameKind(kind), addr, word, !interrupted)
	}
	if err != nil {
		if n := jp.unnamed.Add(1); n <= 20 {
			jp.log.Debug("cannot name a java frame", zap.Int("pid", pid), zap.Bool("leaf", interrupted), zap.Error(err))
		}
		return f
	}
	f.Lines = jf.Lines
	f.Tier = jf.Tier
	return f
}

func (jp *jvmProcs) stats(s *Stats) {
	ns := jp.namer.Stats()
	s.JVM = JVMStats{Processes: jp.found.Load(), Unsupported: jp.unsupported.Load(),
		UnknownVersions: jp.unknownVersions.Load(), Failed: jp.failed.Load(),
		Unnamed: jp.unnamed.Load(), Named: ns.Named + ns.MethodOnly, MethodOnly: ns.MethodOnly, Stale: ns.Stale,
		CacheEvictions: ns.Evictions, CacheLoads: ns.Loads, CacheBytes: ns.Bytes}
}

// jvmInterpBelow is JVM_INTERP_BELOW (support/ebpf/sonde.h).
const jvmInterpBelow = 112

// kernelJVM is the walker's view of vm.
func kernelJVM(vm *jvm.VM) (tracer.JVMProc, error) {
	k := vm.Kernel
	p := tracer.JVMProc{
		CodeLow: k.CodeLow, CodeHigh: k.CodeHigh,
		InterpStart: k.InterpStart, InterpEnd: k.InterpEnd,
		HeapBlockSize:     k.HeapBlockSize,
		HeapBlockUsed:     k.HeapBlockUsed,
		BlobFrameSize:     k.BlobFrameSize,
		BlobFrameComplete: k.BlobFrameComplete,
		BlobCodeBegin:     k.BlobCodeBegin,
		NmethodCompileId:  k.NmethodCompileID,
		NmethodMethod:     k.NmethodMethod,
		InterpMethod:      k.InterpMethod,
		InterpBcp:         k.InterpBCP,
		InterpSenderSp:    k.InterpSenderSP,
	}
	if k.CodeBeginIsOffset {
		p.CodeBeginIsOffset = 1
	}
	if k.BlobFrameCompleteWidth == 2 {
		p.FrameCompleteShort = 1
	}
	// The walker reads an interpreter frame's slots in one block below its
	// frame pointer (JVM_INTERP_BELOW).
	for _, off := range []int16{k.InterpMethod, k.InterpBCP, k.InterpSenderSP} {
		if off < -jvmInterpBelow || off > -8 || off%8 != 0 {
			return p, fmt.Errorf("jvm %s: interpreter frame slot %d outside the walker's %d bytes", vm.Release, off, jvmInterpBelow)
		}
	}
	if len(k.Heaps) == 0 || len(k.Heaps) > len(p.Heaps) {
		return p, fmt.Errorf("jvm %s: %d code heaps", vm.Release, len(k.Heaps))
	}
	for i, h := range k.Heaps {
		p.Heaps[i] = tracer.JVMHeap{Low: h.Low, High: h.High, Segmap: h.Segmap, SegShift: uint32(h.SegShift)}
	}
	p.Nheaps = uint32(len(k.Heaps))
	return p, nil
}
