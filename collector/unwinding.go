package collector

import (
	"context"
	"errors"
	"sync/atomic"

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

	queued  atomic.Uint64 // requests accepted
	handled atomic.Uint64 // requests handled; queued - handled are waiting
	dropped atomic.Uint64
	// gone counts processes that exited before or while being prepared:
	// whatever was set for them is forgotten. Normal for short-lived
	// processes, so counted, not logged.
	gone atomic.Uint64
}

type prepareKind uint8

const (
	prepareUnknown prepareKind = iota // sampled without (current) unwind information
	prepareExec                       // a new image: its old mappings are gone
	prepareExit
)

type prepareWork struct {
	pid  int
	kind prepareKind
}

const prepareQueue = 4096

// newPreparer returns a preparer that loads tables into k (the tracer).
func newPreparer(log *zap.Logger, k unwind.Kernel, procs *process.Table, syms *symbolize.Symbolizer, budget int64) *preparer {
	identify := func(path string) (elfx.FileID, error) {
		fi, err := syms.Open(path)
		if err != nil {
			return elfx.FileID{}, err
		}
		return fi.ID, nil
	}
	return &preparer{
		log:    log,
		procs:  procs,
		loader: unwind.NewLoader(k, identify, log, unwind.LoaderOptions{BudgetBytes: budget}),
		work:   make(chan prepareWork, prepareQueue),
	}
}

// enqueue asks for pid to be (re)prepared or forgotten; it never blocks.
func (p *preparer) enqueue(pid int, kind prepareKind) {
	select {
	case p.work <- prepareWork{pid, kind}:
		p.queued.Add(1)
	default:
		p.dropped.Add(1)
	}
}

// run handles requests until ctx ends.
func (p *preparer) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-p.work:
			p.handle(w)
			p.handled.Add(1)
		}
	}
}

func (p *preparer) handle(w prepareWork) {
	if w.kind == prepareExit {
		_ = p.loader.Forget(w.pid)
		return
	}
	proc, err := p.procs.Get(w.pid)
	if err == nil && w.kind == prepareUnknown && p.loader.Prepared(w.pid) {
		// Known but sampled outside its mappings: something was mapped
		// since (dlopen). Refresh is rate-limited per process.
		proc, err = p.procs.Refresh(w.pid)
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
	// A Process from the table's cache may have exited since: Prepare then
	// sets nothing and forgets the pid.
	switch err := p.loader.Prepare(proc); {
	case errors.Is(err, process.ErrGone):
		p.gone.Add(1)
	case err != nil:
		p.log.Debug("preparing unwinding failed", zap.Int("pid", w.pid), zap.Error(err))
	}
}
