package process

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Defaults for Options.
const (
	DefaultMaxProcesses    = 65536
	DefaultRefreshInterval = 100 * time.Millisecond
	DefaultProcfs          = "/proc"
)

// Options tune a Table. The zero value selects the defaults.
type Options struct {
	// MaxProcesses bounds the number of cached processes (default
	// DefaultMaxProcesses). When full, caching another evicts one that was
	// not used recently; Stats.Dropped counts evictions.
	MaxProcesses int
	// RefreshInterval is the least time between two Refresh reloads of one
	// pid (default DefaultRefreshInterval); more frequent calls return the
	// cached process and count in Stats.RefreshLimited.
	RefreshInterval time.Duration
	// EnvVars names environment variables to keep in Process.Env.
	EnvVars []string
	// CommandLine fills Process.CommandLine.
	CommandLine bool
	// Now is the clock for rate limiting (default time.Now); tests set it.
	Now func() time.Time
}

// Stats counts what a Table did since it was created.
type Stats struct {
	Loads          uint64 // processes read from scratch
	Refreshes      uint64 // mapping reloads by Refresh
	RefreshLimited uint64 // Refresh calls answered from the cache by the rate limit
	Reused         uint64 // cached processes replaced because their pid was reused
	Gone           uint64 // reads that found the process gone, and entries pruned by Scan
	Errors         uint64 // reads that failed for another reason (permissions, malformed files)
	Dropped        uint64 // cached processes evicted to stay within MaxProcesses
	Skipped        uint64 // kernel threads Scan did not cache
	// Malformed counts details left out of a process that was read: an
	// OTEL_RESOURCE_ATTRIBUTES value that does not decode (discarded whole,
	// as the OpenTelemetry SDKs do), an NSpid line that does not parse.
	Malformed uint64
}

// Table caches the processes of one procfs tree, keyed by pid (TGID). It is
// safe for concurrent use. Get on a cached pid takes a read lock and makes no
// system call; all procfs reads happen outside the lock, and concurrent loads
// of one pid share a single read.
type Table struct {
	rd      reader
	log     *zap.Logger
	max     int
	refresh time.Duration
	now     func() time.Time

	mu       sync.RWMutex
	entries  map[int]*entry
	inflight map[int]*call
	// failed remembers pids that could not be read for a reason other than
	// being gone (no permission), so Get does not retry them on every
	// sample; an entry is honoured for RefreshInterval.
	failed map[int]failure
	// waiting, if set (tests), is called when a load is about to wait for
	// another caller's read of the same pid.
	waiting func(pid int)

	loads, refreshes, refreshLimited, reused, gone, errs, dropped, skipped, malformed atomic.Uint64
}

type entry struct {
	proc *Process
	// loaded is when proc was last read (or a refresh attempted), for the
	// Refresh rate limit.
	loaded time.Time
	// read is when the read that gave proc began: proc's mappings are
	// those of that moment or later.
	read time.Time
	// stale is set by Exec: the next Get reloads.
	stale bool
	// forced counts the reads RefreshSince made past the rate limit for
	// this image (at most maxForcedReads).
	forced int
	// used is set by Get and cleared by the eviction scan (second chance).
	used atomic.Bool
}

type failure struct {
	err error
	at  time.Time
}

// maxFailed bounds Table.failed; when full it is emptied, which only costs
// retries.
const maxFailed = 4096

// call is one read of a pid in progress; later callers wait for it.
type call struct {
	done chan struct{}
	proc *Process
	err  error
	// discard is set when Exec or Exit for the pid arrives during the read:
	// the result may predate the event and is not cached. execd says an
	// Exec did: a caller waiting for the result reads the new image
	// instead.
	discard, execd bool
}

// NewTable returns an empty table over the procfs tree at procfs ("" means
// DefaultProcfs). A nil logger discards logs.
func NewTable(procfs string, logger *zap.Logger, opts Options) *Table {
	if procfs == "" {
		procfs = DefaultProcfs
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	if opts.MaxProcesses <= 0 {
		opts.MaxProcesses = DefaultMaxProcesses
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = DefaultRefreshInterval
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	var want map[string]bool
	if len(opts.EnvVars) > 0 {
		want = make(map[string]bool, len(opts.EnvVars))
		for _, v := range opts.EnvVars {
			want[v] = true
		}
	}
	t := &Table{
		rd:       reader{procfs: procfs, envWant: want, commandLine: opts.CommandLine},
		log:      logger,
		max:      opts.MaxProcesses,
		refresh:  opts.RefreshInterval,
		now:      opts.Now,
		entries:  make(map[int]*entry),
		inflight: make(map[int]*call),
		failed:   make(map[int]failure),
	}
	t.rd.malformed = &t.malformed
	return t
}

// Procfs returns the root of the procfs tree the table reads.
func (t *Table) Procfs() string { return t.rd.procfs }

// Get returns the process pid, reading it on a miss or after Exec. It does
// not check a cached process against procfs; Refresh and Exec do. The error
// matches ErrGone when the process no longer exists.
func (t *Table) Get(pid int) (*Process, error) {
	t.mu.RLock()
	e := t.entries[pid]
	if e != nil && !e.stale {
		p := e.proc
		t.mu.RUnlock()
		if !e.used.Load() {
			e.used.Store(true)
		}
		return p, nil
	}
	f, failed := t.failed[pid]
	t.mu.RUnlock()
	if failed && t.now().Sub(f.at) < t.refresh {
		return nil, f.err
	}
	return t.load(pid, loadMiss, true)
}

// Refresh re-reads the mappings of pid, for when a sample hits an address no
// cached mapping covers (a library loaded by dlopen, or by the dynamic loader
// after an exec was already read). It reads stat and maps only; the
// executable, cgroup and environment are kept. Calls for one pid within
// Options.RefreshInterval of the last read or attempt return the cached
// process. A pid now used by another process (its start time differs) is read
// from scratch and replaces the cached one; an uncached pid is loaded.
func (t *Table) Refresh(pid int) (*Process, error) { return t.RefreshSince(pid, time.Time{}) }

// RefreshSince is Refresh for a sample captured at captured. When the read
// behind the cached mappings began before it, they are read again whatever
// the rate limit: a process read while its dynamic loader was still mapping
// its libraries (at its first sample, just after its exec) lacks libc, which
// each later sample's caller of main is in, and a short process may be gone
// before the rate limit lets a refresh through. Other reads of those first
// milliseconds (the preparer's, for a sample taken before the process was
// prepared) may lack libc too, so each image has maxForcedReads such reads,
// not one.
func (t *Table) RefreshSince(pid int, captured time.Time) (*Process, error) {
	now := t.now()
	t.mu.Lock()
	e := t.entries[pid]
	forced := e != nil && !e.stale && e.forced < maxForcedReads && !captured.IsZero() && e.read.Before(captured)
	if e != nil && !e.stale && !forced && now.Sub(e.loaded) < t.refresh {
		p := e.proc
		t.mu.Unlock()
		t.refreshLimited.Add(1)
		return p, nil
	}
	if forced {
		e.forced++
	}
	t.mu.Unlock()
	return t.load(pid, loadRefresh, true)
}

// maxForcedReads bounds the reads of one image's mappings RefreshSince makes
// past the rate limit. A process whose samples keep landing outside its
// mappings (a frame-pointer walk into data) costs no more than that.
const maxForcedReads = 3

// Reread is Refresh without its rate limit, for when the caller knows the
// mappings changed (the unwinder found one of them replaced).
func (t *Table) Reread(pid int) (*Process, error) {
	return t.load(pid, loadRefresh, true)
}

// Exec marks pid for reload: the process replaced its image, so the next Get
// reads it again.
func (t *Table) Exec(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[pid]; e != nil {
		e.stale = true
	}
	delete(t.failed, pid)
	if c := t.inflight[pid]; c != nil {
		c.discard, c.execd = true, true
	}
}

// Exit drops pid from the table.
func (t *Table) Exit(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.entries, pid)
	delete(t.failed, pid)
	if c := t.inflight[pid]; c != nil {
		c.discard = true
	}
}

// Cached reports whether pid's current image is cached: Get returns it
// without reading procfs.
func (t *Table) Cached(pid int) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e := t.entries[pid]
	return e != nil && !e.stale
}

// Len returns the number of cached processes.
func (t *Table) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.entries)
}

// PIDs returns the pids of the cached processes, in no order.
func (t *Table) PIDs() []int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	pids := make([]int, 0, len(t.entries))
	for pid := range t.entries {
		pids = append(pids, pid)
	}
	return pids
}

// Stats returns the table's counters.
func (t *Table) Stats() Stats {
	return Stats{
		Loads:          t.loads.Load(),
		Refreshes:      t.refreshes.Load(),
		RefreshLimited: t.refreshLimited.Load(),
		Reused:         t.reused.Load(),
		Gone:           t.gone.Load(),
		Errors:         t.errs.Load(),
		Dropped:        t.dropped.Load(),
		Skipped:        t.skipped.Load(),
		Malformed:      t.malformed.Load(),
	}
}

// Scan reads every process now in procfs, so processes that started before
// the profiler are known. Kernel threads are not cached. Cached processes
// whose pid is gone are dropped; cached ones whose pid was reused are
// replaced. Failures for single processes are counted in Stats, not
// returned; the error is for an unreadable procfs.
func (t *Table) Scan() error {
	d, err := os.Open(t.rd.procfs)
	if err != nil {
		return fmt.Errorf("scan %s: %w", t.rd.procfs, err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("scan %s: %w", t.rd.procfs, err)
	}
	seen := make(map[int]struct{}, len(names))
	var failed int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= 0 {
			continue
		}
		seen[pid] = struct{}{}
		if t.scanOne(pid) != nil {
			failed++
		}
	}

	t.mu.Lock()
	var pruned int
	for pid := range t.entries {
		if _, ok := seen[pid]; !ok {
			delete(t.entries, pid)
			pruned++
		}
	}
	for pid := range t.failed {
		if _, ok := seen[pid]; !ok {
			delete(t.failed, pid)
		}
	}
	n := len(t.entries)
	t.mu.Unlock()
	t.gone.Add(uint64(pruned))
	t.log.Debug("process scan done",
		zap.Int("cached", n), zap.Int("failed", failed), zap.Int("pruned", pruned))
	return nil
}

// scanOne brings pid up to date for Scan.
func (t *Table) scanOne(pid int) error {
	t.mu.RLock()
	e := t.entries[pid]
	var cached *Process
	if e != nil && !e.stale {
		cached = e.proc
	}
	t.mu.RUnlock()
	if cached != nil {
		st, err := t.rd.stat(t.rd.dir(pid))
		if err == nil && st.StartTime == cached.StartTime {
			return nil
		}
		if err != nil && errors.Is(err, ErrGone) {
			t.Exit(pid)
			t.gone.Add(1)
			return err
		}
		// Reused or unreadable: reload, which counts and logs.
		_, err = t.load(pid, loadForce, false)
		return err
	}
	_, err := t.load(pid, loadMiss, false)
	return err
}

// loadMode says what Table.load does with a cached process.
type loadMode int

const (
	loadMiss    loadMode = iota // return it unless Exec marked it stale
	loadRefresh                 // re-read its mappings (all of it if stale)
	loadForce                   // read it again from scratch
)

// load reads pid and caches the result. cacheKernel says whether kernel
// threads are cached.
func (t *Table) load(pid int, mode loadMode, cacheKernel bool) (*Process, error) {
	refresh := mode == loadRefresh
	t.mu.Lock()
	e := t.entries[pid]
	if mode == loadMiss && e != nil && !e.stale {
		// Loaded by another caller since our read-locked look-up.
		p := e.proc
		t.mu.Unlock()
		return p, nil
	}
	if c := t.inflight[pid]; c != nil {
		t.mu.Unlock()
		if t.waiting != nil {
			t.waiting(pid)
		}
		<-c.done
		t.mu.RLock()
		execd := c.execd
		t.mu.RUnlock()
		if execd {
			// That read may have seen the image before the exec: read
			// the new one (a sample taken after the exec must not be
			// named by the old image).
			return t.load(pid, mode, cacheKernel)
		}
		return c.proc, c.err
	}
	c := &call{done: make(chan struct{})}
	t.inflight[pid] = c
	var old *Process
	if e != nil {
		old = e.proc
		if refresh {
			// Rate-limit attempts, not only successes.
			e.loaded = t.now()
		}
	}
	stale := e != nil && e.stale
	t.mu.Unlock()
	began := t.now()

	var (
		p      *Process
		err    error
		reused bool
	)
	if refresh && old != nil && !stale {
		t.refreshes.Add(1)
		p, reused, err = t.rd.refresh(old)
	} else {
		t.loads.Add(1)
		p, err = t.rd.load(pid)
		reused = err == nil && old != nil && p.StartTime != old.StartTime
	}

	t.mu.Lock()
	delete(t.inflight, pid)
	if err == nil || errors.Is(err, ErrGone) {
		delete(t.failed, pid)
	}
	switch {
	case c.discard:
		// Exec or Exit arrived while reading; the entry was updated by it.
	case err != nil && errors.Is(err, ErrGone) && refresh && old != nil && !stale:
		// A refresh (for mappings it lacked) found the process gone: its
		// snapshot stays, for its samples still queued, until Exit.
	case err != nil && errors.Is(err, ErrGone):
		delete(t.entries, pid)
	case err != nil:
		if e := t.entries[pid]; e == nil || e.stale {
			delete(t.entries, pid)
			if len(t.failed) >= maxFailed {
				clear(t.failed)
			}
			t.failed[pid] = failure{err: err, at: t.now()}
		}
		// Else keep the previous snapshot: an unreadable refresh is not a
		// reason to forget the process.
	case p.KernelThread && !cacheKernel:
		delete(t.entries, pid)
	default:
		t.storeLocked(pid, p, began)
	}
	t.mu.Unlock()

	switch {
	case err != nil && errors.Is(err, ErrGone):
		t.gone.Add(1)
		t.log.Debug("process gone", zap.Int("pid", pid), zap.Error(err))
	case err != nil:
		t.errs.Add(1)
		t.log.Debug("process read failed", zap.Int("pid", pid), zap.Error(err))
	case p.KernelThread && !cacheKernel:
		t.skipped.Add(1)
	}
	if reused {
		t.reused.Add(1)
		t.log.Debug("pid reused", zap.Int("pid", pid),
			zap.Uint64("old_start_time", old.StartTime), zap.Uint64("start_time", p.StartTime))
	}
	c.proc, c.err = p, err
	close(c.done)
	return p, err
}

// storeLocked caches p, read from began on, evicting another process when
// the table is full. t.mu must be held for writing.
func (t *Table) storeLocked(pid int, p *Process, began time.Time) {
	if e := t.entries[pid]; e != nil {
		if e.stale || e.proc.StartTime != p.StartTime {
			e.forced = 0 // a new image
		}
		e.proc, e.loaded, e.read, e.stale = p, t.now(), began, false
		return
	}
	if len(t.entries) >= t.max {
		t.evictLocked()
	}
	e := &entry{proc: p, loaded: t.now(), read: began}
	e.used.Store(true)
	t.entries[pid] = e
}

// evictCandidates is how many entries an eviction examines. Map iteration
// starts at a random place, so this approximates least-recently-used
// eviction without ordering all entries.
const evictCandidates = 32

// evictLocked drops one entry, preferring one Get has not used since the
// last eviction looked at it. t.mu must be held for writing.
func (t *Table) evictLocked() {
	victim, n := -1, 0
	for pid, e := range t.entries {
		if victim < 0 {
			victim = pid
		}
		if !e.used.Load() {
			victim = pid
			break
		}
		e.used.Store(false)
		if n++; n == evictCandidates {
			break
		}
	}
	if victim >= 0 {
		delete(t.entries, victim)
		t.dropped.Add(1)
	}
}
