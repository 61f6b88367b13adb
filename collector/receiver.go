package collector

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/receiver"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/tracer"
)

// profilesReceiver runs the pipeline: a reader goroutine decodes the
// tracer's records and hands them, in order, to a resolver goroutine, which
// finds their process, mapping and names and adds them to the current
// interval's builder; a reporter goroutine swaps builders every
// reporter_interval and hands the finished interval to the next consumer.
type profilesReceiver struct {
	set  receiver.Settings
	cfg  *Config
	next xconsumer.Profiles
	log  *zap.Logger

	tracer   *tracer.Tracer
	resolver *resolver
	preparer *preparer
	filter   *procFilter
	offCPU   *offCPUJoin // pairs off-CPU starts and ends; resolver goroutine only

	mu      sync.Mutex // guards current
	current *profile.Builder
	spare   *profile.Builder // owned by the reporter between flushes

	stats    receiverStats
	tel      *telemetry
	lastLost uint64 // the tracer's lost-record counters at the last flush
	// lastOffCPUDrops: off-CPU waits dropped by the join at the last flush.
	lastOffCPUDrops uint64

	// beforeResolve, when set (by tests, before Start), runs on the
	// resolver goroutine before each record: a slow resolver.
	beforeResolve func()

	cancel context.CancelFunc
	wg     sync.WaitGroup // goroutines that stop with cancel and may use the tracer's maps
	// The reporter stops with cancel too, but it may be held by the next
	// consumer: it uses the tracer only under tracerMu, until Shutdown sets
	// tracerClosed, and Shutdown waits for it (reporterDone) at most
	// shutdownGrace.
	reporterDone chan struct{}
	tracerMu     sync.Mutex
	tracerClosed bool
	readers      sync.WaitGroup // the reader and resolver: they stop when the tracer closes
	shutdownOnce sync.Once
}

// receiverStats are the receiver's own counters; they only grow.
type receiverStats struct {
	records        atomic.Uint64
	samples        atomic.Uint64
	decodeErrors   atomic.Uint64
	filtered       atomic.Uint64 // samples of excluded processes dropped in user space
	exports        atomic.Uint64
	exportFailures atomic.Uint64
}

func newProfilesReceiver(set receiver.Settings, cfg *Config, next xconsumer.Profiles) (*profilesReceiver, error) {
	tb, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return &profilesReceiver{set: set, cfg: cfg, next: next, log: set.Logger, tel: newTelemetry(tb)}, nil
}

// Start checks the host, loads and attaches the eBPF programs and starts the
// pipeline. It returns one error naming what the host lacks.
func (r *profilesReceiver) Start(_ context.Context, _ component.Host) error {
	started := time.Now()
	r.filter = newProcFilter(r.cfg)
	var pending time.Duration
	if r.filter.active {
		pending = filterPending
	}
	tr, err := tracer.New(tracer.Options{
		SamplesPerSecond:     r.cfg.SamplesPerSecond,
		RingBufferBytes:      r.cfg.Limits.RingBufferBytes,
		MaxProcesses:         r.cfg.Limits.MaxProcesses,
		IncludeIdle:          r.cfg.Filters.IncludeIdle,
		IncludeKernelThreads: r.cfg.Filters.IncludeKernelThreads,
		FilterPending:        pending,
		OffCPUThreshold:      r.cfg.OffCPUThreshold,
		OffCPUMinDuration:    r.cfg.OffCPUMinDuration,
	})
	if err != nil {
		return fmt.Errorf("sonde receiver: %w", err)
	}
	r.tracer = tr

	opts := profile.Options{SamplesPerSecond: r.cfg.SamplesPerSecond, ScopeVersion: moduleVersion()}
	r.current, r.spare = profile.NewBuilder(opts), profile.NewBuilder(opts)
	procs := process.NewTable(r.cfg.ProcFS, r.log, process.Options{
		MaxProcesses: r.cfg.Limits.MaxProcesses,
		EnvVars:      r.cfg.IncludeEnvVars,
		CommandLine:  r.cfg.IncludeCommandLine,
	})
	syms := symbolize.New(r.log, symbolize.Options{
		MaxSymbolBytes: r.cfg.Limits.SymbolCacheBytes,
		DebugDirs:      append([]string{}, r.cfg.Symbolization.DebugDirs...),
	})
	r.preparer = newPreparer(r.log, tr, procs, syms, r.filter, r.cfg.Limits.UnwindTableBytes, r.cfg.Symbolization.DebugDirs)
	r.resolver = newResolver(r.log, procs, syms, r.cfg.Symbolization.Native, r.preparer.loader)
	r.resolver.holds = r.preparer.holds
	r.preparer.holds.procfs = r.cfg.ProcFS
	r.offCPU = newOffCPUJoin(maxPendingOffCPU, maxPendingOffCPUFrame, offCPUExpiry(r.cfg.ReporterInterval))
	if err := r.tel.register(r, metadata.Meter(r.set.TelemetrySettings)); err != nil {
		r.tracer = nil
		return errors.Join(fmt.Errorf("sonde receiver: %w", err), tr.Close())
	}

	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	// Records wait here between the reader and the resolver; a record is
	// taken from free before each read, so at most pendingRecords wait.
	records := make(chan *tracer.Record, pendingRecords)
	free := make(chan *tracer.Record, pendingRecords)
	for range pendingRecords {
		free <- new(tracer.Record)
	}
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.prepare(ctx)
	}()
	go func() {
		defer r.wg.Done()
		r.preparer.run(ctx)
	}()
	r.reporterDone = make(chan struct{})
	go func() {
		defer close(r.reporterDone)
		r.report(ctx)
	}()
	r.readers.Add(2)
	go func() {
		defer r.readers.Done()
		r.read(records, free)
	}()
	go func() {
		defer r.readers.Done()
		r.resolve(records, free)
	}()
	r.log.Info("sonde receiver started",
		zap.Int("cpus", tr.CPUs()),
		zap.Int("samples_per_second", r.cfg.SamplesPerSecond),
		zap.Float64("off_cpu_threshold", r.cfg.OffCPUThreshold),
		zap.Duration("reporter_interval", r.cfg.ReporterInterval),
		zap.Duration("start_time", time.Since(started)))
	return nil
}

// prepare does the start-up work that need not delay Start: the initial /proc
// scan and the kernel symbol table.
func (r *profilesReceiver) prepare(ctx context.Context) {
	if err := r.resolver.procs.Scan(); err != nil && ctx.Err() == nil {
		r.log.Warn("initial process scan incomplete; processes load on their first sample", zap.Error(err))
	}
	if r.filter.active {
		// Decide about every running process now, so an excluded one
		// costs nothing from here on, not from its first sample.
		for _, pid := range r.resolver.procs.PIDs() {
			r.preparer.enqueue(pid, prepareFilter)
		}
	}
	if _, err := r.resolver.syms.Kernel(); err != nil && ctx.Err() == nil {
		r.log.Warn("kernel symbols unavailable; kernel frames stay unnamed", zap.Error(err))
	}
}

// pendingRecords bounds the records decoded but not yet resolved. When the
// resolver falls that far behind (loading a big file's symbols), the reader
// waits and the ring buffer, whose drops are counted, absorbs the rest.
const pendingRecords = 256

// read decodes records until the tracer is closed. Samples, exec and exit go
// in order to the resolver; requests for unwind information go straight to
// the preparer, so a resolver busy naming frames never delays unwinding.
func (r *profilesReceiver) read(records chan<- *tracer.Record, free chan *tracer.Record) {
	defer close(records)
	var loggedDecode bool
	for {
		rec := <-free
		err := r.tracer.ReadInto(rec)
		if errors.Is(err, tracer.ErrClosed) {
			return
		}
		r.stats.records.Add(1)
		if err != nil {
			r.stats.decodeErrors.Add(1)
			if !loggedDecode {
				r.log.Warn("dropping undecodable ring buffer records (logged once)", zap.Error(err))
				loggedDecode = true
			}
			free <- rec
			continue
		}
		switch rec.Type {
		case tracer.RecordExec:
			// The process table reads the new image once, for the
			// preparer and the resolver alike.
			r.resolver.procs.Exec(int(rec.PID))
			r.preparer.enqueue(int(rec.PID), prepareExec)
		case tracer.RecordExit:
			r.preparer.enqueue(int(rec.PID), prepareExit)
		case tracer.RecordUnknown:
			r.preparer.enqueue(int(rec.PID), prepareUnknown)
			free <- rec
			continue
		}
		records <- rec
	}
}

// resolve turns records into samples of the current interval until the
// reader stops.
func (r *profilesReceiver) resolve(records <-chan *tracer.Record, free chan<- *tracer.Record) {
	var sample profile.Sample
	for rec := range records {
		if r.beforeResolve != nil {
			r.beforeResolve()
		}
		switch rec.Type {
		case tracer.RecordSample:
			if r.excludedSample(rec) {
				r.stats.filtered.Add(1)
				break
			}
			r.resolver.resolve(rec, &sample)
			r.mu.Lock()
			n := r.current.Len()
			r.current.Add(sample)
			r.stats.samples.Add(1)
			r.tel.countSample(rec, r.current.Len() > n)
			r.mu.Unlock()
		case tracer.RecordOffCPUStart:
			if r.excludedSample(rec) {
				r.stats.filtered.Add(1)
				break
			}
			r.resolver.offCPUStart(rec, &sample)
			r.offCPU.start(offCPUKey{tid: rec.TID, start: rec.KTime}, &sample)
		case tracer.RecordOffCPUEnd:
			r.offCPU.end(offCPUKey{tid: rec.TID, start: rec.KTime}, rec.OffCPU, rec.Flags&tracer.OffCPUShort != 0, r.addOffCPU)
		case tracer.RecordExec:
			r.resolver.exec(int(rec.PID))
		case tracer.RecordExit:
			r.resolver.exit(int(rec.PID))
		}
		free <- rec
	}
}

// excludedSample reports whether rec is of a process the filters exclude,
// sampled before the kernel knew: the decision is taken here if the
// preparer has not taken it yet.
func (r *profilesReceiver) excludedSample(rec *tracer.Record) bool {
	if !r.filter.active {
		return false
	}
	p, err := r.resolver.procs.Get(int(rec.PID))
	return err == nil && r.filter.decide(p).excluded
}

// addOffCPU adds a joined off-CPU wait to the current interval.
func (r *profilesReceiver) addOffCPU(s profile.Sample) {
	r.mu.Lock()
	r.current.Add(s)
	r.mu.Unlock()
}

// report emits one profile per interval until ctx ends. A failing consumer is
// counted and logged once per interval; the next interval goes on.
func (r *profilesReceiver) report(ctx context.Context) {
	ticker := time.NewTicker(r.cfg.ReporterInterval)
	defer ticker.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case end := <-ticker.C:
			r.flush(ctx, start, end)
			start = end
		}
	}
}

func (r *profilesReceiver) flush(ctx context.Context, start, end time.Time) {
	r.mu.Lock()
	done := r.current
	r.current, r.spare = r.spare, nil
	r.mu.Unlock()

	n := done.Len()
	pd := done.Flush(start, end)
	r.spare = done
	r.resolver.endInterval()
	r.reportLost()
	if n == 0 {
		return
	}
	profiles := pd.ProfileCount() // pd belongs to the consumer once handed over
	if err := r.next.ConsumeProfiles(ctx, pd); err != nil {
		r.stats.exportFailures.Add(1)
		r.tel.refused(n)
		if ctx.Err() == nil {
			r.log.Warn("next consumer refused the interval's profiles; dropped",
				zap.Int("samples", n), zap.Uint64("failures_total", r.stats.exportFailures.Load()), zap.Error(err))
		}
		return
	}
	r.stats.exports.Add(1)
	r.tel.exported(profiles, n)
}

// reportLost logs, once per interval, the records the ring buffer could not
// take since the last interval.
func (r *profilesReceiver) reportLost() {
	r.tracerMu.Lock()
	defer r.tracerMu.Unlock()
	if r.tracerClosed {
		return
	}
	c, err := r.tracer.Counters()
	if err != nil {
		return
	}
	lost := c.Lost()
	if lost > r.lastLost {
		r.log.Warn("ring buffer full: records lost this interval; raise limits::ring_buffer_bytes if this persists",
			zap.Uint64("lost", lost-r.lastLost), zap.Uint64("samples_lost_total", c.SamplesLost),
			zap.Uint64("task_events_lost_total", c.TaskEventsLost),
			zap.Uint64("off_cpu_lost_total", c.OffCPUStartsLost+c.OffCPUEndsLost))
	}
	r.lastLost = lost
	r.reportOffCPUDrops(c)
}

// reportOffCPUDrops logs, once per interval, the off-CPU waits that were
// traced but could not become samples.
func (r *profilesReceiver) reportOffCPUDrops(c tracer.Counters) {
	st := &r.offCPU.stats
	drops := st.expired.Load() + st.evicted.Load() + st.orphanEnds.Load() + c.OffCPUMapFull
	if drops > r.lastOffCPUDrops {
		r.log.Debug("off-CPU waits dropped this interval (counted; long waits expire by design)",
			zap.Uint64("dropped", drops-r.lastOffCPUDrops),
			zap.Uint64("expired_total", st.expired.Load()), zap.Uint64("evicted_total", st.evicted.Load()),
			zap.Uint64("orphan_ends_total", st.orphanEnds.Load()), zap.Uint64("map_full_total", c.OffCPUMapFull))
	}
	r.lastOffCPUDrops = drops
}

// shutdownGrace bounds how long Shutdown waits for the next consumer to
// return the interval being handed over when it ignores the cancelled
// context.
const shutdownGrace = 2 * time.Second

// Shutdown stops sampling and waits for the pipeline's goroutines. It is
// prompt, idempotent and safe to call without Start. A next consumer that
// ignores cancellation delays it by at most shutdownGrace (or until ctx
// ends, if sooner); the reporter then ends when the consumer returns.
func (r *profilesReceiver) Shutdown(ctx context.Context) error {
	var err error
	r.shutdownOnce.Do(func() {
		if r.cancel != nil {
			r.cancel()
		}
		// The metrics callback, the preparer and the reporter use the
		// tracer's maps: stop them before the maps close.
		err = r.tel.unregister()
		r.wg.Wait()
		r.tracerMu.Lock()
		r.tracerClosed = true
		r.tracerMu.Unlock()
		if r.tracer != nil {
			err = errors.Join(err, r.tracer.Close())
		}
		r.readers.Wait()
		if r.resolver != nil {
			r.resolver.close() // the resolver goroutine has ended
		}
		if r.reporterDone != nil {
			grace := time.NewTimer(shutdownGrace)
			defer grace.Stop()
			select {
			case <-r.reporterDone:
			case <-grace.C:
				r.log.Warn("next consumer still holds an interval after shutdown began; not waiting for it",
					zap.Duration("waited", shutdownGrace))
			case <-ctx.Done():
			}
		}
	})
	return err
}

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
