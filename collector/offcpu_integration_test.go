package collector_test

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// bpfPrograms names the BPF programs this process holds a file descriptor
// for: the in-process receiver's, not those of other processes on the host.
func bpfPrograms(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || link != "anon_inode:bpf-prog" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		for line := range strings.SplitSeq(string(info), "\n") {
			v, ok := strings.CutPrefix(line, "prog_id:")
			if !ok {
				continue
			}
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				t.Fatalf("fdinfo %s: %q: %v", e.Name(), line, err)
			}
			p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
			if err != nil {
				continue
			}
			if pi, err := p.Info(); err == nil {
				names = append(names, pi.Name)
			}
			testutil.Close(t, p)
		}
	}
	return names
}

func hasOffCPUProgram(names []string) bool {
	return slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "off_cpu") })
}

// userFrames returns the frames below the kernel ones.
func userFrames(frames []frame) []frame {
	for i, f := range frames {
		if f.Type != "kernel" {
			return frames[i:]
		}
	}
	return nil
}

func kernelFunctions(frames []frame) []string {
	var names []string
	for _, f := range frames {
		if f.Type == "kernel" {
			names = append(names, f.Function)
		}
	}
	return names
}

// checkOffCPUShape checks what every off-CPU sample of pid must be: the
// stack starts at __schedule and goes down to user frames; the attributes
// are those of on-CPU samples.
func checkOffCPUShape(t *testing.T, s flatSample, pid int, comm string) {
	t.Helper()
	if len(s.Frames) == 0 || s.Frames[0] != (frame{"__schedule", "kernel"}) {
		t.Errorf("off-CPU leaf is not __schedule: %s", functions(s.Frames))
	}
	for _, f := range userFrames(s.Frames) {
		if f.Type == "kernel" {
			t.Errorf("kernel frame %+v below a user frame in %s", f, functions(s.Frames))
		}
	}
	if s.TID != int64(pid) || s.ThreadName != comm {
		t.Errorf("thread = %d %q, want %d %q", s.TID, s.ThreadName, pid, comm)
	}
	if s.CPU < 0 || s.CPU >= int64(runtime.NumCPU()) {
		t.Errorf("cpu.logical_number = %d, want 0..%d", s.CPU, runtime.NumCPU()-1)
	}
	if len(s.Values) != len(s.Times) || len(s.Values) == 0 {
		t.Errorf("%d values for %d timestamps", len(s.Values), len(s.Times))
	}
	for _, v := range s.Values {
		if v <= 0 {
			t.Errorf("off-CPU value %d ns, want > 0", v)
		}
	}
}

// sleepLog reads the workload's own account of its sleeps: when each ended
// (Unix ns) and how long it took.
type sleep struct{ end, took int64 }

func readSleepLog(t *testing.T, path string) []sleep {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sleep
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue // a line being written
		}
		end, err1 := strconv.ParseInt(fields[0], 10, 64)
		took, err2 := strconv.ParseInt(fields[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("sleep log line %q", sc.Text())
		}
		out = append(out, sleep{end, took})
	}
	return out
}

// latestEnd is the end of the newest interval exported so far.
func latestEnd(sink *consumertest.ProfilesSink) time.Time {
	var end time.Time
	for _, pd := range sink.AllProfiles() {
		for _, rp := range pd.ResourceProfiles().All() {
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					if e := p.Time().AsTime().Add(time.Duration(p.DurationNano())); e.After(end) {
						end = e
					}
				}
			}
		}
	}
	return end
}

// The sleeper's off-CPU profile shows main -> a -> b -> nanosleep down to
// the kernel's sleep, and adds up to the time the sleeper itself measured
// asleep.
func TestOffCPUSleepChain(t *testing.T) {
	sink := startReceiver(t, 99, func(c *collector.Config) { c.OffCPUThreshold = 1 })
	if names := bpfPrograms(t); !hasOffCPUProgram(names) {
		t.Errorf("off_cpu_threshold 1: no off-CPU program loaded; programs: %v", names)
	}
	bin := testutil.BuildWorkload(t, testutil.OffCPUSleep)
	logPath := filepath.Join(t.TempDir(), "sleeps")
	pid := testutil.StartWorkload(t, bin, logPath).Process.Pid

	chain := []frame{{"b", "native"}, {"a", "native"}, {"main", "native"}}
	isSleep := func(s flatSample) bool {
		user := userFrames(s.Frames)
		return s.Type == "off_cpu" && len(user) > len(chain) && strings.Contains(user[0].Function, "nanosleep") &&
			hasChain(user, chain)
	}
	s, _ := waitForSample(t, sink, pid, 30*time.Second, isSleep)
	if s.PID == 0 {
		return
	}
	checkOffCPUShape(t, s, pid, "offcpusleep")
	t.Logf("off-CPU stack: %s", functions(s.Frames))
	if s.ExeName != "offcpusleep" || s.ExePath != bin {
		t.Errorf("executable = %q at %q, want offcpusleep at %q", s.ExeName, s.ExePath, bin)
	}
	if k := kernelFunctions(s.Frames); !slices.ContainsFunc(k, func(n string) bool { return strings.Contains(n, "nanosleep") }) {
		t.Errorf("no kernel frame of the sleep (*nanosleep*) in %s", functions(s.Frames))
	}

	// Unwinding is complete from the first sample above on (the process's
	// unwind tables are loaded). Observe at least 5 s more.
	firstSeen := time.Unix(0, int64(slices.Min(s.Times)))
	target := firstSeen.Add(7 * time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for latestEnd(sink).Before(target) && time.Now().Before(deadline) {
		waitForExport(sink, len(sink.AllProfiles()), time.Until(deadline))
	}
	if end := latestEnd(sink); end.Before(target) {
		t.Fatalf("exports cover until %v, want %v", end, target)
	}

	// The window: from inside the first sleep that ends a second after the
	// first sample, to inside a sleep that ends a second before the last
	// export ends, so that every wait ending in it has been exported
	// (records are read within a poll interval) and no sleep ends near its
	// edges (+100 ms is mid-sleep: the sleeps take 200 ms).
	sleeps := readSleepLog(t, logPath)
	lastEnd := latestEnd(sink).Add(-time.Second).UnixNano()
	var from, to int64
	for _, sl := range sleeps {
		if from == 0 && sl.end > firstSeen.Add(time.Second).UnixNano() {
			from = sl.end + int64(100*time.Millisecond)
		}
		if sl.end < lastEnd {
			to = sl.end + int64(100*time.Millisecond)
		}
	}
	if from == 0 || to <= from {
		t.Fatalf("no window in %d sleeps between %v and %v", len(sleeps), firstSeen, time.Unix(0, lastEnd))
	}
	var slept int64
	var nSlept int
	for _, sl := range sleeps {
		if sl.end > from && sl.end <= to {
			slept += sl.took
			nSlept++
		}
	}
	var offCPU int64
	var nOff int
	var all []flatSample
	for _, pd := range sink.AllProfiles() {
		all = append(all, flatten(pd)...)
	}
	for _, fs := range all {
		if fs.PID != int64(pid) || !isSleep(fs) {
			continue
		}
		checkOffCPUShape(t, fs, pid, "offcpusleep")
		for i, ts := range fs.Times {
			if int64(ts) > from && int64(ts) <= to {
				offCPU += fs.Values[i]
				nOff++
			}
		}
	}
	t.Logf("window %v: the sleeper slept %v in %d sleeps; off-CPU profile: %v in %d waits",
		time.Duration(to-from), time.Duration(slept), nSlept, time.Duration(offCPU), nOff)
	if nSlept < 10 {
		t.Fatalf("only %d sleeps in the window", nSlept)
	}
	if diff := float64(offCPU-slept) / float64(slept); diff < -0.10 || diff > 0.10 {
		t.Errorf("off-CPU time %v differs from the time slept %v by %.1f%%, want within 10%%",
			time.Duration(offCPU), time.Duration(slept), diff*100)
	}

	checkProfilesShape(t, sink.AllProfiles(), pid)
}

// checkProfilesShape checks that, in some interval, pid's resource carries
// its on-CPU and off-CPU profiles side by side in one ScopeProfiles, the
// off-CPU one typed off_cpu/nanoseconds without a period.
func checkProfilesShape(t *testing.T, all []pprofile.Profiles, pid int) {
	t.Helper()
	for _, pd := range all {
		strs := pd.Dictionary().StringTable()
		for _, rp := range pd.ResourceProfiles().All() {
			if v, ok := rp.Resource().Attributes().Get("process.pid"); !ok || v.Int() != int64(pid) {
				continue
			}
			if rp.ScopeProfiles().Len() != 1 {
				t.Errorf("%d ScopeProfiles for pid %d, want 1", rp.ScopeProfiles().Len(), pid)
				return
			}
			var types []string
			for _, p := range rp.ScopeProfiles().At(0).Profiles().All() {
				typ := strs.At(int(p.SampleType().TypeStrindex())) + "/" + strs.At(int(p.SampleType().UnitStrindex()))
				types = append(types, typ)
				if typ == "off_cpu/nanoseconds" && (p.Period() != 0 || p.PeriodType().TypeStrindex() != 0) {
					t.Errorf("off-CPU profile has period %d of type %q, want none", p.Period(), strs.At(int(p.PeriodType().TypeStrindex())))
				}
			}
			if slices.Equal(types, []string{"samples/count", "off_cpu/nanoseconds"}) {
				return
			}
		}
	}
	t.Errorf("no interval has pid %d's on-CPU and off-CPU profiles in one ScopeProfiles", pid)
}

// A reader blocked on a pipe shows the read path through the kernel's
// pipe_read down to main -> reader.
func TestOffCPUPipeRead(t *testing.T) {
	sink := startReceiver(t, 19, func(c *collector.Config) { c.OffCPUThreshold = 1 })
	bin := testutil.BuildWorkload(t, testutil.PipeWait)
	pid := testutil.StartWorkload(t, bin).Process.Pid

	chain := []frame{{"reader", "native"}, {"main", "native"}}
	s, _ := waitForSample(t, sink, pid, 30*time.Second, func(s flatSample) bool {
		user := userFrames(s.Frames)
		return s.Type == "off_cpu" && len(user) > len(chain) && strings.Contains(user[0].Function, "read") &&
			hasChain(user, chain)
	})
	if s.PID == 0 {
		return
	}
	checkOffCPUShape(t, s, pid, "pipewait")
	// pipe_read is anon_pipe_read since Linux 6.15.
	isPipeRead := func(n string) bool { return n == "pipe_read" || n == "anon_pipe_read" }
	if k := kernelFunctions(s.Frames); !slices.ContainsFunc(k, isPipeRead) || !slices.Contains(k, "schedule") {
		t.Errorf("kernel frames %v lack pipe_read (or anon_pipe_read) and schedule", k)
	}
	t.Logf("off-CPU stack: %s", functions(s.Frames))
}

// With off_cpu_threshold 0 (the default) the off-CPU programs are not
// loaded and no off-CPU profile appears, even for a program that sleeps.
func TestOffCPUOffByDefault(t *testing.T) {
	sink := startReceiver(t, 99)
	if names := bpfPrograms(t); hasOffCPUProgram(names) || !slices.Contains(names, "sample_cpu") {
		t.Errorf("programs loaded with off_cpu_threshold 0: %v; want sample_cpu and no off_cpu*", names)
	}
	bin := testutil.BuildWorkload(t, testutil.OffCPUSleep)
	pid := testutil.StartWorkload(t, bin).Process.Pid

	// The sleeper's on-CPU samples (spin) show the pipeline ran over its
	// sleeps; then a few more intervals.
	s, _ := waitForSample(t, sink, pid, 30*time.Second, func(s flatSample) bool {
		return s.Type == "samples" && hasChain(s.Frames, []frame{{"spin", "native"}, {"main", "native"}})
	})
	if s.PID == 0 {
		return
	}
	for range 4 {
		waitForExport(sink, len(sink.AllProfiles()), 10*time.Second)
	}
	for _, pd := range sink.AllProfiles() {
		for _, fs := range flatten(pd) {
			if fs.Type != "samples" {
				t.Fatalf("a %q sample with off_cpu_threshold 0: pid %d %s", fs.Type, fs.PID, functions(fs.Frames))
			}
		}
	}
}
