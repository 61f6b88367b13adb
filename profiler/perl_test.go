//go:build linux

package profiler

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/perl"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// perlBin is Debian 12's perl; the tests skip without it, or fail under
// CI=true.
func perlBin(t *testing.T) testutil.Interpreter {
	t.Helper()
	return testutil.Perl536(t)
}

// startBurnPerl runs internal/perl's burn.pl in mode with pl and waits for
// its "ready" line.
func startBurnPerl(t *testing.T, pl testutil.Interpreter, mode string) int {
	t.Helper()
	cmd := pl.Command(perlTestdata(t, "burn.pl"), mode)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	return cmd.Process.Pid
}

func perlTestdata(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("../internal/perl/testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stackFrame is one location of a sample's stack: its frame type and its
// innermost line's function, file and line.
type stackFrame struct {
	typ, name, file string
	line            int64
}

func (f stackFrame) String() string { return fmt.Sprintf("%s:%s %s:%d", f.typ, f.name, f.file, f.line) }

// framedStacks returns the stacks of pid's samples in pd, leaf first, one
// entry per sample timestamp.
func framedStacks(pd pprofile.Profiles, pid int) [][]stackFrame {
	dict := pd.Dictionary()
	strs := dict.StringTable()
	var out [][]stackFrame
	for _, rp := range pd.ResourceProfiles().All() {
		if v, ok := rp.Resource().Attributes().Get("process.pid"); !ok || v.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					var st []stackFrame
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						var f stackFrame
						for _, ai := range loc.AttributeIndices().All() {
							kv := dict.AttributeTable().At(int(ai))
							if strs.At(int(kv.KeyStrindex())) == "profile.frame.type" {
								f.typ = kv.Value().Str()
							}
						}
						if loc.Lines().Len() > 0 {
							ln := loc.Lines().At(0)
							fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
							f.name = strs.At(int(fn.NameStrindex()))
							f.file = strs.At(int(fn.FilenameStrindex()))
							f.line = ln.Line()
						}
						st = append(st, f)
					}
					for range max(1, s.TimestampsUnixNano().Len()) {
						out = append(out, st)
					}
				}
			}
		}
	}
	return out
}

// perlWant is one expected Perl frame.
type perlWant struct {
	name, file string
	lines      []int64
	// cFrom, when set, is a native function that must be among the
	// native frames between this frame and the next Perl frame (C that
	// called this frame's sub), which are allowed there.
	cFrom string
}

// burnPerlChain is burn.pl's chain in mode from its leaf out.
func burnPerlChain(t *testing.T, mode string) []perlWant {
	t.Helper()
	burn, lib, lib2 := perlTestdata(t, "burn.pl"), perlTestdata(t, "BurnLib.pm"), perlTestdata(t, "BurnLib2.pm")
	at := func(file string, texts ...string) []int64 {
		var out []int64
		for _, text := range texts {
			out = append(out, lineOf(t, file, text))
		}
		return out
	}
	top := []perlWant{
		{name: "main::main", file: burn, lines: at(burn, "main calls alpha")},
		{name: "(main)", file: burn, lines: at(burn, "top-level calls main")},
	}
	if mode == "eval" {
		return append([]perlWant{
			{name: "Burn::Lib2::epsilon_burn", file: lib2, lines: at(lib2, "epsilon_burn loop", "main::ready()")},
			{name: "(require)", file: lib2, lines: at(lib2, "top-level calls epsilon_burn")},
			{name: "Burn::Lib::delta", file: lib, lines: at(lib, "delta requires BurnLib2")},
			{name: "(eval)", file: burn, lines: at(burn, "alpha evals")},
			{name: "main::alpha", file: burn, lines: at(burn, "alpha evals")},
		}, top...)
	}
	if mode == "sort" {
		return append([]perlWant{
			{name: "main::gamma_burn", file: burn, lines: at(burn, "gamma_burn loop", "# chain ready")},
			{name: "main::beta", file: burn, lines: at(burn, "beta calls gamma_burn")},
			{name: "main::by_num", file: burn, lines: at(burn, "by_num calls beta"), cFrom: "Perl_sortsv_flags"},
			{name: "main::alpha", file: burn, lines: at(burn, "alpha sorts")},
		}, top...)
	}
	leaf := at(burn, "gamma_burn loop", "# chain ready")
	if mode == "xs" {
		leaf = at(burn, "# xs leaf", "# xs ready")
	}
	return append([]perlWant{
		{name: "main::gamma_burn", file: burn, lines: leaf},
		{name: "main::beta", file: burn, lines: at(burn, "beta calls gamma_burn")},
		{name: "main::alpha", file: burn, lines: at(burn, "alpha calls beta")},
	}, top...)
}

func lineOf(t *testing.T, path, text string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return int64(i + 1)
		}
	}
	t.Fatalf("%s: no line holds %q", path, text)
	return 0
}

// perlWhole says whether st, a stack with chain[0]'s frame, holds the
// whole chain from it out with names, files and lines, and native frames
// below it (the interpreter's main).
func perlWhole(st []stackFrame, chain []perlWant) bool {
	i := 0
	for i < len(st) && (st[i].typ != "perl" || st[i].name != chain[0].name) {
		i++
	}
	for _, w := range chain {
		if i >= len(st) {
			return false
		}
		f := st[i]
		ok := f.typ == "perl" && f.name == w.name && f.file == w.file
		lineOK := false
		for _, l := range w.lines {
			lineOK = lineOK || f.line == l
		}
		if !ok || !lineOK {
			return false
		}
		i++
		if w.cFrom != "" {
			found := false
			for ; i < len(st) && st[i].typ == "native"; i++ {
				found = found || st[i].name == w.cFrom
			}
			if !found {
				return false
			}
		}
	}
	if i >= len(st) {
		return false
	}
	for _, f := range st[i:] {
		if f.typ != "native" {
			return false
		}
	}
	return true
}

// TestPerlFrames runs burn.pl (main -> alpha -> beta -> gamma_burn, a
// variant through an eval block and two required modules, and one whose
// leaf is Digest::MD5's C code, and one through sort's comparison sub,
// which C calls: its native frames between), started after the profiler. From the first sample in the leaf on, at least 99 % of
// those samples carry the whole chain with names, files and lines, then
// perl's native frames; the walker's and the namer's counters say so too.
func TestPerlFrames(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	for _, pl := range testutil.Perls(t) {
		t.Run(pl.Version, func(t *testing.T) { testPerlFrames(t, pl) })
	}
}

func testPerlFrames(t *testing.T, pl testutil.Interpreter) {
	for _, mode := range []string{"chain", "eval", "xs", "sort"} {
		t.Run(mode, func(t *testing.T) {
			p, s := startProfiler(t, 99)
			pid := startBurnPerl(t, pl, mode)
			chain := burnPerlChain(t, mode)
			var leaf, whole, xs int
			var bad []string
			example := ""
			count := func() {
				leaf, whole, bad = 0, 0, nil
				for _, pd := range s.all() {
					for _, st := range framedStacks(pd, pid) {
						in := false
						for _, f := range st {
							in = in || (f.typ == "perl" && f.name == chain[0].name)
						}
						if !in {
							continue
						}
						leaf++
						if st[0].typ == "native" && !strings.HasPrefix(st[0].name, "Perl_") {
							xs++ // the leaf is C that is not the interpreter's
						}
						if perlWhole(st, chain) {
							whole++
							example = fmt.Sprint(st)
						} else if len(bad) < 5 {
							bad = append(bad, fmt.Sprint(st))
						}
					}
				}
			}
			deadline := time.Now().Add(45 * time.Second)
			for count(); leaf < 300 && time.Now().Before(deadline); count() {
				s.waitFor(len(s.all())+1, 5*time.Second)
			}
			st := p.Stats()
			t.Logf("%d of %d %s samples whole; perl %+v; kernel perl samples %d frames %d read errors %d bad frames %d",
				whole, leaf, chain[0].name, st.Perl, st.Kernel.PerlSamples, st.Kernel.PerlFrames, st.Kernel.PerlReadErrs, st.Kernel.PerlBadFrames)
			t.Logf("a whole stack: %s", example)
			for _, b := range bad {
				t.Logf("not whole: %s", b)
			}
			if leaf < 300 {
				t.Fatalf("%d samples in %s, want 300", leaf, chain[0].name)
			}
			if whole*100 < leaf*99 {
				t.Errorf("%d of %d %s samples whole, want 99 %%", whole, leaf, chain[0].name)
			}
			if mode == "xs" && xs*2 < leaf {
				t.Errorf("%d of %d samples in gamma_burn in Digest::MD5's code, want half", xs, leaf)
			}
			if st.Perl.Processes < 1 || st.Perl.Named == 0 || st.Kernel.PerlSamples == 0 || st.Kernel.PerlFrames < st.Perl.Named {
				t.Errorf("counters: perl %+v, kernel samples %d frames %d", st.Perl, st.Kernel.PerlSamples, st.Kernel.PerlFrames)
			}
		})
	}
}

// TestPerlUnknownVersion runs two real perl processes while the
// profiler's layout table hides 5.36: the version is reported once (one
// log line, counted), and its processes keep their native stacks, with
// Perl_runops_standard where Perl frames would be.
func TestPerlUnknownVersion(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	pl := perlBin(t)
	core, logs := observer.New(zapcore.WarnLevel)
	p, s := startProfiler(t, 99, func(o *Options) {
		o.Logger = zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
		o.perlLayouts = func(v int) (perl.Layout, error) {
			return perl.Layout{}, fmt.Errorf("perl 5.%d: hidden by the test: %w", v, perl.ErrUnknownVersion)
		}
	})
	pids := []int{startBurnPerl(t, pl, "chain"), startBurnPerl(t, pl, "chain")}
	hiddenRuntimeStacks(t, s, pids, "perl", "Perl_runops_standard", 30)
	if lines := logContexts(logs, "perl version not supported", ""); len(lines) != 1 || !strings.Contains(lines[0], "perl 5.36") {
		t.Errorf("unsupported version log lines: %q, want one about perl 5.36", lines)
	}
	ps := p.Stats().Perl
	if ps.UnknownVersions != 1 || ps.Unsupported < 2 || ps.Processes != 0 {
		t.Errorf("Stats.Perl = %+v, want 1 unknown version, >= 2 unsupported, none walked", ps)
	}
	if _, err := perl.LayoutFor(36); errors.Is(err, perl.ErrUnknownVersion) {
		t.Fatalf("the table itself lost 5.36: %v", err)
	}
}

// TestKernelPerlBounds refuses a layout whose fields are outside what the
// walker reads of a context, a stack info or a statement.
func TestKernelPerlBounds(t *testing.T) {
	good, err := perl.LayoutFor(36)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kernelPerl(&perl.Interp{Version: "5.36.0", Layout: good}); err != nil {
		t.Fatalf("5.36: %v", err)
	}
	for name, mutate := range map[string]func(*perl.Layout){
		"cv past the context":      func(l *perl.Layout) { l.CxSubCV = int64(tracer.PerlCxRead) },
		"si_type past the si":      func(l *perl.Layout) { l.SIType = int64(tracer.PerlSIRead) },
		"file past the statement":  func(l *perl.Layout) { l.CopFile = int64(tracer.PerlCopRead) },
		"line not 4-aligned":       func(l *perl.Layout) { l.CopLine = 38 },
		"negative oldcop offset":   func(l *perl.Layout) { l.CxOldcop = -8 },
		"blk_u16 across two words": func(l *perl.Layout) { l.CxU16 = 7 },
	} {
		l := good
		mutate(&l)
		if _, err := kernelPerl(&perl.Interp{Version: "5.36.0", Layout: l}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// coveredUntil is the end of the latest interval in profiles.
func coveredUntil(profiles []pprofile.Profiles) time.Time {
	var end time.Time
	for _, pd := range profiles {
		for _, rp := range pd.ResourceProfiles().All() {
			for _, sp := range rp.ScopeProfiles().All() {
				for _, prof := range sp.Profiles().All() {
					if e := prof.Time().AsTime().Add(time.Duration(prof.DurationNano())); e.After(end) {
						end = e
					}
				}
			}
		}
	}
	return end
}

// TestPerlNYTProf profiles burn.pl's two leaves (leaf_a with three times
// leaf_b's work) under Devel::NYTProf, Debian's Perl profiler, and with
// Sonde at once: the share of leaf_a in Sonde's samples of the two leaves
// agrees with its share of NYTProf's exclusive times within 5 points.
func TestPerlNYTProf(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	bin := perlBin(t)
	if err := bin.Command("-MDevel::NYTProf::Data", "-e", "1").Run(); err != nil {
		if testutil.InCI() {
			t.Fatalf("Devel::NYTProf is missing (CI=true: apt-get install libdevel-nytprof-perl): %v", err)
		}
		t.Skipf("Devel::NYTProf is missing (libdevel-nytprof-perl): %v", err)
	}
	p, s := startProfiler(t, 99)
	out := filepath.Join(t.TempDir(), "nytprof.out")
	cmd := bin.Command("-d:NYTProf", perlTestdata(t, "burn.pl"), "oracle")
	cmd.Env = append(os.Environ(), "NYTPROF=file="+out+":stmts=0")
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	pid := cmd.Process.Pid
	// innermost counts pid's samples by their innermost Perl frame.
	innermost := func() (counts map[string]int, total int, other []string) {
		counts = map[string]int{}
		for _, pd := range s.all() {
			for _, st := range framedStacks(pd, pid) {
				total++
				if len(other) < 5 && !strings.Contains(fmt.Sprint(st), "perl:main::leaf_") {
					other = append(other, fmt.Sprint(st))
				}
				for _, f := range st {
					if f.typ == "perl" {
						counts[f.name]++
						break
					}
				}
			}
		}
		return counts, total, other
	}
	// It runs until Sonde has 400 samples in the two leaves, then stops
	// on SIGTERM and writes its profile.
	deadline := time.Now().Add(90 * time.Second)
	for c, _, _ := innermost(); c["main::leaf_a"]+c["main::leaf_b"] < 400 && time.Now().Before(deadline); c, _, _ = innermost() {
		s.waitFor(len(s.all())+1, 5*time.Second)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("perl -d:NYTProf: %v", err)
	}
	// Every sample of the process is in an interval that ends within the
	// pipeline's lag (1 s) after its exit.
	exited := time.Now()
	deadline = time.Now().Add(30 * time.Second)
	for coveredUntil(s.all()).Before(exited.Add(time.Second)) && time.Now().Before(deadline) {
		s.waitFor(len(s.all())+1, time.Until(deadline))
	}
	counts, total, other := innermost()
	a, b := counts["main::leaf_a"], counts["main::leaf_b"]
	st := p.Stats()
	t.Logf("%d samples of the process; perl %+v; kernel perl samples %d frames %d read errors %d bad frames %d; some not in a leaf:\n%s",
		total, st.Perl, st.Kernel.PerlSamples, st.Kernel.PerlFrames, st.Kernel.PerlReadErrs, st.Kernel.PerlBadFrames, strings.Join(other, "\n"))
	if a+b < 400 {
		t.Fatalf("%d samples in leaf_a, %d in leaf_b, want 400 at least; innermost perl frames: %v", a, b, counts)
	}
	excl := bin.Command(perlTestdata(t, "nytprof_excl.pl"), "main::leaf_a", "main::leaf_b")
	excl.Env = append(os.Environ(), "NYTPROF_FILE="+out)
	excl.Stderr = os.Stderr
	ny, err := excl.Output()
	if err != nil {
		t.Fatalf("nytprof_excl.pl: %v", err)
	}
	secs := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(string(ny)), "\n") {
		var name string
		var sec float64
		if _, err := fmt.Sscanf(line, "%s %f", &name, &sec); err != nil {
			t.Fatalf("nytprof_excl.pl said %q: %v", line, err)
		}
		secs[name] = sec
	}
	ea, eb := secs["main::leaf_a"], secs["main::leaf_b"]
	if ea+eb <= 0 {
		t.Fatalf("NYTProf: leaf_a %.3f s, leaf_b %.3f s", ea, eb)
	}
	ours, theirs := float64(a)/float64(a+b), ea/(ea+eb)
	t.Logf("leaf_a's share: Sonde %.3f (%d of %d samples), NYTProf %.3f (%.3f s of %.3f s)", ours, a, a+b, theirs, ea, ea+eb)
	if ours-theirs > 0.05 || theirs-ours > 0.05 {
		t.Errorf("leaf_a's share: Sonde %.3f, NYTProf %.3f: more than 5 points apart", ours, theirs)
	}
}

// TestPerlCloc profiles a real Perl program, Debian's cloc counting the
// lines of perl's own library (1,155 files): its samples that hold Perl
// frames while the program runs (under perl_run) hold whole Perl stacks,
// each frame named with a file and a line, down to cloc's top-level code,
// then native frames only. Samples taken while perl compiles it (under
// perl_parse: BEGIN blocks, use) have frames of objects perl frees or
// changes as soon as they are done (the BEGIN block's sub, the compiler's
// own statement, PL_compiling): read up to a poll interval later, most are
// gone, a documented limit (docs/perl.md). Their share grows with a cold
// page cache, so they are held to what the namer promises for them instead:
// a frame is named whole or not at all, and every unnamed frame is counted.
func TestPerlCloc(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	perlBin(t)
	const cloc, tree = "/usr/bin/cloc", "/usr/share/perl/5.36.0/"
	for _, p := range []string{cloc, tree} {
		if _, err := os.Stat(p); err != nil {
			if testutil.InCI() {
				t.Fatalf("%s is missing (CI=true: apt-get install cloc perl): %v", p, err)
			}
			t.Skipf("%s is missing (cloc, perl): %v", p, err)
		}
	}
	p, s := startProfiler(t, 99)
	cmd := exec.Command(cloc, "--quiet", tree)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if err := cmd.Wait(); err != nil {
		t.Fatalf("cloc: %v", err)
	}
	exited := time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for coveredUntil(s.all()).Before(exited.Add(time.Second)) && time.Now().Before(deadline) {
		s.waitFor(len(s.all())+1, time.Until(deadline))
	}
	var total, withPerl, whole, compiling, unnamed int
	var bad []string
	subs := map[string]int{}
	for _, pd := range s.all() {
		for _, st := range framedStacks(pd, pid) {
			total++
			last := -1
			parse := false
			for i, f := range st {
				if f.typ == "perl" {
					last = i
					if f.name == "" {
						unnamed++
					}
					if (f.name == "") != (f.file == "") || (f.name != "" && f.line <= 0) {
						t.Errorf("perl frame half named: %+v in %v", f, st)
					}
				}
				parse = parse || (f.typ == "native" && f.name == "perl_parse")
			}
			if last < 0 {
				continue
			}
			if parse {
				compiling++
				continue
			}
			withPerl++
			ok := st[last].name == "(main)" && st[last].file == cloc
			for i, f := range st {
				switch {
				case f.typ == "perl":
					ok = ok && f.name != "" && f.file != "" && f.line > 0
					if f.name != "" {
						subs[f.name]++
					}
				case i > last:
					ok = ok && f.typ == "native"
				}
			}
			if ok {
				whole++
			} else if len(bad) < 5 {
				bad = append(bad, fmt.Sprint(st))
			}
		}
	}
	st := p.Stats()
	t.Logf("%d samples of cloc, %d with Perl frames while it ran, %d of them whole, %d while perl compiled it; %d perl frames unnamed; perl %+v; kernel perl samples %d frames %d read errors %d bad frames %d; frames by sub: %v",
		total, withPerl, whole, compiling, unnamed, st.Perl, st.Kernel.PerlSamples, st.Kernel.PerlFrames, st.Kernel.PerlReadErrs, st.Kernel.PerlBadFrames, subs)
	for _, b := range bad {
		t.Logf("not whole: %s", b)
	}
	if uint64(unnamed) > st.Perl.Unnamed {
		t.Errorf("%d perl frames of cloc unnamed, %d counted", unnamed, st.Perl.Unnamed)
	}
	if withPerl < 100 {
		t.Fatalf("%d of %d samples with Perl frames while cloc ran, want 100", withPerl, total)
	}
	if whole*100 < withPerl*95 {
		t.Errorf("%d of %d samples with Perl frames while cloc ran whole, want 95 %%", whole, withPerl)
	}
}
