package v8

import (
	"errors"
	"fmt"
	"path/filepath"
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
	named  []Frame
	errs   []error
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
	var out []liveSample
	tick := time.NewTicker(3 * time.Millisecond)
	defer tick.Stop()
	for range n {
		<-tick.C
		frames, stop, pc, err := snapshot(pid, &vm.Kernel, mem)
		if err != nil {
			t.Fatal(err)
		}
		s := liveSample{pc: pc, stop: stop, frames: frames}
		for _, f := range frames {
			nf, err := nm.Frame(pid, f.Kind, f.Addr, f.Word, f.ReturnAddr)
			if err != nil && !errors.Is(err, ErrStale) && !errors.Is(err, ErrUnreadable) {
				t.Errorf("naming error matches neither ErrStale nor ErrUnreadable: %v", err)
			}
			s.named = append(s.named, nf)
			s.errs = append(s.errs, err)
		}
		out = append(out, s)
	}
	return out
}

// chainOK says whether s names want (innermost first) as consecutive
// lines from the first line named want[0], each in file with the line
// lines[i] says (0: any line in [lo, hi] of that function).
type wantLine struct {
	fn     string
	line   int64 // 0: any in [lo, hi]
	lo, hi int64
}

func chainOK(s liveSample, file string, want []wantLine) bool {
	ls, _ := s.lines()
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
			if w.line != 0 && g.Line != w.line {
				return false
			}
			if w.line == 0 && (g.Line < w.lo || g.Line > w.hi) {
				return false
			}
		}
		return true
	}
	return false
}

func TestLiveBurn(t *testing.T) {
	testutil.RequireRoot(t, "ptrace of a node process")
	script, err := filepath.Abs("testdata/burn.js")
	if err != nil {
		t.Fatal(err)
	}
	want := []wantLine{
		{fn: "nodeGammaBurn", lo: lineOfText(t, script, "function nodeGammaBurn"), hi: lineOfText(t, script, "return x;")},
		{fn: "nodeBeta", line: lineOfText(t, script, "return nodeGammaBurn(n) + 1;")},
		{fn: "nodeAlpha", line: lineOfText(t, script, "return nodeBeta(n) + 1;")},
		{fn: "main", line: lineOfText(t, script, "sum = (sum + nodeAlpha(")},
	}
	for _, node := range nodes(t) {
		t.Run(node.name, func(t *testing.T) {
			cmd := startNode(t, node.path, "burn.js")
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
			// The snapshots taken in the leaf: nodeGammaBurn is the
			// innermost function named (a snapshot in main's own loop,
			// or in native code, is not).
			for _, s := range samples {
				ls, ts := s.lines()
				if len(ls) == 0 || ls[0].Function != "nodeGammaBurn" {
					continue
				}
				leaf++
				tiers[ts[0]]++
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
		})
	}
}

func TestLiveInline(t *testing.T) {
	testutil.RequireRoot(t, "ptrace of a node process")
	script, err := filepath.Abs("testdata/inline.js")
	if err != nil {
		t.Fatal(err)
	}
	addLine := lineOfText(t, script, "return a + b;")
	mulLine := lineOfText(t, script, "return inlAdd(a, a) * 3;")
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
			// TurboFan must have compiled inlHot first: sample until a
			// frame of it is optimized code, within a deadline.
			deadline := time.Now().Add(20 * time.Second)
			inlined := 0
			var seen []liveSample
			for time.Now().Before(deadline) && inlined < 5 {
				for _, s := range sampleLive(t, pid, vm, mem, nm, 50) {
					for _, f := range s.named {
						if len(f.Lines) < 2 || (f.Tier != TierTurbofan && f.Tier != TierMaglev) {
							continue
						}
						in, out := f.Lines[0], f.Lines[len(f.Lines)-1]
						if out.Function != "inlHot" || out.File != script {
							t.Errorf("optimized frame with inlined functions: outermost %s %s, want inlHot", out.Function, out.File)
							continue
						}
						switch {
						case in.Function == "inlAdd" && in.Line == addLine,
							in.Function == "inlMul" && in.Line == mulLine:
							inlined++
						}
					}
					if len(seen) < 3 {
						seen = append(seen, s)
					}
				}
			}
			t.Logf("%d frames with inlined functions; namer %+v", inlined, nm.Stats())
			if inlined == 0 {
				for _, s := range seen {
					t.Logf("sample: %s", s)
				}
				t.Errorf("no optimized frame named inlAdd or inlMul inlined into inlHot")
			}
		})
	}
}
