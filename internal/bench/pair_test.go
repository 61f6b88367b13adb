package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// pairResult is the distribution and the reference profiling the same
// host at the same time, at the same rate: what sidebyside measures, and
// the samples each agent says it lost, read from its own telemetry (the
// sidebyside script runs both without telemetry).
type pairResult struct {
	Hz       int        `json:"hz"`
	StartupS float64    `json:"startup_s"` // from the start to the steady window
	SteadyS  float64    `json:"steady_s"`
	Sonde    pairFigure `json:"sonde"`
	Ref      pairFigure `json:"reference"`
	Ratio    string     `json:"ratio"`
}

type pairFigure struct {
	ReadyS          float64  `json:"ready_s"`
	IdleRSSMiB      float64  `json:"idle_binary_rss_mib"`
	StartupCPUS     float64  `json:"startup_cpu_s"`
	SteadyCPUPerMin float64  `json:"steady_cpu_s_per_min"`
	PeakRSSMiB      float64  `json:"peak_rss_mib"`
	AddedRSSMiB     float64  `json:"added_rss_mib"`
	EndAnonMiB      float64  `json:"end_anon_mib"`
	EBPFUsPerRun    *float64 `json:"ebpf_us_per_run"`
	Lost            *float64 `json:"samples_lost"`
	LostSteady      *float64 `json:"samples_lost_steady"`
	LostMetric      string   `json:"samples_lost_metric"`
}

// refLostMetric counts the reference's samples that did not fit in its
// ring buffer (bpf_ringbuf_output failures). Its metrics package leaves a
// counter out until it is above zero, so a scrape with the reference's
// other metrics but not this one means none was lost.
const refLostMetric = "bpf.errors.ringbuf_output"

// refConfig is the reference's configuration in a pair run: sidebyside's,
// with the Collector's telemetry on a Prometheus reader.
func refConfig(hz, port int) string {
	return strings.NewReplacer("sonde:", "profiling:", "[sonde]", "[profiling]").Replace(agentConfig(hz, port))
}

// pair runs the distribution and the reference side by side on sc's
// workloads at sc's rate, as sidebyside does (same start, same window,
// same warm-up, the idle binaries' floors measured at the same time), and
// prints both agents' rows and the ratio line. Without REF_BIN it returns
// nil.
func (e *distEnv) pair(b *testing.B, sc scenario) *pairResult {
	b.Helper()
	if os.Getenv(refBinEnv) == "" || e.floor.Ref == nil {
		return nil
	}
	hz := e.rate(sc)
	fmt.Printf("   side by side with the reference on %s at %d Hz (%d workloads, %v)...\n", sc.name, hz, len(sc.workloads), sc.window)
	work := startWorkloads(b, sc.workloads, filepath.Join(e.results, sc.name+"-pair-workloads.log"))
	defer work.stop()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run-time statistics: %v", err)
	}
	defer testutil.Close(b, stats)

	sPort, rPort := freePort(b), freePort(b)
	sCfg, rCfg := filepath.Join(e.results, sc.name+"-pair-sonde.yaml"), filepath.Join(e.results, sc.name+"-pair-reference.yaml")
	writeFile(b, sCfg, agentConfig(hz, sPort))
	writeFile(b, rCfg, refConfig(hz, rPort))
	fromDisk(b, os.Getenv(refBinEnv))
	agents := []*distProcess{
		startCollector(b, e.dist, sCfg, filepath.Join(e.results, sc.name+"-pair-sonde.log")),
		startProcess(b, []string{filepath.Join(filepath.Dir(sideBySideScript(b)), "run-reference"), rCfg}, filepath.Join(e.results, sc.name+"-pair-reference.log")),
	}
	urls := []string{fmt.Sprintf("http://127.0.0.1:%d/metrics", sPort), fmt.Sprintf("http://127.0.0.1:%d/metrics", rPort)}
	start := agents[0].start
	var cpu0 [2]float64
	var fd0 [2]fdObjects
	sample := func(i int) (float64, fdObjects) {
		a := agents[i]
		if a.exited() {
			b.Fatalf("%s: %s exited during the run (%v); log %s ends:\n%s", sc.name, a.cmd.Path, a.err, a.log, a.lastLines())
		}
		cpu, err := readCPU(a.pid())
		if err != nil {
			b.Fatal(err)
		}
		fd, err := scanFDInfo(a.pid())
		if err != nil {
			b.Fatal(err)
		}
		return cpu, fd
	}
	// The steady window starts at the warm-up's end as sidebyside's does,
	// but not before both agents have been ready for 5 s: on a loaded host
	// the reference's eBPF load took over a minute at 792 Hz, and a window
	// it spent loading would measure its verifier, not its profiling.
	p := &pairResult{Hz: hz}
	figs := []*pairFigure{&p.Sonde, &p.Ref}
	warmAt := start.Add(e.warm)
	for i, a := range agents {
		a.awaitReady(b, 5*time.Minute)
		ready, _, _ := a.events()
		figs[i].ReadyS = ready.Seconds()
		warmAt = later(warmAt, a.start.Add(ready+5*time.Second))
	}
	time.Sleep(time.Until(warmAt)) // the measuring clock
	var lost0 [2]*float64
	for i := range agents {
		cpu0[i], fd0[i] = sample(i)
		if s, err := scrape(urls[i]); err == nil {
			lost0[i] = lostOf(i, s)
		}
	}
	time.Sleep(time.Until(warmAt.Add(sc.window - e.warm)))
	steady := time.Since(warmAt)
	p.StartupS, p.SteadyS = warmAt.Sub(start).Seconds(), steady.Seconds()
	floors := []float64{e.floor.Sonde.HWM, e.floor.Ref.HWM}
	for i, a := range agents {
		cpu, fd := sample(i)
		st, err := readStatus(a.pid())
		if err != nil {
			b.Fatal(err)
		}
		f := figs[i]
		f.IdleRSSMiB, f.StartupCPUS = floors[i]/1024, cpu0[i]
		f.SteadyCPUPerMin = (cpu - cpu0[i]) / steady.Minutes()
		f.PeakRSSMiB, f.EndAnonMiB = st.HWM/1024, st.Anon/1024
		f.AddedRSSMiB = f.PeakRSSMiB - f.IdleRSSMiB
		ns0, runs0 := fd0[i].perfEventRuns()
		if ns1, runs1 := fd.perfEventRuns(); runs1 > runs0 {
			f.EBPFUsPerRun = ptr(float64(ns1-ns0) / float64(runs1-runs0) / 1e3)
		}
		s, err := scrape(urls[i])
		if err != nil {
			b.Errorf("%s: read the metrics of %s at %s: %v", sc.name, a.cmd.Path, urls[i], err)
			continue
		}
		f.LostMetric = lostMetrics[i]
		f.Lost = lostOf(i, s)
		switch {
		case f.Lost != nil && lost0[i] != nil:
			f.LostSteady = ptr(*f.Lost - *lost0[i])
		case f.Lost != nil && *f.Lost == 0:
			f.LostSteady = ptr(0) // a counter at 0 at the end was 0 throughout
		}
	}
	for _, a := range agents {
		if _, err := a.stop(2 * time.Minute); err != nil {
			b.Errorf("%s: %v; log %s ends:\n%s", sc.name, err, a.log, a.lastLines())
		}
	}
	row := func(name string, f pairFigure) {
		fmt.Printf("   %-6s ready %5.1f s  idle_rss %6.1f MiB  startup %5.2f CPU-s  steady %6.3f CPU-s/min  peak_rss %6.1f MiB (added %6.1f)  end_anon %6.1f MiB  ebpf %s  lost %s (steady %s)\n",
			name, f.ReadyS, f.IdleRSSMiB, f.StartupCPUS, f.SteadyCPUPerMin, f.PeakRSSMiB, f.AddedRSSMiB, f.EndAnonMiB, fmtUs(f.EBPFUsPerRun), fmtN(f.Lost), fmtN(f.LostSteady))
	}
	fmt.Printf("   start-up: the first %.0f s; steady: the %.0f s after\n", p.StartupS, p.SteadyS)
	row("sonde", p.Sonde)
	row("ref", p.Ref)
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	ebpfRatio := "n/a"
	if p.Sonde.EBPFUsPerRun != nil && p.Ref.EBPFUsPerRun != nil {
		ebpfRatio = ratio(*p.Sonde.EBPFUsPerRun, *p.Ref.EBPFUsPerRun)
	}
	p.Ratio = fmt.Sprintf("sonde/ref  startup %s  steady %s  peak_rss %s  added_rss %s  ebpf/run %s  lost_steady %s / %s",
		ratio(p.Sonde.StartupCPUS, p.Ref.StartupCPUS), ratio(p.Sonde.SteadyCPUPerMin, p.Ref.SteadyCPUPerMin),
		ratio(p.Sonde.PeakRSSMiB, p.Ref.PeakRSSMiB), ratio(p.Sonde.AddedRSSMiB, p.Ref.AddedRSSMiB), ebpfRatio,
		fmtN(p.Sonde.LostSteady), fmtN(p.Ref.LostSteady))
	fmt.Println("   " + p.Ratio)
	return p
}

// lostMetrics are the metrics of the samples each agent lost, Sonde's
// first.
var lostMetrics = [2]string{"sonde.samples.lost", refLostMetric}

// lostOf is the samples agent i (0 Sonde, 1 the reference) lost so far,
// nil if its scrape does not tell.
func lostOf(i int, s promScrape) *float64 {
	if v, ok := s.sum(lostMetrics[i]); ok {
		return ptr(v)
	}
	if i == 0 && hasSonde(s) || i == 1 && anyPrefix(s, "agent_", "bpf_") {
		return ptr(0) // the agent's metrics are there, and none lost
	}
	return nil
}

func anyPrefix(s promScrape, prefixes ...string) bool {
	for _, x := range s {
		for _, p := range prefixes {
			if strings.HasPrefix(x.Name, p) {
				return true
			}
		}
	}
	return false
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
