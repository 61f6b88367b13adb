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
// stack reached its root anyway is kept. Processes started later are not
// held back: their tables are built at exec, and a stack of theirs cut
// short is marked [truncated].
type warmUp struct {
	mu sync.Mutex
	// ready holds, per process found by the start-up scan, when its
	// preparation ended (zero: not yet).
	ready map[int]time.Time
}

// start registers the processes the start-up scan found.
func (w *warmUp) start(pids []int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ready == nil {
		w.ready = make(map[int]time.Time, len(pids))
	}
	for _, pid := range pids {
		if _, ok := w.ready[pid]; !ok {
			w.ready[pid] = time.Time{}
		}
	}
}

// prepared records that pid's preparation ended at t.
func (w *warmUp) prepared(pid int, t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if at, ok := w.ready[pid]; ok && at.IsZero() {
		w.ready[pid] = t
	}
}

// forget drops pid: it exited, or exec'd a new image (prepared at exec).
func (w *warmUp) forget(pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.ready, pid)
}

// holdBack reports whether a sample of pid captured at t came before its
// preparation ended.
func (w *warmUp) holdBack(pid int, t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.ready[pid]
	return ok && (at.IsZero() || t.Before(at))
}
