package v8

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// liveSample is one ptrace snapshot, walked and named.
type liveSample struct {
	pc     uint64
	stop   WalkStop
	frames []WalkedFrame
	// taken is when the walk was done: the frames are named as of a
	// sample taken then (Namer.FrameCaptured).
	taken time.Time
	named []Frame
	errs  []error
}

// lines flattens the named frames' lines, innermost first, with each
// line's tier.
func (s liveSample) lines() ([]symbolize.Line, []string) {
	var ls []symbolize.Line
	var tiers []string
	for _, f := range s.named {
		for _, l := range f.Lines {
			ls = append(ls, l)
			tiers = append(tiers, f.Tier)
		}
	}
	return ls, tiers
}

// leaf returns the innermost function named below the builtins and stubs
// at the top of the stack, and its tier.
func (s liveSample) leaf() (symbolize.Line, string, bool) {
	for i, f := range s.named {
		if s.errs[i] == nil && f.Tier != TierStub && len(f.Lines) > 0 {
			return f.Lines[0], f.Tier, true
		}
		if s.errs[i] != nil {
			break
		}
	}
	return symbolize.Line{}, "", false
}

// inlinedCallers says, for each of s.lines(), whether it is the caller
// of a function inlined in the same frame (not the frame's innermost).
func (s liveSample) inlinedCallers() []bool {
	var out []bool
	for _, f := range s.named {
		for i := range f.Lines {
			out = append(out, i > 0)
		}
	}
	return out
}

func (s liveSample) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pc %#x stop %s:", s.pc, s.stop)
	for i, f := range s.frames {
		fmt.Fprintf(&b, "\n  %d kind %d addr %#x word %#x", i, f.Kind, f.Addr, f.Word)
		if s.errs[i] != nil {
			fmt.Fprintf(&b, " error %v", s.errs[i])
			continue
		}
		for _, l := range s.named[i].Lines {
			fmt.Fprintf(&b, " [%s %s:%d]", l.Function, filepath.Base(l.File), l.Line)
		}
		fmt.Fprintf(&b, " %s", s.named[i].Tier)
	}
	return b.String()
}

// sampleLive takes n snapshots of pid's main thread, walks and names them.
func sampleLive(t *testing.T, pid int, vm *VM, mem Memory, nm *Namer, n int) []liveSample {
	t.Helper()
	out := snapshots(t, pid, vm, mem, n)
	for i := range out {
		nameSample(t, pid, nm, &out[i])
	}
	return out
}

// snapshots takes n snapshots of pid's main thread and walks them.
func snapshots(t *testing.T, pid int, vm *VM, mem Memory, n int) []liveSample {
	t.Helper()
	var out []liveSample
	tick := time.NewTicker(3 * time.Millisecond)
	defer tick.Stop()
	for range n {
		<-tick.C
		frames, stop, pc, err := snapshot(pid, &vm.Kernel, mem)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, liveSample{pc: pc, stop: stop, frames: frames, taken: time.Now()})
	}
	return out
}

// nameSample names s's frames.
func nameSample(t *testing.T, pid int, nm *Namer, s *liveSample) {
	t.Helper()
	{
		for _, f := range s.frames {
			nf, err := nm.FrameCaptured(s.taken, pid, f.Kind, f.Addr, f.Word, f.ReturnAddr)
			if err != nil && !errors.Is(err, ErrStale) && !errors.Is(err, ErrUnreadable) {
				t.Errorf("naming error matches neither ErrStale nor ErrUnreadable: %v", err)
			}
			s.named = append(s.named, nf)
			s.errs = append(s.errs, err)
		}
	}
}

// wantLine is a function of a call chain: its name, the line it calls
// the next inner function on (0 for the leaf), and its body's lines.
type wantLine struct {
	fn     string
	line   int64
	lo, hi int64
}

// ok says whether l is w on the line expected: the call line, or for the
// leaf (line 0) and for a caller of an inlined function (outer) any line
// of its body. V8 records the call sites of functions inlined into
// on-stack-replaced code at the loop's position, not the call's (seen on
// V8 12 to 14, TurboFan and Maglev: the position table its own profiler
// reads says so), so only the function is certain there.
func (w wantLine) ok(l symbolize.Line, outer bool) bool {
	if w.line == 0 || outer {
		return l.Line >= w.lo && l.Line <= w.hi
	}
	return l.Line == w.line
}

// funcLines returns the lines of function name's body in path: from its
// "function name(" line to the next line that is "}".
func funcLines(t *testing.T, path, name string) (lo, hi int64) {
	t.Helper()
	lo = lineOfText(t, path, "function "+name+"(")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n")[lo:] {
		if l == "}" {
			return lo, lo + int64(i) + 1
		}
	}
	t.Fatalf("%s: function %s has no end", path, name)
	return 0, 0
}

// want returns the chain of fns (innermost first) in path, each calling
// the next inner one on the line holding calls[i] ("" for the leaf).
func wantChain(t *testing.T, path string, fns, calls []string) []wantLine {
	t.Helper()
	var out []wantLine
	for i, fn := range fns {
		w := wantLine{fn: fn}
		w.lo, w.hi = funcLines(t, path, fn)
		if calls[i] != "" {
			w.line = lineOfText(t, path, calls[i])
		}
		out = append(out, w)
	}
	return out
}

// chainOK says whether s names want (innermost first) as consecutive
// lines from the first line naming want[0], each in file on its line.
func chainOK(s liveSample, file string, want []wantLine) bool {
	ls, _ := s.lines()
	inlinedCaller := s.inlinedCallers()
	for i, l := range ls {
		if l.Function != want[0].fn {
			continue
		}
		if len(ls)-i < len(want) {
			return false
		}
		for j, w := range want {
			g := ls[i+j]
			if g.Function != w.fn || g.File != file {
				return false
			}
			if !w.ok(g, inlinedCaller[i+j]) {
				return false
			}
		}
		return true
	}
	return false
}

func TestLiveBurn(t *testing.T) {
	testutil.RequireRoot(t, "ptrace of a node process")
	for _, node := range nodes(t) {
		t.Run(node.name, func(t *testing.T) { burnChain(t, node, nil, "") })
	}
}

// TestLiveBaseline runs burn.js with TurboFan and Maglev off and
// Sparkplug compiling every function: the leaf is baseline code, named
// with its line from the code's bytecode offset table.
func TestLiveBaseline(t *testing.T) {
	testutil.RequireRoot(t, "ptrace of a node process")
	for _, node := range nodes(t) {
		t.Run(node.name, func(t *testing.T) {
			flags := []string{"--no-opt", "--no-maglev", "--always-sparkplug"}
			if node.name == "npm-18" {
				flags = []string{"--no-opt", "--always-sparkplug"} // no Maglev to turn off
			}
			burnChain(t, node, flags, TierBaseline)
		})
	}
}

// burnChain runs testdata/burn.js with node and flags, takes 400
// snapshots, and checks that ≥ 95 % of those in the leaf name the whole
// chain, the leaf in tier wantTier if not "".
func burnChain(t *testing.T, node nodeBin, flags []string, wantTier string) {
	script, err := filepath.Abs("testdata/burn.js")
	if err != nil {
		t.Fatal(err)
	}
	want := wantChain(t, script, []string{"nodeGammaBurn", "nodeBeta", "nodeAlpha", "main"},
		[]string{"", "return nodeGammaBurn(n) + 1;", "return nodeBeta(n) + 1;", "sum = (sum + nodeAlpha("})
	cmd := startNode(t, node.path, "burn.js", flags...)
	pid := cmd.Process.Pid
	vm, mem := findVM(t, pid)
	t.Logf("node %s v8 %s kernel %+v", vm.Node, vm.V8, vm.Kernel)
	nm := NewNamer("/proc", 16<<20)
	if err := nm.Add(pid, vm); err != nil {
		t.Fatal(err)
	}
	defer nm.Forget(pid)
	samples := sampleLive(t, pid, vm, mem, nm, 400)
	whole, leaf := 0, 0
	tiers := map[string]int{}
	var bad []liveSample
	// The snapshots taken in the leaf: nodeGammaBurn is the innermost
	// function named (a snapshot in main's own loop, or in native code,
	// is not).
	for _, s := range samples {
		l, tier, ok := s.leaf()
		if !ok || l.Function != "nodeGammaBurn" {
			continue
		}
		leaf++
		tiers[tier]++
		if chainOK(s, script, want) {
			whole++
		} else if len(bad) < 5 {
			bad = append(bad, s)
		}
	}
	if leaf < len(samples)/2 {
		t.Fatalf("%d of %d snapshots in nodeGammaBurn: the walk or naming misses the leaf", leaf, len(samples))
	}
	share := float64(whole) / float64(leaf)
	t.Logf("%d snapshots, %d in the leaf: %d name the whole chain (%.1f %%); leaf tiers %v; namer %+v",
		len(samples), leaf, whole, 100*share, tiers, nm.Stats())
	for _, s := range bad {
		t.Logf("not whole: %s", s)
	}
	if share < 0.95 {
		t.Errorf("%.1f %% of the leaf's snapshots name the whole chain, want ≥ 95 %%", 100*share)
	}
	if wantTier != "" && tiers[wantTier] < leaf*9/10 {
		t.Errorf("leaf tiers %v: want %s", tiers, wantTier)
	}
}

func TestLiveInline(t *testing.T) {
	testutil.RequireRoot(t, "ptrace of a node process")
	script, err := filepath.Abs("testdata/inline.js")
	if err != nil {
		t.Fatal(err)
	}
	// The call chain, innermost first, with the line each function is on
	// when it calls the next inner one (the innermost: its own line).
	chain := wantChain(t, script, []string{"inlAdd", "inlMul", "inlHot", "batch"},
		[]string{"", "return inlAdd(a, a) * 3;", "s = (s + inlMul(i))", "sum = (sum + inlHot("})
	for _, node := range nodes(t) {
		t.Run(node.name, func(t *testing.T) {
			cmd := startNode(t, node.path, "inline.js")
			pid := cmd.Process.Pid
			vm, mem := findVM(t, pid)
			nm := NewNamer("/proc", 16<<20)
			if err := nm.Add(pid, vm); err != nil {
				t.Fatal(err)
			}
			defer nm.Forget(pid)
			// Sample until optimized frames with inlined functions were
			// seen, within a deadline: TurboFan or Maglev compile
			// inlHot (or main, on stack) with inlMul and inlAdd in it.
			deadline := time.Now().Add(20 * time.Second)
			inlined, leafInlined := 0, 0
			var seen []liveSample
			for time.Now().Before(deadline) && inlined < 20 {
				for _, s := range sampleLive(t, pid, vm, mem, nm, 50) {
					for _, f := range s.named {
						if f.Tier != TierTurbofan && f.Tier != TierMaglev {
							continue
						}
						// The script's functions in the frame (Node's
						// own may be inlined around them).
						var ours []symbolize.Line
						for _, l := range f.Lines {
							if l.File == script {
								ours = append(ours, l)
							}
						}
						if len(ours) < 2 {
							continue
						}
						if !inlinedChainOK(ours, script, chain) {
							t.Errorf("optimized frame's lines do not follow the calls: %v", f.Lines)
							continue
						}
						inlined++
						if in := ours[0].Function; in == "inlAdd" || in == "inlMul" {
							leafInlined++
						}
					}
					if len(seen) < 3 {
						seen = append(seen, s)
					}
				}
			}
			t.Logf("%d optimized frames with the script's functions inlined, %d with inlAdd or inlMul innermost; namer %+v",
				inlined, leafInlined, nm.Stats())
			if inlined == 0 {
				for _, s := range seen {
					t.Logf("sample: %s", s)
				}
				t.Errorf("no optimized frame named a function of the script inlined")
			}
		})
	}
}

// inlinedChainOK says whether lines (innermost first) are consecutive
// functions of chain, from any of them up, each on its line in file.
func inlinedChainOK(lines []symbolize.Line, file string, chain []wantLine) bool {
	for i, w := range chain {
		if w.fn != lines[0].Function {
			continue
		}
		if len(chain)-i < len(lines) {
			return false
		}
		for j, l := range lines {
			c := chain[i+j]
			if j == 0 {
				c.line = 0 // innermost: any line of its body
			}
			if l.Function != c.fn || l.File != file || !c.ok(l, j > 0) {
				return false
			}
		}
		return true
	}
	return false
}

// TestLiveChurn samples a process whose heap churns (run-time compiled
// functions, garbage collection, optimization and deoptimization): every
// frame named in the script names one of its functions on a line of its
// body, and what cannot be named is counted, never named wrongly.
func TestLiveChurn(t *testing.T) {
	testutil.RequireRoot(t, "ptrace of a node process")
	script, err := filepath.Abs("testdata/churn.js")
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string][2]int64{}
	for _, fn := range []string{"churnMake", "churnAlloc", "churnEval", "churnLoop"} {
		lo, hi := funcLines(t, script, fn)
		bodies[fn] = [2]int64{lo, hi}
	}
	evalLine := lineOfText(t, script, "function churnEvaled")
	for _, node := range nodes(t) {
		t.Run(node.name, func(t *testing.T) {
			cmd := startNode(t, node.path, "churn.js")
			pid := cmd.Process.Pid
			vm, mem := findVM(t, pid)
			nm := NewNamer("/proc", 16<<20)
			if err := nm.Add(pid, vm); err != nil {
				t.Fatal(err)
			}
			defer nm.Forget(pid)
			// Named after all were taken, as the profiler names a batch
			// after its samples: the heap has moved on meanwhile.
			samples := snapshots(t, pid, vm, mem, 600)
			for i := range samples {
				nameSample(t, pid, nm, &samples[i])
			}
			ours, generated, failed := 0, 0, 0
			for _, s := range samples {
				for i, f := range s.named {
					if s.errs[i] != nil {
						failed++
						continue
					}
					for _, l := range f.Lines {
						switch {
						case l.File == script && l.Function == "<anonymous@1:1>":
							// The module's top level.
						case l.File == script:
							ours++
							b, ok := bodies[l.Function]
							if !ok {
								t.Errorf("frame named %s in %s: no such function", l.Function, script)
							} else if l.Line != 0 && (l.Line < b[0] || l.Line > b[1]) {
								t.Errorf("%s on line %d, outside its body %v (tier %s)", l.Function, l.Line, b, f.Tier)
							}
						case l.Function == "churnEvaled":
							// eval's script is named after no file; its
							// code is one line (0: unknown, as baseline
							// code's lines are).
							generated++
							if l.Line > 1 {
								t.Errorf("churnEvaled on line %d of its eval source", l.Line)
							}
						case l.Function == "anonymous" && l.File == "":
							generated++ // new Function's
						}
					}
				}
			}
			st := nm.Stats()
			t.Logf("script lines %d, run-time compiled %d, frames not named %d; namer %+v (eval line %d)",
				ours, generated, failed, st, evalLine)
			if ours == 0 || generated == 0 {
				t.Errorf("script lines %d, run-time compiled functions %d: want both", ours, generated)
			}
		})
	}
}

// TestLiveWorker walks a worker thread, whose isolate has a heap and a
// code space of its own: its chain is named like the main thread's.
func TestLiveWorker(t *testing.T) {
	testutil.RequireRoot(t, "ptrace of a node process")
	script, err := filepath.Abs("testdata/worker.js")
	if err != nil {
		t.Fatal(err)
	}
	want := wantChain(t, script, []string{"wGammaBurn", "wBeta", "wAlpha", "wMain"},
		[]string{"", "return wGammaBurn(n) + 1;", "return wBeta(n) + 1;", "sum = (sum + wAlpha("})
	for _, node := range nodes(t) {
		t.Run(node.name, func(t *testing.T) {
			cmd := startNode(t, node.path, "worker.js")
			pid := cmd.Process.Pid
			vm, mem := findVM(t, pid)
			nm := NewNamer("/proc", 16<<20)
			if err := nm.Add(pid, vm); err != nil {
				t.Fatal(err)
			}
			defer nm.Forget(pid)
			// The worker is the thread that burns CPU: snapshot every
			// thread and keep those in the leaf.
			tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			if err != nil {
				t.Fatal(err)
			}
			leaf, whole := 0, 0
			var bad []liveSample
			// Snapshots 3 ms apart: taken back to back they all fell, now
			// and then, in one pause of the worker's JavaScript (a tier-up
			// or a collection just after it started), 26 of 40 in one run.
			tick := time.NewTicker(3 * time.Millisecond)
			defer tick.Stop()
			for _, e := range tids {
				tid, err := strconv.Atoi(e.Name())
				if err != nil {
					continue
				}
				for range 40 {
					<-tick.C
					frames, stop, pc, err := snapshot(tid, &vm.Kernel, mem)
					if err != nil {
						break // the thread exited
					}
					s := liveSample{pc: pc, stop: stop, frames: frames}
					nameSample(t, pid, nm, &s)
					if ls, _ := s.lines(); len(ls) == 0 || ls[0].Function != "wGammaBurn" {
						continue
					}
					leaf++
					if chainOK(s, script, want) {
						whole++
					} else if len(bad) < 3 {
						bad = append(bad, s)
					}
				}
			}
			t.Logf("%d snapshots in the worker's leaf, %d name the whole chain; namer %+v", leaf, whole, nm.Stats())
			for _, s := range bad {
				t.Logf("not whole: %s", s)
			}
			if leaf < 20 || float64(whole) < 0.95*float64(leaf) {
				t.Errorf("%d of %d snapshots in the worker's leaf name the whole chain, want ≥ 95 %%", whole, leaf)
			}
		})
	}
}
