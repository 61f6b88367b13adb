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

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// The benchmark re-executes its own test binary as the agent, so the agent's
// CPU time and peak RSS are those of a process that runs only the receiver.
const agentEnv = "SONDE_BENCH_AGENT_HZ"

// heapProfileEnv names a file the agent writes its heap profile to before it
// stops, for finding where the memory goes.
const heapProfileEnv = "SONDE_BENCH_HEAP_PROFILE"

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
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
	begin := time.Now()
	var once sync.Once
	next, _ := xconsumer.NewProfiles(func(context.Context, pprofile.Profiles) error {
		once.Do(func() { fmt.Printf("first-profile %d\n", time.Since(begin).Nanoseconds()) })
		return nil
	})
	rcv, err := f.CreateProfiles(context.Background(), receivertest.NewNopSettings(f.Type()), cfg, next)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
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

// runFixed runs the fixed task n times and returns the median wall time.
func runFixed(b *testing.B, bin string, n int) time.Duration {
	b.Helper()
	var d []time.Duration
	for range n {
		start := time.Now()
		if out, err := exec.Command(bin, fixedIterations).CombinedOutput(); err != nil {
			b.Fatalf("fixed task: %v\n%s", err, out)
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	return d[len(d)/2]
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
	const runs = 5
	window := 30 * time.Second

	for _, hz := range []int{19, 99} {
		b.Run(fmt.Sprintf("%dHz", hz), func(b *testing.B) {
			before := runFixed(b, fixed, runs)

			agent := exec.Command(os.Args[0], "-test.run=^$")
			agent.Env = append(os.Environ(), fmt.Sprintf("%s=%d", agentEnv, hz))
			agent.Stderr = os.Stderr
			out, err := agent.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := agent.Start(); err != nil {
				b.Fatal(err)
			}
			defer agent.Wait()
			defer agent.Process.Signal(syscall.SIGTERM)
			lines := bufio.NewScanner(out)
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

			cpu0, t0 := procCPU(b, agent.Process.Pid), time.Now()
			during := runFixed(b, fixed, runs)
			if rest := window - time.Since(t0); rest > 0 {
				time.Sleep(rest) // measuring window, not synchronization
			}
			cpuPerMin := (procCPU(b, agent.Process.Pid) - cpu0) / time.Since(t0).Minutes()
			rss := peakRSS(b, agent.Process.Pid)
			after := runFixed(b, fixed, runs)
			// The baseline is measured before and after; their gap shows the noise.
			baseline := (before + after) / 2

			b.ReportMetric(cpuPerMin, "agent-cpu-s/min")
			b.ReportMetric(rss, "peak-rss-MiB")
			b.ReportMetric(started.Seconds(), "start-s")
			b.ReportMetric(firstProfile.Seconds(), "first-profile-s")
			b.ReportMetric((float64(during)/float64(baseline)-1)*100, "slowdown-%")
			b.ReportMetric(float64(max(before, after)-min(before, after))/float64(baseline)*100, "baseline-noise-%")
			b.ReportMetric(0, "ns/op")
		})
	}
}
