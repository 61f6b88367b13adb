package collector_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver/xreceiver"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/collector/internal/metadatatest"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/profiler"
)

// The many-methods test's workload and receiver.
const (
	manyClasses    = 5000 // classes ManyG<i>
	manyMethods    = 10   // methods m<k> each, besides applyAsInt
	manyHot        = 20   // classes in the hot set
	manyHotRepeat  = 250  // extra calls of each hot class a round: half the time
	manyCompiled   = 50_000
	manyRate       = 499
	manySymbolMiB  = 16 // limits::symbol_cache_bytes: a JVM share of 2 MiB
	manyRingMiB    = 8  // limits::ring_buffer_bytes
	manyWindow     = 15 * time.Second
	manyNamedFloor = 99.0 // % of the window's main-thread samples with a named java leaf
)

// manyCounts tallies the samples of the Many JVM's main thread as the
// receiver hands them over (the profiles are not kept: the test's heap is
// the receiver's).
type manyCounts struct {
	mu       sync.Mutex
	pid      int64
	main     int64
	from, to uint64 // the window, Unix ns; 0: not open yet
	thirds   [3]struct{ total, named int }
	leaves   map[string]int // named leaf methods
	hotLeaf  int            // named leaves in the hot set's classes
	latest   uint64         // the latest timestamp of any sample handed over
	unnamed  []string       // examples
}

func (c *manyCounts) consume(_ context.Context, pd pprofile.Profiles) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range jvmFlatten(pd) {
		for _, ts := range s.Times {
			c.latest = max(c.latest, ts)
		}
		if c.to == 0 || s.PID != c.pid || s.TID != c.main || s.Type != "samples" {
			continue
		}
		leaf, named := "", false
		for _, l := range s.Locs {
			if l.Type != "jvm" || l.Tier == "stub" {
				continue
			}
			if len(l.Lines) > 0 {
				leaf, named = l.Lines[0].Function, true
			}
			break
		}
		named = named && (strings.HasPrefix(leaf, "ManyG") || strings.HasPrefix(leaf, "Many."))
		for _, ts := range s.Times {
			if ts < c.from || ts >= c.to {
				continue
			}
			third := &c.thirds[min(2, 3*(ts-c.from)/(c.to-c.from))]
			third.total++
			if named {
				third.named++
				c.leaves[leaf]++
				class, _, _ := cutLast(leaf, ".")
				if n, err := strconv.Atoi(strings.TrimPrefix(class, "ManyG")); err == nil && n < manyHot {
					c.hotLeaf++
				}
			} else if len(c.unnamed) < 5 {
				c.unnamed = append(c.unnamed, jvmFunctions(s))
			}
		}
	}
	return nil
}

// metricValue sums the points of an int64 sum or gauge that have the
// attributes match.
func metricValue(t *testing.T, tt *componenttest.Telemetry, name string, match ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tt.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var v int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			var dps []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				dps = d.DataPoints
			case metricdata.Gauge[int64]:
				dps = d.DataPoints
			default:
				t.Fatalf("metric %s: %T", name, m.Data)
			}
			for _, dp := range dps {
				if slices.ContainsFunc(match, func(kv attribute.KeyValue) bool {
					v, ok := dp.Attributes.Value(kv.Key)
					return !ok || v != kv.Value
				}) {
					continue
				}
				v += dp.Value
			}
		}
	}
	return v
}

// compiledMany counts the compiled methods of Many's generated classes in
// pid's code cache, as the JVM lists them (jcmd Compiler.codelist: the
// test's oracle, never Sonde's).
func compiledMany(t *testing.T, j jdk, pid int) int {
	t.Helper()
	out, err := exec.Command(j.bin("jcmd"), fmt.Sprint(pid), "Compiler.codelist").Output()
	if err != nil {
		t.Fatalf("jcmd %d Compiler.codelist: %v", pid, err)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, " ManyG") {
			n++
		}
	}
	return n
}

// heapAlloc is the test process's live heap (the receiver's, with the
// test's counts) after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestJVMManyMethods profiles, on each JDK, a JVM that has compiled more
// than 50,000 distinct methods (Many: 5,000 generated classes of 10 small
// methods and a caller each, called in rounds, half the calls to a hot
// set of 20 classes) for 15 s at 499 Hz, with limits::symbol_cache_bytes
// at 16 MiB, so the JVM namer's share (2 MiB) is far below what naming all
// of them would take. The receiver runs from before the JVM starts and
// profiles it alone (include_executables: the JDK's java; not jcmd, whose
// own JVM would be named too, nor the rest of the host). Once
// Many has warmed up and the JVM lists at least 50,000 compiled methods
// of Many's (jcmd, the oracle), the same number 2 s apart, the window
// opens; over it
//   - the namer's bytes (sonde.jvm.code_cache.size) stay within its share
//     at every look, and it evicted: the workload does exceed it;
//   - the receiver's live heap stays within what it held before the JVM
//     started plus limits::symbol_cache_bytes, the bound of all the symbol
//     data it keeps (the namer's share included), plus
//     limits::ring_buffer_bytes (8 MiB here) for the samples in flight
//     (read from the ring and decoded, in the interval being built); its
//     growth in the window is logged (0.1-1.7 MiB seen, the namer full
//     from the start);
//   - at least manyNamedFloor % of the main thread's samples have a named
//     Java leaf in each third of the window (the leaf is always compiled
//     code of a small method; the JBurn tests name 99 % and more), and
//     the leaves spread over at least 1,000 methods (the hot set has 220);
//   - naming stays cheap: the namer's loads (cache misses) per named Java
//     frame stay at most 2. Without a cache a frame costs 2 or 3 loads (the
//     blob of its PC, the compiled method or stub, the method), and a
//     sample of a cold method about 6 for its 5 or 6 Java frames: the
//     bound holds the cache to answering at least a third of what the
//     frames need, while cold methods stream through it, and no frame to
//     reading anything twice.
func TestJVMManyMethods(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver") // before the builds
	for _, j := range jdks(t) {
		t.Run("jdk"+j.name, func(t *testing.T) {
			classes := javac(t, j, "", jvmSource(t, "Many.java"))
			tt := componenttest.NewTelemetry()
			t.Cleanup(func() { _ = tt.Shutdown(context.Background()) })
			f := collector.NewFactory().(xreceiver.Factory)
			cfg := f.CreateDefaultConfig().(*collector.Config)
			cfg.SamplesPerSecond = manyRate
			cfg.ReporterInterval = 500 * time.Millisecond
			cfg.Limits.SymbolCacheBytes = manySymbolMiB << 20
			cfg.Limits.RingBufferBytes = manyRingMiB << 20
			// Many's JVM only: not jcmd's, nor the rest of the host's.
			java, err := filepath.EvalSymlinks(j.bin("java"))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Filters.IncludeExecutables = []string{java}
			share := profiler.Options{SymbolCacheBytes: cfg.Limits.SymbolCacheBytes}.JVMCacheBytes()
			counts := &manyCounts{leaves: map[string]int{}}
			next, err := xconsumer.NewProfiles(counts.consume)
			if err != nil {
				t.Fatal(err)
			}
			set := metadatatest.NewSettings(tt)
			set.Logger = zaptest.NewLogger(t)
			rcv, err := f.CreateProfiles(context.Background(), set, cfg, next)
			if err != nil {
				t.Fatal(err)
			}
			if err := rcv.Start(context.Background(), componenttest.NewNopHost()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rcv.Shutdown(context.Background()) })
			// -Xbatch keeps the compile queue short in the warm-up (see
			// Many.java); C1 only and a code cache with room for all keep
			// the methods compiled, once, for the window.
			heapIdle := heapAlloc()
			p := startJava(t, j, "-Xbatch", "-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=256m",
				"-cp", classes, "Many", fmt.Sprint(manyClasses), fmt.Sprint(manyMethods), fmt.Sprint(manyHot), fmt.Sprint(manyHotRepeat))
			start := time.Now()
			for deadline := start.Add(90 * time.Second); ; {
				if out, _ := os.ReadFile(p.stdout); strings.Contains(string(out), "warm\n") {
					break
				}
				if time.Now().After(deadline) || !alive(p.pid) {
					t.Fatalf("JDK %s: Many not warm in 90 s (alive: %v)", j.name, alive(p.pid))
				}
				time.Sleep(100 * time.Millisecond) // poll interval of Many's output
			}
			// Then the compiles still queued: until the count holds still.
			compiled, last := compiledMany(t, j, p.pid), -1
			for deadline := time.Now().Add(60 * time.Second); compiled < manyCompiled || compiled != last; {
				if time.Now().After(deadline) {
					t.Fatalf("JDK %s: %d methods of Many's compiled (%d 2 s before), want at least %d, settled", j.name, compiled, last, manyCompiled)
				}
				time.Sleep(2 * time.Second) // poll interval of jcmd
				compiled, last = compiledMany(t, j, p.pid), compiled
			}
			warm := time.Since(start)

			// The samples taken up to now (jcmd's attach included) are
			// named before the window's counters start.
			waitExported := func(ts time.Time) {
				t.Helper()
				for deadline := time.Now().Add(30 * time.Second); ; {
					counts.mu.Lock()
					done := counts.latest >= uint64(ts.UnixNano())
					counts.mu.Unlock()
					if done {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("no sample after %v handed over in 30 s", ts.Format(time.TimeOnly))
					}
					time.Sleep(100 * time.Millisecond) // poll interval of the receiver's exports
				}
			}
			waitExported(time.Now())
			metric := func(name string) int64 { return metricValue(t, tt, "sonde."+name) }
			namedFrames := func() int64 { return metricValue(t, tt, "sonde.jvm.frames", attribute.String("outcome", "named")) }
			loads0, named0, evict0 := metric("jvm.code_cache.loads"), namedFrames(), metric("jvm.code_cache.evictions")
			heap0 := heapAlloc()
			from := time.Now()
			counts.mu.Lock()
			counts.pid, counts.main = int64(p.pid), p.main
			counts.from, counts.to = uint64(from.UnixNano()), uint64(from.Add(manyWindow).UnixNano())
			counts.mu.Unlock()
			var maxBytes, maxSym int64
			var maxHeap uint64
			sym0 := metric("symbolize.cache.size")
			for time.Since(from) < manyWindow+2*cfg.ReporterInterval {
				time.Sleep(time.Second) // the interval of the looks at the gauges
				maxBytes = max(maxBytes, metric("jvm.code_cache.size"))
				maxHeap = max(maxHeap, heapAlloc())
				maxSym = max(maxSym, metric("symbolize.cache.size"))
				if !alive(p.pid) {
					t.Fatalf("Many %d died", p.pid)
				}
			}
			waitExported(from.Add(manyWindow))
			loads, named, evict := metric("jvm.code_cache.loads")-loads0, namedFrames()-named0, metric("jvm.code_cache.evictions")-evict0
			compiledEnd := compiledMany(t, j, p.pid)

			counts.mu.Lock()
			defer counts.mu.Unlock()
			total, namedLeaf := 0, 0
			for _, th := range counts.thirds {
				total += th.total
				namedLeaf += th.named
			}
			perFrame := float64(loads) / float64(max(named, 1))
			grown := int64(maxHeap) - int64(heap0)
			heapBound := heapIdle + uint64(cfg.Limits.SymbolCacheBytes) + uint64(cfg.Limits.RingBufferBytes)
			t.Logf("JDK %s: %d (then %d) methods of Many's compiled, %v after start; window %v at %d Hz:", j.name, compiled, compiledEnd, warm.Round(time.Second), manyWindow, manyRate)
			t.Logf("  namer: at most %d bytes of its %d (%.0f %%), %d evictions, %d loads for %d java frames (%.2f a frame)",
				maxBytes, share, 100*float64(maxBytes)/float64(share), evict, loads, named, perFrame)
			t.Logf("  heap: %.1f MiB before the JVM, %.1f MiB when the window opened, at most %.1f MiB in it (%+.1f MiB in the window; bound %.1f MiB)",
				float64(heapIdle)/(1<<20), float64(heap0)/(1<<20), float64(maxHeap)/(1<<20), float64(grown)/(1<<20), float64(heapBound)/(1<<20))
			t.Logf("  native symbol cache: %.1f MiB when the window opened, at most %.1f MiB in it", float64(sym0)/(1<<20), float64(maxSym)/(1<<20))
			t.Logf("  main thread: %d of %d samples with a named java leaf (%.2f %%), thirds %v; %d distinct leaves, %d samples in the hot set; e.g. unnamed: %v",
				namedLeaf, total, 100*float64(namedLeaf)/float64(max(total, 1)), counts.thirds, len(counts.leaves), counts.hotLeaf, counts.unnamed)

			if maxBytes > share || maxBytes == 0 {
				t.Errorf("namer holds up to %d bytes, its share is %d", maxBytes, share)
			}
			if evict == 0 {
				t.Errorf("no eviction: the workload did not exceed the namer's %d bytes", share)
			}
			if maxHeap > heapBound {
				t.Errorf("heap up to %d bytes, more than the %d before the JVM, limits::symbol_cache_bytes (%d) and limits::ring_buffer_bytes (%d)",
					maxHeap, heapIdle, cfg.Limits.SymbolCacheBytes, cfg.Limits.RingBufferBytes)
			}
			for i, th := range counts.thirds {
				if th.total < 300 || 100*float64(th.named) < manyNamedFloor*float64(th.total) {
					t.Errorf("third %d of the window: %d of %d samples with a named java leaf, want %.0f %% of at least 300", i, th.named, th.total, manyNamedFloor)
				}
			}
			if len(counts.leaves) < 1000 {
				t.Errorf("samples named %d distinct leaf methods, want at least 1000", len(counts.leaves))
			}
			if named == 0 || perFrame > 2 {
				t.Errorf("%d namer loads for %d java frames (%.2f a frame), want at most 2", loads, named, perFrame)
			}
		})
	}
}
