package collector

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/collector/internal/metadatatest"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/profiler"
	"github.com/sonde-dev/sonde/tracer"
)

// collected is one collection of the receiver's metrics: data points by
// metric name.
type collected map[string][]metricdata.DataPoint[int64]

// quietCollect collects until a collection across which counts (the
// profiler's own, read before and after) did not move, and returns that
// collection with the counts it saw: its figures are compared with them,
// not with counts read again later, which a resolve in between may have
// moved. It fails after 100 collections that all saw the counts move.
func quietCollect[S comparable](t *testing.T, tt *componenttest.Telemetry, what string, counts func() S) (collected, S) {
	t.Helper()
	for n := 1; ; n++ {
		before := counts()
		m := collect(t, tt)
		if counts() == before {
			return m, before
		}
		if n == 100 {
			t.Fatalf("the %s counts moved across 100 collections", what)
		}
	}
}

func collect(t *testing.T, tt *componenttest.Telemetry) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tt.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect metrics: %v", err)
	}
	out := collected{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				out[m.Name] = d.DataPoints
			case metricdata.Gauge[int64]:
				out[m.Name] = d.DataPoints
			case metricdata.Gauge[float64]:
				// In thousandths (ms of a gauge in seconds).
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], metricdata.DataPoint[int64]{
						Attributes: dp.Attributes, Value: int64(dp.Value * 1000)})
				}
			case metricdata.Histogram[float64]:
				// The number of observations.
				for _, dp := range d.DataPoints {
					out[m.Name] = append(out[m.Name], metricdata.DataPoint[int64]{
						Attributes: dp.Attributes, Value: int64(dp.Count)})
				}
			default:
				t.Errorf("metric %s has data of type %T, want an int64 sum or gauge, a float64 gauge or histogram", m.Name, m.Data)
			}
		}
	}
	return out
}

// sum adds the points of name whose attributes include every one of match.
func (c collected) sum(name string, match ...attribute.KeyValue) int64 {
	var total int64
	for _, dp := range c[name] {
		ok := true
		for _, kv := range match {
			if v, found := dp.Attributes.Value(kv.Key); !found || v != kv.Value {
				ok = false
				break
			}
		}
		if ok {
			total += dp.Value
		}
	}
	return total
}

// sampleValues is what a consumer counts as samples: the sum of the values.
func sampleValues(pd pprofile.Profiles) int64 {
	var n int64
	for _, rp := range pd.ResourceProfiles().All() {
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				for _, s := range p.Samples().All() {
					for _, v := range s.Values().All() {
						n += v
					}
				}
			}
		}
	}
	return n
}

// hasFunction reports whether a sample of process pid in pd has a frame
// named fn.
func hasFunction(pd pprofile.Profiles, pid int, fn string) bool {
	dict := pd.Dictionary()
	for _, rp := range pd.ResourceProfiles().All() {
		if v, ok := rp.Resource().Attributes().Get("process.pid"); !ok || v.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				for _, s := range p.Samples().All() {
					stack := dict.StackTable().At(int(s.StackIndex()))
					for _, li := range stack.LocationIndices().All() {
						for _, ln := range dict.LocationTable().At(int(li)).Lines().All() {
							f := dict.FunctionTable().At(int(ln.FunctionIndex()))
							if dict.StringTable().At(int(f.NameStrindex())) == fn {
								return true
							}
						}
					}
				}
			}
		}
	}
	return false
}

// TestTelemetry runs the real receiver with a workload and a consumer that
// refuses the first intervals, accepts the next ones and then holds one. While
// it holds, the reporter cannot flush, and one collection reads one snapshot
// of the profiler's counts: every sample received is exported, refused,
// dropped by a full interval, in the held interval, or in the open one.
func TestTelemetry(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	// Intervals 1 and 2 are refused. The one held is the first after at
	// least one accepted interval and after an interval with a workload
	// stack down to _start, whose unwind row marks the outermost frame:
	// by then at least one complete stack was received.
	const refuse = 2

	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { _ = tt.Shutdown(context.Background()) })

	var (
		mu                sync.Mutex
		calls             int
		refused, accepted int64 // sample values
		acceptedProfiles  int64
		held              = make(chan int64, 1) // the held interval's samples
		release           = make(chan struct{})
		releaseOnce       sync.Once
		errBackend        = errors.New("backend unavailable")
		sawStart          int  // the first call with a workload stack down to _start
		holding           bool // an interval is held or was
		pid               int
	)
	releaseConsumer := func() { releaseOnce.Do(func() { close(release) }) }
	next, err := xconsumer.NewProfiles(func(_ context.Context, pd pprofile.Profiles) error {
		n, profiles := sampleValues(pd), int64(pd.ProfileCount())
		mu.Lock()
		calls++
		call := calls
		if sawStart == 0 && hasFunction(pd, pid, "_start") {
			sawStart = call
		}
		if call <= refuse {
			refused += n
			mu.Unlock()
			return errBackend
		}
		hold := !holding && call >= refuse+2 && sawStart != 0 && call > sawStart
		holding = holding || hold
		mu.Unlock()
		if hold {
			held <- n
			<-release
		}
		mu.Lock()
		accepted += n
		acceptedProfiles += profiles
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	cfg := createDefaultConfig()
	cfg.SamplesPerSecond = 99
	cfg.ReporterInterval = 300 * time.Millisecond
	set := metadatatest.NewSettings(tt)
	set.Logger = zaptest.NewLogger(t)
	rcv, err := createProfiles(context.Background(), set, cfg, next)
	if err != nil {
		t.Fatal(err)
	}
	r := rcv.(*profilesReceiver)
	pid = testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChainNoFP)).Process.Pid
	if err := r.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	t.Cleanup(releaseConsumer) // runs first: Shutdown waits for the reporter

	var inFlight int64
	select {
	case inFlight = <-held:
	case <-time.After(60 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no interval held in 60s: the consumer saw %d, the first workload stack down to _start in interval %d", calls, sawStart)
	}

	// The reporter is held inside ConsumeProfiles. The reader and the
	// preparer run on: the samples received, their stacks and the open
	// interval's samples come from one snapshot, which agrees with itself;
	// take a collection the loader's stats did not change across, with no
	// table being built or loaded: a load in flight has its bytes counted
	// (reserved) before its rows.
	var (
		m  collected
		ls profiler.UnwindStats
	)
	for deadline := time.Now().Add(10 * time.Second); ; {
		before := r.prof.Stats().Unwind
		m = collect(t, tt)
		ls = r.prof.Stats().Unwind
		if ls == before && ls.Pending == 0 || time.Now().After(deadline) {
			break
		}
		if ls.Pending > 0 {
			time.Sleep(10 * time.Millisecond) // polling the loader until its builds are done, with a deadline
		}
	}
	if ls.Pending != 0 {
		t.Errorf("the loader still builds or loads %d tables after 10 s: %+v", ls.Pending, ls)
	}
	pending := m.sum("sonde.samples.pending")
	if emitting := m.sum("sonde.samples.emitting"); emitting != inFlight {
		t.Errorf("sonde.samples.emitting = %d while the consumer holds an interval of %d samples", emitting, inFlight)
	}
	// The export counters cannot move until the consumer is released.
	mu.Lock()
	acceptedAtHold, profilesAtHold, refusedAtHold := accepted, acceptedProfiles, refused
	mu.Unlock()
	metadatatest.AssertEqualExportErrors(t, tt, []metricdata.DataPoint[int64]{{Value: refuse}}, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualExportSamples(t, tt, []metricdata.DataPoint[int64]{{Value: acceptedAtHold}}, metricdatatest.IgnoreTimestamp())
	metadatatest.AssertEqualExportProfiles(t, tt, []metricdata.DataPoint[int64]{{Value: profilesAtHold}}, metricdatatest.IgnoreTimestamp())
	releaseConsumer()

	for _, name := range []string{
		"sonde.samples.received", "sonde.samples.repeated", "sonde.samples.pending", "sonde.samples.emitting", "sonde.samples.late", "sonde.samples.lost",
		"sonde.records.queued", "sonde.export.lag", "sonde.records.lost", "sonde.records.malformed",
		"sonde.unwind.stacks", "sonde.unwind.errors", "sonde.unwind.frames", "sonde.unwind.processes",
		"sonde.unwind.requests.dropped", "sonde.unwind.table.count", "sonde.unwind.table.rows",
		"sonde.unwind.table.size", "sonde.unwind.table.builds", "sonde.unwind.table.evictions", "sonde.unwind.table.delay",
		"sonde.unwind.table.refused", "sonde.unwind.table.retried",
		"sonde.unwind.table.failures", "sonde.processes.tracked", "sonde.symbolize.cache.requests",
		"sonde.symbolize.cache.loads", "sonde.symbolize.cache.evictions", "sonde.symbolize.cache.size", "sonde.symbolize.refused",
		"sonde.export.profiles", "sonde.export.samples", "sonde.export.errors",
	} {
		if len(m[name]) == 0 {
			t.Errorf("metric %s not reported", name)
		}
	}

	received := m.sum("sonde.samples.received")
	exported := m.sum("sonde.export.samples")
	exportFailed := m.sum("sonde.samples.lost", attribute.String("reason", "export_failed"))
	intervalFull := m.sum("sonde.samples.lost", attribute.String("reason", "interval_full"))
	backlog := m.sum("sonde.samples.lost", attribute.String("reason", "consumer_backlog"))
	t.Logf("received %d = exported %d + refused %d + interval full %d + dropped behind the held consumer %d + held %d + open %d; ring buffer full %d",
		received, exported, exportFailed, intervalFull, backlog, inFlight, pending,
		m.sum("sonde.samples.lost", attribute.String("reason", "ring_buffer_full")))
	if received <= 0 {
		t.Errorf("sonde.samples.received = %d, want > 0", received)
	}
	if exported != acceptedAtHold {
		t.Errorf("sonde.export.samples = %d, the consumer accepted %d", exported, acceptedAtHold)
	}
	if exportFailed != refusedAtHold {
		t.Errorf("sonde.samples.lost{export_failed} = %d, the consumer refused %d", exportFailed, refusedAtHold)
	}
	if got := exported + exportFailed + intervalFull + backlog + inFlight + pending; received != got {
		t.Errorf("sonde.samples.received = %d, want exported + refused + interval full + dropped behind the consumer + held + open = %d", received, got)
	}
	// The repeats are among the samples received (a burner's leaf PCs vary,
	// so a short run may have none).
	if repeated := m.sum("sonde.samples.repeated"); repeated < 0 || repeated > received {
		t.Errorf("sonde.samples.repeated = %d, want in [0, sonde.samples.received = %d]", repeated, received)
	}
	if stacks := m.sum("sonde.unwind.stacks"); stacks != received {
		t.Errorf("sonde.unwind.stacks sums to %d, want sonde.samples.received = %d", stacks, received)
	}
	for _, o := range []string{"complete", "ended", "truncated", "failed", "none"} {
		t.Logf("  stacks %s: %d (frame pointer used: %d)", o, m.sum("sonde.unwind.stacks", attribute.String("outcome", o)),
			m.sum("sonde.unwind.stacks", attribute.String("outcome", o), attribute.Bool("frame_pointer", true)))
	}
	// A stack reached _start before the held interval; its unwind row marks
	// the outermost frame.
	if n := m.sum("sonde.unwind.stacks", attribute.String("outcome", "complete")); n <= 0 {
		t.Errorf("sonde.unwind.stacks{outcome=complete} = %d, want > 0", n)
	}
	if n := m.sum("sonde.unwind.frames", attribute.String("method", "cfi")); n <= 0 {
		t.Errorf("sonde.unwind.frames{method=cfi} = %d, want > 0", n)
	}

	if n := m.sum("sonde.processes.tracked"); n < 1 {
		t.Errorf("sonde.processes.tracked = %d, want >= 1", n)
	}
	tables, rows, size := m.sum("sonde.unwind.table.count"), m.sum("sonde.unwind.table.rows"), m.sum("sonde.unwind.table.size")
	t.Logf("unwind tables: %d, %d rows, %d bytes; loader: %+v", tables, rows, size, ls)
	if tables < 1 {
		t.Errorf("sonde.unwind.table.count = %d, want >= 1", tables)
	}
	if tables != int64(ls.Tables) || rows != ls.Rows || size != ls.Bytes || m.sum("sonde.unwind.processes") != int64(ls.Processes) {
		t.Errorf("unwind metrics: %d tables, %d rows, %d bytes, %d processes; the loader says %+v",
			tables, rows, size, m.sum("sonde.unwind.processes"), ls)
	}
	if n := m.sum("sonde.unwind.table.builds"); n != int64(ls.Built) || n < tables {
		t.Errorf("sonde.unwind.table.builds = %d, want the loader's %d, at least the %d tables loaded", n, ls.Built, tables)
	}
	if n, r := m.sum("sonde.unwind.table.refused"), m.sum("sonde.unwind.table.retried"); n != int64(ls.Refused) || r != int64(ls.Retried) {
		t.Errorf("sonde.unwind.table.refused = %d, retried = %d; the loader says %d, %d", n, r, ls.Refused, ls.Retried)
	}
	// One delay per table a preparation newly loaded; the last preparation's
	// may not be recorded yet (it is after its tables load).
	if n, built := m.sum("sonde.unwind.table.delay"), m.sum("sonde.unwind.table.builds"); n < 1 || n > built {
		t.Errorf("sonde.unwind.table.delay has %d observations, want 1..%d (the tables built)", n, built)
	}
	// A table is an array with a page of header, then its rows and a page
	// index of at most half an entry a row, in whole pages.
	page := int64(os.Getpagesize())
	lo := rows*tracer.RowKernelBytes + tables*page
	hi := rows*tracer.RowKernelBytes*3/2 + tables*(2*page+tracer.RowKernelBytes)
	if size < lo || size > hi {
		t.Errorf("sonde.unwind.table.size = %d, want %d rows * %d (and up to half as much of index) + %d tables * (1 to 2 pages) = %d..%d",
			size, rows, tracer.RowKernelBytes, tables, lo, hi)
	}

	hits := m.sum("sonde.symbolize.cache.requests", attribute.String("result", "hit"))
	misses := m.sum("sonde.symbolize.cache.requests", attribute.String("result", "miss"))
	t.Logf("symbolization: %d hits, %d misses, %d files loaded, %d bytes", hits, misses,
		m.sum("sonde.symbolize.cache.loads"), m.sum("sonde.symbolize.cache.size"))
	if hits+misses <= 0 {
		t.Errorf("sonde.symbolize.cache.requests: %d hits + %d misses, want > 0", hits, misses)
	}
	if n := m.sum("sonde.symbolize.cache.loads"); n < 1 {
		t.Errorf("sonde.symbolize.cache.loads = %d, want >= 1", n)
	}
	if n := m.sum("sonde.symbolize.cache.size"); n <= 0 {
		t.Errorf("sonde.symbolize.cache.size = %d, want > 0", n)
	}
}
