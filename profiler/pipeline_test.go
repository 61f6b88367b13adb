package profiler

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// gate stalls the resolver while closed: a test's slow resolver, set as
// Options.BeforeResolve.
type gate struct {
	mu     sync.Mutex
	closed bool
	open   chan struct{}
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

// stall makes the resolver wait before its next record.
func (g *gate) stall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		g.open = make(chan struct{})
	}
}

// release lets the resolver go on.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.open)
	}
}

func (g *gate) wait() {
	g.mu.Lock()
	open := g.open
	closed := g.closed
	g.mu.Unlock()
	if closed {
		<-open
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling the pipeline, bounded by the deadline
	}
}

// checkAll applies the conformance checker to every interval.
func checkAll(t *testing.T, pds []pprofile.Profiles) {
	t.Helper()
	for i, pd := range pds {
		if err := profile.Check(pd); err != nil {
			t.Errorf("interval %d: %v", i, err)
		}
	}
}

// A resolver that falls several intervals behind: every interval it then
// emits still holds only samples captured in its window, and the lag shows
// how far behind it ran.
func TestIntervalsByCaptureTime(t *testing.T) {
	g := newGate()
	p, sink := startProfiler(t, 99, func(o *Options) {
		o.ReporterInterval = 200 * time.Millisecond
		o.BeforeResolve = g.wait
	})
	t.Cleanup(g.release)
	pid := testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChain)).Process.Pid
	waitFor(t, "a sample of the workload", 30*time.Second, func() bool {
		for _, pd := range sink.all() {
			if pidsOf(pd)[int64(pid)] {
				return true
			}
		}
		return false
	})

	// Stall the resolver for many intervals' worth of samples: 2 s of
	// them at least, by the tracer's count.
	g.stall()
	st := p.Stats()
	sent0 := st.Kernel.SamplesSent
	waitFor(t, "2 s of samples sent while the resolver is stalled", 60*time.Second, func() bool {
		return p.Stats().Kernel.SamplesSent >= sent0+2*99
	})
	before := len(sink.all())
	g.release()
	waitFor(t, "the backlog resolved and emitted", 60*time.Second, func() bool {
		s := p.Stats()
		return s.Queued == 0 && len(sink.all()) >= before+5
	})
	all := sink.all()
	checkAll(t, all)
	s := p.Stats()
	t.Logf("%d intervals, lag at the last %v, late samples %d, lost to the ring buffer %d",
		len(all), s.Lag, s.Late, s.Kernel.SamplesLost)
	// A resolver catching up opens many intervals at once; the consumer
	// keeps up, so none is dropped as a backlog.
	if s.Backlog.Intervals != 0 {
		t.Errorf("%d intervals (%d samples) dropped as a consumer backlog while the resolver caught up with a consumer that keeps up",
			s.Backlog.Intervals, s.Backlog.Samples)
	}
	// The windows follow each other.
	var prevEnd uint64
	for i, pd := range all {
		rps := pd.ResourceProfiles()
		if rps.Len() == 0 {
			continue
		}
		prof := rps.At(0).ScopeProfiles().At(0).Profiles().At(0)
		if start := uint64(prof.Time()); start < prevEnd {
			t.Errorf("interval %d starts at %d, before the previous one ended (%d)", i, start, prevEnd)
		}
		prevEnd = uint64(prof.Time()) + prof.DurationNano()
	}
}

// A process whose samples are resolved after it exited is one resource,
// with its executable's path, in every interval.
func TestExitedProcessIsOneResource(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	// Only the workload is profiled, at a low rate: the reader keeps
	// reading while the resolver is stalled, until pendingRecords wait.
	bin := filepath.Join(t.TempDir(), "burn-exiting")
	copyFile(t, testutil.BuildWorkload(t, testutil.CChain), bin)
	g := newGate()
	p, sink := startProfiler(t, 29, func(o *Options) {
		o.ReporterInterval = 200 * time.Millisecond
		o.BeforeResolve = g.wait
		o.Filters.IncludeExecutables = []string{"burn-exiting"}
	})
	t.Cleanup(g.release)
	testutil.StartWorkload(t, bin) // a first one, so that intervals are emitted
	// Warm up: the profiler is running and resolving.
	waitFor(t, "a first interval", 60*time.Second, func() bool { return len(sink.all()) > 0 })

	g.stall()
	cmd := testutil.StartWorkload(t, bin)
	pid := cmd.Process.Pid
	waitFor(t, "the workload known and sampled", 30*time.Second, func() bool {
		// The process table read it (at its exec, or for its first
		// sample), and it ran long enough on a CPU to have been sampled
		// a dozen times at 29 Hz: those samples wait, unresolved.
		return p.procs.Cached(pid) && cpuTime(t, pid) >= 400*time.Millisecond
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pid %d still in /proc after it was reaped: %v", pid, err)
	}
	before := len(sink.all())
	g.release()
	waitFor(t, "the backlog resolved and emitted", 60*time.Second, func() bool {
		return p.Stats().Queued == 0 && len(sink.all()) >= before+3
	})
	all := sink.all()
	checkAll(t, all)
	var resources []map[string]any
	for _, pd := range all {
		for _, rp := range pd.ResourceProfiles().All() {
			attrs := rp.Resource().Attributes().AsRaw()
			if attrs["process.pid"] == int64(pid) {
				resources = append(resources, attrs)
			}
		}
	}
	if len(resources) == 0 {
		t.Fatalf("no sample of pid %d: nothing was exercised", pid)
	}
	for i, r := range resources {
		if r["process.executable.path"] != bin {
			t.Errorf("resource %d of pid %d: %v, want process.executable.path %s", i, pid, r, bin)
		}
	}
	t.Logf("pid %d: %d resources (one per interval), %v", pid, len(resources), resources[0])
}

// At the end of Run the last, partial interval is emitted: every sample
// received is emitted, none is left behind uncounted.
func TestRunFlushesLastInterval(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	pid := testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChain)).Process.Pid
	opts := DefaultOptions()
	opts.SamplesPerSecond = 99
	opts.ReporterInterval = 10 * time.Minute // never reached: only the final flush emits
	opts.Logger = zaptest.NewLogger(t)
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer testutil.Close(t, p)
	s := new(sink)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, s.emit) }()
	// The workload's samples count once its tables are loaded (samples of
	// processes running at start are held back until then): wait for that,
	// then for 200 more samples of the host.
	waitFor(t, "the workload prepared", 60*time.Second, func() bool { return p.Prepared(pid) })
	after := p.Stats().Samples
	waitFor(t, "200 samples received", 60*time.Second, func() bool { return p.Stats().Samples >= after+200 })
	if n := len(s.all()); n != 0 {
		t.Fatalf("%d intervals emitted before the end of a 10-minute interval", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	all := s.all()
	if len(all) != 1 {
		t.Fatalf("%d intervals emitted at the end, want the last one", len(all))
	}
	checkAll(t, all)
	if !pidsOf(all[0])[int64(pid)] {
		t.Errorf("the last interval holds no sample of the workload %d", pid)
	}
	st := p.Stats()
	t.Logf("samples %d, emitted %d, unread %d, unflushed %d, lost to the ring buffer %d",
		st.Samples, st.EmittedSamples, st.Shutdown.Unread, st.Shutdown.Unflushed, st.Kernel.SamplesLost)
	if st.EmittedSamples != st.Samples-st.IntervalFull {
		t.Errorf("emitted %d samples of %d received (%d refused by a full interval)", st.EmittedSamples, st.Samples, st.IntervalFull)
	}
	if st.Shutdown.Unread != 0 || st.Shutdown.Unresolved != 0 || st.Shutdown.Unflushed != 0 {
		t.Errorf("shutdown left samples unread (%d), unresolved (%d) or unflushed (%d), want none",
			st.Shutdown.Unread, st.Shutdown.Unresolved, st.Shutdown.Unflushed)
	}
	// Every sample the kernel sent was read: received, filtered or held
	// back during warm-up.
	if read := st.Samples + st.FilteredInUser + st.WarmUp; read != st.Kernel.SamplesSent {
		t.Errorf("%d samples received, filtered or held back during warm-up; the kernel sent %d", read, st.Kernel.SamplesSent)
	}
}

// A process the file holds' sweep found gone without an exit record (lost
// to a full ring buffer) is forgotten as if the record had come: the reader
// queues an exit for it, which the preparer and the resolver handle, while
// the other processes' samples go on. Here the process still runs, asleep,
// as one that reused a gone process's pid would: it is forgotten, and would
// be prepared again when its next stack asked for it.
func TestLostExitForgetsProcess(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	burner := testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChain)).Process.Pid
	// A shell that runs for a few seconds (it is prepared once sampled),
	// then waits for its child.
	sleeper := testutil.StartWorkload(t, testutil.RequireTool(t, "bash"), "-c",
		"for ((i = 0; i < 3000000; i++)); do :; done; sleep 3600").Process.Pid
	p, s, stop := runProfiler(t, 99)
	waitFor(t, "both prepared", 60*time.Second, func() bool { return p.Prepared(burner) && p.Prepared(sleeper) })
	waitFor(t, "the shell waiting", 60*time.Second, func() bool { return taskState(t, sleeper) == 'S' })

	p.lostExitsFound([]int{sleeper})
	waitFor(t, "the sleeper forgotten", 30*time.Second, func() bool { return !p.Prepared(sleeper) })
	if n := p.Stats().ExitsSwept; n != 1 {
		t.Errorf("Stats().ExitsSwept = %d, want 1", n)
	}
	if !p.Prepared(burner) {
		t.Error("the burner was forgotten with the sleeper")
	}
	after := p.Stats().Samples
	waitFor(t, "100 more samples", 60*time.Second, func() bool { return p.Stats().Samples >= after+100 })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	all := s.all()
	checkAll(t, all)
	found := false
	for _, pd := range all {
		found = found || pidsOf(pd)[int64(burner)]
	}
	if !found {
		t.Errorf("no interval holds a sample of the burner %d", burner)
	}
	// The queued exit went through the pipeline as a record does:
	// nothing is left in flight, and every sample was emitted.
	if n := p.inflight.Load(); n != 0 {
		t.Errorf("%d records in flight after Run returned, want 0", n)
	}
	st := p.Stats()
	if st.EmittedSamples != st.Samples-st.IntervalFull {
		t.Errorf("emitted %d samples of %d received (%d refused by a full interval)", st.EmittedSamples, st.Samples, st.IntervalFull)
	}
}

// taskState is the state letter of pid's main thread (proc(5)).
func taskState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		t.Fatalf("malformed /proc/%d/stat: %q", pid, b)
	}
	return b[i+2]
}
