package collector_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/profiler"
)

// The issue "Whole stacks on real programs, from their first sample": each
// program below runs under `perf record --call-graph dwarf` and under the
// receiver at the same time, from its start; every sample of it that the
// receiver exported counts, warm-up included.

// wholeFlags build the fixtures without frame pointers, keeping calls as
// calls so the chain is real: only the unwind tables find the callers.
var wholeFlags = []string{"-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"}

// wholeRate is the sampling rate of both the receiver and perf.
const wholeRate = 499

// rooted reports whether a stack perf unwound (its names, leaf first,
// kernel frames included) reaches the process's root, as far as names tell:
// main (the existing tests' root: TestUnwindLayoutsAgainstPerf), libc's
// __libc_start_main below a main without a name (a stripped program), or
// the dynamic loader's _start (samples before main). perf has no mark for
// a stack it could not finish; Sonde has one: see sondeWhole.
func rooted(names, chain []string) bool {
	if len(names) == 0 {
		return false
	}
	root := names[len(names)-1] == "_start" || slices.Contains(names, "main") ||
		slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "__libc_start_main") })
	return root && chained(names, chain)
}

// chained reports whether a stack that holds the leaf of chain (leaf
// first) shows the whole chain below it.
func chained(names, chain []string) bool {
	if len(chain) > 0 && slices.Contains(names, chain[0]) {
		return followsChain(names, chain)
	}
	return true
}

// sondeWhole reports whether Sonde's stack is whole: its unwinder reached
// the outermost frame (an unwind row that ends the stack: _start, a
// thread's start, the loader's entry), so it did not mark the stack
// [truncated], and where it holds the workload's leaf it names the chain.
func sondeWhole(user, chain []string) bool {
	return len(user) > 0 && !slices.Contains(user, profiler.TruncatedFrame) && chained(user, chain)
}

// perfSample is one sample perf script printed.
type perfSample struct {
	pid, tid int
	comm     string
	syms     []string // leaf first, kernel frames included
}

// perfRun runs args under `perf record --call-graph dwarf`, which follows
// the workload's children (fork and exec), waits until the workload and
// perf exit (at most timeout), and returns perf's samples and the
// workload's PID.
func perfRun(t *testing.T, rate int, timeout time.Duration, args ...string) ([]perfSample, int) {
	t.Helper()
	perf := testutil.RequireTool(t, "perf")
	data := filepath.Join(t.TempDir(), "perf.data")
	rec := exec.Command(perf, append([]string{"record", "-q", "-F", strconv.Itoa(rate), "--call-graph", "dwarf", "-o", data, "--"}, args...)...)
	var out bytes.Buffer
	rec.Stdout, rec.Stderr = &out, &out
	testutil.StartCmd(t, rec)
	pid := 0
	done := make(chan error, 1)
	go func() { done <- rec.Wait() }()
	// perf forks the workload at once; it execs when perf has its events.
	for deadline := time.Now().Add(10 * time.Second); pid == 0 && time.Now().Before(deadline); {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", rec.Process.Pid, rec.Process.Pid))
		if f := strings.Fields(string(b)); len(f) > 0 {
			pid, _ = strconv.Atoi(f[0])
		} else {
			time.Sleep(time.Millisecond) // poll interval of the condition above
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("perf record %s: %v\n%s", strings.Join(args, " "), err, out.Bytes())
		}
	case <-time.After(timeout):
		_ = rec.Process.Kill()
		if err := <-done; err != nil {
			t.Logf("perf record, killed: %v", err)
		}
		t.Fatalf("perf record %s: not done in %v", strings.Join(args, " "), timeout)
	}
	script, err := exec.Command(perf, "script", "-i", data, "-F", "comm,pid,tid,ip,sym").Output()
	if err != nil {
		t.Fatalf("perf script: %v", err)
	}
	var samples []perfSample
	sc := bufio.NewScanner(bytes.NewReader(script))
	sc.Buffer(nil, 1<<20)
	var cur *perfSample
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			cur = nil
		case !strings.HasPrefix(line, "\t"):
			// "comm pid/tid": the command may hold spaces.
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			ids := strings.SplitN(f[len(f)-1], "/", 2)
			if len(ids) != 2 {
				continue
			}
			p, _ := strconv.Atoi(ids[0])
			tid, _ := strconv.Atoi(ids[1])
			samples = append(samples, perfSample{pid: p, tid: tid, comm: strings.Join(f[:len(f)-1], " ")})
			cur = &samples[len(samples)-1]
		case cur != nil:
			if f := strings.Fields(line); len(f) >= 2 {
				cur.syms = append(cur.syms, f[1])
			}
		}
	}
	return samples, pid
}

// sondeSamples waits until the receiver exported an interval that ends
// after the workload did (on a busy host it lags; Shutdown hands over only
// what it resolves within its grace), stops it so it hands over the rest,
// and returns every on-CPU sample it exported that keep selects.
func sondeSamples(t *testing.T, sink *consumertest.ProfilesSink, rcv xreceiver.Profiles, keep func(flatSample) bool) []flatSample {
	t.Helper()
	ended := time.Now()
	deadline := ended.Add(30 * time.Second)
	for latestEnd(sink).Before(ended) && time.Now().Before(deadline) {
		waitForExport(sink, len(sink.AllProfiles()), time.Until(deadline))
	}
	if err := rcv.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	var out []flatSample
	for _, pd := range sink.AllProfiles() {
		for _, s := range flatten(pd) {
			if s.Type == "samples" && keep(s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// wholeShares counts the whole samples of both tools and logs the figures
// and a few of the stacks that were not whole.
func wholeShares(t *testing.T, what string, sonde []flatSample, perf []perfSample, chain []string) (share, perfShare float64, total, perfTotal int) {
	t.Helper()
	complete := 0
	var bad []flatSample
	badBy := map[int64]int{}
	for _, s := range sonde {
		user := userNames(s.Frames)
		total += s.Count
		if sondeWhole(user, chain) {
			complete += s.Count
			continue
		}
		badBy[s.PID] += s.Count
		if len(bad) < 8 {
			bad = append(bad, s)
		}
	}
	perfComplete := 0
	var perfBad [][]string
	for _, s := range perf {
		perfTotal++
		if rooted(s.syms, chain) {
			perfComplete++
		} else if len(perfBad) < 3 {
			perfBad = append(perfBad, s.syms)
		}
	}
	share = 100 * float64(complete) / float64(max(total, 1))
	perfShare = 100 * float64(perfComplete) / float64(max(perfTotal, 1))
	t.Logf("%s: Sonde %d of %d samples whole (%.2f %%), all from the first export; perf --call-graph dwarf %d of %d (%.2f %%)",
		what, complete, total, share, perfComplete, perfTotal, perfShare)
	if len(badBy) > 0 {
		t.Logf("  Sonde's samples not whole, by process: %v", badBy)
	}
	for _, s := range bad {
		t.Logf("  Sonde, not whole (pid %d): %s", s.PID, functions(s.Frames))
	}
	for _, syms := range perfBad {
		t.Logf("  perf, not whole: %s", strings.Join(syms, " <- "))
	}
	return share, perfShare, total, perfTotal
}

// A program forks children that never exec: each runs main -> child_work
// -> burn in the parent's image. The children are new processes the
// profiler never saw exec; their stacks unwind whole and named from their
// first sample, from the file tables the parent's image already has.
func TestWholeStacksForkedChildren(t *testing.T) {
	testutil.RequireRoot(t, "perf record of forked children")
	bin := testutil.BuildC(t, "forkchild", wholeFlags, filepath.Join("testdata", "wholestack", "forkchild.c"))
	sink, rcv := startReceiverWith(t, wholeRate)
	// Eight children of 1.5 s each, one at a time.
	perf, parent := perfRun(t, wholeRate, 60*time.Second, bin, "8", "1500")
	const comm = "forkchild-w"
	var child []perfSample
	for _, s := range perf {
		if s.comm == comm && s.pid != parent {
			child = append(child, s)
		}
	}
	sonde := sondeSamples(t, sink, rcv, func(s flatSample) bool {
		return s.ExePath == bin && s.PID != int64(parent) && s.ThreadName == comm
	})
	chain := []string{"burn", "child_work", "main"}
	share, perfShare, total, perfTotal := wholeShares(t, "forked children", sonde, child, chain)
	if total < 2000 || share < 99.5 {
		t.Errorf("forked children: %.2f %% of %d samples whole, want at least 99.5 %% of at least 2000", share, total)
	}
	if perfTotal < 1000 || share < perfShare-1 {
		t.Errorf("forked children: Sonde %.2f %% whole, perf %.2f %% of %d; want perf's share at least (less 1 point) over at least 1000", share, perfShare, perfTotal)
	}
	// Every child's leaf is named: the chain is read from the parent's
	// image, whose symbols the children share.
	named := 0
	for _, s := range sonde {
		if followsChain(userNames(s.Frames), chain) {
			named += s.Count
		}
	}
	if named*2 < total {
		t.Errorf("forked children: %d of %d samples show %s, want most", named, total, strings.Join(chain, " <- "))
	}
}

// fillerAsm writes n small functions with CFI (local symbols, so the
// dynamic symbol table stays small) to an assembly file in dir.
func fillerAsm(t *testing.T, dir, name string, n int) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("\t.text\n")
	for i := range n {
		fmt.Fprintf(&b, `	.type %[1]s_%[2]d, @function
%[1]s_%[2]d:
	.cfi_startproc
	pushq %%rbx
	.cfi_def_cfa_offset 16
	.cfi_offset 3, -16
	leaq %[2]d(%%rdi), %%rbx
	movq %%rbx, %%rax
	popq %%rbx
	.cfi_def_cfa_offset 8
	ret
	.cfi_endproc
	.size %[1]s_%[2]d, .-%[1]s_%[2]d
`, name, i)
	}
	b.WriteString("\t.section .note.GNU-stack,\"\",@progbits\n")
	path := filepath.Join(dir, name+".s")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A long-running program loads a big library (100,000 functions besides
// its chain, megabytes of CFI) a second after the agent started, and burns
// CPU in it: main -> lib_outer -> lib_middle -> lib_inner. The library is
// new to the agent, so its table is built while the program already runs
// in it; at least 99.5 % of the program's samples are whole all the same.
func TestWholeStacksLateBigLibrary(t *testing.T) {
	testutil.RequireRoot(t, "perf record of a program loading a library late")
	dir := t.TempDir()
	lib := testutil.BuildC(t, "biglib.so", append([]string{"-shared", "-fPIC"}, wholeFlags...),
		fillerAsm(t, dir, "before", 50000), filepath.Join("testdata", "wholestack", "biglib.c"), fillerAsm(t, dir, "after", 50000))
	bin := testutil.BuildC(t, "lateload", wholeFlags, filepath.Join("testdata", "wholestack", "lateload.c"))
	sink, rcv := startReceiverWith(t, wholeRate)
	perf, _ := perfRun(t, wholeRate, 60*time.Second, bin, lib, "6000")
	var main []perfSample
	for _, s := range perf {
		if s.comm == "lateload" && s.pid == s.tid {
			main = append(main, s)
		}
	}
	sonde := sondeSamples(t, sink, rcv, func(s flatSample) bool { return s.ExePath == bin && s.TID == s.PID })
	chain := []string{"lib_inner", "lib_middle", "lib_outer", "main"}
	share, perfShare, total, perfTotal := wholeShares(t, "late big library", sonde, main, chain)
	if total < 1500 || share < 99.5 {
		t.Errorf("late big library: %.2f %% of %d samples whole, want at least 99.5 %% of at least 1500", share, total)
	}
	if perfTotal < 1000 || share < perfShare-1 {
		t.Errorf("late big library: Sonde %.2f %% whole, perf %.2f %% of %d; want perf's share at least (less 1 point) over at least 1000", share, perfShare, perfTotal)
	}
}

// A loop runs one short program after another, each exec'd anew and
// living 300 ms on the CPU (main -> work -> burn): most of a process's
// life is its start, when its tables are being prepared.
func TestWholeStacksShortProcesses(t *testing.T) {
	testutil.RequireRoot(t, "perf record of a loop of short processes")
	bin := testutil.BuildC(t, "shortburn", wholeFlags, filepath.Join("testdata", "wholestack", "shortburn.c"))
	sink, rcv := startReceiverWith(t, wholeRate)
	perf, _ := perfRun(t, wholeRate, 60*time.Second, "/bin/sh", "-c", `for i in $(seq 20); do "$0" 300 || exit 1; done`, bin)
	var runs []perfSample
	for _, s := range perf {
		if s.comm == "shortburn" {
			runs = append(runs, s)
		}
	}
	sonde := sondeSamples(t, sink, rcv, func(s flatSample) bool { return s.ExePath == bin })
	chain := []string{"burn", "work", "main"}
	share, perfShare, total, perfTotal := wholeShares(t, "300 ms processes", sonde, runs, chain)
	if total < 1000 || perfTotal < 1000 || share < perfShare-1 {
		t.Errorf("300 ms processes: Sonde %.2f %% of %d samples whole, perf %.2f %% of %d; want perf's share at least (less 1 point) over at least 1000 each",
			share, total, perfShare, perfTotal)
	}
	// Each sample is its program's: one whose process was gone before
	// it was read would lack the executable's path.
	if total < perfTotal*9/10 {
		t.Errorf("300 ms processes: Sonde attributed %d samples to the program, perf %d; want at least 90 %% of perf's", total, perfTotal)
	}
}

// A loop compiles a C++ file again and again with g++: each compile is a
// new cc1plus (a big stripped binary) living a second or two. Its stacks
// reach __libc_start_main below cc1plus's main (unnamed: stripped).
func TestWholeStacksCompileLoop(t *testing.T) {
	testutil.RequireRoot(t, "perf record of a compile loop")
	gxx := testutil.RequireTool(t, "g++")
	src, err := filepath.Abs(filepath.Join("testdata", "wholestack", "compile.cc"))
	if err != nil {
		t.Fatal(err)
	}
	// A lower rate than the other tests: perf's DWARF unwinding of
	// cc1plus's deep stacks (perf script) costs far more than the compiles.
	const rate = 199
	sink, rcv := startReceiverWith(t, rate)
	perf, _ := perfRun(t, rate, 90*time.Second, "/bin/sh", "-c", `for i in 1 2 3 4 5 6; do "$0" -O1 -c "$1" -o /dev/null || exit 1; done`, gxx, src)
	// The loop's compilers, as perf saw them: other compiles may run on
	// the host, which Sonde profiles too.
	var cc1 []perfSample
	pids := map[int64]bool{}
	for _, s := range perf {
		if s.comm == "cc1plus" {
			cc1 = append(cc1, s)
			pids[int64(s.pid)] = true
		}
	}
	sonde := sondeSamples(t, sink, rcv, func(s flatSample) bool { return s.ExeName == "cc1plus" && pids[s.PID] })
	share, perfShare, total, perfTotal := wholeShares(t, "cc1plus", sonde, cc1, nil)
	if total < 500 || perfTotal < 500 || share < perfShare-1 {
		t.Errorf("cc1plus: Sonde %.2f %% of %d samples whole, perf %.2f %% of %d; want perf's share at least (less 1 point) over at least 500 each",
			share, total, perfShare, perfTotal)
	}
}
