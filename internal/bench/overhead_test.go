package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/cilium/ebpf"
	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/internal/testutil"
	"golang.org/x/sys/unix"
)

// The benchmark re-executes its own test binary as the agent, so the agent's
// CPU time and peak RSS are those of a process that runs only the receiver.
const agentEnv = "SONDE_BENCH_AGENT_HZ"

// offCPUEnv, when set, is the agent's off_cpu_threshold.
const offCPUEnv = "SONDE_BENCH_AGENT_OFF_CPU"

// heapProfileEnv names a file the agent writes its heap profile to before it
// stops, for finding where the memory goes.
const heapProfileEnv = "SONDE_BENCH_HEAP_PROFILE"

// cpuProfileEnv names a file the agent writes its CPU profile to.
const cpuProfileEnv = "SONDE_BENCH_CPU_PROFILE"

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func TestMain(m *testing.M) {
	if hz := os.Getenv(agentEnv); hz != "" {
		os.Exit(runAgent(hz))
	}
	os.Exit(m.Run())
}

// runAgent runs the receiver with a consumer that drops what it gets, and
// prints "started <ns>" after Start returns and "first-profile <ns>" at the
// first export, both measured from just before Start.
func runAgent(hz string) int {
	sps, err := strconv.Atoi(hz)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	f := collector.NewFactory().(xreceiver.Factory)
	cfg := f.CreateDefaultConfig().(*collector.Config)
	cfg.SamplesPerSecond = sps
	if v := os.Getenv(offCPUEnv); v != "" {
		if cfg.OffCPUThreshold, err = strconv.ParseFloat(v, 64); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	for _, l := range []struct {
		env string
		to  *int64
	}{{unwindBytesEnv, &cfg.Limits.UnwindTableBytes}, {symbolBytesEnv, &cfg.Limits.SymbolCacheBytes}} {
		if v := os.Getenv(l.env); v != "" {
			if *l.to, err = strconv.ParseInt(v, 10, 64); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
		}
	}
	set := receivertest.NewNopSettings(f.Type())
	var figures *figureKeeper
	if focus := os.Getenv(figuresEnv); focus != "" {
		figures = newFigureKeeper(focus, cfg)
		set.TelemetrySettings = figures.tt.NewTelemetrySettings()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go figures.poll(ctx)
		go figures.printOnSignal(ctx)
	}
	begin := time.Now()
	var once sync.Once
	next, _ := xconsumer.NewProfiles(func(_ context.Context, pd pprofile.Profiles) error {
		once.Do(func() { fmt.Printf("first-profile %d\n", time.Since(begin).Nanoseconds()) })
		if figures != nil {
			figures.count(pd)
		}
		return nil
	})
	rcv, err := f.CreateProfiles(context.Background(), set, cfg, next)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	if path := os.Getenv(cpuProfileEnv); path != "" {
		f, err := os.Create(path)
		if err == nil {
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	begin = time.Now()
	if err := rcv.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("started %d\n", time.Since(begin).Nanoseconds())
	<-stop
	if path := os.Getenv(heapProfileEnv); path != "" {
		if err := writeHeapProfile(path); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if err := rcv.Shutdown(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// fixedIterations makes the fixed task take about a second of CPU here.
const fixedIterations = "400000000"

// runFixed runs the fixed task n times and returns the medians of its wall
// time and of its CPU time (user + system). CPU time does not depend on the
// share of the CPUs the scheduler gives the task among the busy workloads,
// so it shows the cost profiling adds to the task itself with less noise.
func runFixed(b *testing.B, bin string, n int) (wall, cpu time.Duration) {
	b.Helper()
	var walls, cpus []time.Duration
	for range n {
		cmd := exec.Command(bin, fixedIterations)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("fixed task: %v\n%s", err, out)
		}
		walls = append(walls, time.Since(start))
		cpus = append(cpus, cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
	}
	slices.Sort(walls)
	slices.Sort(cpus)
	return walls[len(walls)/2], cpus[len(cpus)/2]
}

// bpfStats sums the kernel's run-time statistics of the newest loaded
// programs with the given names: the agent's.
func bpfStats(b *testing.B, names ...string) map[string]ebpf.ProgramStats {
	b.Helper()
	newest := map[string]ebpf.ProgramID{}
	for id, err := ebpf.ProgramGetNextID(0); err == nil; id, err = ebpf.ProgramGetNextID(id) {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && slices.Contains(names, info.Name) && id > newest[info.Name] {
			newest[info.Name] = id
		}
		testutil.Close(b, p)
	}
	out := map[string]ebpf.ProgramStats{}
	for name, id := range newest {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			b.Fatal(err)
		}
		st, err := p.Stats()
		testutil.Close(b, p)
		if err != nil {
			b.Fatal(err)
		}
		out[name] = *st
	}
	return out
}

// procCPU is utime+stime of pid, in seconds.
func procCPU(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

// peakRSS is VmHWM of pid, in MiB.
func peakRSS(b *testing.B, pid int) float64 {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	b.Fatal("no VmHWM")
	return 0
}

// BenchmarkReceiverOverhead measures the receiver at 19 Hz and 99 Hz while
// two CPU-bound workloads keep both CPUs busy. Each sub-benchmark runs once
// whatever b.N is; the figures are reported as metrics.
func BenchmarkReceiverOverhead(b *testing.B) {
	testutil.RequirePrivileges(b, "receiver overhead benchmark")
	burner := testutil.BuildWorkload(b, testutil.CChain)
	fixed := testutil.BuildWorkload(b, testutil.Fixed)
	testutil.StartWorkload(b, burner)
	testutil.StartWorkload(b, burner)
	const runs = 7
	window := 60 * time.Second
	// The kernel keeps run-time statistics of BPF programs while this is open.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run-time statistics: %v", err)
	}
	defer testutil.Close(b, stats)

	for _, hz := range []int{19, 99} {
		b.Run(fmt.Sprintf("%dHz", hz), func(b *testing.B) {
			beforeWall, beforeCPU := runFixed(b, fixed, runs)

			a := startAgent(b, fmt.Sprintf("%s=%d", agentEnv, hz))
			defer a.stop()
			agent, stop, lines := a.cmd, a.stop, a.lines
			readValue := func(key string) time.Duration {
				for lines.Scan() {
					if v, ok := strings.CutPrefix(lines.Text(), key+" "); ok {
						ns, _ := strconv.ParseInt(v, 10, 64)
						return time.Duration(ns)
					}
				}
				b.Fatalf("agent exited before reporting %q", key)
				return 0
			}
			started := readValue("started")
			firstProfile := readValue("first-profile")

			// The window starts after the first export, so start-up work
			// (scanning /proc, loading kernel symbols) is not in it; the
			// fixed task runs at its end, when the agent is in its steady
			// state, and the baseline after runs once the agent has exited.
			cpu0, t0 := procCPU(b, agent.Process.Pid), time.Now()
			bpf0 := bpfStats(b, "sample_cpu", "unwind_user")
			time.Sleep(window / 2) // a measuring window, not synchronization
			duringWall, duringCPU := runFixed(b, fixed, runs)
			if rest := window - time.Since(t0); rest > 0 {
				time.Sleep(rest)
			}
			cpuPerMin := (procCPU(b, agent.Process.Pid) - cpu0) / time.Since(t0).Minutes()
			bpf1 := bpfStats(b, "sample_cpu", "unwind_user")
			rss := peakRSS(b, agent.Process.Pid)
			stop()
			afterWall, afterCPU := runFixed(b, fixed, runs)
			// The baseline is measured before and after; their gap shows the noise.
			baseCPU := (beforeCPU + afterCPU) / 2
			baseWall := (beforeWall + afterWall) / 2
			runs := bpf1["sample_cpu"].RunCount - bpf0["sample_cpu"].RunCount
			bpfTime := bpf1["sample_cpu"].Runtime - bpf0["sample_cpu"].Runtime +
				bpf1["unwind_user"].Runtime - bpf0["unwind_user"].Runtime

			b.ReportMetric(cpuPerMin, "agent-cpu-s/min")
			b.ReportMetric(rss, "peak-rss-MiB")
			b.ReportMetric(started.Seconds(), "start-s")
			b.ReportMetric(firstProfile.Seconds(), "first-profile-s")
			b.ReportMetric((float64(duringCPU)/float64(baseCPU)-1)*100, "slowdown-cpu-%")
			b.ReportMetric(float64(max(beforeCPU, afterCPU)-min(beforeCPU, afterCPU))/float64(baseCPU)*100, "noise-cpu-%")
			b.ReportMetric((float64(duringWall)/float64(baseWall)-1)*100, "slowdown-wall-%")
			if runs > 0 {
				b.ReportMetric(float64(bpfTime.Nanoseconds())/float64(runs), "ebpf-ns/sample")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// agentProcess is the receiver running in a child copy of this test binary
// (see runAgent), with its standard output read line by line.
type agentProcess struct {
	cmd     *exec.Cmd
	lines   *bufio.Scanner
	stopped bool
}

// startAgent starts the agent with env added to this process's
// environment; stop (also deferred by the caller) ends it.
func startAgent(b *testing.B, env ...string) *agentProcess {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	lines.Buffer(nil, 1<<20)
	return &agentProcess{cmd: cmd, lines: lines}
}

// stop ends the agent with SIGTERM and waits for it; once.
func (a *agentProcess) stop() {
	if !a.stopped {
		a.stopped = true
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		_ = a.cmd.Wait()
	}
}
