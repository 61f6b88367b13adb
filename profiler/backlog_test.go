//go:build linux

package profiler

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// backlogMessage starts the log line of a dropped backlog.
const backlogMessage = "next consumer is behind"

// A next consumer that blocks, or that fails slowly (an exporter retrying
// each interval for a while, then giving up), holds the reporter: the
// intervals behind it stay within MaxPendingSamples, the oldest are
// dropped and counted while it still holds it (one log line per interval
// at most), and once it is fast again the intervals that come next are
// emitted.
func TestBlockedConsumerBacklogBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		// failAfter: each interval is refused after this long; 0 blocks
		// until released.
		failAfter time.Duration
		// blockFor is how long the consumer holds the reporter: a
		// minute for one that blocks, as a stuck exporter would.
		blockFor time.Duration
	}{
		{"blocks", 0, time.Minute},
		{"fails slowly", 2 * time.Second, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { testConsumerBacklog(t, tc.failAfter, tc.blockFor) })
	}
}

func testConsumerBacklog(t *testing.T, failAfter, blockFor time.Duration) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	const (
		sps     = 997
		every   = 500 * time.Millisecond
		maxWait = 1 << 10
	)
	core, logs := observer.New(zapcore.WarnLevel)
	opts := DefaultOptions()
	opts.SamplesPerSecond = sps
	opts.ReporterInterval = every
	opts.MaxPendingSamples = maxWait
	opts.Logger = zap.New(core)
	// Only the workload is profiled: the figures are its own, whatever
	// else the host runs.
	bin := filepath.Join(t.TempDir(), "burn-backlog")
	copyFile(t, testutil.BuildWorkload(t, testutil.CChain), bin)
	opts.Filters.IncludeExecutables = []string{"burn-backlog"}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	pid := testutil.StartWorkload(t, bin).Process.Pid

	var blocking atomic.Bool
	release := make(chan struct{})
	blocked := make(chan struct{}, 1)
	s := new(sink)
	emit := func(ctx context.Context, pd pprofile.Profiles) error {
		if blocking.Load() {
			select {
			case blocked <- struct{}{}:
			default:
			}
			if failAfter > 0 {
				timer := time.NewTimer(failAfter)
				defer timer.Stop()
				select {
				case <-timer.C:
					return errors.New("test consumer: retries exhausted")
				case <-release:
				case <-ctx.Done():
				}
			} else {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
		}
		return s.emit(ctx, pd)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, emit) }()
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	waitFor(t, "the workload prepared and emitted", 60*time.Second, func() bool {
		if !p.Prepared(pid) {
			return false
		}
		for _, pd := range s.all() {
			if pidsOf(pd)[int64(pid)] {
				return true
			}
		}
		return false
	})

	blocking.Store(true)
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatalf("the next emit did not come within 30 s: %+v", p.Stats())
	}
	// The newest interval is never dropped, and nothing is before the
	// consumer has held the reporter for an interval (a resolver catching
	// up with a consumer that keeps up is not behind): at most every
	// CPU's samples of two intervals, with a tenth to spare for late
	// ones, wait on top of MaxPendingSamples.
	bound := maxWait + int(float64(2*p.CPUs()*sps)*every.Seconds()*1.1)
	start := time.Now()
	st0 := p.Stats()
	heap0 := liveHeap()
	var maxPending int
	var heapMid uint64
	// The block lasts blockFor, and longer on a machine busy enough that
	// the workload ran slowly (up to four times): until twice the
	// pending bound's samples have come, so that the bound is exercised.
	exercised := func() bool { return p.Stats().Samples-st0.Samples >= 2*maxWait }
	for time.Since(start) < blockFor || !exercised() && time.Since(start) < 4*blockFor {
		if heapMid == 0 && time.Since(start) >= blockFor/3 {
			heapMid = liveHeap()
		}
		st := p.Stats()
		maxPending = max(maxPending, st.Pending)
		if st.Pending > bound {
			t.Fatalf("%v into the block, %d samples wait, more than %d (max_pending_samples %d plus two intervals')",
				time.Since(start).Round(time.Millisecond), st.Pending, bound, maxWait)
		}
		time.Sleep(100 * time.Millisecond) // sampling the gauge while the consumer blocks, for blockFor
	}
	heldFor := time.Since(start)
	st1 := p.Stats()
	heap1 := liveHeap()
	lines := logs.FilterMessageSnippet(backlogMessage).Len()
	received := st1.Samples - st0.Samples
	dropped := st1.Backlog.Samples - st0.Backlog.Samples
	refused := st1.EmitDropped - st0.EmitDropped
	t.Logf("consumer refused %d intervals (%d samples) during the block", st1.EmitErrors-st0.EmitErrors, refused)
	if failAfter > 0 && st1.EmitErrors == st0.EmitErrors {
		t.Errorf("the slowly failing consumer refused no interval in %v", heldFor)
	}
	t.Logf("blocked %v: %d samples received, %d dropped in %d intervals, pending at most %d (bound %d), %d log lines, live heap %d -> %d -> %d KiB (start, a third, end)",
		heldFor.Round(time.Second), received, dropped, st1.Backlog.Intervals-st0.Backlog.Intervals, maxPending, bound, lines, heap0>>10, heapMid>>10, heap1>>10)
	if received < 2*maxWait {
		t.Fatalf("only %d samples received during the block: the bound was not exercised", received)
	}
	if dropped == 0 || st1.Backlog.Intervals == st0.Backlog.Intervals {
		t.Errorf("nothing counted as dropped while the consumer blocked (%+v -> %+v)", st0.Backlog, st1.Backlog)
	}
	// What is not dropped waits: every sample received during the block
	// is pending, with the consumer, or counted.
	if waiting := uint64(st1.Pending+st1.Emitting) + dropped + refused; waiting+uint64(st0.Pending) < received {
		t.Errorf("%d samples received during the block, %d pending, %d with the consumer, %d dropped and %d refused: some unaccounted",
			received, st1.Pending, st1.Emitting, dropped, refused)
	}
	if lines == 0 {
		t.Error("no log line told of the dropped intervals while the consumer blocked")
	}
	if most := int(heldFor/every) + 1; lines > most {
		t.Errorf("%d log lines of dropped intervals in %v, more than one per interval (%d)", lines, heldFor, most)
	}

	// Released, the consumer gets what comes next.
	emitted := len(s.all())
	blocking.Store(false)
	close(release)
	released = true
	after := time.Now()
	waitFor(t, "an interval captured after the release, with the workload", 30*time.Second, func() bool {
		for _, pd := range s.all()[emitted:] {
			rps := pd.ResourceProfiles()
			if rps.Len() == 0 {
				continue
			}
			prof := rps.At(0).ScopeProfiles().At(0).Profiles().At(0)
			if prof.Time().AsTime().After(after) && pidsOf(pd)[int64(pid)] {
				return true
			}
		}
		return false
	})
	checkAll(t, s.all()[emitted:])
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
