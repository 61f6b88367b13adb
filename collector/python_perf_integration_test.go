package collector_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// perfPyFrame matches a Python frame in perf script's output: a perf
// trampoline named py::<qualified name>:<file>.
var perfPyFrame = regexp.MustCompile(`\spy::([^:\s]+):(\S+)`)

// TestPythonAgainstPerf checks the Python frames against an independent
// oracle: CPython's own perf support. The burn workload runs under
// `perf record` and under the receiver at the same time; the Python
// function sequence (leaf first) most of perf's samples show must be the
// one most of Sonde's samples show, and both the workload's chain.
//
// Only 3.13 gives perf a chain it can follow: with -X perf_jit the
// interpreter writes a jitdump whose trampolines carry CFI, so `perf
// record -k 1 --call-graph dwarf` then `perf inject --jit` unwinds through
// every Python call. 3.12 has -X perf only (perf_jit is 3.13+), whose
// trampolines live in anonymous memory named by /tmp/perf-PID.map, without
// CFI: `perf record -g` finds no Python frame at all (pyenv's libpython
// 3.12.1 has no frame pointers, so the chain breaks in its first frame),
// and --call-graph dwarf stops at the first trampoline (perf's libdw
// unwinder does not fall back to frame pointers there), so perf shows the
// leaf Python function only. (Sonde itself unwinds 3.12's trampolines:
// TestPythonStacks/perf-trampoline.)
func TestPythonAgainstPerf(t *testing.T) {
	perf := testutil.RequireTool(t, "perf")
	testutil.RequireRoot(t, "perf record of a python workload")
	wl := pyWorkload(t)
	want := []string{"gamma_burn", "Beta.method", "alpha", "<module>"}
	for _, in := range pyInterpreters(t) {
		if in.minor < 12 {
			continue // no perf support before 3.12
		}
		t.Run(in.name, func(t *testing.T) {
			if in.minor == 12 {
				t.Skip("3.12 has -X perf only: its trampolines have no CFI, so perf --call-graph dwarf stops at the first " +
					"one and perf -g finds no Python frame (libpython 3.12.1 lacks frame pointers); -X perf_jit is 3.13+")
			}
			dir := t.TempDir()
			data := filepath.Join(dir, "perf.data")
			cmd := exec.Command(perf, "record", "-F", "199", "-k", "1", "--call-graph", "dwarf", "-o", data, "--",
				in.bin, "-X", "perf_jit", wl, "burn")
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			testutil.StartCmd(t, cmd)
			if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
				t.Fatalf("workload under perf: %q, %v", line, err)
			}
			pid := perfChild(t, cmd.Process.Pid)
			t.Cleanup(func() {
				// What -X perf_jit and perf inject leave in /tmp.
				for _, pat := range []string{"jit-%d.dump", "jitted-%d-*.so", "perf-%d.map"} {
					files, _ := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf(pat, pid)))
					for _, f := range files {
						_ = os.Remove(f)
					}
				}
			})

			// Sonde's samples of the workload while perf records it.
			sink := startReceiver(t, 99)
			const n = 200
			sonde := map[string]int{}
			total := 0
			deadline := time.Now().Add(120 * time.Second)
			for read := 0; total < n && time.Now().Before(deadline); {
				all := sink.AllProfiles()
				for _, pd := range all[read:] {
					for _, s := range flatten(pd) {
						if s.PID != int64(pid) || s.Type != "samples" {
							continue
						}
						var seq []string
						for _, f := range s.Frames {
							if f.Type == "cpython" {
								seq = append(seq, f.Function)
							}
						}
						sonde[strings.Join(seq, " <- ")] += s.Count
						total += s.Count
					}
				}
				read = len(all)
				waitForExport(sink, read, time.Until(deadline))
			}
			if total < n {
				t.Fatalf("sonde: %d samples of the workload in 120 s, want %d", total, n)
			}

			// Interrupt the interpreter: it exits, flushing its jitdump,
			// and perf record writes its data once its child is gone.
			if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			waitExit(t, cmd, 60*time.Second)
			inj := filepath.Join(dir, "perf.jit.data")
			if b, err := exec.Command(perf, "inject", "--jit", "-i", data, "-o", inj).CombinedOutput(); err != nil {
				t.Fatalf("perf inject --jit: %v\n%s", err, b)
			}
			script, err := exec.Command(perf, "script", "-i", inj, "-F", "tid,ip,sym").Output()
			if err != nil {
				t.Fatalf("perf script: %v", err)
			}
			perfSeqs, perfTotal := map[string]int{}, 0
			for _, sample := range strings.Split(string(script), "\n\n") {
				lines := strings.Split(strings.TrimSpace(sample), "\n")
				if tid, err := strconv.Atoi(strings.TrimSpace(lines[0])); err != nil || tid != pid {
					continue
				}
				var seq []string
				for _, l := range lines[1:] {
					if m := perfPyFrame.FindStringSubmatch(l); m != nil {
						seq = append(seq, m[1])
					}
				}
				perfSeqs[strings.Join(seq, " <- ")]++
				perfTotal++
			}

			wantSeq := strings.Join(want, " <- ")
			sondeTop, sondeN := majority(sonde)
			perfTop, perfN := majority(perfSeqs)
			t.Logf("sonde: %d/%d samples %q; perf: %d/%d samples %q", sondeN, total, sondeTop, perfN, perfTotal, perfTop)
			t.Logf("sonde's sequences: %v", top(sonde, 5))
			t.Logf("perf's sequences: %v", top(perfSeqs, 5))
			if perfTotal < 100 {
				t.Errorf("perf recorded %d samples of the workload, want at least 100", perfTotal)
			}
			if perfTop != wantSeq || 2*perfN <= perfTotal {
				t.Errorf("perf: most samples (%d of %d) show %q, want a majority showing %q", perfN, perfTotal, perfTop, wantSeq)
			}
			if sondeTop != perfTop || 2*sondeN <= total {
				t.Errorf("sonde: most samples (%d of %d) show %q, perf's majority shows %q", sondeN, total, sondeTop, perfTop)
			}
		})
	}
}

// perfChild returns the PID of the workload perf record started.
func perfChild(t *testing.T, perfPID int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", perfPID, perfPID))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("perf record %d has children %q, want one", perfPID, f)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitExit waits for cmd to exit, killing it past timeout.
func waitExit(t *testing.T, cmd *exec.Cmd, timeout time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // how the workload ended is not under test, only that it did
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not exit in %v", cmd.Path, timeout)
	}
}

// majority returns the most frequent key of counts and its count.
func majority(counts map[string]int) (string, int) {
	best, n := "", -1
	for k, v := range counts {
		if v > n || v == n && k < best {
			best, n = k, v
		}
	}
	return best, n
}

// top formats the k most frequent keys of counts.
func top(counts map[string]int, k int) string {
	keys := make([]string, 0, len(counts))
	for key := range counts {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	var b []string
	for _, key := range keys[:min(k, len(keys))] {
		b = append(b, fmt.Sprintf("%d %q", counts[key], key))
	}
	return strings.Join(b, "; ")
}
