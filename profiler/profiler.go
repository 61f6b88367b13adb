package profiler

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/tracer"
)

// EmitFunc receives each finished interval. The profiles belong to it once
// called. An error is counted and logged once per interval; the profiler
// keeps running. ctx ends when the profiler stops.
type EmitFunc func(ctx context.Context, profiles pprofile.Profiles) error

// Profiler samples every thread of the host and builds one
// pprofile.Profiles per reporting interval.
//
// The pipeline: a reader goroutine decodes the tracer's records and hands
// them, in order, to a resolver goroutine, which finds their process,
// mapping and names and adds them to the current interval's builder; the
// goroutine that calls Run swaps builders every interval and emits the
// finished one. A preparer goroutine keeps the eBPF unwinder's tables in
// step with the processes.
//
// New loads the eBPF programs; Run runs the pipeline once; Close releases
// everything. Stats is safe to call at any time from any goroutine.
type Profiler struct {
	opts Options
	log  *zap.Logger

	tracer   *tracer.Tracer
	procs    *process.Table
	syms     *symbolize.Symbolizer
	resolver *resolver
	preparer *preparer
	filter   *procFilter
	offCPU   *offCPUJoin // pairs off-CPU starts and ends; resolver goroutine only
	// offCPUEnabled: the off-CPU program is loaded.
	offCPUEnabled bool

	mu      sync.Mutex // guards current and the counters updated with it
	current *profile.Builder
	spare   *profile.Builder // owned by the reporter between flushes
	// Counted under mu, with the sample's addition to the interval.
	samples      uint64
	stacks       [NumStackOutcomes][2]uint64
	intervalFull uint64

	records      atomic.Uint64
	decodeErrors atomic.Uint64
	filtered     atomic.Uint64 // samples of excluded processes dropped in user space
	intervals    atomic.Uint64 // intervals emitted without error
	emitProfiles atomic.Uint64 // profiles in them
	emitSamples  atomic.Uint64 // samples in them
	emitErrors   atomic.Uint64 // intervals whose emit returned an error
	emitDropped  atomic.Uint64 // samples of those intervals

	lastLost uint64 // the tracer's lost-record counters at the last flush
	// lastOffCPUDrops: off-CPU waits dropped by the join at the last flush.
	lastOffCPUDrops uint64

	// The tracer's maps are read under tracerMu until stop closes it;
	// kernel then holds the counters as they were last read.
	tracerMu     sync.Mutex
	tracerClosed bool
	kernel       tracer.Counters

	ran      atomic.Bool
	runMu    sync.Mutex
	closed   bool               // stop began; under runMu
	cancel   context.CancelFunc // of the running pipeline, nil before Run
	wg       sync.WaitGroup     // goroutines that stop with cancel and may use the tracer's maps
	readers  sync.WaitGroup     // the reader and resolver: they stop when the tracer closes
	stopOnce sync.Once
	stopErr  error
}

// New checks opts and the host, and loads and attaches the eBPF programs.
// Sampling starts at once; records wait in the ring buffer until Run. It
// returns one error naming what the host lacks. The caller must Close the
// profiler.
func New(opts Options) (*Profiler, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("profiler options: %w", err)
	}
	opts.IncludeEnvVars = append([]string(nil), opts.IncludeEnvVars...)
	opts.DebugDirs = append([]string(nil), opts.DebugDirs...)
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	p := &Profiler{opts: opts, log: log}
	p.filter = newProcFilter(&opts)
	var pending time.Duration
	if p.filter.active {
		pending = filterPending
	}
	tr, err := tracer.New(tracer.Options{
		SamplesPerSecond:     opts.SamplesPerSecond,
		RingBufferBytes:      opts.RingBufferBytes,
		MaxProcesses:         opts.MaxProcesses,
		IncludeIdle:          opts.Filters.IncludeIdle,
		IncludeKernelThreads: opts.Filters.IncludeKernelThreads,
		FilterPending:        pending,
		OffCPUThreshold:      opts.OffCPUThreshold,
		OffCPUMinDuration:    opts.OffCPUMinDuration,
	})
	if err != nil {
		return nil, err
	}
	p.tracer = tr
	p.offCPUEnabled = tr.OffCPU()

	version := opts.ScopeVersion
	if version == "" {
		version = moduleVersion()
	}
	popts := profile.Options{SamplesPerSecond: opts.SamplesPerSecond, ScopeVersion: version}
	p.current, p.spare = profile.NewBuilder(popts), profile.NewBuilder(popts)
	p.procs = process.NewTable(opts.ProcFS, log, process.Options{
		MaxProcesses: opts.MaxProcesses,
		EnvVars:      opts.IncludeEnvVars,
		CommandLine:  opts.IncludeCommandLine,
	})
	p.syms = symbolize.New(log, symbolize.Options{
		MaxSymbolBytes: opts.SymbolCacheBytes,
		DebugDirs:      append([]string{}, opts.DebugDirs...),
	})
	p.preparer = newPreparer(log, tr, p.procs, p.syms, p.filter, opts.UnwindTableBytes, opts.DebugDirs)
	p.resolver = newResolver(log, p.procs, p.syms, opts.NativeSymbols, p.preparer.loader)
	p.resolver.holds = p.preparer.holds
	p.preparer.holds.procfs = opts.ProcFS
	p.offCPU = newOffCPUJoin(maxPendingOffCPU, maxPendingOffCPUFrame, offCPUExpiry(opts.ReporterInterval))
	return p, nil
}

// CPUs is how many CPUs are sampled.
func (p *Profiler) CPUs() int { return p.tracer.CPUs() }

// ErrRunTwice is returned by a second call of Run.
var ErrRunTwice = errors.New("profiler: Run called twice")

// Run runs the pipeline until ctx ends, calling emit with each finished
// interval that holds samples, from the calling goroutine. When ctx ends it
// stops sampling and the pipeline's goroutines, and returns once the emit
// in progress, if any, has returned. It can be called once.
func (p *Profiler) Run(ctx context.Context, emit EmitFunc) error {
	if !p.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	p.runMu.Lock()
	if p.closed {
		p.runMu.Unlock()
		return tracer.ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	// Records wait here between the reader and the resolver; a record is
	// taken from free before each read, so at most pendingRecords wait.
	records := make(chan *tracer.Record, pendingRecords)
	free := make(chan *tracer.Record, pendingRecords)
	for range pendingRecords {
		free <- new(tracer.Record)
	}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.prepare(ctx)
	}()
	go func() {
		defer p.wg.Done()
		p.preparer.run(ctx)
	}()
	p.readers.Add(2)
	go func() {
		defer p.readers.Done()
		p.read(records, free)
	}()
	go func() {
		defer p.readers.Done()
		p.resolve(records, free)
	}()
	p.runMu.Unlock()
	p.log.Info("sonde profiler running",
		zap.Int("cpus", p.tracer.CPUs()),
		zap.Int("samples_per_second", p.opts.SamplesPerSecond),
		zap.Float64("off_cpu_threshold", p.opts.OffCPUThreshold),
		zap.Duration("reporter_interval", p.opts.ReporterInterval))
	p.report(ctx, emit)
	return p.stop()
}

// Close stops the pipeline if it runs and releases the eBPF programs and
// maps. It does not wait for an emit in progress: Run returns when that
// emit does. It is idempotent and safe to call concurrently with Run.
func (p *Profiler) Close() error { return p.stop() }

// stop cancels the pipeline, waits for the goroutines that use the
// tracer's maps, closes the tracer and waits for the reader and resolver.
func (p *Profiler) stop() error {
	p.stopOnce.Do(func() {
		p.runMu.Lock()
		p.closed = true
		if p.cancel != nil {
			p.cancel()
		}
		p.runMu.Unlock()
		p.wg.Wait()
		p.tracerMu.Lock()
		if c, err := p.tracer.Counters(); err == nil {
			p.kernel = c
		}
		p.tracerClosed = true
		p.tracerMu.Unlock()
		p.stopErr = p.tracer.Close()
		p.readers.Wait()
		p.resolver.close() // the resolver goroutine has ended
	})
	return p.stopErr
}

// prepare does the start-up work that need not delay New: the initial /proc
// scan and the kernel symbol table.
func (p *Profiler) prepare(ctx context.Context) {
	if err := p.procs.Scan(); err != nil && ctx.Err() == nil {
		p.log.Warn("initial process scan incomplete; processes load on their first sample", zap.Error(err))
	}
	if p.filter.active {
		// Decide about every running process now, so an excluded one
		// costs nothing from here on, not from its first sample.
		for _, pid := range p.procs.PIDs() {
			p.preparer.enqueue(pid, prepareFilter)
		}
	}
	if _, err := p.syms.Kernel(); err != nil && ctx.Err() == nil {
		p.log.Warn("kernel symbols unavailable; kernel frames stay unnamed", zap.Error(err))
	}
}

// pendingRecords bounds the records decoded but not yet resolved. When the
// resolver falls that far behind (loading a big file's symbols), the reader
// waits and the ring buffer, whose drops are counted, absorbs the rest.
const pendingRecords = 256

// read decodes records until the tracer is closed. Samples, exec and exit go
// in order to the resolver; requests for unwind information go straight to
// the preparer, so a resolver busy naming frames never delays unwinding.
func (p *Profiler) read(records chan<- *tracer.Record, free chan *tracer.Record) {
	defer close(records)
	var loggedDecode bool
	for {
		rec := <-free
		err := p.tracer.ReadInto(rec)
		if errors.Is(err, tracer.ErrClosed) {
			return
		}
		p.records.Add(1)
		if err != nil {
			p.decodeErrors.Add(1)
			if !loggedDecode {
				p.log.Warn("dropping undecodable ring buffer records (logged once)", zap.Error(err))
				loggedDecode = true
			}
			free <- rec
			continue
		}
		switch rec.Type {
		case tracer.RecordExec:
			// The process table reads the new image once, for the
			// preparer and the resolver alike.
			p.procs.Exec(int(rec.PID))
			p.preparer.enqueue(int(rec.PID), prepareExec)
		case tracer.RecordExit:
			p.preparer.enqueue(int(rec.PID), prepareExit)
		case tracer.RecordUnknown:
			p.preparer.enqueue(int(rec.PID), prepareUnknown)
			free <- rec
			continue
		}
		records <- rec
	}
}

// resolve turns records into samples of the current interval until the
// reader stops.
func (p *Profiler) resolve(records <-chan *tracer.Record, free chan<- *tracer.Record) {
	var sample profile.Sample
	for rec := range records {
		if p.opts.BeforeResolve != nil {
			p.opts.BeforeResolve()
		}
		switch rec.Type {
		case tracer.RecordSample:
			if p.excludedSample(rec) {
				p.filtered.Add(1)
				break
			}
			p.resolver.resolve(rec, &sample)
			c, fp := classifyStack(rec.Flags, len(rec.User))
			p.mu.Lock()
			n := p.current.Len()
			p.current.Add(sample)
			p.samples++
			p.stacks[c][b2i(fp)]++
			if p.current.Len() == n {
				p.intervalFull++
			}
			p.mu.Unlock()
		case tracer.RecordOffCPUStart:
			if p.excludedSample(rec) {
				p.filtered.Add(1)
				break
			}
			p.resolver.offCPUStart(rec, &sample)
			p.offCPU.start(offCPUKey{tid: rec.TID, start: rec.KTime}, &sample)
		case tracer.RecordOffCPUEnd:
			p.offCPU.end(offCPUKey{tid: rec.TID, start: rec.KTime}, rec.OffCPU, rec.Flags&tracer.OffCPUShort != 0, p.addOffCPU)
		case tracer.RecordExec:
			p.resolver.exec(int(rec.PID))
		case tracer.RecordExit:
			p.resolver.exit(int(rec.PID))
		}
		free <- rec
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// excludedSample reports whether rec is of a process the filters exclude,
// sampled before the kernel knew: the decision is taken here if the
// preparer has not taken it yet.
func (p *Profiler) excludedSample(rec *tracer.Record) bool {
	if !p.filter.active {
		return false
	}
	proc, err := p.procs.Get(int(rec.PID))
	return err == nil && p.filter.decide(proc).excluded
}

// addOffCPU adds a joined off-CPU wait to the current interval.
func (p *Profiler) addOffCPU(s profile.Sample) {
	p.mu.Lock()
	p.current.Add(s)
	p.mu.Unlock()
}

// report emits one profile per interval until ctx ends. A failing emit is
// counted and logged once per interval; the next interval goes on.
func (p *Profiler) report(ctx context.Context, emit EmitFunc) {
	ticker := time.NewTicker(p.opts.ReporterInterval)
	defer ticker.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case end := <-ticker.C:
			p.flush(ctx, emit, start, end)
			start = end
		}
	}
}

func (p *Profiler) flush(ctx context.Context, emit EmitFunc, start, end time.Time) {
	p.mu.Lock()
	done := p.current
	p.current, p.spare = p.spare, nil
	p.mu.Unlock()

	n := done.Len()
	pd := done.Flush(start, end)
	p.spare = done
	p.resolver.endInterval()
	p.reportLost()
	if n == 0 {
		return
	}
	profiles := pd.ProfileCount() // pd belongs to emit once called
	if err := emit(ctx, pd); err != nil {
		p.emitErrors.Add(1)
		p.emitDropped.Add(uint64(n))
		if ctx.Err() == nil {
			p.log.Warn("next consumer refused the interval's profiles; dropped",
				zap.Int("samples", n), zap.Uint64("failures_total", p.emitErrors.Load()), zap.Error(err))
		}
		return
	}
	p.emitProfiles.Add(uint64(profiles))
	p.emitSamples.Add(uint64(n))
	p.intervals.Add(1)
}

// reportLost logs, once per interval, the records the ring buffer could not
// take since the last interval.
func (p *Profiler) reportLost() {
	p.tracerMu.Lock()
	defer p.tracerMu.Unlock()
	if p.tracerClosed {
		return
	}
	c, err := p.tracer.Counters()
	if err != nil {
		return
	}
	p.kernel = c
	lost := c.Lost()
	if lost > p.lastLost {
		p.log.Warn("ring buffer full: records lost this interval; raise the ring buffer size (limits::ring_buffer_bytes) if this persists",
			zap.Uint64("lost", lost-p.lastLost), zap.Uint64("samples_lost_total", c.SamplesLost),
			zap.Uint64("task_events_lost_total", c.TaskEventsLost),
			zap.Uint64("off_cpu_lost_total", c.OffCPUStartsLost+c.OffCPUEndsLost))
	}
	p.lastLost = lost
	p.reportOffCPUDrops(c)
}

// reportOffCPUDrops logs, once per interval, the off-CPU waits that were
// traced but could not become samples.
func (p *Profiler) reportOffCPUDrops(c tracer.Counters) {
	st := &p.offCPU.stats
	drops := st.expired.Load() + st.evicted.Load() + st.orphanEnds.Load() + c.OffCPUMapFull
	if drops > p.lastOffCPUDrops {
		p.log.Debug("off-CPU waits dropped this interval (counted; long waits expire by design)",
			zap.Uint64("dropped", drops-p.lastOffCPUDrops),
			zap.Uint64("expired_total", st.expired.Load()), zap.Uint64("evicted_total", st.evicted.Load()),
			zap.Uint64("orphan_ends_total", st.orphanEnds.Load()), zap.Uint64("map_full_total", c.OffCPUMapFull))
	}
	p.lastOffCPUDrops = drops
}

// Prepared reports whether the unwinder holds pid's mappings: its stacks
// are unwound with its files' tables from now on.
func (p *Profiler) Prepared(pid int) bool { return p.preparer.loader.Prepared(pid) }

// moduleVersion is the version of this module as built into the binary.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if bi.Main.Path == modulePath && bi.Main.Version != "" {
		return bi.Main.Version
	}
	for _, dep := range bi.Deps {
		if dep.Path == modulePath {
			if dep.Replace != nil && dep.Replace.Version != "" {
				return dep.Replace.Version
			}
			return dep.Version
		}
	}
	return "devel"
}

const modulePath = "github.com/sonde-dev/sonde"
