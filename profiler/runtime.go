//go:build linux

package profiler

import (
	"runtime"
	"sync"
	"time"

	"go.uber.org/zap"

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
	// close lets go of what naming every process's frames holds (the
	// memory files it opened): the profiler has stopped.
	close()
	// frame names a frame the walker reported in a sample taken at
	// captured: its kind, address and second word as the tracer decoded
	// them (tracer.RuntimeFrame), and whether its PC was interrupted
	// rather than a return address.
	frame(pid int, captured time.Time, kind uint8, addr, word uint64, interrupted bool) profile.Frame
	// stats writes the runtime's counters into s.
	stats(s *Stats)
}

// A startingRuntime may know a process runs it before its walker can be
// set up (a JVM whose interpreter is not generated yet): starting reports
// whether pid is such a process, whose tables will be needed as soon as
// it is set up.
type startingRuntime interface {
	starting(pid int) bool
}

// runtimeWalkers says whether the interpreter walkers (CPython, HotSpot,
// V8) run on this architecture. Their eBPF side reads x86-64 frames and code
// (the JVM's and CPython's trampolines, the thread pointer): on arm64 no
// process is set up for them, and those processes keep native stacks.
const runtimeWalkers = runtime.GOARCH == "amd64"

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

// frame names frame i of rec, which a runtime's walker reported; named is
// false when its runtime could not name it (a runtime none of the set is
// stays unnamed, and named).
func (s *runtimeSet) frame(pid int, rec *tracer.Record, i int) (f profile.Frame, named bool) {
	ref := fileRef(rec, i)
	id, kind := tracer.RuntimeFrame(ref)
	rt := s.byID[id&15]
	if rt == nil {
		return profile.Frame{Address: rec.User[i]}, true
	}
	f = rt.frame(pid, rec.Time, kind, rec.User[i], ref.Offset, rec.UserFlags[i]&tracer.FrameInterrupted != 0)
	return f, len(f.Lines) > 0
}

// imageSeen is what prepare examined of a process: its image (start time),
// how many file mappings it had then, and whether that settled it (a
// runtime found, supported or not); see imageMemo.
type imageSeen struct {
	start   uint64
	files   int
	settled bool
	found   bool // its runtime is set up for the walker
}

// fileMappings counts proc's file-backed mappings.
func fileMappings(proc *process.Process) int {
	n := 0
	for _, m := range proc.Mappings {
		if m.FileBacked() {
			n++
		}
	}
	return n
}

// imageMemo remembers, per pid, what a runtime's prepare examined of a
// process: its image (start time), how many file mappings it had then,
// and whether that settled it (the runtime found, supported or not). An
// image not found to run the runtime is examined again when its file
// mappings change: a process prepared at its exec has not mapped the
// runtime's library yet (the dynamic loader maps it next). Safe for
// concurrent use.
type imageMemo struct {
	mu   sync.Mutex
	seen map[int]imageSeen
}

// begin says whether proc was examined already for its current image and
// file mappings and, if so, whether the runtime was set up for it then.
// Otherwise it notes proc as being examined now: end records the outcome.
func (m *imageMemo) begin(proc *process.Process) (done, found bool) {
	now := imageSeen{start: proc.StartTime, files: fileMappings(proc)}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[int]imageSeen{}
	}
	if st, ok := m.seen[proc.PID]; ok && st.start == now.start && (st.settled || st.files == now.files) {
		return true, st.found
	}
	m.seen[proc.PID] = now
	return false, false
}

// end records what examining proc found, unless its image changed since.
func (m *imageMemo) end(proc *process.Process, settled, found bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st, ok := m.seen[proc.PID]; ok && st.start == proc.StartTime {
		st.settled, st.found = settled, found
		m.seen[proc.PID] = st
	}
}

// again lets the next begin of proc examine it again even if its file
// mappings did not change (a runtime still starting up).
func (m *imageMemo) again(proc *process.Process) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st, ok := m.seen[proc.PID]; ok && st.start == proc.StartTime {
		st.files = -1
		m.seen[proc.PID] = st
	}
}

// forget lets the next begin of pid examine it again.
func (m *imageMemo) forget(pid int) {
	m.mu.Lock()
	delete(m.seen, pid)
	m.mu.Unlock()
}

// onceLog logs a message the first time its key is seen, up to 256 keys
// (past them nothing more is logged: counters still count). Safe for
// concurrent use.
type onceLog struct {
	log    *zap.Logger
	mu     sync.Mutex
	logged map[string]bool
}

// warn logs msg the first time key is seen and says whether it did.
func (o *onceLog) warn(key, msg string, fields ...zap.Field) bool {
	o.mu.Lock()
	if o.logged == nil {
		o.logged = map[string]bool{}
	}
	done := o.logged[key] || len(o.logged) >= 256
	if !done {
		o.logged[key] = true
	}
	o.mu.Unlock()
	if !done {
		o.log.Warn(msg, fields...)
	}
	return !done
}

// setUpBefore says whether proc was set up for its runtime's walker
// before, as this very process (walked maps a pid to the start time of the
// image set up) and not exec'd since (forgetImage deletes it). Such a
// process is prepared again whenever its set of mapped files changes (PHP
// maps each file it reads): its namer keeps what it cached of it.
func setUpBefore(walked *sync.Map, proc *process.Process) bool {
	prev, ok := walked.Load(proc.PID)
	return ok && prev == proc.StartTime
}

// retrier asks the preparer to prepare a process again soon, rather than
// at the next change of its mappings the kernel reports (at most once a
// second): every retryDelay, retries times at most per image. A runtime
// found still starting (a JVM, a Ruby VM) or not whole yet (PHP's JIT
// buffer, which opcache maps as PHP starts) is so known from its first
// second. Its zero value asks nothing until retry is set.
type retrier struct {
	retry   func(pid int) // nil: no retries
	mu      sync.Mutex
	retried map[int]int // pid -> retries asked for its current image
}

// Retries: every 100 ms for at most 3 s.
const (
	retryDelay = 100 * time.Millisecond
	retries    = 30
)

// soon asks for pid to be prepared again after retryDelay, within its
// image's retries.
func (r *retrier) soon(pid int) {
	if r.retry == nil {
		return
	}
	r.mu.Lock()
	if r.retried == nil {
		r.retried = map[int]int{}
	}
	n := r.retried[pid]
	if n < retries {
		r.retried[pid] = n + 1
	}
	r.mu.Unlock()
	if n < retries {
		time.AfterFunc(retryDelay, func() { r.retry(pid) })
	}
}

// asked reports whether a retry was asked for pid's current image.
func (r *retrier) asked(pid int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.retried[pid] > 0
}

// forget lets pid's next image have its own retries.
func (r *retrier) forget(pid int) {
	r.mu.Lock()
	delete(r.retried, pid)
	r.mu.Unlock()
}
