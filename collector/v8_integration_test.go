//go:build linux

package collector_test

import (
	"encoding/json"
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
		cmd := exec.Command(b.bin, script)
		cmd.Stderr = os.Stderr
		testutil.StartReady(t, cmd, 30*time.Second)
		names[int64(cmd.Process.Pid)] = b.name
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

// cpuProfile is what the tests read of a .cpuprofile (node --cpu-prof).
type cpuProfile struct {
	Nodes []struct {
		ID        int `json:"id"`
		CallFrame struct {
			FunctionName string `json:"functionName"`
			URL          string `json:"url"`
			LineNumber   int    `json:"lineNumber"` // from 0
			ColumnNumber int    `json:"columnNumber"`
		} `json:"callFrame"`
		Children []int `json:"children"`
	} `json:"nodes"`
	Samples []int `json:"samples"`
}

// jsShares returns, over the samples whose leaf is a JavaScript function
// of script, each leaf function's share and each chain's (the leaf, then
// its callers in script, joined by " <- "), in percent, and how many
// samples that was.
type jsShares struct {
	leaves, chains map[string]float64
	n              int
}

func (s *jsShares) add(fns []string, count int) {
	if len(fns) == 0 {
		return
	}
	s.leaves[fns[0]] += float64(count)
	s.chains[strings.Join(fns, " <- ")] += float64(count)
	s.n += count
}

func (s *jsShares) percent() {
	for _, m := range []map[string]float64{s.leaves, s.chains} {
		for k := range m {
			m[k] *= 100 / float64(max(s.n, 1))
		}
	}
}

func newJSShares() *jsShares {
	return &jsShares{leaves: map[string]float64{}, chains: map[string]float64{}}
}

// cpuProfShares reads a .cpuprofile: the function of each sample's node
// and its ancestors' in script, leaf first.
func cpuProfShares(t *testing.T, path, script string) *jsShares {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var p cpuProfile
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	parent := map[int]int{}
	idx := map[int]int{}
	for i, n := range p.Nodes {
		idx[n.ID] = i
		for _, c := range n.Children {
			parent[c] = n.ID
		}
	}
	s := newJSShares()
	for _, id := range p.Samples {
		var fns []string
		for at, ok := id, true; ok; at, ok = parent[at] {
			cf := p.Nodes[idx[at]].CallFrame
			if strings.HasSuffix(cf.URL, "/"+script) {
				fn := cf.FunctionName
				if fn == "" { // as Sonde names an anonymous function
					fn = fmt.Sprintf("<anonymous@%d:%d>", cf.LineNumber+1, cf.ColumnNumber+1)
				}
				fns = append(fns, fn)
			} else if len(fns) == 0 {
				break // the leaf is not the script's: (garbage collector), a builtin, ...
			}
		}
		s.add(fns, 1)
	}
	s.percent()
	return s
}

// TestV8AgainstCPUProf runs mix.js (two leaves, two calls to one, under
// one chain) for 20 s under node --cpu-prof on each Node, profiled by the
// receiver from its start: over each one's whole run, every leaf function
// and every chain (the leaf and its callers in mix.js) over 1 % of either
// profiler's samples with a JavaScript leaf has the same share in both,
// within 5 points. Inlining is off in TurboFan and Maglev: with it on,
// --cpu-prof gives a third of the leaves' samples to their callers (the
// positions optimized code keeps are sparse) where Sonde shows the
// inlined functions, so the oracle would be wrong, not Sonde.
func TestV8AgainstCPUProf(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	builds := nodeBuilds(t)
	script, err := filepath.Abs("../internal/v8/testdata/mix.js")
	if err != nil {
		t.Fatal(err)
	}
	sink := startReceiver(t, jvmRate)
	type run struct {
		name string
		cmd  *exec.Cmd
		dir  string
	}
	var runs []run
	for _, b := range builds {
		dir := t.TempDir()
		args := []string{"--cpu-prof", "--cpu-prof-dir=" + dir, "--no-turbo-inlining"}
		if out, err := exec.Command(b.bin, "--v8-options").Output(); err == nil && strings.Contains(string(out), "--maglev-inlining") {
			args = append(args, "--no-maglev-inlining")
		}
		cmd := exec.Command(b.bin, append(args, script, "20")...)
		cmd.Stderr = os.Stderr
		testutil.StartCmd(t, cmd)
		runs = append(runs, run{b.name, cmd, dir})
	}
	for _, r := range runs {
		if err := r.cmd.Wait(); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
	}
	// The receiver exports what it holds of the exited processes at its
	// next intervals.
	waitForExport(sink, len(sink.AllProfiles())+3, 30*time.Second)
	sonde := map[int64]*jsShares{}
	for _, r := range runs {
		sonde[int64(r.cmd.Process.Pid)] = newJSShares()
	}
	for _, pd := range sink.AllProfiles() {
		for _, s := range jvmFlatten(pd) {
			sh, ok := sonde[s.PID]
			if !ok {
				continue
			}
			fs, _ := jsFrames(s)
			var fns []string
			for _, f := range fs {
				if filepath.Base(f.File) == "mix.js" {
					fns = append(fns, f.Function)
				} else if len(fns) == 0 {
					break
				}
			}
			sh.add(fns, s.Count)
		}
	}
	for _, r := range runs {
		files, err := filepath.Glob(filepath.Join(r.dir, "*.cpuprofile"))
		if err != nil || len(files) != 1 {
			t.Fatalf("%s: node --cpu-prof wrote %v (%v)", r.name, files, err)
		}
		want := cpuProfShares(t, files[0], "mix.js")
		got := sonde[int64(r.cmd.Process.Pid)]
		got.percent()
		t.Logf("%s: --cpu-prof %d samples, Sonde %d with a mix.js leaf", r.name, want.n, got.n)
		if want.n < 1000 || got.n < 500 {
			t.Errorf("%s: %d --cpu-prof and %d Sonde samples with a mix.js leaf, want 1,000 and 500", r.name, want.n, got.n)
			continue
		}
		for _, kind := range []struct {
			name      string
			got, want map[string]float64
		}{{"leaf", got.leaves, want.leaves}, {"chain", got.chains, want.chains}} {
			keys := map[string]bool{}
			for k, v := range kind.got {
				keys[k] = keys[k] || v >= 1
			}
			for k, v := range kind.want {
				keys[k] = keys[k] || v >= 1
			}
			for k, big := range keys {
				if !big {
					continue
				}
				t.Logf("  %s %s: --cpu-prof %.1f %%, Sonde %.1f %%", kind.name, k, kind.want[k], kind.got[k])
				if d := kind.got[k] - kind.want[k]; d > 5 || d < -5 {
					t.Errorf("%s: %s %s: Sonde %.1f %% of samples, --cpu-prof %.1f %%: more than 5 points apart", r.name, kind.name, k, kind.got[k], kind.want[k])
				}
			}
		}
	}
}
