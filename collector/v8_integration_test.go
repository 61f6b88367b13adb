//go:build linux

package collector_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// nodeBuild is one Node binary the V8 tests run.
type nodeBuild struct {
	name, bin string
}

// nodeBuilds are Debian's Node and npm's official build of every major
// testutil.NodeMajors lists; a missing one is skipped, or fails under CI.
func nodeBuilds(t *testing.T) []nodeBuild {
	t.Helper()
	var out []nodeBuild
	if _, err := os.Stat("/usr/bin/node"); err == nil {
		out = append(out, nodeBuild{"debian", "/usr/bin/node"})
	} else if testutil.InCI() {
		t.Fatalf("Debian's node is not installed (CI=true: the tests need it): %v", err)
	}
	for _, major := range testutil.NodeMajors {
		out = append(out, nodeBuild{fmt.Sprintf("node%d", major), testutil.NodeBinary(t, major)})
	}
	return out
}

// startNodeScript runs node on script until the test ends and returns its
// pid once it printed "ready".
func startNodeScript(t *testing.T, node, script string) int {
	t.Helper()
	cmd := exec.Command(node, script)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if sc.Text() == "ready" {
			return cmd.Process.Pid
		}
	}
	t.Fatalf("%s %s never said ready", node, script)
	return 0
}

// jsFrame is one JavaScript function of a sample (an inline level of a
// location is one too), leaf first.
type jsFrame struct {
	jvmLine
	Tier string
}

// jsFrames are the v8js frames of s with a name, stubs left out.
func jsFrames(s jvmSample) (out []jsFrame, below []string) {
	for i, l := range s.Locs {
		if l.Type != "v8js" {
			if len(out) > 0 && s.Frames[i].Function != "" {
				below = append(below, s.Frames[i].Function)
			}
			continue
		}
		if l.Tier == "stub" {
			continue
		}
		for _, ln := range l.Lines {
			out = append(out, jsFrame{ln, l.Tier})
		}
		if len(l.Lines) == 0 {
			out = append(out, jsFrame{jvmLine{Function: unnamed}, l.Tier})
		}
	}
	return out, below
}

// TestV8Stacks runs burn.js (main -> nodeAlpha -> nodeBeta ->
// nodeGammaBurn, a CPU loop) on Debian's Node and on npm's official
// binary of every tested major, all started after the receiver, and
// counts from each one's first sample in nodeGammaBurn: at least 99 % of
// them carry the whole chain in order (as frames or inline levels), each
// with burn.js and a line, frame type v8js and a tier, and then node's
// C++ frames down to node::Start.
func TestV8Stacks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	builds := nodeBuilds(t)
	script, err := filepath.Abs("../internal/v8/testdata/burn.js")
	if err != nil {
		t.Fatal(err)
	}
	sink := startReceiver(t, jvmRate)
	names := map[int64]string{}
	for _, b := range builds {
		names[int64(startNodeScript(t, b.bin, script))] = b.name
	}
	type tally struct {
		leaf, whole int
		tiers       map[string]int
		bad         []string
	}
	got := map[int64]*tally{}
	for pid := range names {
		got[pid] = &tally{tiers: map[string]int{}}
	}
	chain := []string{"nodeGammaBurn", "nodeBeta", "nodeAlpha", "main"}
	const n = 400
	enough := func() bool {
		for _, tl := range got {
			if tl.leaf < n {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(3 * time.Minute)
	read := 0
	for time.Now().Before(deadline) && !enough() {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range jvmFlatten(pd) {
				tl, ok := got[s.PID]
				if !ok {
					continue
				}
				fs, below := jsFrames(s)
				if len(fs) == 0 || fs[0].Function != chain[0] {
					continue
				}
				tl.leaf += s.Count
				tl.tiers[fs[0].Tier] += s.Count
				if err := wholeJSChain(fs, below, chain); err != nil {
					if len(tl.bad) < 5 {
						tl.bad = append(tl.bad, fmt.Sprintf("%v: %v / %v", err, fs, below))
					}
					continue
				}
				tl.whole += s.Count
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	for pid, tl := range got {
		t.Logf("burn.js, %s: %d of %d nodeGammaBurn samples whole (%.2f %%); leaf tiers %v",
			names[pid], tl.whole, tl.leaf, 100*float64(tl.whole)/float64(max(tl.leaf, 1)), tl.tiers)
		for _, b := range tl.bad {
			t.Logf("  not whole: %s", b)
		}
		if tl.leaf < n {
			t.Errorf("%s: %d samples in nodeGammaBurn, want %d", names[pid], tl.leaf, n)
		}
		if tl.whole*100 < tl.leaf*99 {
			t.Errorf("%s: %d of %d nodeGammaBurn samples whole, want 99 %%", names[pid], tl.whole, tl.leaf)
		}
	}
}

// wholeJSChain checks that fs holds chain in order from its leaf, each
// with burn.js, a line and a tier, and that node's C++ frames below reach
// node::Start.
func wholeJSChain(fs []jsFrame, below []string, chain []string) error {
	k := 0
	for _, f := range fs {
		if k < len(chain) && f.Function == chain[k] {
			if filepath.Base(f.File) != "burn.js" || f.Line <= 0 || f.Tier == "" {
				return fmt.Errorf("%s at %s:%d tier %q", f.Function, f.File, f.Line, f.Tier)
			}
			k++
		}
	}
	if k < len(chain) {
		return fmt.Errorf("chain ends before %s", chain[k])
	}
	for _, fn := range below {
		if strings.HasPrefix(fn, "node::Start") {
			return nil
		}
	}
	return fmt.Errorf("no node::Start below the JavaScript")
}
