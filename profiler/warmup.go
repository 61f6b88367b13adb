//go:build linux

package profiler

import (
	"sync"
	"time"
)

// warmUp holds back the stacks cut short of the processes that were
// running when the profiler started, until each is prepared. Their first
// samples come before the preparer has built their tables: the unwinder
// then falls back to frame pointers, which most native code lacks, and a
// stack that ends early is a leaf without its callers. Such a sample is
// dropped and counted (sonde.samples.skipped{reason=warm_up}); one whose
// stack reached its root is kept. Processes started later are not held
// back: their tables are built at exec, and a stack of theirs cut short is
// marked [truncated].
//
// A process counts as prepared from the first whole stack taken after its
// preparation ended (the kernel side is then seen to use its tables), or
// warmUpGrace after that end, whichever comes first: a process whose
// stacks are never whole (code without unwind information) is held back
// no longer than that.
type warmUp struct {
	mu    sync.Mutex
	procs map[int]*warming
}

// warmUpGrace bounds how long after its preparation a process's cut-short
// stacks are still held back, waiting for a whole one.
const warmUpGrace = time.Second

// warming is the state of one process of the start-up scan.
type warming struct {
	prepared ktime // when its preparation ended; 0: not yet
	whole    bool  // a whole stack was taken after prepared
}

// start registers the processes the start-up scan found.
func (w *warmUp) start(pids []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.procs == nil {
		w.procs = make(map[int]*warming, len(pids))
	}
	for _, pid := range pids {
		if _, ok := w.procs[pid]; !ok {
			w.procs[pid] = &warming{}
		}
	}
}

// prepared records that pid's preparation ended at t.
func (w *warmUp) prepared(pid int, t ktime) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.procs[pid]; ok && p.prepared == 0 {
		p.prepared = t
	}
}

// forget drops pid: it exited, or exec'd a new image (prepared at exec).
func (w *warmUp) forget(pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.procs, pid)
}

// holdBack reports whether a sample of pid taken at t, whose stack is
// whole or not, is to be held back; a whole one never is, but it may end
// pid's warm-up.
func (w *warmUp) holdBack(pid int, t ktime, whole bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.procs[pid]
	switch {
	case !ok:
		return false
	case p.prepared != 0 && (p.whole || t >= p.prepared.add(warmUpGrace)):
		delete(w.procs, pid) // warmed up: samples count from here on
		return false
	case whole:
		if p.prepared != 0 && t >= p.prepared {
			p.whole = true
		}
		return false
	}
	return true
}
