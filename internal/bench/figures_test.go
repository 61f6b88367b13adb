package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/collector"
)

// figuresEnv, when set, makes the agent keep the receiver's own telemetry
// in a manual reader and count what its consumer receives; on SIGUSR1 it
// prints one "figures <json>" line. Its value is the directory of the
// scenario's workload binaries: samples of executables under it are
// counted apart ("focus") from the rest of the host.
const figuresEnv = "SONDE_BENCH_FIGURES"

// Limits the agent runs with when set; the receiver's defaults otherwise.
const (
	unwindBytesEnv = "SONDE_BENCH_UNWIND_TABLE_BYTES"
	symbolBytesEnv = "SONDE_BENCH_SYMBOL_CACHE_BYTES"
)

// agentFigures is what the agent prints on SIGUSR1.
type agentFigures struct {
	// Metrics are the receiver's telemetry at that moment, keyed by name
	// and sorted attributes: "sonde.samples.lost{reason=ring_buffer_full}".
	Metrics map[string]int64
	// Peaks of gauges, polled once a second while the agent runs.
	PeakUnwindTableBytes int64
	PeakSymbolCacheBytes int64
	PeakProcesses        int64
	// The limits the receiver ran with.
	UnwindTableBytesLimit int64
	SymbolCacheBytesLimit int64
	MaxProcesses          int64
	// What the consumer received, in samples (a sample with n timestamps
	// counts n times). Named: every frame has a function name. Complete:
	// the outermost frame is _start, the root of every C program's stack.
	Samples, Named, Frames, FramesNamed int64
	FocusSamples, FocusNamed            int64
	FocusComplete                       int64
	// ConsumerCPU is the CPU time the consumer spent counting, which is
	// the benchmark's, not the receiver's: the bench subtracts it.
	ConsumerCPU time.Duration
}

// figureKeeper collects agentFigures inside the agent.
type figureKeeper struct {
	tt    *componenttest.Telemetry
	focus string

	mu  sync.Mutex
	fig agentFigures
}

func newFigureKeeper(focus string, cfg *collector.Config) *figureKeeper {
	return &figureKeeper{
		tt:    componenttest.NewTelemetry(),
		focus: focus,
		fig: agentFigures{
			UnwindTableBytesLimit: cfg.Limits.UnwindTableBytes,
			SymbolCacheBytesLimit: cfg.Limits.SymbolCacheBytes,
			MaxProcesses:          int64(cfg.Limits.MaxProcesses),
		},
	}
}

// collect reads the receiver's telemetry as flat keys.
func (k *figureKeeper) collect() (map[string]int64, error) {
	var rm metricdata.ResourceMetrics
	if err := k.tt.Reader.Collect(context.Background(), &rm); err != nil {
		return nil, fmt.Errorf("collect telemetry: %w", err)
	}
	out := map[string]int64{}
	add := func(name string, dps []metricdata.DataPoint[int64]) {
		for _, dp := range dps {
			var kv []string
			for _, a := range dp.Attributes.ToSlice() {
				kv = append(kv, string(a.Key)+"="+a.Value.String())
			}
			slices.Sort(kv)
			key := name
			if len(kv) > 0 {
				key += "{" + strings.Join(kv, ",") + "}"
			}
			out[key] += dp.Value
		}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				add(m.Name, d.DataPoints)
			case metricdata.Gauge[int64]:
				add(m.Name, d.DataPoints)
			}
		}
	}
	return out, nil
}

// poll keeps the peaks of the memory gauges until ctx ends.
func (k *figureKeeper) poll(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m, err := k.collect()
		if err != nil {
			continue
		}
		k.mu.Lock()
		k.fig.PeakUnwindTableBytes = max(k.fig.PeakUnwindTableBytes, m["sonde.unwind.table.size"])
		k.fig.PeakSymbolCacheBytes = max(k.fig.PeakSymbolCacheBytes, m["sonde.symbolize.cache.size"])
		k.fig.PeakProcesses = max(k.fig.PeakProcesses, m["sonde.processes.tracked"])
		k.mu.Unlock()
	}
}

// printOnSignal prints the figures on every SIGUSR1 until ctx ends.
func (k *figureKeeper) printOnSignal(ctx context.Context) {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-usr1:
		}
		m, err := k.collect()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		k.mu.Lock()
		fig := k.fig
		k.mu.Unlock()
		fig.Metrics = m
		data, err := json.Marshal(fig)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			continue
		}
		fmt.Printf("figures %s\n", data)
	}
}

// threadCPU is the calling thread's user and system time.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// count tallies one export. It runs on a locked thread so the thread's CPU
// time is the counting's alone.
func (k *figureKeeper) count(pd pprofile.Profiles) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	begin := threadCPU()
	var f agentFigures
	dict := pd.Dictionary()
	strs := dict.StringTable()
	for _, rp := range pd.ResourceProfiles().All() {
		focus := false
		if v, ok := rp.Resource().Attributes().Get("process.executable.path"); ok {
			focus = strings.HasPrefix(v.Str(), k.focus)
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					n := int64(max(s.TimestampsUnixNano().Len(), 1))
					locs := dict.StackTable().At(int(s.StackIndex())).LocationIndices()
					named, outer := true, ""
					for _, li := range locs.All() {
						loc := dict.LocationTable().At(int(li))
						name := ""
						if loc.Lines().Len() > 0 {
							fn := dict.FunctionTable().At(int(loc.Lines().At(0).FunctionIndex()))
							name = strs.At(int(fn.NameStrindex()))
						}
						f.Frames += n
						if name != "" {
							f.FramesNamed += n
						} else {
							named = false
						}
						outer = name
					}
					f.Samples += n
					if named {
						f.Named += n
					}
					if focus {
						f.FocusSamples += n
						if named {
							f.FocusNamed += n
						}
						if outer == "_start" {
							f.FocusComplete += n
						}
					}
				}
			}
		}
	}
	spent := threadCPU() - begin
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fig.Samples += f.Samples
	k.fig.Named += f.Named
	k.fig.Frames += f.Frames
	k.fig.FramesNamed += f.FramesNamed
	k.fig.FocusSamples += f.FocusSamples
	k.fig.FocusNamed += f.FocusNamed
	k.fig.FocusComplete += f.FocusComplete
	k.fig.ConsumerCPU += spent
}
