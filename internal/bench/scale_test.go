package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// Knobs of the scale scenarios, read from the environment.
const (
	// scaleWindowEnv: how long each scenario is measured (default 60s).
	scaleWindowEnv = "SONDE_BENCH_SCALE_WINDOW"
	// execStormEnv: how long the exec storm lasts (default 60s); it is
	// that scenario's window.
	execStormEnv = "SONDE_BENCH_EXEC_STORM"
	// hugeFuncsEnv: functions in the huge binary (default 200000).
	hugeFuncsEnv = "SONDE_BENCH_HUGE_FUNCS"
)

func envDuration(b *testing.B, key string, def time.Duration) time.Duration {
	b.Helper()
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s: want a positive duration such as 20s, got %q", key, v)
	}
	return d
}

// BenchmarkScale runs the agent through the scale and churn scenarios of
// issue 7: many live processes of many binaries, an exec storm, one huge
// binary, and 1000 Hz sampling on busy CPUs. Each sub-benchmark runs once
// whatever b.N is and reports, over its window (which starts at the
// agent's first export): the agent's CPU, peak RSS and BPF map memory,
// lost samples, the shares of samples fully unwound and named, and the
// memory the unwind tables and symbol caches held against their limits,
// with what did not fit. It fails when a limit was exceeded.
func BenchmarkScale(b *testing.B) {
	testutil.RequirePrivileges(b, "scale benchmark")
	window := envDuration(b, scaleWindowEnv, 60*time.Second)

	b.Run("processes=500/binaries=50", func(b *testing.B) {
		dir := b.TempDir()
		var bins []string
		for i := range 50 {
			src := filepath.Join(dir, fmt.Sprintf("many%02d.c", i))
			writeFile(b, src, fmt.Sprintf(manyTemplate, i, 1000003*(i+1)))
			bins = append(bins, testutil.BuildC(b, fmt.Sprintf("many%02d", i), noFramePointers, src))
		}
		focus := benchDir(bins[0])
		for range 10 {
			for _, bin := range bins {
				testutil.StartWorkload(b, bin)
			}
		}
		measureScale(b, 99, focus, window, nil)
	})

	b.Run("exec-storm=200/s", func(b *testing.B) {
		storm := envDuration(b, execStormEnv, 60*time.Second)
		src := filepath.Join(b.TempDir(), "storm.c")
		writeFile(b, src, stormSource)
		bin := testutil.BuildC(b, "storm", noFramePointers, src)
		measureScale(b, 99, benchDir(bin), storm, func(deadline time.Time) map[string]float64 {
			return execStorm(b, bin, 200, deadline)
		})
	})

	b.Run("huge-binary", func(b *testing.B) {
		n := 200000
		if v := os.Getenv(hugeFuncsEnv); v != "" {
			var err error
			if n, err = strconv.Atoi(v); err != nil || n < 3 {
				b.Fatalf("%s: want a number of functions, at least 3, got %q", hugeFuncsEnv, v)
			}
		}
		bin := buildHuge(b, n)
		testutil.StartWorkload(b, bin)
		measureScale(b, 99, benchDir(bin), window, func(time.Time) map[string]float64 {
			return map[string]float64{"functions": float64(n)}
		})
	})

	b.Run("1000Hz/both-CPUs-busy", func(b *testing.B) {
		bin := testutil.BuildWorkload(b, testutil.CChainNoFP)
		testutil.StartWorkload(b, bin)
		testutil.StartWorkload(b, bin)
		measureScale(b, 1000, benchDir(bin), window, nil)
	})
}

// Flags of the generated workloads: no frame pointers, so only CFI unwinds
// them, calls kept as calls.
var noFramePointers = []string{"-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"}

// manyTemplate is one of the 50 binaries: its own function names and
// constant; a burst of about a millisecond of CPU every second, so 500 of
// them keep a fraction of a CPU busy.
const manyTemplate = `#include <stdint.h>
#include <time.h>

volatile uint64_t sink;

__attribute__((noinline)) uint64_t work_%[1]d(uint64_t n)
{
	uint64_t x = %[2]d;
	for (uint64_t i = 0; i < n; i++)
		x = x * 6364136223846793005ULL + %[2]d + i;
	return x;
}

__attribute__((noinline)) void burst_%[1]d(void)
{
	sink += work_%[1]d(700000);
	sink++;
}

int main(void)
{
	struct timespec ts = {1, 0};
	for (;;) {
		burst_%[1]d();
		nanosleep(&ts, 0);
	}
}
`

// stormSource is the exec storm's process: about a millisecond of CPU in
// main -> spin, then exit. Its arguments only make each command line
// different.
const stormSource = `#include <stdint.h>
#include <stdlib.h>

volatile uint64_t sink;

__attribute__((noinline)) uint64_t spin(uint64_t seed)
{
	uint64_t x = seed;
	for (uint64_t i = 0; i < 700000; i++)
		x = x * 6364136223846793005ULL + i;
	return x;
}

int main(int argc, char **argv)
{
	sink = spin(argc > 1 ? strtoull(argv[1], 0, 10) : 1);
	return 0;
}
`

// benchDir is the directory of all the temporary directories of the
// sub-benchmark that built bin: each BuildC call gets its own one.
func benchDir(bin string) string { return filepath.Dir(filepath.Dir(bin)) + "/" }

func writeFile(b *testing.B, path, content string) {
	b.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		b.Fatal(err)
	}
}

// execStorm starts rate processes of bin per second, each with its own
// command line, until deadline, and reaps them. It returns the rate it
// reached and the processes that failed.
func execStorm(b *testing.B, bin string, rate int, deadline time.Time) map[string]float64 {
	b.Helper()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	started, begin := 0, time.Now()
	for time.Now().Before(deadline) {
		<-tick.C
		cmd := exec.Command(bin, strconv.Itoa(started), fmt.Sprintf("--storm-%d-%x", started, time.Now().UnixNano()))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			failed++
			continue
		}
		started++
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}()
	}
	took := time.Since(begin)
	wg.Wait()
	return map[string]float64{"execs/s": float64(started) / took.Seconds(), "execs-failed": float64(failed)}
}

// hugeInner and hugeLeaf are the two shapes of the huge binary's
// functions, compiled once to assembly and stamped out under each
// function's own name and constant: the compiler's own code and CFI for
// every function, without compiling hundreds of thousands of them.
const hugeTemplate = `extern unsigned long tmpl_c1(unsigned long), tmpl_c2(unsigned long);

unsigned long tmpl_inner(unsigned long x)
{
	x = x * 6364136223846793005UL + 987654321UL;
	x = (x >> 33) & 1 ? tmpl_c1(x) : tmpl_c2(x);
	return x ^ 987654321UL;
}

unsigned long tmpl_leaf(unsigned long x)
{
	for (int k = 0; k < 20000; k++)
		x = x * 2862933555777941757UL + 987654321UL + k;
	return x;
}
`

const hugeMain = `volatile unsigned long sink;
unsigned long f0(unsigned long);

int main(void)
{
	unsigned long x = 1;
	for (;;)
		sink = x = f0(x + 1);
}
`

// hugeFlags are the huge binary's compiler flags.
var hugeFlags = []string{"-O1", "-fomit-frame-pointer"}

// buildHuge builds a binary of n functions in a binary call tree: f(i)
// calls f(2i+1) or f(2i+2) depending on its argument, and the leaves burn
// CPU, so every run of main walks one path from f0 to a leaf and, over
// time, samples land in all of them. Its assembly is split in files
// assembled in parallel.
func buildHuge(b *testing.B, n int) string {
	b.Helper()
	cc := testutil.RequireTool(b, "cc")
	dir := b.TempDir()
	tmpl := filepath.Join(dir, "tmpl.c")
	writeFile(b, tmpl, hugeTemplate)
	out, err := exec.Command(cc, append(append([]string{}, hugeFlags...), "-S", "-o", "-", tmpl)...).CombinedOutput()
	if err != nil {
		b.Fatalf("compile the huge binary's template: %v\n%s", err, out)
	}
	inner, leaf := asmFunction(b, string(out), "tmpl_inner"), asmFunction(b, string(out), "tmpl_leaf")

	const parts = 8
	// A bufio.Writer keeps its first error for Flush, which is checked, so
	// the writes into it below are not.
	files := make([]*bufio.Writer, parts)
	osFiles := make([]*os.File, parts)
	var paths []string
	for p := range parts {
		path := filepath.Join(dir, fmt.Sprintf("part%d.s", p))
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close() // on failure; closed and checked after the flush
		osFiles[p] = f
		files[p] = bufio.NewWriter(f)
		_, _ = fmt.Fprintln(files[p], "\t.text")
		paths = append(paths, path)
	}
	for i := range n {
		w := files[i%parts]
		name := fmt.Sprintf("f%d", i)
		constant := strconv.Itoa(100000000 + i)
		labels := fmt.Sprintf(".L%d_", i)
		c1, c2 := 2*i+1, 2*i+2
		if c1 >= n {
			_, _ = strings.NewReplacer("tmpl_leaf", name, "987654321", constant, ".L", labels).WriteString(w, leaf)
			continue
		}
		if c2 >= n {
			c2 = c1
		}
		_, _ = strings.NewReplacer("tmpl_inner", name, "tmpl_c1", fmt.Sprintf("f%d", c1), "tmpl_c2", fmt.Sprintf("f%d", c2),
			"987654321", constant, ".L", labels).WriteString(w, inner)
	}
	for p, w := range files {
		_, _ = fmt.Fprintln(w, "\t.section\t.note.GNU-stack,\"\",@progbits")
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
		if err := osFiles[p].Close(); err != nil {
			b.Fatal(err)
		}
	}
	mainSrc := filepath.Join(dir, "main.c")
	writeFile(b, mainSrc, hugeMain)
	paths = append(paths, mainSrc)

	// Assemble (and compile main.c) in parallel, then link.
	objs := make([]string, len(paths))
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, path := range paths {
		objs[i] = strings.TrimSuffix(path, filepath.Ext(path)) + ".o"
		wg.Go(func() {
			if out, err := exec.Command(cc, append(append([]string{}, hugeFlags...), "-c", "-o", objs[i], path)...).CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("%s: %w\n%s", path, err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return testutil.BuildC(b, "huge", nil, objs...)
}

// asmFunction cuts function name out of the compiler's assembly: from its
// .globl to its .size, CFI directives included.
func asmFunction(b *testing.B, asm, name string) string {
	b.Helper()
	start := strings.Index(asm, "\t.globl\t"+name+"\n")
	end := strings.Index(asm, "\t.size\t"+name+", .-"+name+"\n")
	if start < 0 || end < start {
		b.Fatalf("no function %s in the compiler's assembly:\n%s", name, asm)
	}
	end += len("\t.size\t" + name + ", .-" + name + "\n")
	return asm[start:end]
}

// bpfMemory sums the memlock of the BPF maps the agent holds and of the
// unwind tables its tables map holds (which it keeps no descriptor of).
func bpfMemory(pid int) (total, tables uint64, err error) {
	ids, err := agentMapIDs(pid)
	if err != nil {
		return 0, 0, err
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue // closed since
		}
		info, err := m.Info()
		if err != nil {
			_ = m.Close() // our own handle of the agent's map
			continue
		}
		if mem, ok := info.Memlock(); ok {
			total += mem
		}
		if info.Name == "tables" && info.Type == ebpf.ArrayOfMaps {
			for k := uint32(0); k < info.MaxEntries; k++ {
				var inner ebpf.MapID
				if err := m.Lookup(k, &inner); err != nil || inner == 0 {
					continue
				}
				im, err := ebpf.NewMapFromID(inner)
				if err != nil {
					continue
				}
				if ii, err := im.Info(); err == nil {
					if mem, ok := ii.Memlock(); ok {
						tables += mem
					}
				}
				_ = im.Close()
			}
		}
		_ = m.Close()
	}
	return total + tables, tables, nil
}

// agentMapIDs are the distinct ids of the BPF maps pid holds descriptors of.
func agentMapIDs(pid int) ([]ebpf.MapID, error) {
	dir := fmt.Sprintf("/proc/%d/fdinfo", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("agent descriptors: %w", err)
	}
	seen := map[ebpf.MapID]bool{}
	var ids []ebpf.MapID
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "map_id:"); ok {
				id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
				if err == nil && !seen[ebpf.MapID(id)] {
					seen[ebpf.MapID(id)] = true
					ids = append(ids, ebpf.MapID(id))
				}
			}
		}
	}
	return ids, nil
}

// sumMetric adds the telemetry points of name whose attributes contain
// every one of attrs ("reason=over_budget").
func sumMetric(m map[string]int64, name string, attrs ...string) int64 {
	var n int64
	for k, v := range m {
		base, rest, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		kv := strings.Split(strings.TrimSuffix(rest, "}"), ",")
		ok := true
		for _, a := range attrs {
			found := false
			for _, x := range kv {
				found = found || x == a
			}
			ok = ok && found
		}
		if ok {
			n += v
		}
	}
	return n
}

// measureScale starts the agent at hz, waits for its first export, runs
// during (or only waits) until the window ends, and reports the figures.
// focus is the directory of the scenario's binaries. during returns extra
// figures of the load to report.
func measureScale(b *testing.B, hz int, focus string, window time.Duration, during func(deadline time.Time) map[string]float64) {
	b.Helper()
	a := startAgent(b, fmt.Sprintf("%s=%d", agentEnv, hz), figuresEnv+"="+focus)
	defer a.stop()
	agent, stop, lines := a.cmd, a.stop, a.lines
	pid := agent.Process.Pid
	await := func(prefix string) string {
		for lines.Scan() {
			if v, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				return v
			}
		}
		b.Fatalf("agent exited before printing %q", prefix)
		return ""
	}
	figures := func() agentFigures {
		if err := agent.Process.Signal(syscall.SIGUSR1); err != nil {
			b.Fatal(err)
		}
		var f agentFigures
		if err := json.Unmarshal([]byte(await("figures ")), &f); err != nil {
			b.Fatal(err)
		}
		return f
	}
	await("first-profile ")

	// The window starts at the first export. BPF memory is sampled from
	// here, in this process, while the load runs.
	cpu0, f0, t0 := procCPU(b, pid), figures(), time.Now()
	var peakBPF, peakTables uint64
	var bpfErr error
	done := make(chan struct{})
	var sampler sync.WaitGroup
	sample := func() {
		total, tables, err := bpfMemory(pid)
		if err != nil {
			bpfErr = err
			return
		}
		peakBPF, peakTables = max(peakBPF, total), max(peakTables, tables)
	}
	sampler.Go(func() {
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	})
	deadline := t0.Add(window)
	var extra map[string]float64
	if during != nil {
		extra = during(deadline)
	}
	if rest := time.Until(deadline); rest > 0 {
		time.Sleep(rest) // the rest of the measuring window, not synchronization
	}
	close(done)
	sampler.Wait()
	cpu1, f1, took := procCPU(b, pid), figures(), time.Since(t0)
	sample()
	rss := peakRSS(b, pid)
	stop()
	if bpfErr != nil {
		b.Fatalf("BPF map memory: %v", bpfErr)
	}

	d := func(name string, attrs ...string) float64 {
		return float64(sumMetric(f1.Metrics, name, attrs...) - sumMetric(f0.Metrics, name, attrs...))
	}
	pct := func(part, whole float64) float64 {
		if whole == 0 {
			return 0
		}
		return part / whole * 100
	}
	// A failed benchmark prints no metrics: they are logged too.
	var logged []string
	report := func(v float64, unit string) {
		b.ReportMetric(v, unit)
		logged = append(logged, fmt.Sprintf("%.4g %s", v, unit))
	}
	const mib = 1 << 20
	consumer := (f1.ConsumerCPU - f0.ConsumerCPU).Seconds()
	report((cpu1-cpu0-consumer)/took.Minutes(), "agent-cpu-s/min")
	report(cpu0-f0.ConsumerCPU.Seconds(), "startup-cpu-s")
	report(rss, "peak-rss-MiB")
	report(float64(peakBPF)/mib, "bpf-maps-MiB")
	report(float64(peakTables)/mib, "bpf-unwind-tables-MiB")

	received := d("sonde.samples.received")
	ringLost := d("sonde.samples.lost", "reason=ring_buffer_full")
	lost := d("sonde.samples.lost")
	report(received/took.Seconds(), "samples/s")
	report(lost, "samples-lost")
	report(pct(lost, received+ringLost), "lost-%")
	withUser := d("sonde.unwind.stacks") - d("sonde.unwind.stacks", "outcome=none")
	report(pct(d("sonde.unwind.stacks", "outcome=complete"), withUser), "complete-%")
	report(pct(float64(f1.Named-f0.Named), float64(f1.Samples-f0.Samples)), "named-%")
	report(pct(float64(f1.FramesNamed-f0.FramesNamed), float64(f1.Frames-f0.Frames)), "frames-named-%")
	focusSamples := float64(f1.FocusSamples - f0.FocusSamples)
	report(focusSamples, "workload-samples")
	report(pct(float64(f1.FocusComplete-f0.FocusComplete), focusSamples), "workload-to-_start-%")
	report(pct(float64(f1.FocusNamed-f0.FocusNamed), focusSamples), "workload-named-%")

	// Memory against the limits, over the whole run, and what did not fit.
	report(float64(f1.PeakUnwindTableBytes)/mib, "unwind-tables-MiB")
	report(float64(f1.UnwindTableBytesLimit)/mib, "unwind-limit-MiB")
	report(float64(f1.PeakSymbolCacheBytes)/mib, "symbol-cache-MiB")
	report(float64(f1.SymbolCacheBytesLimit)/mib, "symbol-limit-MiB")
	report(float64(f1.PeakProcesses), "processes-peak")
	total := func(name string, attrs ...string) float64 { return float64(sumMetric(f1.Metrics, name, attrs...)) }
	report(total("sonde.unwind.table.failures", "reason=over_budget"), "tables-over-budget")
	report(total("sonde.unwind.table.evictions"), "tables-evicted")
	report(total("sonde.symbolize.cache.evictions"), "symbol-files-evicted")
	report(total("sonde.unwind.requests.dropped"), "unwind-requests-dropped")
	report(total("sonde.records.lost"), "records-lost")
	for k, v := range extra {
		report(v, k)
	}
	report(0, "ns/op")
	b.Log(strings.Join(logged, "  "))

	if f1.PeakUnwindTableBytes > f1.UnwindTableBytesLimit {
		b.Errorf("unwind tables held %d bytes, over limits::unwind_table_bytes %d", f1.PeakUnwindTableBytes, f1.UnwindTableBytesLimit)
	}
	if int64(peakTables) > f1.UnwindTableBytesLimit {
		b.Errorf("the kernel charged %d bytes to the unwind tables, over limits::unwind_table_bytes %d", peakTables, f1.UnwindTableBytesLimit)
	}
	if f1.PeakSymbolCacheBytes > f1.SymbolCacheBytesLimit {
		b.Errorf("symbol data held %d bytes, over limits::symbol_cache_bytes %d", f1.PeakSymbolCacheBytes, f1.SymbolCacheBytesLimit)
	}
}
