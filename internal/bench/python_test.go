package bench

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// pyPhase is one phase of the Python comparison: which burners ran (the
// others were stopped) and what the sampler cost meanwhile.
type pyPhase struct {
	Kind        string  `json:"kind"` // "native" or "cpython"
	Seconds     float64 `json:"s"`
	Runs        uint64  `json:"sampler_runs"`
	NS          uint64  `json:"sampler_ns"`
	PythonWalks float64 `json:"python_walks"` // sonde.python.walks during the phase
	UsPerRun    float64 `json:"us_per_run"`
}

// pyComparison is the eBPF time per sampler run with CPython burners
// against native ones, measured in one agent run.
type pyComparison struct {
	Interpreter string    `json:"interpreter"`
	Hz          int       `json:"hz"`
	Phases      []pyPhase `json:"phases"`
	// NativeUsPerRun and PythonUsPerRun are the mean eBPF time per run of
	// the perf-event programs (sampler and the unwinders it tail-calls,
	// which the kernel counts in the sampler's run_time_ns) over the
	// phases of each kind; Ratio is Python over native.
	NativeUsPerRun float64 `json:"native_us_per_run"`
	PythonUsPerRun float64 `json:"python_us_per_run"`
	Ratio          float64 `json:"python_over_native"`
	// PythonWalkShare is, over the CPython phases, the share of sampler
	// runs that walked a Python stack: the rest sampled other processes
	// or idle CPUs, and dilute the Python figure.
	PythonWalkShare float64 `json:"python_walk_share"`
}

// pythonVsNative runs two native C burners and two CPython burners under
// one agent and alternates which pair runs (the other is stopped with
// SIGSTOP) in phases of equal length, native first, three rounds; the
// sampler's run time and run count (bpf_stats) are read at each phase's
// ends. One agent, one set of tables and one warm symbol cache for both, so
// the difference per run is the Python walk's, not another run's.
func (e *distEnv) pythonVsNative(b *testing.B, py, burn, native string) *pyComparison {
	b.Helper()
	const rounds = 3
	phase := e.pythonWindow / (2 * rounds)
	ws := []workload{{name: "c-1", argv: []string{native}}, {name: "c-2", argv: []string{native}},
		{name: "python-1", argv: []string{py, burn}}, {name: "python-2", argv: []string{py, burn}}}
	work := startWorkloads(b, ws, filepath.Join(e.results, "python-vs-native-workloads.log"))
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
	cfg := filepath.Join(e.results, "python-vs-native.yaml")
	writeFile(b, cfg, agentConfig(e.hz, port))
	agent := startCollector(b, e.dist, cfg, filepath.Join(e.results, "python-vs-native-agent.log"))
	agent.awaitReady(b, time.Minute)

	// Warm-up with all four running: tables loaded, both interpreters set
	// up for the Python walker.
	deadline := time.Now().Add(e.warm + time.Minute)
	for {
		s, err := scrapeWithin(url, agent, 15*time.Second, false)
		if err == nil {
			if n, _ := s.sum("sonde.python.processes", "outcome=walked"); n >= 2 && time.Since(agent.start) >= e.warm {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("python-vs-native: the CPython burners were not set up for the Python walker within %v; agent log %s", e.warm+time.Minute, agent.log)
		}
		time.Sleep(time.Second) // polling a condition with a deadline
	}

	r := &pyComparison{Interpreter: py, Hz: e.hz}
	read := func() (ns, runs uint64, walks float64) {
		fd, err := scanFDInfo(agent.pid())
		if err != nil {
			b.Fatal(err)
		}
		s, err := scrapeWithin(url, agent, 15*time.Second, true)
		if err != nil {
			b.Fatalf("python-vs-native: read the agent's metrics: %v", err)
		}
		ns, runs = fd.perfEventRuns()
		walks, _ = s.sum("sonde.python.walks")
		return ns, runs, walks
	}
	var sum [2]struct {
		ns, runs uint64
		walks    float64
	}
	for range rounds {
		for k, kind := range []string{"native", "cpython"} {
			signal(2-2*k, syscall.SIGSTOP) // the other pair
			signal(2*k, syscall.SIGCONT)
			ns0, runs0, walks0 := read()
			start := time.Now()
			time.Sleep(phase) // the measuring window
			ns1, runs1, walks1 := read()
			p := pyPhase{Kind: kind, Seconds: time.Since(start).Seconds(), Runs: runs1 - runs0, NS: ns1 - ns0, PythonWalks: walks1 - walks0}
			if p.Runs > 0 {
				p.UsPerRun = float64(p.NS) / float64(p.Runs) / 1e3
			}
			r.Phases = append(r.Phases, p)
			sum[k].ns += p.NS
			sum[k].runs += p.Runs
			sum[k].walks += p.PythonWalks
		}
	}
	if sum[0].runs > 0 && sum[1].runs > 0 {
		r.NativeUsPerRun = float64(sum[0].ns) / float64(sum[0].runs) / 1e3
		r.PythonUsPerRun = float64(sum[1].ns) / float64(sum[1].runs) / 1e3
		r.PythonWalkShare = sum[1].walks / float64(sum[1].runs)
	}
	if r.NativeUsPerRun > 0 {
		r.Ratio = r.PythonUsPerRun / r.NativeUsPerRun
	}
	if _, err := agent.stop(2 * time.Minute); err != nil {
		b.Errorf("python-vs-native: %v; log %s ends:\n%s", err, agent.log, agent.lastLines())
	}
	return r
}
