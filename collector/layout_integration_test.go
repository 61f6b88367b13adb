package collector_test

import (
	"bufio"
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// perfShare records pid with `perf record --call-graph dwarf` for the
// duration of wait and returns, of the samples of its main thread, how many
// match (their function names, leaf first), and how many there were.
func perfShare(t *testing.T, pid int, match func([]string) bool, wait func()) (complete, total int) {
	t.Helper()
	perf := testutil.RequireTool(t, "perf")
	data := filepath.Join(t.TempDir(), "perf.data")
	// perf records until its command ends; the test ends it once Sonde has
	// its samples, so both watched the same stretch of the process.
	rec := exec.Command(perf, "record", "-q", "-F", "499", "--call-graph", "dwarf", "-p", strconv.Itoa(pid), "-o", data, "--", "sleep", "600")
	var recErr bytes.Buffer
	rec.Stderr = &recErr
	testutil.StartCmd(t, rec)
	wait()
	// perf's child (sleep) ends, perf writes its file and exits.
	if err := exec.Command("pkill", "-P", strconv.Itoa(rec.Process.Pid), "sleep").Run(); err != nil {
		t.Fatalf("ending perf record: %v", err)
	}
	// perf passes its workload's end on: it dies by the sleep's SIGTERM,
	// after it has written its data.
	var exit *exec.ExitError
	if err := rec.Wait(); err != nil && (!errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM) {
		t.Fatalf("perf record: %v\n%s", err, recErr.Bytes())
	}
	out, err := exec.Command(perf, "script", "-i", data, "-F", "tid,ip,sym").Output()
	if err != nil {
		t.Fatalf("perf script: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	var tid int
	var syms []string
	flush := func() {
		if tid == pid {
			total++
			if match(syms) {
				complete++
			}
		}
		tid, syms = 0, nil
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case !strings.HasPrefix(line, "\t"):
			tid, _ = strconv.Atoi(strings.TrimSpace(line))
		default:
			if f := strings.Fields(line); len(f) >= 2 {
				syms = append(syms, f[1])
			}
		}
	}
	flush()
	return complete, total
}

// Programs linked by lld (stable Rust's linker), mold and BOLT lay out
// their code segments with an address a page above their file offset, or
// with several offset-to-address shifts: Sonde unwinds them as well as
// perf's DWARF unwinder does on the same process at the same time.
func TestUnwindLayoutsAgainstPerf(t *testing.T) {
	want := map[string]bool{"c-lld-pie": true, "c-lld-bolt": true, "c-mold-nopie": true, "rust": true, "rust-lld-bolt": true}
	for _, l := range testutil.Layouts() {
		if !want[l.Name] {
			continue
		}
		t.Run(l.Name, func(t *testing.T) {
			sink := startReceiver(t, 499)
			bin := testutil.BuildLayout(t, l)
			cmd := testutil.StartWorkload(t, bin)
			// The workload's chain, leaf first, then C's main below it
			// (Rust's main calls the program's through its runtime).
			chain := l.Functions()
			match := func(user []string) bool {
				i := slices.Index(user, chain[len(chain)-1])
				return followsChain(user, chain) && (!l.Rust || i >= 0 && slices.Contains(user[i:], "main"))
			}
			var complete, total int
			var bad []flatSample
			perfComplete, perfTotal := perfShare(t, cmd.Process.Pid, match, func() {
				complete, total, bad = completeShare(t, sink, cmd.Process.Pid, 1500, func(frames []frame) bool {
					return match(userNames(frames))
				})
			})
			share := 100 * float64(complete) / float64(max(total, 1))
			perf := 100 * float64(perfComplete) / float64(max(perfTotal, 1))
			t.Logf("%s: Sonde %d of %d samples (%.2f %%) whole down to main, from the program's first sample; perf --call-graph dwarf %d of %d (%.2f %%)",
				l.Name, complete, total, share, perfComplete, perfTotal, perf)
			for i, s := range bad {
				if i == 5 {
					break
				}
				t.Logf("  incomplete: %s", functions(s.Frames))
			}
			if total < 1500 || share < 99.5 {
				t.Errorf("%s: %.2f %% of %d samples whole, want at least 99.5 %% of at least 1500", l.Name, share, total)
			}
			if perfTotal < 500 || share < perf-1 {
				t.Errorf("%s: Sonde %.2f %% whole, perf %.2f %% of %d samples; want perf's share at least (less 1 point) over at least 500", l.Name, share, perf, perfTotal)
			}
		})
	}
}
