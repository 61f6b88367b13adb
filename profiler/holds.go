//go:build linux

package profiler

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/symbolize"
)

// A process whose exit record was lost (a full ring buffer) is never
// released by the resolver. Every holdSweep reporter intervals the holds
// of processes without an exit are checked against procfs; one found gone
// is released holdGrace intervals later, time for its last queued samples.
const (
	holdSweep = 30
	holdGrace = 10
)

// fileHolds keeps the files of every prepared process open, by descriptor,
// from the moment the preparer reads its mappings (the process is alive
// then) until the resolver has processed its exit record, after every
// sample queued before it. A short-lived process's frames are thus named
// even when it is gone, with its /proc entries, by the time its samples are
// resolved. The preparer adds, the resolver releases; safe for concurrent
// use; nil holds nothing.
type fileHolds struct {
	procfs string // where liveness is checked; "" checks nothing
	mu     sync.Mutex
	byPID  map[int]*pidHold
	ticks  int
}

type pidHold struct {
	handles map[elfx.FileID]*symbolize.Handle
	exited  bool // the preparer saw the exit: the resolver will release it
	gone    int  // intervals since a sweep found it gone without an exit; -1 not found gone
}

func newFileHolds(procfs string) *fileHolds {
	return &fileHolds{procfs: procfs, byPID: make(map[int]*pidHold)}
}

// add keeps h for pid; a second handle to a file pid already holds is
// released at once.
func (fh *fileHolds) add(pid int, h *symbolize.Handle) {
	if fh == nil {
		h.Release()
		return
	}
	fh.mu.Lock()
	ph, ok := fh.byPID[pid]
	if !ok {
		ph = &pidHold{handles: make(map[elfx.FileID]*symbolize.Handle), gone: -1}
		fh.byPID[pid] = ph
	}
	// The preparer reads only a live process: a pid a sweep found gone
	// runs again (reused).
	ph.gone = -1
	_, dup := ph.handles[h.ID]
	if !dup {
		ph.handles[h.ID] = h
	}
	fh.mu.Unlock()
	if dup {
		h.Release()
	}
}

// exited notes that the reader saw pid exit: the exit record is on its
// way to the resolver, which releases the files when it gets there.
func (fh *fileHolds) exited(pid int) {
	if fh == nil {
		return
	}
	fh.mu.Lock()
	defer fh.mu.Unlock()
	if ph, ok := fh.byPID[pid]; ok {
		ph.exited = true
	}
}

// release lets go of pid's files: the resolver has processed its exit.
func (fh *fileHolds) release(pid int) {
	if fh == nil {
		return
	}
	fh.mu.Lock()
	ph, ok := fh.byPID[pid]
	delete(fh.byPID, pid)
	fh.mu.Unlock()
	if ok {
		ph.close()
	}
}

// tick runs once per reporter interval: it releases the holds of processes
// found gone without an exit record holdGrace intervals ago, and returns
// their pids; every holdSweep intervals it looks for such processes.
func (fh *fileHolds) tick() (gone []int) {
	if fh == nil {
		return nil
	}
	var done []*pidHold
	fh.mu.Lock()
	fh.ticks++
	sweep := fh.procfs != "" && fh.ticks%holdSweep == 0
	for pid, ph := range fh.byPID {
		switch {
		case ph.exited:
		case ph.gone >= 0:
			if ph.gone++; ph.gone > holdGrace {
				done = append(done, ph)
				gone = append(gone, pid)
				delete(fh.byPID, pid)
			}
		case sweep:
			if _, err := os.Stat(filepath.Join(fh.procfs, strconv.Itoa(pid))); os.IsNotExist(err) {
				ph.gone = 0
			}
		}
	}
	fh.mu.Unlock()
	for _, ph := range done {
		ph.close()
	}
	return gone
}

// close releases every hold.
func (fh *fileHolds) close() {
	if fh == nil {
		return
	}
	fh.mu.Lock()
	all := fh.byPID
	fh.byPID = make(map[int]*pidHold)
	fh.mu.Unlock()
	for _, ph := range all {
		ph.close()
	}
}

// len is how many processes hold files.
func (fh *fileHolds) len() int {
	fh.mu.Lock()
	defer fh.mu.Unlock()
	return len(fh.byPID)
}

func (ph *pidHold) close() {
	for _, h := range ph.handles {
		h.Release()
	}
}
