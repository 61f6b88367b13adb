package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// pingPong runs the ping-pong workload on cpu runs times for window and
// returns the median of its round trips per second.
func pingPong(b *testing.B, bin string, cpu, runs int, window time.Duration) float64 {
	b.Helper()
	var rates []float64
	for range runs {
		rates = append(rates, pingPongOnce(b, bin, cpu, window))
	}
	slices.Sort(rates)
	return rates[len(rates)/2]
}

func pingPongOnce(b *testing.B, bin string, cpu int, window time.Duration) float64 {
	b.Helper()
	out, err := exec.Command(bin, strconv.FormatFloat(window.Seconds(), 'f', -1, 64), strconv.Itoa(cpu)).CombinedOutput()
	if err != nil {
		b.Fatalf("ping-pong: %v\n%s", err, out)
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "round-trips-per-second ")
	if !ok {
		b.Fatalf("ping-pong printed %q", out)
	}
	rate, err := strconv.ParseFloat(v, 64)
	if err != nil {
		b.Fatal(err)
	}
	return rate
}

// agentObjects opens, by the ids in /proc/PID/fdinfo, the BPF maps and
// programs the agent process holds, by name: the agent's own, whatever else
// runs on the host. The caller closes them.
func agentObjects(b *testing.B, pid int) (map[string]*ebpf.Map, map[string]*ebpf.Program) {
	b.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	maps, progs := map[string]*ebpf.Map{}, map[string]*ebpf.Program{}
	for _, e := range entries {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || (link != "anon_inode:bpf-map" && link != "anon_inode:bpf-prog") {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "map_id:"); ok {
				id, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
				m, err := ebpf.NewMapFromID(ebpf.MapID(id))
				if err != nil {
					continue
				}
				if mi, err := m.Info(); err == nil && maps[mi.Name] == nil {
					maps[mi.Name] = m
					continue
				}
				testutil.Close(b, m)
			}
			if v, ok := strings.CutPrefix(line, "prog_id:"); ok {
				id, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
				p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
				if err != nil {
					continue
				}
				if pi, err := p.Info(); err == nil && progs[pi.Name] == nil {
					progs[pi.Name] = p
					continue
				}
				testutil.Close(b, p)
			}
		}
	}
	return maps, progs
}

// offCPUFigures are the agent's kernel-side figures at one moment.
type offCPUFigures struct {
	lost, starts, switches uint64
	runtime                time.Duration // of the off-CPU programs
}

func readOffCPUFigures(b *testing.B, pid int) offCPUFigures {
	b.Helper()
	maps, progs := agentObjects(b, pid)
	defer func() {
		for _, m := range maps {
			testutil.Close(b, m)
		}
		for _, p := range progs {
			testutil.Close(b, p)
		}
	}()
	counters := maps["counters"]
	if counters == nil {
		b.Fatalf("agent %d holds no counters map", pid)
	}
	sum := func(idx support.SondeCounter) uint64 {
		var perCPU []uint64
		if err := counters.Lookup(uint32(idx), &perCPU); err != nil {
			b.Fatal(err)
		}
		var n uint64
		for _, v := range perCPU {
			n += v
		}
		return n
	}
	var f offCPUFigures
	for _, idx := range []support.SondeCounter{
		support.SondeCounterCOUNTER_SAMPLES_LOST, support.SondeCounterCOUNTER_TASK_EVENTS_LOST,
		support.SondeCounterCOUNTER_UNKNOWN_LOST, support.SondeCounterCOUNTER_OFFCPU_STARTS_LOST,
		support.SondeCounterCOUNTER_OFFCPU_ENDS_LOST,
	} {
		f.lost += sum(idx)
	}
	f.starts = sum(support.SondeCounterCOUNTER_OFFCPU_STARTS_SENT)
	for name, p := range progs {
		if !strings.HasPrefix(name, "off_cpu") {
			continue
		}
		if st, err := p.Stats(); err == nil {
			f.runtime += st.Runtime
			if name == "off_cpu" {
				// It runs at every context switch; the unwinders it
				// tail-calls count their own runs.
				f.switches += st.RunCount
			}
		}
	}
	return f
}

// BenchmarkOffCPUOverhead measures what off-CPU profiling costs a program
// that does nothing but switch contexts: two processes bouncing a byte over
// two pipes, every round trip two blocking reads, both pinned to the last
// CPU. At each threshold it reports the round trips per second with the
// agent running, as a fraction of those without it (medians of runs
// before and after; their gap is the noise), the agent's CPU, the off-CPU
// records it sent, the records the ring buffer lost, and the eBPF time per
// context switch (all switches, traced or not). Each sub-benchmark runs
// once whatever b.N is.
func BenchmarkOffCPUOverhead(b *testing.B) {
	testutil.RequirePrivileges(b, "off-CPU overhead benchmark")
	bin := testutil.BuildWorkload(b, testutil.PingPong)
	const window, runs = 5 * time.Second, 3
	cpu := runtime.NumCPU() - 1
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run-time statistics: %v", err)
	}
	defer testutil.Close(b, stats)

	for _, threshold := range []float64{0.01, 0.1, 1} {
		b.Run(fmt.Sprintf("threshold=%g", threshold), func(b *testing.B) {
			before := pingPong(b, bin, cpu, runs, window)

			a := startAgent(b, agentEnv+"=19", fmt.Sprintf("%s=%g", offCPUEnv, threshold))
			defer a.stop()
			agent, stop, lines := a.cmd, a.stop, a.lines
			for found := false; !found; {
				if !lines.Scan() {
					b.Fatal("agent exited before its first profile")
				}
				found = strings.HasPrefix(lines.Text(), "first-profile ")
			}

			pid := agent.Process.Pid
			cpu0, f0, t0 := procCPU(b, pid), readOffCPUFigures(b, pid), time.Now()
			during := pingPong(b, bin, cpu, runs, window)
			cpu1, f1, took := procCPU(b, pid), readOffCPUFigures(b, pid), time.Since(t0)
			stop()
			after := pingPong(b, bin, cpu, runs, window)

			base := (before + after) / 2
			b.ReportMetric(during/base, "round-trips-on/off")
			b.ReportMetric(during, "round-trips/s")
			b.ReportMetric(base, "round-trips-off/s")
			b.ReportMetric((max(before, after)-min(before, after))/base*100, "noise-%")
			b.ReportMetric((cpu1-cpu0)/took.Minutes(), "agent-cpu-s/min")
			b.ReportMetric(float64(f1.starts-f0.starts)/took.Seconds(), "off-cpu-starts/s")
			b.ReportMetric(float64(f1.lost-f0.lost), "records-lost")
			if n := f1.switches - f0.switches; n > 0 {
				b.ReportMetric(float64((f1.runtime-f0.runtime).Nanoseconds())/float64(n), "ebpf-ns/switch")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
