package collector_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// These tests check what the JVM integration tests stand on, without the
// receiver: the workloads build and run with each JDK, their marks agree
// with the line number tables, and the JFR oracle reads the stacks the
// tests expect. They need no privileges.

// methodMarks pairs each method of a workload with the marks of its first
// and last lines: "alpha" and "alpha-end" bracket jAlpha.
var methodMarks = map[string]map[string]string{
	"JBurn.java":   {"main": "JBurn.main", "alpha": "JBurn.jAlpha", "beta": "JBurn.jBeta", "gamma": "JBurn.jGammaBurn", "delta": "JBurn.jDeltaBurn"},
	"Inline.java":  {"main": "Inline.main", "drive": "Inline.drive", "loop": "Inline.loop", "mid": "Inline.mid", "leaf": "Inline.leaf"},
	"JniBurn.java": {"main": "JniBurn.main", "outer": "JniBurn.jOuter", "callback": "JniBurn.jCallback", "inner": "JniBurn.jInnerBurn"},
}

// callMarks names, for each call mark, the method it is in.
var callMarks = map[string]map[string]string{
	"JBurn.java":   {"call-alpha": "JBurn.main", "call-beta": "JBurn.jAlpha", "call-gamma": "JBurn.jBeta", "call-gamma-mix": "JBurn.jBeta", "call-delta": "JBurn.jBeta"},
	"Inline.java":  {"call-drive": "Inline.main", "call-loop": "Inline.drive", "call-mid": "Inline.loop", "call-leaf": "Inline.mid"},
	"JniBurn.java": {"call-outer": "JniBurn.main", "call-native": "JniBurn.jOuter", "call-inner": "JniBurn.jCallback"},
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && len(b) > i+2 && b[i+2] != 'Z'
}

// waitBurning waits until the main thread of p has run cpu on the CPU
// since it was ready, and fails if the process dies first.
func waitBurning(t *testing.T, p javaProc, cpu time.Duration) {
	t.Helper()
	start := threadCPU(p.pid, int(p.main))
	// Six times the CPU asked for: two JVMs and the agent share two CPUs.
	deadline := time.Now().Add(6 * cpu)
	for threadCPU(p.pid, int(p.main))-start < cpu {
		if !alive(p.pid) || time.Now().After(deadline) {
			t.Fatalf("pid %d: main thread %d ran %v since ready, want %v while alive (alive: %v)",
				p.pid, p.main, threadCPU(p.pid, int(p.main))-start, cpu, alive(p.pid))
		}
		time.Sleep(50 * time.Millisecond) // poll interval of the condition above
	}
}

// TestJVMWorkloads builds the workloads with each JDK, checks their marks
// against javap's line number tables and names, and runs each: the chain
// starts and burns CPU (JniBurn's callback from C works), and Churn
// unloads Plugin classes and deoptimizes their code (JFR's
// jdk.Deoptimization events count it).
func TestJVMWorkloads(t *testing.T) {
	for _, j := range jdks(t) {
		t.Run("jdk"+j.name, func(t *testing.T) {
			b := buildJVM(t, j)
			for file, ms := range methodMarks {
				marks := jvmMarks(t, file)
				for m, fn := range ms {
					got := b.method(t, fn)
					lo, hi := jvmMark(t, marks, m), jvmMark(t, marks, m+"-end")
					if got.First < lo || got.Last > hi || got.File != file {
						t.Errorf("%s: lines %d-%d in %s, want within %d-%d of %s", fn, got.First, got.Last, got.File, lo, hi, file)
					}
				}
				for c, fn := range callMarks[file] {
					got := b.method(t, fn)
					if l := jvmMark(t, marks, c); l < got.First || l > got.Last {
						t.Errorf("%s: call mark %s at line %d outside %s's %d-%d", file, c, l, fn, got.First, got.Last)
					}
				}
			}
			for fn, want := range map[string]jvmMethod{
				"JBurn.jGammaBurn":  {SystemName: "JBurn.jGammaBurn(J)J", File: "JBurn.java"},
				"JniBurn.jCallback": {SystemName: "JniBurn.jCallback(J)V", File: "JniBurn.java"},
				"Churn$Circle.area": {SystemName: "Churn$Circle.area(J)J", File: "Churn.java"},
				"Plugin$Local.area": {SystemName: "Plugin$Local.area(J)J", File: "Plugin.java"},
				"JBurn.<init>":      {SystemName: "JBurn.<init>()V", File: "JBurn.java"},
				"Plugin.<init>":     {SystemName: "Plugin.<init>()V", File: "Plugin.java"},
			} {
				got := b.method(t, fn)
				if got.SystemName != want.SystemName || got.File != want.File {
					t.Errorf("%s: %s in %s, want %s in %s", fn, got.SystemName, got.File, want.SystemName, want.File)
				}
			}
			for _, class := range []string{"JBurn", "Inline", "JniBurn"} {
				p := b.start(t, nil, class)
				waitBurning(t, p, 300*time.Millisecond)
			}
			// Churn, with its class unloading and compiler's work on
			// standard output: a deoptimized method's code is "made not
			// entrant".
			p := b.start(t, []string{"-Xlog:class+unload=info", "-XX:+PrintCompilation"}, "Churn", b.plugins)
			unloaded := regexp.MustCompile(`unloading class Plugin\b`)
			deopted := regexp.MustCompile(`(?m)(Plugin|Churn)::\S+ .*made not entrant`)
			deadline := time.Now().Add(60 * time.Second)
			unloads, deopts := 0, 0
			for ; (unloads < 3 || deopts < 3) && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) { // poll the output
				out, _ := os.ReadFile(p.stdout)
				unloads, deopts = len(unloaded.FindAll(out, -1)), len(deopted.FindAll(out, -1))
			}
			t.Logf("JDK %s: Churn unloaded Plugin %d times, deoptimized its or Churn's code %d times", j.name, unloads, deopts)
			if unloads < 3 || deopts < 3 {
				t.Errorf("JDK %s: Churn unloaded Plugin %d times and deoptimized %d methods of Plugin or Churn in 60 s, want at least 3 each", j.name, unloads, deopts)
			}
		})
	}
}

// jfrJavaFrames are the frames of a JFR sample as jframes, leaf first.
func jfrJavaFrames(s testutil.JFRSample) []jframe {
	out := make([]jframe, len(s.Frames))
	for i, f := range s.Frames {
		out[i] = jframe{jvmLine: jvmLine{Function: f.Function(), SystemName: f.Function() + f.Descriptor, Line: f.Line}, Tier: f.Type,
			Inlined: f.Type == "Inlined"}
	}
	return out
}

// jwant is one expected frame of a chain: its Function, and its line
// exactly (line) or within lo-hi (line 0).
type jwant struct {
	fn       string
	line     int64
	lo, hi   int64
	anyLine  bool // no line to check (a native method)
	inlined  bool // expected inlined into the next frame
	checkInl bool // whether inlined is checked
}

func (w jwant) String() string {
	if w.line != 0 {
		return fmt.Sprintf("%s:%d", w.fn, w.line)
	}
	return fmt.Sprintf("%s:%d-%d", w.fn, w.lo, w.hi)
}

// jat is a frame expected at a call line.
func jat(fn string, line int64) jwant { return jwant{fn: fn, line: line} }

// jin is a frame expected anywhere in its method's lines.
func jin(m jvmMethod, fn string) jwant { return jwant{fn: fn, lo: m.First, hi: m.Last} }

// matchChain checks Java frames (leaf first) against a chain exactly.
func matchChain(got []jframe, chain []jwant) error {
	if len(got) != len(chain) {
		return fmt.Errorf("%d java frames, want %d (%v)", len(got), len(chain), chain)
	}
	for i, w := range chain {
		g := got[i]
		if g.Function != w.fn {
			return fmt.Errorf("java frame %d is %s, want %v", i, g.Function, w)
		}
		switch {
		case w.anyLine:
		case w.line != 0 && g.Line != w.line:
			return fmt.Errorf("java frame %d is %s:%d, want line %d", i, g.Function, g.Line, w.line)
		case w.line == 0 && (g.Line < w.lo || g.Line > w.hi):
			return fmt.Errorf("java frame %d is %s:%d, want a line in %d-%d", i, g.Function, g.Line, w.lo, w.hi)
		}
		if w.checkInl && g.Inlined != w.inlined {
			return fmt.Errorf("java frame %d %s: inlined %v, want %v", i, g.Function, g.Inlined, w.inlined)
		}
	}
	return nil
}

// runJFR runs class of build b under a JFR recording (settings=profile)
// for seconds, opts before the class, until it exits by itself, and
// returns the process and the execution samples of its main thread taken
// after it printed "ready".
func runJFR(t *testing.T, b jvmBuild, opts []string, class string, args ...string) (javaProc, []testutil.JFRSample) {
	t.Helper()
	rec := filepath.Join(t.TempDir(), class+".jfr")
	p := b.start(t, append([]string{"-XX:StartFlightRecording=filename=" + rec + ",settings=profile"}, opts...), class, args...)
	waitExit(t, p.cmd, 120*time.Second)
	var mine []testutil.JFRSample
	tids := map[int64]int{}
	for _, s := range testutil.JFRSamples(t, b.jdk.home, rec, 128) {
		tids[s.TID]++
		if s.TID == p.main && s.Time.After(p.ready) {
			mine = append(mine, s)
		}
	}
	if len(mine) < 100 {
		t.Fatalf("JDK %s %s: JFR has %d samples of thread %d, want at least 100 (samples by thread: %v)", b.jdk.name, class, len(mine), p.main, tids)
	}
	return p, mine
}

// TestJFROracle runs the oracle alone on two workloads with each JDK: on
// JBurn's mix, JFR's top leaf is jGammaBurn with its whole chain at the
// call lines, jDeltaBurn the second leaf; on Inline with
// DebugNonSafepoints, the leaf is Inline.leaf inlined into mid, inlined
// into loop. It checks the oracle's parsing against known stacks, and
// that the test's main-thread TID is the one JFR samples.
func TestJFROracle(t *testing.T) {
	for _, j := range jdks(t) {
		t.Run("jdk"+j.name, func(t *testing.T) {
			b := buildJVM(t, j)
			jb := jvmMarks(t, "JBurn.java")
			_, samples := runJFR(t, b, nil, "JBurn", "mix", "6")
			gamma := []jwant{jin(b.method(t, "JBurn.jGammaBurn"), "JBurn.jGammaBurn"), jat("JBurn.jBeta", jvmMark(t, jb, "call-gamma-mix")),
				jat("JBurn.jAlpha", jvmMark(t, jb, "call-beta")), jat("JBurn.main", jvmMark(t, jb, "call-alpha"))}
			delta := []jwant{jin(b.method(t, "JBurn.jDeltaBurn"), "JBurn.jDeltaBurn"), jat("JBurn.jBeta", jvmMark(t, jb, "call-delta")),
				jat("JBurn.jAlpha", jvmMark(t, jb, "call-beta")), jat("JBurn.main", jvmMark(t, jb, "call-alpha"))}
			leaves := map[string]int{}
			whole := map[string]int{}
			var bad []string
			for _, s := range samples {
				jf := jfrJavaFrames(s)
				leaves[jf[0].Function]++
				for _, chain := range [][]jwant{gamma, delta} {
					if jf[0].Function != chain[0].fn {
						continue
					}
					if err := matchChain(jf, chain); err != nil {
						if len(bad) < 5 {
							bad = append(bad, err.Error())
						}
						continue
					}
					whole[chain[0].fn]++
				}
			}
			t.Logf("JDK %s JBurn mix: %d JFR samples; leaves %s; whole chains %v", j.name, len(samples), topShares(leaves, 4), whole)
			top, n := majority(leaves)
			if top != "JBurn.jGammaBurn" || whole[top] < n*95/100 {
				t.Errorf("JDK %s: JFR's top leaf %s (%d of %d samples, %d whole), want JBurn.jGammaBurn, at least 95 %% whole; e.g. %s",
					j.name, top, n, len(samples), whole[top], strings.Join(bad, "; "))
			}
			if d := leaves["JBurn.jDeltaBurn"]; d < len(samples)/10 || whole["JBurn.jDeltaBurn"] < d*95/100 {
				t.Errorf("JDK %s: jDeltaBurn leads %d of %d samples (%d whole), want at least 10 %%, 95 %% of them whole",
					j.name, d, len(samples), whole["JBurn.jDeltaBurn"])
			}

			// The main thread's TID: the test picks it from /proc, JFR
			// names it; runJFR kept only its samples and found enough.
			im := jvmMarks(t, "Inline.java")
			_, samples = runInlineJFR(t, b)
			chain := inlineChain(t, b, im, true)
			// Warm-up: until C2's code with leaf and mid inlined runs,
			// loop calls them compiled apart, and the chain is the same
			// but not inlined.
			ok, warm, total := 0, 0, 0
			bad = nil
			for _, s := range samples {
				err := matchChain(jfrJavaFrames(s), chain)
				if ok == 0 && err != nil {
					warm++
					continue
				}
				total++
				if err != nil {
					if len(bad) < 5 {
						bad = append(bad, err.Error())
					}
					continue
				}
				ok++
			}
			t.Logf("JDK %s Inline, DebugNonSafepoints: %d of %d JFR samples after warm-up (%d samples) show leaf inlined in mid inlined in loop", j.name, ok, total, warm)
			if total < 100 || ok < total*80/100 {
				chains := map[string]int{}
				for _, s := range samples {
					var c []string
					for _, f := range jfrJavaFrames(s) {
						c = append(c, fmt.Sprintf("%s:%d (%s)", f.Function, f.Line, f.Tier))
					}
					chains[strings.Join(c, " <- ")]++
				}
				t.Errorf("JDK %s: %d of %d JFR samples of Inline show the inlined chain after warm-up, want at least 80 %% of at least 100; e.g. %s; JFR's chains: %s",
					j.name, ok, total, strings.Join(bad, "; "), topShares(chains, 4))
			}
		})
	}
}

// inlineFlags show C2's inlined frames between safepoints.
// inlineFlags run Inline with the debug information that names inlined
// frames at any pc, and with leaf and mid always inlined: left to its
// heuristics, C2 at times compiled leaf apart (a CI run saw JFR's leaf
// "JIT compiled" under mid "Inlined" in every sample), and the workload
// then had no inlined chain to compare.
var inlineFlags = []string{"-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints",
	"-XX:CompileCommand=quiet", "-XX:CompileCommand=inline,Inline::leaf", "-XX:CompileCommand=inline,Inline::mid"}

// runInlineJFR runs Inline with DebugNonSafepoints under JFR until C2
// has compiled loop, then for 4 s of its CPU (SIGTERM ends it and JFR
// writes the recording on exit).
func runInlineJFR(t *testing.T, b jvmBuild) (javaProc, []testutil.JFRSample) {
	t.Helper()
	rec := filepath.Join(t.TempDir(), "inline.jfr")
	opts := append([]string{"-XX:StartFlightRecording=filename=" + rec + ",settings=profile", "-XX:+PrintCompilation"}, inlineFlags...)
	p := b.start(t, opts, "Inline")
	waitC2(t, p, "Inline::loop", 60*time.Second)
	waitBurning(t, p, 4*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, p.cmd, 30*time.Second)
	var mine []testutil.JFRSample
	for _, s := range testutil.JFRSamples(t, b.jdk.home, rec, 128) {
		if s.TID == p.main && s.Time.After(p.ready) {
			mine = append(mine, s)
		}
	}
	if len(mine) < 100 {
		t.Fatalf("JDK %s Inline: JFR has %d samples of thread %d, want at least 100", b.jdk.name, len(mine), p.main)
	}
	return p, mine
}

// waitC2 waits until the JVM of p, run with -XX:+PrintCompilation, logs a
// C2 (tier 4) compilation of method ("Class::name"), OSR or not. On a busy
// machine the compiler threads can lag the program by seconds; until then
// the method runs as C1 code that calls its callees apart.
func waitC2(t *testing.T, p javaProc, method string, limit time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(limit); ; {
		out, _ := os.ReadFile(p.stdout)
		var seen []string
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			for i := 1; i < len(f); i++ {
				if f[i] == method {
					seen = append(seen, strings.TrimSpace(line))
					if f[i-1] == "4" && !strings.Contains(line, "made not entrant") {
						return
					}
				}
			}
		}
		if !alive(p.pid) || time.Now().After(deadline) {
			t.Fatalf("pid %d: no C2 compilation of %s in %v (alive: %v); its compilations: %q", p.pid, method, limit, alive(p.pid), seen)
		}
		time.Sleep(50 * time.Millisecond) // poll interval of the condition above
	}
}

// inlineChain is Inline's whole chain, leaf first: leaf inlined into mid
// inlined into loop (when inlined is set, checked), then drive and main.
func inlineChain(t *testing.T, b jvmBuild, marks map[string]int64, inlined bool) []jwant {
	t.Helper()
	leaf := jin(b.method(t, "Inline.leaf"), "Inline.leaf")
	mid := jat("Inline.mid", jvmMark(t, marks, "call-leaf"))
	leaf.inlined, leaf.checkInl = true, inlined
	mid.inlined, mid.checkInl = true, inlined
	loop := jat("Inline.loop", jvmMark(t, marks, "call-mid"))
	loop.checkInl = inlined
	return []jwant{leaf, mid, loop, jat("Inline.drive", jvmMark(t, marks, "call-loop")), jat("Inline.main", jvmMark(t, marks, "call-drive"))}
}
