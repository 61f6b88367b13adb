//go:build linux

package profiler

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/unwind"
)

// preparer keeps the eBPF unwinder's tables in step with processes, off the
// reader goroutine: building a table costs milliseconds, decoding a sample
// microseconds. Requests queue in a bounded channel; what does not fit is
// counted and asked again by the eBPF side a second later.
type preparer struct {
	log    *zap.Logger
	procs  *process.Table
	loader *unwind.Loader
	work   chan prepareWork
	// urgent holds exec and exit requests, handled before the rest: a new
	// image must be filtered before its samples cost anything, and a burst
	// of other processes' table builds must not delay that.
	urgent chan prepareWork
	// filter decides which processes are profiled; kernel enforces it.
	filter *procFilter
	kernel preparerKernel
	// runtimes set the eBPF runtime walkers (CPython, HotSpot) up for the
	// processes among those prepared that run them; nil: none is.
	runtimes *runtimeSet

	queued   atomic.Uint64 // requests accepted
	handled  atomic.Uint64 // requests handled; queued - handled are waiting
	dropped  atomic.Uint64
	excluded atomic.Uint64 // process images the filters excluded
	// gone counts processes that exited before or while being prepared:
	// whatever was set for them is forgotten. Normal for short-lived
	// processes, so counted, not logged.
	gone atomic.Uint64

	// holds keeps the files of the processes prepared open for the
	// resolver; pid is the process being prepared (run's goroutine only).
	holds *fileHolds
	pid   int

	// misses holds when each process was first sampled without unwind
	// information, until its tables are loaded; tableLoaded (may be nil)
	// is told, for each file whose table is then newly loaded, how long
	// after that first sample it was.
	misses      missLog
	tableLoaded func(delay time.Duration)
	// reported serializes the calls of tableLoaded: tables loaded in the
	// background are reported from the Loader's goroutines.
	reported sync.Mutex

	// warm holds back the cut-short samples of the processes running at
	// start until they are prepared.
	warm warmUp

	// execs are the processes that exec'd, waiting out execGrace before
	// they are prepared (run's goroutine only), oldest first; skipped
	// counts those that exited before, never prepared.
	execs   []pendingExec
	skipped atomic.Uint64
}

// pendingExec is a process that exec'd, to be prepared at due.
type pendingExec struct {
	pid int
	due time.Time
}

// execGrace is how long a process that exec'd waits before it is prepared
// (its mappings read, set in the unwinder's maps). Most short-lived
// programs, a script's grep and awk, are gone by then and cost nothing;
// one sampled meanwhile asks for its unwind information with that sample
// and is prepared at once, and its first stacks are unwound from their
// snapshots in the meantime. Where process filters are set, a new image
// is decided at once: its samples must not cost anything.
const execGrace = 50 * time.Millisecond

// reprepareAfterExec is when a new image is prepared once more after its
// exec was handled.
const reprepareAfterExec = 200 * time.Millisecond

// maxMisses bounds the processes a missLog remembers; beyond it a miss is
// not recorded, and its tables count as loaded in time.
const maxMisses = 1 << 16

// missLog remembers, per process, the capture time of the first sample
// the eBPF side could not unwind for want of the process's mappings or
// tables. The reader writes it, the preparer takes it.
type missLog struct {
	mu    sync.Mutex
	first map[int]time.Time
}

// note records t as pid's first miss unless an earlier one is recorded.
func (m *missLog) note(pid int, t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.first == nil {
		m.first = map[int]time.Time{}
	}
	if old, ok := m.first[pid]; ok && !old.After(t) || !ok && len(m.first) >= maxMisses {
		return
	}
	m.first[pid] = t
}

// peek returns pid's first miss.
func (m *missLog) peek(pid int) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.first[pid]
	return t, ok
}

// take returns and forgets pid's first miss.
func (m *missLog) take(pid int) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.first[pid]
	delete(m.first, pid)
	return t, ok
}

// reportTable tells tableLoaded, if set, of a table loaded d after the
// first miss.
func (p *preparer) reportTable(d time.Duration) {
	if p.tableLoaded == nil {
		return
	}
	p.reported.Lock()
	defer p.reported.Unlock()
	p.tableLoaded(d)
}

// tableDelay is how long after the first miss at t a table loaded at now
// came: 0 when no sample missed it before (tables built at exec or at
// start-up, ahead of the samples).
func tableDelay(t time.Time, missed bool, now time.Time) time.Duration {
	if !missed || !now.After(t) {
		return 0
	}
	return now.Sub(t)
}

// preparerKernel is what the preparer sets in the eBPF side: the
// unwinder's tables and mappings, and the process filter. The tracer is
// one; tests record what is set.
type preparerKernel interface {
	unwind.Kernel
	Filter(pid uint32, until uint64) error
	Unfilter(pid uint32) error
}

type prepareKind uint8

const (
	prepareUnknown prepareKind = iota // sampled without (current) unwind information
	prepareExec                       // a new image: its old mappings are gone
	prepareExit
	prepareFilter // a process found by the start-up scan: filter it only
)

type prepareWork struct {
	pid  int
	kind prepareKind
}

const prepareQueue = 4096

// newPreparer returns a preparer that sets tables, mappings and filter
// decisions in k (the tracer). Its Loader keeps tables within budget bytes
// and reads separate debug files' CFI from debugDirs (as the symbolizer
// does; nil searches no host directory).
func newPreparer(log *zap.Logger, k preparerKernel, procs *process.Table, syms *symbolize.Symbolizer,
	filter *procFilter, budget int64, debugDirs []string) *preparer {
	// Every file of a process being prepared is held open, while the
	// process surely lives, until the resolver is done with the process.
	holds := newFileHolds("")
	var p *preparer
	identify := func(path string) (elfx.FileID, error) {
		h, err := syms.Open(path)
		if err != nil {
			return elfx.FileID{}, err
		}
		holds.add(p.pid, h)
		return h.ID, nil
	}
	loader := unwind.NewLoader(k, identify, log, unwind.LoaderOptions{
		BudgetBytes: budget,
		DebugDirs:   append([]string{}, debugDirs...),
		// New files' tables are built off this goroutine: a new process's
		// mappings are set in milliseconds instead of waiting behind the
		// builds of other processes' new files (hundreds of milliseconds
		// each for big binaries), and its small tables come before a big
		// one's. Whole-stack shares measured
		// against perf, this off / on: forked children 97.0 / 99.5 %,
		// 300 ms processes 95.4 / 98.1 %, a big library loaded late
		// 94.9 / 96.5 %.
		Background: true,
		// Asked while p.pid is being prepared: its first miss is taken
		// after Prepare returns.
		Since: func() time.Time {
			t, _ := p.misses.peek(p.pid)
			return t
		},
		Loaded: func(since time.Time, pids []int, onDemand bool) {
			if !onDemand {
				p.reportTable(tableDelay(since, !since.IsZero(), time.Now()))
			}
			for _, pid := range pids {
				if !p.loader.Pending(pid) {
					p.warm.prepared(pid, monotonic())
				}
			}
		},
		Demand: tableDemand,
	})
	p = &preparer{
		log:    log,
		procs:  procs,
		loader: loader,
		work:   make(chan prepareWork, prepareQueue),
		urgent: make(chan prepareWork, prepareQueue),
		filter: filter,
		kernel: k,
		holds:  holds,
	}
	return p
}

// tableDemand is how many frames must be unwound in user space in a file
// with unwind bytes of unwind information (.eh_frame, .debug_frame,
// .gopclntab) before its table is built: none below 64 KiB (its table is
// built at once, in a millisecond or two), else one per KiB, at least 64
// and at most 32,768. Unwinding a frame from a snapshot costs 1-8 µs;
// building a table about 0.3 µs per row, some 2-6 rows per 100 bytes of
// unwind information: by then about as much was spent on walks as the
// build costs. A busy program has its table within a second (libc after
// 149 frames, a few samples; cc1plus after 2,500, some 30 of its deep
// stacks); a file seldom sampled (an idle daemon, the agent's own 42 MB of
// pclntab) is not worth its table's build, memory and kernel bytes until
// 32,768 of its frames were walked.
func tableDemand(unwind int64) int {
	if unwind < smallTable {
		return 0
	}
	return int(min(max(unwind/(1<<10), 64), 32768))
}

// smallTable is the unwind information below which a file's table is
// built at first sight.
const smallTable = 64 << 10

// enqueue asks for pid to be (re)prepared or forgotten; it never blocks.
func (p *preparer) enqueue(pid int, kind prepareKind) {
	q := p.work
	if kind == prepareExec || kind == prepareExit {
		q = p.urgent
	}
	select {
	case q <- prepareWork{pid, kind}:
		p.queued.Add(1)
	default:
		p.dropped.Add(1)
	}
}

// run handles requests until ctx ends.
func (p *preparer) run(ctx context.Context) {
	grace := time.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	for {
		for len(p.execs) > 0 && !time.Now().Before(p.execs[0].due) {
			pid := p.execs[0].pid
			p.execs = p.execs[1:]
			p.handle(prepareWork{pid, prepareExec})
			p.handled.Add(1)
		}
		var due <-chan time.Time
		if len(p.execs) > 0 {
			grace.Reset(time.Until(p.execs[0].due))
			due = grace.C
		}
		var w prepareWork
		select {
		case w = <-p.urgent:
		default:
			select {
			case <-ctx.Done():
				return
			case <-due:
				continue
			case w = <-p.urgent:
			case w = <-p.work:
			}
		}
		grace.Stop() // no stale tick follows (Go >= 1.23 timers)
		if p.deferExec(w) {
			continue
		}
		p.handle(w)
		p.handled.Add(1)
	}
}

// deferExec keeps an exec for execGrace, and settles a waiting one when
// a request about its process comes first: an exit skips it (counted as
// handled, never prepared), a sample without unwind information prepares
// it as an exec at once. It reports whether w is done with.
func (p *preparer) deferExec(w prepareWork) bool {
	if w.kind == prepareExec && !p.filter.active {
		if !slices.ContainsFunc(p.execs, func(e pendingExec) bool { return e.pid == w.pid }) {
			p.execs = append(p.execs, pendingExec{w.pid, time.Now().Add(execGrace)})
			return true
		}
		p.handled.Add(1) // the image waiting is read when due, once
		return true
	}
	i := slices.IndexFunc(p.execs, func(e pendingExec) bool { return e.pid == w.pid })
	if i < 0 {
		return false
	}
	p.execs = slices.Delete(p.execs, i, i+1)
	switch w.kind {
	case prepareExit:
		p.skipped.Add(1)
		p.handled.Add(1) // the exec
	case prepareUnknown:
		p.handle(prepareWork{w.pid, prepareExec})
		p.handled.Add(2) // the exec and w
		return true
	default:
		p.handle(prepareWork{w.pid, prepareExec})
		p.handled.Add(1)
	}
	return false
}

// forgetImage lets every runtime examine pid again.
func (p *preparer) forgetImage(pid int) {
	if p.runtimes == nil {
		return
	}
	for _, rt := range p.runtimes.list {
		rt.forgetImage(pid)
	}
}

// prepareRuntimes lets every runtime examine proc and reports whether one
// set its walker up for it, or will once the runtime has started.
func (p *preparer) prepareRuntimes(proc *process.Process) bool {
	if p.runtimes == nil {
		return false
	}
	found := false
	for _, rt := range p.runtimes.list {
		if rt.prepare(proc) {
			found = true
		} else if sr, ok := rt.(startingRuntime); ok && sr.starting(proc.PID) {
			found = true
		}
	}
	return found
}

func (p *preparer) handle(w prepareWork) {
	p.pid = w.pid
	switch w.kind {
	case prepareExit:
		p.misses.take(w.pid)
		p.warm.forget(w.pid)
		p.filter.forget(w.pid)
		p.forgetImage(w.pid)
		_ = p.loader.Forget(w.pid)
		p.holds.exited(w.pid)
		return
	case prepareExec:
		// The reader marked the old image stale in the process table.
		p.warm.forget(w.pid)
		p.filter.forget(w.pid)
		p.forgetImage(w.pid)
		// A new image read this early may not have its libraries mapped
		// yet (the dynamic loader maps them next), and the kernel asks
		// about a process at most once a second: its mappings are read
		// once more shortly, so its first second is not cut above main.
		pid := w.pid
		time.AfterFunc(reprepareAfterExec, func() { p.enqueue(pid, prepareUnknown) })
	}
	proc, err := p.procs.Get(w.pid)
	if err == nil && w.kind == prepareUnknown && p.loader.Prepared(w.pid) {
		// Known but sampled outside its mappings, or in one that was
		// replaced: something was mapped or unmapped since (dlopen,
		// dlclose). The eBPF side rate-limits these requests per process,
		// so the maps are read again every time.
		proc, err = p.procs.Reread(w.pid)
	}
	if err != nil {
		if errors.Is(err, process.ErrGone) {
			p.gone.Add(1)
		} else {
			p.log.Debug("cannot prepare unwinding", zap.Int("pid", w.pid), zap.Error(err))
		}
		_ = p.loader.Forget(w.pid)
		return
	}
	if p.filter.active {
		d := p.filter.decide(proc)
		if err := p.kernel.Filter(uint32(w.pid), d.kernelUntil()); err != nil {
			p.log.Debug("cannot set the process filter", zap.Int("pid", w.pid), zap.Error(err))
		}
		// The kernel clears a decision when the process exits; one set
		// after that (a cached Process that has exited since) would stay.
		if err := proc.Alive(); errors.Is(err, process.ErrGone) {
			p.gone.Add(1)
			p.filter.forget(w.pid)
			_ = p.kernel.Unfilter(uint32(w.pid))
			_ = p.loader.Forget(w.pid)
			return
		}
		if d.excluded {
			p.excluded.Add(1)
			_ = p.loader.Forget(w.pid)
			return
		}
	}
	if w.kind == prepareFilter {
		return
	}
	// A Process from the table's cache may have exited since: Prepare then
	// sets nothing and forgets the pid.
	before := p.loader.Stats()
	err = p.loader.Prepare(proc)
	if err == nil && p.prepareRuntimes(proc) {
		// A runtime's walker needs the eBPF side's native frames, which
		// take no snapshots: its tables are built now, already while the
		// runtime starts (a JVM's libjvm.so takes a few hundred
		// milliseconds), so that they are there when the walker is.
		p.loader.WantProcess(proc.PID)
	}
	// A process of the start-up scan is held back until all its tables
	// are loaded, those built in the background too (Loaded): a CPython
	// process's lazy ones as well, now wanted.
	if !p.loader.Pending(w.pid) {
		p.warm.prepared(w.pid, monotonic())
	}
	if err == nil {
		missed, ok := p.misses.take(w.pid)
		// Tables built in the background meanwhile are reported by the
		// Loader's Loaded.
		after := p.loader.Stats()
		if n := (after.Built - before.Built) - (after.BuiltLater - before.BuiltLater); n > 0 && p.tableLoaded != nil {
			d := tableDelay(missed, ok, time.Now())
			for range n {
				p.reportTable(d)
			}
		}
	}
	switch {
	case errors.Is(err, process.ErrGone):
		p.gone.Add(1)
	case err != nil:
		p.log.Debug("preparing unwinding failed", zap.Int("pid", w.pid), zap.Error(err))
	}
}
