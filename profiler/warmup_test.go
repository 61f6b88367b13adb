//go:build linux

package profiler

import (
	"bytes"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// A process running before the profiler starts has samples before its
// tables are loaded; those whose stack ends early are held back (counted
// in Stats.WarmUp), so from the first export on at least 99.5 % of its
// samples (over 1000) are whole down to main, for C without frame pointers, C++ and
// Go alike.
func TestStartupProcessesWhole(t *testing.T) {
	for _, w := range []struct{ name, chain string }{
		{testutil.CChainNoFP, "c b a main"},
		{testutil.Throw, "c b a main"},
		{testutil.GoChain, "main.gamma main.beta main.alpha main.main"},
	} {
		t.Run(w.name, func(t *testing.T) {
			testutil.RequirePrivileges(t, "the sonde profiler")
			cmd := testutil.StartWorkload(t, testutil.BuildWorkload(t, w.name))
			pid := cmd.Process.Pid
			// Running: its first thread is on a CPU or ready for one.
			waitRunning(t, pid)
			p, s := startProfiler(t, 99)
			chain := strings.Fields(w.chain)
			root := chain[len(chain)-1]
			var whole, total int
			var bad [][]testFrame
			deadline := time.Now().Add(90 * time.Second)
			for seen := 0; total < 1000 && time.Now().Before(deadline); {
				all := s.all()
				for _, pd := range all[seen:] {
					for _, st := range stacksOf(pd, pid) {
						truncated := hasFrame(st, TruncatedFrame, "")
						if !truncated && !slices.ContainsFunc(chain, func(fn string) bool { return hasFrame(st, fn, "") }) {
							continue // whole, but not the workload's chain: a Go runtime thread
						}
						total++
						if !truncated && hasFrame(st, root, "") {
							whole++
						} else if len(bad) < 5 {
							bad = append(bad, st)
						}
					}
				}
				seen = len(all)
				s.waitFor(seen+1, 2*time.Second)
			}
			for _, st := range bad {
				t.Logf("not whole: %v", st)
			}
			t.Logf("%s: %d of %d samples whole from the first export; %d held back during warm-up", w.name, whole, total, p.Stats().WarmUp)
			if total < 1000 || whole*1000 < total*995 {
				t.Errorf("%s: %d of %d samples whole, want at least 99.5 %% of at least 1000", w.name, whole, total)
			}
		})
	}
}

// cpuTime is how long pid has run on a CPU (utime+stime in its stat).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after "pid (comm)": state is the first, utime the 12th,
	// stime the 13th, in clock ticks (100 a second).
	i := bytes.LastIndexByte(b, ')')
	if f := strings.Fields(string(b[i+1:])); i > 0 && len(f) > 12 {
		u, _ := strconv.Atoi(f[11])
		s, _ := strconv.Atoi(f[12])
		return time.Duration(u+s) * 10 * time.Millisecond
	}
	return 0
}

// waitRunning waits until pid has run on a CPU (utime+stime > 0 in its
// stat), so it is running, not starting, when the profiler starts.
func waitRunning(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		// Fields after "pid (comm)": state is the first, utime the 12th,
		// stime the 13th.
		if i := bytes.LastIndexByte(b, ')'); i > 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 12 && (f[11] != "0" || f[12] != "0") {
				return
			}
		}
		runtime.Gosched()
	}
	t.Fatalf("pid %d never ran", pid)
}

// Only the processes of the start-up scan are held back, and only their
// cut-short stacks: until a whole stack taken after their preparation
// ended, or warmUpGrace after that end. An exec or exit forgets them, and
// a second preparation does not move the time.
func TestWarmUpHoldBack(t *testing.T) {
	var w warmUp
	t0 := ktime(1000 * time.Second)
	w.start([]int{1, 2, 3, 4})
	if !w.holdBack(1, t0, false) {
		t.Error("a cut-short stack of a start-up process not yet prepared is not held back")
	}
	if w.holdBack(1, t0, true) {
		t.Error("a whole stack is held back")
	}
	if w.holdBack(9, t0, false) {
		t.Error("a process started later is held back")
	}

	// Prepared at t0: held back until a whole stack after t0.
	w.prepared(1, t0)
	w.prepared(1, t0.add(time.Minute))
	if !w.holdBack(1, t0.add(time.Millisecond), false) {
		t.Error("a cut-short stack right after the preparation, before any whole one, is not held back")
	}
	if w.holdBack(1, t0.add(-time.Millisecond), true); !w.holdBack(1, t0.add(2*time.Millisecond), false) {
		t.Error("a whole stack taken before the preparation ended ended the warm-up")
	}
	w.holdBack(1, t0.add(3*time.Millisecond), true)
	if w.holdBack(1, t0.add(4*time.Millisecond), false) {
		t.Error("a cut-short stack after a whole one is still held back")
	}

	// Prepared, never whole: held back for warmUpGrace only.
	w.prepared(3, t0)
	if !w.holdBack(3, t0.add(warmUpGrace-time.Millisecond), false) || w.holdBack(3, t0.add(warmUpGrace), false) {
		t.Error("without a whole stack: want held back until warmUpGrace after the preparation, not after")
	}

	w.forget(2)
	if w.holdBack(2, t0, false) {
		t.Error("a process forgotten (exec, exit) is still held back")
	}
	w.prepared(9, t0)
	if w.holdBack(9, t0.add(-time.Second), false) {
		t.Error("preparing a process the scan did not find made it held back")
	}
}
