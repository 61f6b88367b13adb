//go:build linux

package profiler

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	sondeversion "github.com/sonde-dev/sonde/internal/version"
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

	// Intervals are by capture time: interval k holds the samples captured
	// in [t0 + k*ReporterInterval, t0 + (k+1)*ReporterInterval).
	t0    time.Time
	popts profile.Options

	mu   sync.Mutex  // guards what follows, up to the counters updated with it
	open []*interval // by start; the resolver adds to them, the reporter closes them
	free []*profile.Builder
	// closedEnd is the end of the last interval closed: a sample captured
	// before it is late, and goes to the oldest open interval.
	closedEnd time.Time
	// newest is the capture time of the newest record resolved: every
	// record captured before it, less watermarkSkew, was resolved too.
	newest time.Time
	// drained is the last time the reader found the ring buffer empty
	// whose records before it are all resolved: every record captured
	// before it, less watermarkSkew, was resolved too.
	drained time.Time
	// Counted under mu, with the sample's addition to its interval.
	samples      uint64
	stacks       [NumStackOutcomes][2]uint64
	intervalFull uint64
	late         uint64
	// repeated: samples added by the key of a stack seen before in their
	// interval; unkeyed: keys an interval could not keep (addSample).
	repeated, unkeyed uint64
	// pending is how many samples the open intervals hold; backlog counts
	// the intervals, and their samples, dropped unsent because the next
	// consumer fell behind (trimBacklog), and backlogLogged what of them
	// the last log line told, at backlogLogAt.
	pending       int
	backlog       backlogCount
	backlogLogged backlogCount
	backlogLogAt  time.Time
	backlogUntold bool // dropped since the last log line
	// emitStart is when the emit in progress began; zero between emits.
	// emitting is how many samples that emit holds.
	emitStart time.Time
	emitting  int

	wake chan struct{} // the resolver opened an interval, or drained the ring: older ones may be complete
	// kicked: the reporter asked the reader to read the ring buffer now
	// and say when it found it empty (batch.drained).
	kicked atomic.Bool
	// Processes found gone whose exit record never came (a full ring
	// buffer): the reader queues an exit for each, as if it had come, so
	// that nothing keeps what was held for them until their pid is reused.
	lostExitsMu  sync.Mutex
	lostExits    []int
	lostExitsAll atomic.Uint64 // exits queued for processes found gone
	inflight     atomic.Int64  // records read and not yet resolved
	samplesRead  atomic.Uint64 // sample records read (decoded)
	lag          atomic.Int64  // the newest sample's age when its interval was emitted
	// What shutdown could not deliver: samples left in the ring buffer,
	// read but left unresolved when Close came, and in intervals never
	// emitted.
	unread, unresolved, unflushed atomic.Uint64

	records      atomic.Uint64
	decodeErrors atomic.Uint64
	filtered     atomic.Uint64 // samples of excluded processes dropped in user space
	warmUpHeld   atomic.Uint64 // cut-short samples of start-up processes not yet prepared
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

	ran    atomic.Bool
	runMu  sync.Mutex
	closed bool               // stop began; under runMu
	cancel context.CancelFunc // of the running pipeline, nil before Run
	// closing ends when Close begins: the final flush's emit stops then.
	closing      context.Context
	closingStart context.CancelFunc
	wg           sync.WaitGroup // goroutines that stop with cancel and may use the tracer's maps
	readers      sync.WaitGroup // the reader and resolver: they stop when the tracer closes
	stopOnce     sync.Once
	stopErr      error
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
	if err := checkProcFS(opts.ProcFS); err != nil {
		return nil, err
	}
	// Before anything is sampled: no record is captured before t0.
	p := &Profiler{opts: opts, log: log, t0: time.Now(), wake: make(chan struct{}, 1)}
	p.closedEnd = p.t0
	p.closing, p.closingStart = context.WithCancel(context.Background())
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
		CountCosts:           opts.countCosts,
		SnapshotAll:          opts.checkSnapshots,
	})
	if err != nil {
		p.closingStart()
		return nil, err
	}
	p.tracer = tr
	p.offCPUEnabled = tr.OffCPU()
	// Loading decoded the kernel's BTF for the programs' relocations, 5 MB
	// of heap that is garbage now. Left to the next cycle, it would first
	// set that cycle's goal twice as high as the agent needs, and the
	// start-up's tables and lookups would grow the heap up to it. One
	// collection now resets the goal from what stays, and the pages the
	// garbage took go back to the system now rather than over minutes of
	// background scavenging: with nothing to profile they were 3–4 MiB of
	// the agent's RSS.
	debug.FreeOSMemory()

	version := opts.ScopeVersion
	if version == "" {
		version = sondeversion.Get()
	}
	p.popts = profile.Options{SamplesPerSecond: opts.SamplesPerSecond, ScopeVersion: version}
	p.procs = process.NewTable(opts.ProcFS, log, process.Options{
		MaxProcesses: opts.MaxProcesses,
		EnvVars:      opts.IncludeEnvVars,
		CommandLine:  opts.IncludeCommandLine,
	})
	p.syms = symbolize.New(log, symbolize.Options{
		MaxSymbolBytes: nativeSymbolBytes(opts.SymbolCacheBytes),
		DebugDirs:      append([]string{}, opts.DebugDirs...),
	})
	p.preparer = newPreparer(log, tr, p.procs, p.syms, p.filter, opts.UnwindTableBytes, opts.DebugDirs)
	p.preparer.tableLoaded = opts.TableLoaded
	p.resolver = newResolver(log, p.procs, p.syms, opts.NativeSymbols, p.preparer.loader)
	p.resolver.debugDirs = opts.DebugDirs
	p.resolver.checkSnapshots = opts.checkSnapshots
	p.resolver.holds = p.preparer.holds
	if runtimeWalkers {
		jvms := newJVMProcs(log, tr, opts.ProcFS, opts.JVMCacheBytes())
		jvms.retries.retry = func(pid int) { p.preparer.enqueue(pid, prepareUnknown) }
		phps := newPHPProcs(log, tr, opts.ProcFS, opts.SymbolCacheBytes/phpCodeShare, opts.phpLayouts)
		phps.retries.retry = jvms.retries.retry
		rubies := newRubyProcs(log, tr, opts.ProcFS, opts.SymbolCacheBytes/rubyCodeShare, opts.rubyLayouts)
		rubies.retries.retry = jvms.retries.retry
		p.preparer.runtimes = newRuntimeSet(
			newPythonProcs(log, tr, opts.ProcFS, opts.SymbolCacheBytes/pythonCodeShare, opts.pythonLayouts),
			jvms,
			newPerlProcs(log, tr, opts.ProcFS, opts.SymbolCacheBytes/perlCodeShare, opts.perlLayouts),
			newV8Procs(log, tr, opts.ProcFS, opts.SymbolCacheBytes/v8CodeShare, opts.v8Find),
			phps,
			rubies,
		)
		p.resolver.runtimes = p.preparer.runtimes
	}
	p.preparer.holds.procfs = opts.ProcFS
	p.offCPU = newOffCPUJoin(maxPendingOffCPU, maxPendingOffCPUFrame, offCPUExpiry(opts.ReporterInterval))
	return p, nil
}

// checkProcFS refuses a procfs root that is not a mounted procfs: without
// it every process would be unknown and every user frame unnamed. A plain
// directory that holds self/stat and self/maps is refused by its file
// system type.
func checkProcFS(root string) error {
	const hint = "mount the host's /proc there, or set procfs to where it is mounted"
	for _, f := range []string{"self/stat", "self/maps"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			return fmt.Errorf("procfs %s is not a mounted procfs (%s: %w): %s", root, f, err, hint)
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return fmt.Errorf("procfs %s is not a mounted procfs (statfs: %w): %s", root, err, hint)
	}
	if fs.Type != unix.PROC_SUPER_MAGIC {
		return fmt.Errorf("procfs %s is not a mounted procfs (its file system type is %#x, procfs's is %#x): %s",
			root, fs.Type, unix.PROC_SUPER_MAGIC, hint)
	}
	return nil
}

// nativeSymbolBytes is the part of SymbolCacheBytes the native symbolizer
// holds: all but the CPython code objects', the JVM namer's, the V8
// namer's, the PHP namer's, the Ruby namer's and the Perl namer's shares. A quarter of it is the per-file
// inflation cap (at most 32 MiB) that README.md documents.
func nativeSymbolBytes(symbolCacheBytes int64) int64 {
	return symbolCacheBytes - symbolCacheBytes/pythonCodeShare - symbolCacheBytes/jvmCodeShare - symbolCacheBytes/v8CodeShare -
		symbolCacheBytes/phpCodeShare - symbolCacheBytes/rubyCodeShare - symbolCacheBytes/perlCodeShare
}

// CPUs is how many CPUs are sampled.
func (p *Profiler) CPUs() int { return p.tracer.CPUs() }

// ErrRunTwice is returned by a second call of Run.
var ErrRunTwice = errors.New("profiler: Run called twice")

// Run runs the pipeline until ctx ends, calling emit, from the calling
// goroutine, with each interval that holds samples once every sample
// captured in it is resolved. When ctx ends it stops sampling, resolves what
// the ring buffer still holds (for at most DrainTimeout), emits the last,
// partial intervals, stops the pipeline's goroutines and returns. It
// returns early if Close is called; an emit in progress then delays it
// until that emit returns. It can be called once.
func (p *Profiler) Run(ctx context.Context, emit EmitFunc) error {
	if !p.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	p.runMu.Lock()
	if p.closed {
		p.runMu.Unlock()
		return tracer.ErrClosed
	}
	runCtx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	// Records wait here between the reader and the resolver, in batches;
	// a record is taken from free before each read, so at most
	// pendingRecords wait.
	records := make(chan batch, pendingRecords/maxBatch+1)
	free := newRecordPool(pendingRecords)
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.prepare(runCtx)
	}()
	go func() {
		defer p.wg.Done()
		p.preparer.run(runCtx)
	}()
	p.readers.Add(3)
	go func() {
		defer p.readers.Done()
		p.read(records, free)
	}()
	go func() {
		defer p.readers.Done()
		p.readNotices()
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
	p.report(runCtx, emit)
	p.finish(emit)
	return p.stop()
}

// DrainTimeout bounds how long Run resolves, after its context ended, the
// records the ring buffer still holds; FinalEmitTimeout bounds the emit of
// the last intervals. What they cut short is counted (Stats.Shutdown).
const (
	DrainTimeout     = 5 * time.Second
	FinalEmitTimeout = 5 * time.Second
)

// finish stops sampling, lets the reader and resolver drain the ring buffer
// and emits every open interval, unless Close came first.
func (p *Profiler) finish(emit EmitFunc) {
	if p.closing.Err() != nil {
		return
	}
	if err := p.tracer.Stop(); err != nil {
		p.log.Warn("stopping the tracer", zap.Error(err))
	}
	drained := make(chan struct{})
	go func() {
		p.readers.Wait()
		close(drained)
	}()
	timer := time.NewTimer(DrainTimeout)
	defer timer.Stop()
	select {
	case <-drained:
	case <-timer.C:
		p.log.Warn("the ring buffer's last records were not resolved in time; counted as lost at shutdown",
			zap.Duration("waited", DrainTimeout))
	case <-p.closing.Done():
		return
	}
	ctx, cancel := context.WithTimeout(p.closing, FinalEmitTimeout)
	defer cancel()
	p.emitReady(ctx, emit, true)
}

// Close stops the pipeline if it runs and releases the eBPF programs and
// maps. It does not wait for an emit in progress: Run returns when that
// emit does. It is idempotent and safe to call concurrently with Run.
func (p *Profiler) Close() error { return p.stop() }

// stop cancels the pipeline, waits for the goroutines that use the
// tracer's maps, closes the tracer and waits for the reader and resolver.
// What was sampled and never emitted is counted.
func (p *Profiler) stop() error {
	p.stopOnce.Do(func() {
		p.closingStart()
		p.runMu.Lock()
		p.closed = true
		if p.cancel != nil {
			p.cancel()
		}
		p.runMu.Unlock()
		p.wg.Wait()
		// The preparer has stopped; the tables it left to the background
		// must be done with the tracer's maps before they close.
		p.preparer.loader.Close()
		// Nothing is written once the producers stop: the counters read
		// then say how many samples were sent, and so how many were not
		// read.
		stopErr := p.tracer.Stop()
		p.tracerMu.Lock()
		if c, err := p.tracer.Counters(); err == nil {
			p.kernel = c
		}
		p.tracerClosed = true
		sent := p.kernel.SamplesSent
		p.tracerMu.Unlock()
		p.stopErr = errors.Join(stopErr, p.tracer.Close())
		p.readers.Wait()
		p.resolver.close() // the resolver goroutine has ended
		// Nothing names frames any more: the runtimes let go of the
		// processes' memory files they kept open to name them.
		if rts := p.preparer.runtimes; rts != nil {
			for _, rt := range rts.list {
				rt.close()
			}
		}
		if read := p.samplesRead.Load(); sent > read {
			p.unread.Store(sent - read)
		}
		p.mu.Lock()
		for _, iv := range p.open {
			p.unflushed.Add(uint64(iv.b.Len()))
		}
		p.open = nil
		p.pending = 0
		p.mu.Unlock()
	})
	return p.stopErr
}

// prepare does the start-up work that need not delay New: the initial /proc
// scan and the kernel symbol table.
func (p *Profiler) prepare(ctx context.Context) {
	if err := p.procs.Scan(); err != nil && ctx.Err() == nil {
		p.log.Warn("initial process scan incomplete; processes load on their first sample", zap.Error(err))
	}
	// The processes running now have samples before their tables exist.
	p.preparer.warm.start(p.procs.PIDs())
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

// maxBatch bounds the records the reader hands the resolver at once. It
// reads what the ring buffer holds at each wake-up and hands it over in
// one go: one wake-up of the resolver per batch, not per record, which on
// a quiet host is most of what the pipeline costs.
const maxBatch = 64

// batch is what the reader hands the resolver at once: the records it read
// in a row, and, when the ring buffer was found empty after them, when it
// was: every record written before then is in this batch or an earlier one.
type batch struct {
	qs      []queued
	drained time.Time
}

// queued is a record on its way from the reader to the resolver, with the
// process it is of, as the table held it when the record was read: a
// process that exits, or execs, before its samples are resolved is
// attributed as it was when sampled.
type queued struct {
	rec     *tracer.Record
	proc    *process.Process
	procErr error
}

// readNotices hands the requests for unwind information to the preparer
// until the tracer is closed or drained. They have a ring buffer and a
// reader of their own: read reads no faster than the resolver names frames,
// and a resolver loading a big file's symbols would otherwise leave new
// processes and libraries unwound by frame pointers meanwhile.
func (p *Profiler) readNotices() {
	var rec tracer.Record
	for {
		err := p.tracer.ReadNotice(&rec)
		if errors.Is(err, tracer.ErrClosed) || errors.Is(err, tracer.ErrDrained) {
			return
		}
		p.records.Add(1)
		if err != nil {
			p.decodeErrors.Add(1)
			continue
		}
		if rec.Type == tracer.RecordUnknown {
			p.preparer.misses.note(int(rec.PID), rec.Time)
			p.preparer.enqueue(int(rec.PID), prepareUnknown)
		}
	}
}

// read decodes records until the tracer is closed or drained. Samples, exec
// and exit go in order to the resolver, in batches of what the ring buffer
// held at once; requests for unwind information come through readNotices.
//
// It reads what the ring buffer holds, hands it over, and waits: for the
// eBPF side's wake-up (an eighth of the ring buffer full), the tracer's
// poll interval, or the reporter's kick at the end of an interval, after
// which it says that the ring buffer was empty (batch.drained) even when
// it read nothing.
func (p *Profiler) read(records chan<- batch, free *recordPool) {
	var b batch
	defer func() {
		if len(b.qs) > 0 {
			records <- b
		}
		close(records)
	}()
	var loggedDecode bool
	for {
		rec := free.get()
		before := time.Now()
		err := p.tracer.TryReadInto(rec)
		if errors.Is(err, tracer.ErrEmpty) {
			free.put(rec)
			b = p.queueLostExits(b, free)
			if kicked := p.kicked.Swap(false); len(b.qs) > 0 || kicked {
				b.drained = before
				records <- b
				b = batch{}
			}
			p.tracer.Wait()
			continue
		}
		if errors.Is(err, tracer.ErrClosed) || errors.Is(err, tracer.ErrDrained) {
			return
		}
		p.records.Add(1)
		if err != nil {
			p.decodeErrors.Add(1)
			if !loggedDecode {
				p.log.Warn("dropping undecodable ring buffer records (logged once)", zap.Error(err))
				loggedDecode = true
			}
			free.put(rec)
			continue
		}
		q := queued{rec: rec}
		switch rec.Type {
		case tracer.RecordSample, tracer.RecordOffCPUStart:
			if rec.Type == tracer.RecordSample {
				p.samplesRead.Add(1)
			}
			// Read now, while the process most likely still runs; cached
			// after its first sample.
			q.proc, q.procErr = p.procs.Get(int(rec.PID))
		case tracer.RecordExec:
			// The process table reads the new image once, for the
			// preparer and the resolver alike.
			p.procs.Exec(int(rec.PID))
			p.preparer.enqueue(int(rec.PID), prepareExec)
		case tracer.RecordExit:
			// The kernel side forgets the process now; its files stay
			// held open until the resolver reaches the exit.
			p.preparer.enqueue(int(rec.PID), prepareExit)
		case tracer.RecordUnknown:
			p.preparer.misses.note(int(rec.PID), rec.Time)
			p.preparer.enqueue(int(rec.PID), prepareUnknown)
			free.put(rec)
			continue
		}
		p.inflight.Add(1)
		if b.qs == nil {
			b.qs = make([]queued, 0, maxBatch)
		}
		if b.qs = append(b.qs, q); len(b.qs) == maxBatch {
			records <- b
			b = batch{}
		}
	}
}

// resolve turns records into samples of their intervals until the reader
// stops.
func (p *Profiler) resolve(records <-chan batch, free *recordPool) {
	var sample profile.Sample
	dropped := time.Now()
	for b := range records {
		for _, q := range b.qs {
			p.resolveOne(q, free, &sample)
			if now := time.Now(); now.Sub(dropped) >= dropPagesEvery {
				p.resolver.dropPages()
				dropped = now
			}
		}
		if !b.drained.IsZero() {
			p.resolvedDrain(b.drained)
		}
	}
}

// queueLostExits appends to b an exit record for each process found gone
// without one (lostExitsFound), after the records read before, and tells
// the preparer and the tracer, as read does for an exit from the ring
// buffer. Such a record has no capture time.
func (p *Profiler) queueLostExits(b batch, free *recordPool) batch {
	p.lostExitsMu.Lock()
	pids := p.lostExits
	p.lostExits = nil
	p.lostExitsMu.Unlock()
	for _, pid := range pids {
		p.tracer.ForgetTask(uint32(pid))
		p.preparer.enqueue(pid, prepareExit)
		rec := free.get()
		rec.SetLostExit(uint32(pid))
		p.inflight.Add(1)
		b.qs = append(b.qs, queued{rec: rec})
	}
	return b
}

// lostExitsFound hands the reader the processes the resolver's sweep found
// gone without an exit record, and wakes it; logged once per sweep.
func (p *Profiler) lostExitsFound(pids []int) {
	if len(pids) == 0 {
		return
	}
	p.lostExitsMu.Lock()
	p.lostExits = append(p.lostExits, pids...)
	p.lostExitsMu.Unlock()
	p.lostExitsAll.Add(uint64(len(pids)))
	p.log.Info("processes gone without an exit record (a full ring buffer lost it): forgetting them",
		zap.Int("processes", len(pids)), zap.Uint64("processes_total", p.lostExitsAll.Load()))
	p.tracer.Kick()
}

// resolvedDrain records that every record written before t is resolved,
// and wakes the reporter if that completes the oldest open interval.
func (p *Profiler) resolvedDrain(t time.Time) {
	p.mu.Lock()
	before := p.drained
	if t.After(p.drained) {
		p.drained = t
	}
	wake := false
	if len(p.open) > 0 {
		// The oldest interval's watermark was passed by this drain.
		mark := p.open[0].end.Add(watermarkSkew)
		wake = mark.After(before) && !mark.After(p.drained)
	}
	p.mu.Unlock()
	if wake {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// resolveOne turns one record into a sample of its interval, and gives the
// record back to free.
func (p *Profiler) resolveOne(q queued, free *recordPool, sample *profile.Sample) {
	rec := q.rec
	if p.closing.Err() != nil {
		// Close does not wait for the backlog: what is left is
		// counted, and the pipeline stops promptly.
		if rec.Type == tracer.RecordSample {
			p.unresolved.Add(1)
		}
		p.done(rec, free)
		return
	}
	if p.opts.BeforeResolve != nil {
		p.opts.BeforeResolve()
	}
	captured := rec.Time
	switch rec.Type {
	case tracer.RecordSample:
		if p.excludedSample(q.proc) {
			p.filtered.Add(1)
			break
		}
		// First: a stack unwound on from its snapshot may now be whole.
		q.proc = p.resolver.snapshotWalk(rec, q.proc, q.procErr)
		if len(rec.User) > 0 && p.preparer.warm.holdBack(int(rec.PID), ktime(rec.KTime), rec.Flags&tracer.FlagUserComplete != 0) {
			p.warmUpHeld.Add(1)
			break
		}
		p.addSample(rec, q.proc, q.procErr, sample)
	case tracer.RecordOffCPUStart:
		if p.excludedSample(q.proc) {
			p.filtered.Add(1)
			break
		}
		p.resolver.wantTable(rec)
		p.resolver.offCPUStart(rec, q.proc, q.procErr, sample)
		p.offCPU.start(offCPUKey{tid: rec.TID, start: rec.KTime}, sample)
	case tracer.RecordOffCPUEnd:
		// Time is when the wait began; the record was written at its end.
		captured = captured.Add(rec.OffCPU)
		p.offCPU.end(offCPUKey{tid: rec.TID, start: rec.KTime}, rec.OffCPU, rec.Flags&tracer.OffCPUShort != 0, p.addOffCPU)
	case tracer.RecordExec:
		p.resolver.exec(int(rec.PID))
	case tracer.RecordExit:
		at := rec.Time
		if at.IsZero() { // queued for a process found gone (queueLostExits)
			at = time.Now()
		}
		p.resolver.exit(int(rec.PID), at)
	}
	p.mu.Lock()
	if captured.After(p.newest) {
		p.newest = captured
	}
	p.mu.Unlock()
	p.done(rec, free)
}

// done gives a resolved (or dropped) record back to free, without its
// snapshot.
func (p *Profiler) done(rec *tracer.Record, free *recordPool) {
	p.inflight.Add(-1)
	rec.ReleaseSnapshot()
	free.put(rec)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// excludedSample reports whether proc is one the filters exclude,
// sampled before the kernel knew: the decision is taken here if the
// preparer has not taken it yet.
func (p *Profiler) excludedSample(proc *process.Process) bool {
	return p.filter.active && proc != nil && p.filter.decide(proc).excluded
}

// addOffCPU adds a joined off-CPU wait to the current interval.
func (p *Profiler) addOffCPU(s profile.Sample) {
	p.mu.Lock()
	b := p.intervalFor(s.Time)
	n := b.Len()
	b.Add(s)
	p.pending += b.Len() - n
	p.trimBacklog()
	tell := p.backlogUntold
	p.mu.Unlock()
	if tell {
		p.logBacklog(false)
	}
}

// interval is one open reporting interval: [start, end) of capture time.
type interval struct {
	start, end time.Time
	b          *profile.Builder
}

// Bounds of the open intervals.
const (
	// maxOpenIntervals bounds the intervals open at once. Records arrive
	// nearly in capture order, so two are open most of the time, more
	// while a resolver that fell behind catches up or the next consumer
	// holds the reporter; past the bound a sample goes to the newest open
	// interval, whose window Flush widens, and counts as late.
	maxOpenIntervals = 64
	// maxWaitingIntervals bounds the intervals open while the next
	// consumer is behind (consumerBehind): past it, as past
	// Options.MaxPendingSamples, the oldest is dropped and counted
	// (trimBacklog).
	maxWaitingIntervals = 8
	// maxFreeBuilders bounds the builders kept for reuse.
	maxFreeBuilders = 2
)

// intervalFor returns the builder of the interval that holds capture time
// t. A sample captured before the last interval closed is late: it goes to
// the oldest open interval, whose window Flush widens to cover it. Called
// with p.mu held.
func (p *Profiler) intervalFor(t time.Time) *profile.Builder {
	if t.Before(p.closedEnd) {
		p.late++
		t = p.closedEnd
	}
	every := p.opts.ReporterInterval
	start := p.t0.Add(t.Sub(p.t0) / every * every)
	i := 0
	for ; i < len(p.open); i++ {
		if iv := p.open[i]; iv.start.Equal(start) {
			return iv.b
		} else if iv.start.After(start) {
			break
		}
	}
	for len(p.open) >= maxWaitingIntervals && i > 0 && p.consumerBehind() {
		p.dropOldest()
		i--
	}
	if len(p.open) >= maxOpenIntervals {
		p.late++
		return p.open[len(p.open)-1].b
	}
	var b *profile.Builder
	if n := len(p.free); n > 0 {
		b, p.free = p.free[n-1], p.free[:n-1]
	} else {
		b = profile.NewBuilder(p.popts)
	}
	iv := &interval{start: start, end: start.Add(every), b: b}
	p.open = append(p.open, nil)
	copy(p.open[i+1:], p.open[i:])
	p.open[i] = iv
	if len(p.open) > 1 {
		// The older ones may be complete: tell the reporter now rather
		// than at its next tick, so that a resolver catching up does not
		// pile them up.
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return b
}

// When an interval is complete. Records reach the ring buffer nearly in
// capture order (a BPF program takes the time before it writes), so once a
// record captured watermarkSkew after an interval's end was resolved, every
// sample of the interval was; and so was it once the reader found the ring
// buffer empty watermarkSkew after the end and everything read before was
// resolved. The reporter kicks the reader at that time (Tracer.Kick), so
// an interval is emitted within milliseconds of its end however seldom the
// reader polls. Should neither tell, an interval is complete too once
// idleDelay has passed since its end with nothing read and unresolved.
// idleDelay exceeds the tracer's poll interval, within which a record
// written without a wake-up is read.
const (
	watermarkSkew = 50 * time.Millisecond
	idleDelay     = tracer.DefaultPollInterval + 400*time.Millisecond
	// recheck is how soon the reporter looks again at an interval that
	// is due but not complete yet (the resolver catching up).
	recheck = 250 * time.Millisecond
)

// report emits the intervals as they complete, until ctx ends. A failing
// emit is counted and logged once per interval; the next interval goes on.
// It wakes at each interval's end (plus watermarkSkew) to kick the reader,
// when the resolver says an interval may be complete, and once per
// interval to log: a handful of wake-ups per interval, not a tick.
func (p *Profiler) report(ctx context.Context, emit EmitFunc) {
	every := p.opts.ReporterInterval
	nextLog := p.t0.Add(every)
	timer := time.NewTimer(time.Until(nextLog.Add(watermarkSkew)))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
			if p.due(time.Now()) {
				p.kick()
			}
		}
		p.emitReady(ctx, emit, false)
		now := time.Now()
		if !now.Before(nextLog) {
			// Once per interval of wall-clock time: what was lost,
			// and the resolver may log its first problem again.
			p.reportLost()
			p.logBacklog(true)
			p.lostExitsFound(p.resolver.endInterval())
			for !now.Before(nextLog) {
				nextLog = nextLog.Add(every)
			}
		}
		timer.Reset(time.Until(p.nextCheck(now, nextLog)))
	}
}

// backlogCount counts what trimBacklog dropped.
type backlogCount struct{ intervals, samples uint64 }

// trimBacklog drops the oldest open intervals while their samples pass
// Options.MaxPendingSamples, never the newest: a next consumer that blocks
// or fails slowly holds the reporter, and without a bound the intervals
// that wait for it would grow for as long. What is dropped is counted now,
// and logged once per interval (logBacklog). Called with p.mu held.
func (p *Profiler) trimBacklog() {
	for p.pending > p.opts.MaxPendingSamples && len(p.open) > 1 && p.consumerBehind() {
		p.dropOldest()
	}
}

// consumerBehind reports whether the next consumer has held the reporter
// for a reporting interval or more: the intervals open then wait for it.
// A resolver catching up on a backlog with a consumer that keeps up opens
// many intervals too, which the reporter closes as soon as it runs; those
// are not dropped. Called with p.mu held.
func (p *Profiler) consumerBehind() bool {
	return !p.emitStart.IsZero() && time.Since(p.emitStart) >= p.opts.ReporterInterval
}

// dropOldest drops the oldest open interval and counts its samples. Called
// with p.mu held.
func (p *Profiler) dropOldest() {
	iv := p.open[0]
	p.open = p.open[1:]
	p.closedEnd = iv.end
	n := iv.b.Len()
	p.pending -= n
	p.backlog.intervals++
	p.backlog.samples += uint64(n)
	p.backlogUntold = true
	iv.b.Discard()
	if len(p.free) < maxFreeBuilders {
		p.free = append(p.free, iv.b)
	}
}

// logBacklog logs what trimBacklog dropped since the last line, at most
// once per interval. The resolver calls it after a drop, since the
// reporter may be held by the consumer then; the reporter calls it with
// force once per interval, so the last drops are told too.
func (p *Profiler) logBacklog(force bool) {
	now := time.Now()
	p.mu.Lock()
	d, total := p.backlog, p.backlog
	d.intervals -= p.backlogLogged.intervals
	d.samples -= p.backlogLogged.samples
	if d.intervals == 0 || (!force && now.Sub(p.backlogLogAt) < p.opts.ReporterInterval) {
		p.mu.Unlock()
		return
	}
	p.backlogLogged, p.backlogLogAt, p.backlogUntold = total, now, false
	p.mu.Unlock()
	p.log.Warn("next consumer is behind: the oldest waiting intervals were dropped unsent; make it faster (an exporter's sending_queue) or raise limits::max_pending_samples",
		zap.Uint64("intervals", d.intervals), zap.Uint64("samples", d.samples),
		zap.Uint64("samples_total", total.samples), zap.Int("max_pending_samples", p.opts.MaxPendingSamples))
}

// kick asks the reader to read the ring buffer now and say when it found
// it empty.
func (p *Profiler) kick() {
	p.kicked.Store(true)
	p.tracer.Kick()
}

// due reports whether the oldest open interval has ended (plus
// watermarkSkew) but is not complete yet.
func (p *Profiler) due(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.open) > 0 && !now.Before(p.open[0].end.Add(watermarkSkew))
}

// nextCheck is when the reporter next has something to do after now: the
// end (plus watermarkSkew) of the oldest open interval, or, with none open,
// the next log (the end of the interval running now); while the oldest
// interval waits for the resolver past its end, a recheck.
func (p *Profiler) nextCheck(now, nextLog time.Time) time.Time {
	next := nextLog.Add(watermarkSkew)
	p.mu.Lock()
	if len(p.open) > 0 {
		if end := p.open[0].end.Add(watermarkSkew); now.Before(end) {
			next = end
		} else {
			next = now.Add(recheck)
		}
	}
	p.mu.Unlock()
	return next
}

// emitReady closes the open intervals that are complete, all of them if
// all is set, and emits them in order. It takes them one at a time: one
// not handed over yet stays open, and its samples pending.
func (p *Profiler) emitReady(ctx context.Context, emit EmitFunc, all bool) {
	for {
		now := time.Now()
		idle := p.inflight.Load() == 0
		p.mu.Lock()
		if len(p.open) == 0 {
			p.mu.Unlock()
			return
		}
		iv := p.open[0]
		if !all && p.newest.Sub(iv.end) < watermarkSkew && p.drained.Sub(iv.end) < watermarkSkew &&
			(!idle || now.Sub(iv.end) < idleDelay) {
			p.mu.Unlock()
			return
		}
		p.open = p.open[1:]
		p.closedEnd = iv.end
		p.pending -= iv.b.Len()
		p.mu.Unlock()
		p.flush(ctx, emit, iv)
	}
}

// flush emits one closed interval and keeps its builder for reuse.
func (p *Profiler) flush(ctx context.Context, emit EmitFunc, iv *interval) {
	n := iv.b.Len()
	_, last, ok := iv.b.Span()
	pd := iv.b.Flush(iv.start, iv.end)
	p.mu.Lock()
	if len(p.free) < maxFreeBuilders {
		p.free = append(p.free, iv.b)
	}
	p.mu.Unlock()
	if n == 0 {
		return
	}
	if ok {
		p.lag.Store(int64(time.Since(last)))
	}
	profiles := pd.ProfileCount() // pd belongs to emit once called
	p.mu.Lock()
	p.emitStart, p.emitting = time.Now(), n
	p.mu.Unlock()
	err := emit(ctx, pd)
	p.mu.Lock()
	// Counted as refused before it stops counting as emitting, so that
	// Stats never misses the interval's samples.
	if err != nil {
		p.emitErrors.Add(1)
		p.emitDropped.Add(uint64(n))
	}
	p.emitStart, p.emitting = time.Time{}, 0
	p.mu.Unlock()
	if err != nil {
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
