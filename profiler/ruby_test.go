//go:build linux

package profiler

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/ruby"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// rubyBin is Debian 12's Ruby 3.1; the tests skip without it, or fail
// under CI=true.
func rubyBin(t *testing.T) testutil.Ruby {
	t.Helper()
	return testutil.Ruby31(t)
}

const burnRB = "../internal/ruby/testdata/burn.rb"

// startBurnRuby runs internal/ruby's burn.rb in mode with rb and waits for
// its "ready" line.
func startBurnRuby(t *testing.T, rb testutil.Ruby, mode string) int {
	t.Helper()
	cmd := rb.Command(burnRB, mode)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	return cmd.Process.Pid
}

// rbFrame is a frame of a sample as the profile has it.
type rbFrame struct {
	typ, name, file string
	line            int64
}

// rubyStacks returns the stacks (leaf first) of pid's samples in pd, each
// repeated by its sample count, with each frame's first line.
func rubyStacks(pd pprofile.Profiles, pid int) [][]rbFrame {
	dict := pd.Dictionary()
	strs := dict.StringTable()
	var out [][]rbFrame
	for _, rp := range pd.ResourceProfiles().All() {
		if v, ok := rp.Resource().Attributes().Get("process.pid"); !ok || v.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					var st []rbFrame
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						var f rbFrame
						for _, ai := range loc.AttributeIndices().All() {
							kv := dict.AttributeTable().At(int(ai))
							if strs.At(int(kv.KeyStrindex())) == "profile.frame.type" {
								f.typ = kv.Value().Str()
							}
						}
						if loc.Lines().Len() > 0 {
							ln := loc.Lines().At(0)
							fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
							f.name, f.file, f.line = strs.At(int(fn.NameStrindex())), strs.At(int(fn.FilenameStrindex())), ln.Line()
						}
						st = append(st, f)
					}
					for range s.TimestampsUnixNano().Len() {
						out = append(out, st)
					}
				}
			}
		}
	}
	return out
}

// rubyLine returns the 1-based line of burn.rb holding text.
func rubyLine(t *testing.T, text string) int64 {
	t.Helper()
	b, err := os.ReadFile(burnRB)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return int64(i + 1)
		}
	}
	t.Fatalf("%s: no line holds %q", burnRB, text)
	return 0
}

// rubyChain is a mode of burn.rb run by a Ruby version and the Ruby frames
// above its leaf, innermost first: name and the text on its line, or the
// file ("<internal:kernel>") of a method Ruby defines in Ruby (any line).
type rubyChain struct {
	rb    testutil.Ruby
	mode  string
	chain [][2]string
}

func rubyChains(rb testutil.Ruby) []rubyChain {
	top := [][2]string{
		{"Object#alpha", "beta(mode) + 1 # alpha's call"},
		{"block in main", "alpha(mode) # main's call"},
		{"Object#main", "loop do"},
	}
	if rb.Minor >= 3 { // Kernel#loop is written in Ruby (kernel.rb)
		top = slices.Insert(top, 2, [2]string{"Kernel#loop", "<internal:kernel>"})
	}
	script := [2]string{"<main>", "main(mode) # the script's call"}
	cat := func(a ...[][2]string) [][2]string {
		var out [][2]string
		for _, x := range a {
			out = append(out, x...)
		}
		return out
	}
	return []rubyChain{
		{rb, "ruby", cat([][2]string{{"Object#beta", "gamma_burn(200_000) # beta's call"}}, top, [][2]string{script})},
		{rb, "block", cat([][2]string{
			{"block in beta", "with_block { gamma_burn(200_000) } # beta's block"},
			{"Object#with_block", "yield + 1"},
			{"Object#beta", "with_block { gamma_burn(200_000) } # beta's block"}}, top, [][2]string{script})},
		{rb, "class", cat([][2]string{
			{"Burner#run", "gamma_burn(n) # Burner#run's call"},
			{"Burner.start", "new.run(n) # Burner.start's call"},
			{"Object#beta", "Burner.start(200_000) # beta's class call"}}, top, [][2]string{script})},
		{rb, "thread", cat([][2]string{{"Object#beta", "gamma_burn(200_000) # beta's call"}}, top,
			[][2]string{{"block in <main>", "Thread.new { main(mode) }.join # the thread's start"}})},
	}
}

// rubyWhole says what a stack of burn.rb whose leaf is gamma_burn lacks of
// the whole chain c (each Ruby frame in order with its file and line, any
// native frames between runs, and native frames below the last), or "".
func rubyWhole(t *testing.T, st []rbFrame, c rubyChain, file string, lo, hi int64) string {
	f := st[0]
	if f.file != file || f.line < lo || f.line > hi {
		return fmt.Sprintf("leaf at %s:%d, want %s:%d..%d", f.file, f.line, file, lo, hi)
	}
	i := 1
	for _, w := range c.chain {
		for i < len(st) && st[i].typ == "native" {
			i++
		}
		if i == len(st) {
			return fmt.Sprintf("no %s", w[0])
		}
		g := st[i]
		if strings.HasPrefix(w[1], "<internal:") {
			if g.typ != "ruby" || g.name != w[0] || g.file != w[1] || g.line <= 0 {
				return fmt.Sprintf("frame %d: %s %s at %s:%d, want ruby %s at %s", i, g.typ, g.name, g.file, g.line, w[0], w[1])
			}
			i++
			continue
		}
		if want := rubyLine(t, w[1]); g.typ != "ruby" || g.name != w[0] || g.file != file || g.line != want {
			return fmt.Sprintf("frame %d: %s %s at %s:%d, want ruby %s at %s:%d", i, g.typ, g.name, g.file, g.line, w[0], file, want)
		}
		i++
	}
	if i == len(st) || st[i].typ != "native" {
		return "no native frames below the Ruby ones"
	}
	for _, g := range st[i:] {
		if g.typ == "ruby" {
			return "a ruby frame below the chain"
		}
	}
	return ""
}

// TestRubyFrames runs burn.rb (main -> alpha -> beta -> gamma_burn) in its
// four modes (the chain on the main thread, the leaf in a block, through a
// class's singleton and instance methods, the chain on a second thread),
// started after the profiler. From the first sample in gamma_burn on, at
// least 99 % of those samples carry the whole chain with names, files and
// lines, and native frames below; the walker's and the namer's counters say
// so too. (Stacks sampled before libruby's unwind table is in the kernel
// have no Ruby frames at all: see the kernel's RubyNoTable.)
func TestRubyFrames(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	rubies := testutil.Rubies(t)
	file, err := filepath.Abs(burnRB)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := rubyLine(t, "while i < n"), rubyLine(t, "i += 1")
	p, s := startProfiler(t, 99)
	var cases []rubyChain
	for _, rb := range rubies {
		cases = append(cases, rubyChains(rb)...)
	}
	pids := make([]int, len(cases))
	for i, c := range cases {
		pids[i] = startBurnRuby(t, c.rb, c.mode)
	}
	const want = 200
	leaf := make([]int, len(cases))
	whole := make([]int, len(cases))
	bad := make([][]string, len(cases))
	example := make([]string, len(cases))
	count := func() {
		all := s.all()
		for i, c := range cases {
			leaf[i], whole[i], bad[i] = 0, 0, nil
			for k, pd := range all {
				for _, st := range rubyStacks(pd, pids[i]) {
					if len(st) == 0 || st[0].typ != "ruby" || st[0].name != "Object#gamma_burn" {
						continue
					}
					leaf[i]++
					if why := rubyWhole(t, st, c, file, lo, hi); why == "" {
						whole[i]++
						example[i] = fmt.Sprint(st)
					} else if len(bad[i]) < 5 {
						bad[i] = append(bad[i], fmt.Sprintf("interval %d of %d: %s: %v", k, len(all), why, st))
					}
				}
			}
		}
	}
	enough := func() bool {
		for _, n := range leaf {
			if n < want {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(120 * time.Second)
	for count(); !enough() && time.Now().Before(deadline); count() {
		s.waitFor(len(s.all())+1, 5*time.Second)
	}
	st := p.Stats()
	t.Logf("ruby %+v; kernel ruby samples %d frames %d read errors %d bad frames %d left native (no table yet) %d",
		st.Ruby, st.Kernel.RubySamples, st.Kernel.RubyFrames, st.Kernel.RubyReadErrs, st.Kernel.RubyBadFrames, st.Kernel.RubyNoTable)
	for i, c := range cases {
		name := c.rb.Version + " " + c.mode
		t.Logf("%s: %d of %d gamma_burn samples whole, one: %s", name, whole[i], leaf[i], example[i])
		for _, b := range bad[i] {
			t.Logf("%s: not whole: %s", name, b)
		}
		if leaf[i] < want {
			t.Errorf("%s: %d samples in gamma_burn, want %d", name, leaf[i], want)
		}
		if whole[i]*100 < leaf[i]*99 {
			t.Errorf("%s: %d of %d gamma_burn samples whole, want 99 %%", name, whole[i], leaf[i])
		}
	}
	if st.Ruby.Processes < uint64(len(cases)) || st.Ruby.Named == 0 || st.Kernel.RubySamples == 0 || st.Kernel.RubyFrames < st.Ruby.Named {
		t.Errorf("counters: ruby %+v, kernel samples %d frames %d", st.Ruby, st.Kernel.RubySamples, st.Kernel.RubyFrames)
	}
}

// TestKernelRubyBounds refuses a layout whose fields are outside what the
// walker reads of a control frame, and takes every version's of the table.
func TestKernelRubyBounds(t *testing.T) {
	good, err := ruby.LayoutFor(3, 1)
	if err != nil {
		t.Fatal(err)
	}
	in := ruby.Interp{Version: "3.1.0", Layout: good, TLSOffset: 8, Core: ruby.Range{Start: 0x1000, End: 0x9000}}
	if _, err := kernelRuby(&in); err != nil {
		t.Fatalf("3.1: %v", err)
	}
	for minor := 0; minor <= 4; minor++ {
		l, err := ruby.LayoutFor(3, minor)
		if err != nil {
			t.Fatalf("3.%d: %v", minor, err)
		}
		c := in
		c.Version, c.Layout = fmt.Sprintf("3.%d.0", minor), l
		if _, err := kernelRuby(&c); err != nil {
			t.Errorf("3.%d: %v", minor, err)
		}
	}
	for name, mutate := range map[string]func(*ruby.Interp){
		"ep past the frame block": func(in *ruby.Interp) { in.Layout.CFPEP = int64(tracer.RubyCFPRead) },
		"pc not 8-aligned":        func(in *ruby.Interp) { in.Layout.CFPPC = 4 },
		"negative cfp offset":     func(in *ruby.Interp) { in.Layout.ECCFP = -8 },
		"no tls offset":           func(in *ruby.Interp) { in.TLSOffset = 0 },
		"empty vm loop":           func(in *ruby.Interp) { in.Core.End = in.Core.Start },
	} {
		c := in
		mutate(&c)
		if _, err := kernelRuby(&c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestRubyUnknownVersion runs two real Ruby 3.1 processes while the
// profiler's layout table hides 3.1: the version is reported once (one log
// line, counted), and its processes keep their native stacks, with
// rb_vm_exec where Ruby frames would be.
func TestRubyUnknownVersion(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	rb := rubyBin(t)
	core, logs := observer.New(zapcore.WarnLevel)
	p, s := startProfiler(t, 99, func(o *Options) {
		o.Logger = zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
		o.rubyLayouts = func(major, minor int) (ruby.Layout, error) {
			return ruby.Layout{}, fmt.Errorf("ruby %d.%d: hidden by the test: %w", major, minor, ruby.ErrUnknownVersion)
		}
	})
	pids := []int{startBurnRuby(t, rb, "ruby"), startBurnRuby(t, rb, "ruby")}
	hiddenRuntimeStacks(t, s, pids, "ruby", "rb_vm_exec", 30)
	if lines := logContexts(logs, "ruby version not supported", ""); len(lines) != 1 || !strings.Contains(lines[0], "ruby 3.1") {
		t.Errorf("unsupported version log lines: %q, want one about ruby 3.1", lines)
	}
	rs := p.Stats().Ruby
	if rs.UnknownVersions != 1 || rs.Unsupported < 2 || rs.Processes != 0 {
		t.Errorf("Stats.Ruby = %+v, want 1 unknown version, >= 2 unsupported, none walked", rs)
	}
}

// TestRubyOracle compares the profiler with Ruby's own view of the same
// process: oracle.rb's second thread samples the main thread's innermost
// frame with Thread#backtrace_locations every 10 ms (it gets the GVL about
// 8 times a second: 300 samples take some 40 s). The share of gamma_burn
// among the two leaves' samples agrees within 10 points.
func TestRubyOracle(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	rb := rubyBin(t)
	_, s := startProfiler(t, 99)
	out := filepath.Join(t.TempDir(), "oracle")
	cmd := rb.Command("../internal/ruby/testdata/oracle.rb", out)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	pid := cmd.Process.Pid
	var gamma, delta, og, od int
	count := func() {
		gamma, delta = 0, 0
		for _, pd := range s.all() {
			for _, st := range rubyStacks(pd, pid) {
				if len(st) == 0 || st[0].typ != "ruby" {
					continue
				}
				switch st[0].name {
				case "Object#gamma_burn":
					gamma++
				case "Object#delta_burn":
					delta++
				}
			}
		}
		if b, err := os.ReadFile(out); err == nil {
			_, _ = fmt.Sscanf(string(b), "%d %d", &og, &od)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for count(); (gamma+delta < 500 || og+od < 300) && time.Now().Before(deadline); count() {
		s.waitFor(len(s.all())+1, 5*time.Second)
	}
	t.Logf("profiler: gamma_burn %d, delta_burn %d; Thread#backtrace: %d, %d", gamma, delta, og, od)
	if gamma+delta < 500 || og+od < 300 || delta == 0 || od == 0 {
		t.Fatalf("too few samples: profiler %d+%d (want 500), oracle %d+%d (want 300)", gamma, delta, og, od)
	}
	prof, oracle := float64(gamma)/float64(gamma+delta), float64(og)/float64(og+od)
	if prof-oracle > 0.1 || oracle-prof > 0.1 {
		t.Errorf("gamma_burn's share: profiler %.3f, Thread#backtrace %.3f: more than 10 points apart", prof, oracle)
	}
}

// TestRubyRealProgram profiles RubyGems loading every installed gem's
// specification over and over (library code, blocks, C functions between
// runs, gemspecs eval'd into iseqs that are freed at the next reset): at
// least 99 % of the samples with Ruby frames reach the stack's root through
// the interpreter's native frames, at least 90 % of their Ruby frames are
// named (a frame whose iseq was freed before the sample was resolved is
// left unnamed, counted as stale or unreadable, never misnamed), and
// RubyGems' own files are among the frames. It runs on each Ruby version.
func TestRubyRealProgram(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	for _, rb := range testutil.Rubies(t) {
		t.Run(rb.Version, func(t *testing.T) { testRubyRealProgram(t, rb) })
	}
}

func testRubyRealProgram(t *testing.T, rb testutil.Ruby) {
	p, s := startProfiler(t, 99)
	cmd := rb.Command("-e", `require "rubygems"
$stdout.sync = true
said = false
loop do
  Gem::Specification.reset
  Gem::Specification.to_a.size
  puts "ready" unless said
  said = true
end`)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	pid := cmd.Process.Pid
	var withRuby, rooted, frames, named, gems int
	var bad []string
	count := func() {
		withRuby, rooted, frames, named, gems, bad = 0, 0, 0, 0, 0, nil
		for _, pd := range s.all() {
			for _, st := range rubyStacks(pd, pid) {
				n, inGems := 0, false
				for _, f := range st {
					if f.typ != "ruby" {
						continue
					}
					n++
					frames++
					if f.name != "" && f.file != "" && f.line != 0 {
						named++
					}
					inGems = inGems || strings.Contains(f.file, "/rubygems")
				}
				if n == 0 {
					continue
				}
				withRuby++
				if inGems {
					gems++
				}
				if last := st[len(st)-1]; last.typ == "native" && (last.name == "_start" || last.name == "__clone3") {
					rooted++
				} else if len(bad) < 5 {
					bad = append(bad, fmt.Sprint(st))
				}
			}
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for count(); withRuby < 300 && time.Now().Before(deadline); count() {
		s.waitFor(len(s.all())+1, 5*time.Second)
	}
	t.Logf("%d of %d samples with ruby frames reach the root, %d in rubygems' files; %d of %d ruby frames named; ruby %+v",
		rooted, withRuby, gems, named, frames, p.Stats().Ruby)
	for _, b := range bad {
		t.Logf("not rooted: %s", b)
	}
	if withRuby < 300 {
		t.Fatalf("%d samples with ruby frames, want 300", withRuby)
	}
	if rooted*100 < withRuby*99 {
		t.Errorf("%d of %d samples with ruby frames reach the root, want 99 %%", rooted, withRuby)
	}
	if named*100 < frames*90 {
		t.Errorf("%d of %d ruby frames named, want 90 %%", named, frames)
	}
	if gems == 0 {
		t.Error("no frame in rubygems' files")
	}
}
