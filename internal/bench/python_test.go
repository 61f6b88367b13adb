package bench

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// rtPhase is one phase of a runtime's comparison: which burners ran (the
// others were stopped) and what the sampler cost meanwhile.
type rtPhase struct {
	Kind     string  `json:"kind"` // "native", or the runtime's frame type ("cpython", "jvm")
	Seconds  float64 `json:"s"`
	Runs     uint64  `json:"sampler_runs"`
	NS       uint64  `json:"sampler_ns"`
	Walks    float64 `json:"walks"` // the runtime's walks (sonde.<runtime>.walks) during the phase
	UsPerRun float64 `json:"us_per_run"`
}

// rtComparison is the eBPF time per sampler run with a runtime's burners
// against native ones, measured in one agent run.
type rtComparison struct {
	Runtime string    `json:"runtime"` // the runtime's burner, as run
	Hz      int       `json:"hz"`
	Phases  []rtPhase `json:"phases"`
	// NativeUsPerRun and RuntimeUsPerRun are the mean eBPF time per run of
	// the perf-event programs (sampler and the unwinders it tail-calls,
	// which the kernel counts in the sampler's run_time_ns) over the
	// phases of each kind; Ratio is the runtime's over native.
	NativeUsPerRun  float64 `json:"native_us_per_run"`
	RuntimeUsPerRun float64 `json:"runtime_us_per_run"`
	Ratio           float64 `json:"runtime_over_native"`
	// WalkShare is, over the runtime's phases, the share of sampler runs
	// that walked the runtime's stack: the rest sampled other processes
	// or idle CPUs, and dilute the figure.
	WalkShare float64 `json:"walk_share"`
}

// rtBench is a runtime as runtimeVsNative runs it.
type rtBench struct {
	kind   string   // its frame type: "cpython", "jvm"
	metric string   // its telemetry prefix: "sonde.python", "sonde.jvm"
	argv   []string // one burner
}

// runtimeVsNative runs two native C burners and two of the runtime's
// burners under one agent and alternates which pair runs (the other is
// stopped with SIGSTOP) in phases of equal length, native first, three
// rounds; the sampler's run time and run count (bpf_stats) are read at
// each phase's ends. One agent, one set of tables and one warm symbol
// cache for both, so the difference per run is the runtime walk's, not
// another run's.
func (e *distEnv) runtimeVsNative(b *testing.B, rt rtBench, native string) *rtComparison {
	b.Helper()
	const rounds = 3
	name := rt.kind + "-vs-native"
	phase := e.pythonWindow / (2 * rounds)
	ws := []workload{{name: "c-1", argv: []string{native}}, {name: "c-2", argv: []string{native}},
		{name: rt.kind + "-1", argv: rt.argv}, {name: rt.kind + "-2", argv: rt.argv}}
	work := startWorkloads(b, ws, filepath.Join(e.results, name+"-workloads.log"))
	signal := func(from int, sig syscall.Signal) {
		for _, cmd := range work.cmds[from : from+2] {
			if err := cmd.Process.Signal(sig); err != nil {
				b.Fatalf("signal %v to %s: %v", sig, cmd.Path, err)
			}
		}
	}
	defer func() { // stopped burners could not be stopped otherwise
		signal(0, syscall.SIGCONT)
		signal(2, syscall.SIGCONT)
	}()

	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run-time statistics: %v", err)
	}
	defer testutil.Close(b, stats)
	port := freePort(b)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	cfg := filepath.Join(e.results, name+".yaml")
	writeFile(b, cfg, agentConfig(e.hz, port))
	agent := startCollector(b, e.dist, cfg, filepath.Join(e.results, name+"-agent.log"))
	agent.awaitReady(b, time.Minute)

	// Warm-up with all four running: tables loaded, both burners set up
	// for the runtime's walker.
	deadline := time.Now().Add(e.warm + time.Minute)
	for {
		s, err := scrapeWithin(url, agent, 15*time.Second, false)
		if err == nil {
			if n, _ := s.sum(rt.metric+".processes", "outcome=walked"); n >= 2 && time.Since(agent.start) >= e.warm {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: the burners were not set up for the %s walker within %v; agent log %s", name, rt.kind, e.warm+time.Minute, agent.log)
		}
		time.Sleep(time.Second) // polling a condition with a deadline
	}

	r := &rtComparison{Runtime: strings.Join(rt.argv, " "), Hz: e.hz}
	read := func() (ns, runs uint64, walks float64) {
		fd, err := scanFDInfo(agent.pid())
		if err != nil {
			b.Fatal(err)
		}
		s, err := scrapeWithin(url, agent, 15*time.Second, true)
		if err != nil {
			b.Fatalf("%s: read the agent's metrics: %v", name, err)
		}
		ns, runs = fd.perfEventRuns()
		walks, _ = s.sum(rt.metric + ".walks")
		return ns, runs, walks
	}
	var sum [2]struct {
		ns, runs uint64
		walks    float64
	}
	for range rounds {
		for k, kind := range []string{"native", rt.kind} {
			signal(2-2*k, syscall.SIGSTOP) // the other pair
			signal(2*k, syscall.SIGCONT)
			ns0, runs0, walks0 := read()
			start := time.Now()
			time.Sleep(phase) // the measuring window
			ns1, runs1, walks1 := read()
			p := rtPhase{Kind: kind, Seconds: time.Since(start).Seconds(), Runs: runs1 - runs0, NS: ns1 - ns0, Walks: walks1 - walks0}
			if p.Runs > 0 {
				p.UsPerRun = float64(p.NS) / float64(p.Runs) / 1e3
			}
			r.Phases = append(r.Phases, p)
			sum[k].ns += p.NS
			sum[k].runs += p.Runs
			sum[k].walks += p.Walks
		}
	}
	if sum[0].runs > 0 && sum[1].runs > 0 {
		r.NativeUsPerRun = float64(sum[0].ns) / float64(sum[0].runs) / 1e3
		r.RuntimeUsPerRun = float64(sum[1].ns) / float64(sum[1].runs) / 1e3
		r.WalkShare = sum[1].walks / float64(sum[1].runs)
	}
	if r.NativeUsPerRun > 0 {
		r.Ratio = r.RuntimeUsPerRun / r.NativeUsPerRun
	}
	if _, err := agent.stop(2 * time.Minute); err != nil {
		b.Errorf("%s: %v; log %s ends:\n%s", name, err, agent.log, agent.lastLines())
	}
	return r
}

// print writes the comparison's lines.
func (r *rtComparison) print(kind string) {
	fmt.Printf("== %s: eBPF time per sampler run in one agent run, two %s burners %.2f µs vs two native C burners %.2f µs (%.2f×; %.0f%% of the %s phases' runs walked %s)\n",
		kind, kind, r.RuntimeUsPerRun, r.NativeUsPerRun, r.Ratio, 100*r.WalkShare, kind, kind)
	for _, p := range r.Phases {
		fmt.Printf("   %-7s %5.1f s: %6d runs, %.2f µs/run, %.0f walks\n", p.Kind, p.Seconds, p.Runs, p.UsPerRun, p.Walks)
	}
}
