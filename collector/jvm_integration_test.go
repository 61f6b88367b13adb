package collector_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// The JVM stack tests run the real receiver in-process on HotSpot
// programs (testdata/jvm, built by the test with each JDK; run with
// -Xmx128m and no profiling aid: no frame pointers, perf maps or agents)
// and read Java frames through the contract of jvm_helpers_test.go. The
// receiver starts before the programs, so their first samples count.

// jvmRate is the receivers' sampling rate in these tests.
const jvmRate = 199

// readySlack keeps the samples taken while a program printed "ready"
// (the test reads the line a little after) out of its chain's count.
const readySlack = 100 * time.Millisecond

// jvmCollect polls the sink until the main thread of each process has n
// samples taken after it was ready, or timeout passes; each gets every
// such sample with how many of its timestamps count.
func jvmCollect(t *testing.T, sink *consumertest.ProfilesSink, procs []javaProc, n int, timeout time.Duration, each func(p javaProc, s jvmSample, count int)) map[int]int {
	t.Helper()
	got := map[int]int{}
	byPID := map[int64]javaProc{}
	for _, p := range procs {
		byPID[int64(p.pid)] = p
		got[p.pid] = 0
	}
	done := func() bool {
		for _, c := range got {
			if c < n {
				return false
			}
		}
		return true
	}
	far := time.Now().Add(24 * time.Hour)
	deadline := time.Now().Add(timeout)
	read := 0
	for !done() && time.Now().Before(deadline) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range jvmFlatten(pd) {
				p, ok := byPID[s.PID]
				if !ok || s.TID != p.main {
					continue
				}
				if c := timesIn(s.flatSample, p.ready.Add(readySlack), far); c > 0 {
					got[p.pid] += c
					each(p, s, c)
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	return got
}

// javaSeq is the sequence a chain is checked against: the Java frames of
// s, inlined ones apart, stubs left out, with the native frames named in
// natives in their places; leaf first.
func javaSeq(s jvmSample, natives []string) []jframe {
	var out []jframe
	for i, l := range s.Locs {
		switch {
		case l.Type == "jvm" && l.Tier == "stub":
		case l.Type == "jvm" && len(l.Lines) == 0:
			out = append(out, jframe{jvmLine: jvmLine{Function: unnamed}, Tier: l.Tier, Loc: i})
		case l.Type == "jvm":
			for k, ln := range l.Lines {
				out = append(out, jframe{jvmLine: ln, Tier: l.Tier, Loc: i, Inlined: k < len(l.Lines)-1})
			}
		case l.Type != "kernel" && slices.Contains(natives, s.Frames[i].Function):
			out = append(out, jframe{jvmLine: jvmLine{Function: s.Frames[i].Function}, Tier: l.Type, Loc: i})
		}
	}
	return out
}

// checkJava checks the shape of a sample with Java frames: not cut short
// ([truncated]), every Java frame named and rightly (checkName), the
// outermost frame native (the VM that called the first Java method, down
// to the thread's start), and, when natives is nil, no native frame
// between two Java frames.
func checkJava(s jvmSample, b jvmBuild, natives []string) error {
	if truncated(s.flatSample) {
		return fmt.Errorf("marked %s", "[truncated]")
	}
	first, last := -1, -1
	for i, l := range s.Locs {
		if l.Type == "jvm" {
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if first < 0 {
		return fmt.Errorf("no java frame")
	}
	for _, f := range javaFrames(s) {
		if f.Function == unnamed {
			return fmt.Errorf("unnamed java frame (%s)", f.Tier)
		}
		if err := checkName(f, b.methods); err != nil {
			return fmt.Errorf("wrong name: %w", err)
		}
	}
	if last == len(s.Locs)-1 {
		return fmt.Errorf("the outermost frame is a java frame")
	}
	if natives == nil {
		for i := first; i <= last; i++ {
			if s.Locs[i].Type != "jvm" {
				return fmt.Errorf("%s frame %s between java frames", s.Locs[i].Type, s.Frames[i].Function)
			}
		}
	}
	return nil
}

// jvmTally counts one process's samples for a chain.
type jvmTally struct {
	total, whole, partial int
	// pending counts samples neither whole nor their root side with a
	// frame found by frame pointers: a file on the stack had no unwind
	// table loaded yet (a library the program loaded just before "ready").
	pending int
	tiers   map[string]int // the leaf's tier in whole samples
	bad     []string
}

func (tl *jvmTally) fail(s jvmSample, err error) {
	if len(tl.bad) < 6 {
		tl.bad = append(tl.bad, err.Error()+": "+jvmFunctions(s))
	}
}

// failPending is fail for a sample of count c, counted as pending instead
// where a frame of it was found by frame pointers.
func (tl *jvmTally) failPending(s jvmSample, err error, c int) {
	if slices.Contains(s.ByFP, true) {
		tl.pending += c
		return
	}
	tl.fail(s, err)
}

// jvmReport logs the tallies and fails where fewer than minWhole percent of
// at least n samples are whole.
func jvmReport(t *testing.T, what string, procs map[int]jvmBuild, got map[int]*jvmTally, n int, minWhole float64) {
	t.Helper()
	for pid, tl := range got {
		j := procs[pid].jdk.name
		share := 100 * float64(tl.whole) / float64(max(tl.total, 1))
		t.Logf("%s, JDK %s: %d of %d samples whole (%.2f %%), %d partial, %d pending tables; leaf tiers %v", what, j, tl.whole, tl.total, share, tl.partial, tl.pending, tl.tiers)
		if tl.total < n || share < minWhole {
			t.Errorf("%s, JDK %s: %d of %d samples whole (%.2f %%), want at least %.0f %% of at least %d; e.g.\n%s",
				what, j, tl.whole, tl.total, share, minWhole, n, strings.Join(tl.bad, "\n"))
		}
	}
}

// TestJVMStacks profiles JBurn (main -> jAlpha -> jBeta -> jGammaBurn)
// with each JDK from its first sample: of the main thread's samples after
// it printed "ready", at least 99 % carry exactly that chain, named, with
// the source file and descriptor of each method, the leaf on a line of
// jGammaBurn and each caller at its call line, interpreted callers above
// a leaf that runs interpreted, then in C1's and C2's (on-stack
// replacement) code: most of it in C2's.
func TestJVMStacks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver") // before the builds
	builds := map[int]jvmBuild{}
	var bs []jvmBuild
	for _, j := range jdks(t) {
		bs = append(bs, buildJVM(t, j))
	}
	sink := startReceiver(t, jvmRate)
	var procs []javaProc
	chains := map[int][]jwant{}
	marks := jvmMarks(t, "JBurn.java")
	for _, b := range bs {
		p := b.start(t, nil, "JBurn")
		procs = append(procs, p)
		builds[p.pid] = b
		chains[p.pid] = []jwant{jin(b.method(t, "JBurn.jGammaBurn"), "JBurn.jGammaBurn"), jat("JBurn.jBeta", jvmMark(t, marks, "call-gamma")),
			jat("JBurn.jAlpha", jvmMark(t, marks, "call-beta")), jat("JBurn.main", jvmMark(t, marks, "call-alpha"))}
	}
	got := map[int]*jvmTally{}
	for _, p := range procs {
		got[p.pid] = &jvmTally{tiers: map[string]int{}}
	}
	const n = 2500 // about 15 s of a core each
	jvmCollect(t, sink, procs, n, 120*time.Second, func(p javaProc, s jvmSample, c int) {
		tl := got[p.pid]
		tl.total += c
		if err := checkJava(s, builds[p.pid], nil); err != nil {
			tl.fail(s, err)
			return
		}
		seq := javaSeq(s, nil)
		if err := matchChain(seq, chains[p.pid]); err != nil {
			tl.fail(s, err)
			return
		}
		for _, f := range seq[1:] {
			if f.Tier != "interpreted" {
				tl.fail(s, fmt.Errorf("caller %s in %s code, want interpreted (called once)", f.Function, f.Tier))
				return
			}
		}
		tl.whole += c
		tl.tiers[seq[0].Tier] += c
	})
	jvmReport(t, "JBurn", builds, got, n, 99)
	for pid, tl := range got {
		for tier := range tl.tiers {
			if !slices.Contains([]string{"interpreted", "c1", "c2"}, tier) {
				t.Errorf("JDK %s: jGammaBurn in %q code", builds[pid].jdk.name, tier)
			}
		}
		if 2*tl.tiers["c2"] < tl.whole {
			t.Errorf("JDK %s: jGammaBurn in C2's code in %d of %d whole samples, want most (its loop runs on)", builds[pid].jdk.name, tl.tiers["c2"], tl.whole)
		}
	}
}

// TestJVMInlinedFrames profiles Inline, whose loop calls mid, which calls
// leaf, small methods C2 inlines into loop's code. By default HotSpot
// records where inlined code is only at safepoints, so a sample may show
// the innermost inlined frames or not, but at least 99 % of the samples
// after "ready" carry a whole chain: leaf <- mid <- loop, mid <- loop or
// loop alone, then drive and main at their call lines. With
// DebugNonSafepoints each instruction has its inlining chain: the same
// 99 % hold, and after the first sample that shows it, at least 80 % show
// leaf and mid as inlined Lines of loop's location, in order, each at its
// line (JFR shows 93-97 % on the same program: TestJFROracle).
func TestJVMInlinedFrames(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver") // before the builds
	var bs []jvmBuild
	for _, j := range jdks(t) {
		bs = append(bs, buildJVM(t, j))
	}
	marks := jvmMarks(t, "Inline.java")
	for _, mode := range []struct {
		name    string
		opts    []string
		inlined bool
	}{{"default", nil, false}, {"DebugNonSafepoints", inlineFlags, true}} {
		t.Run(mode.name, func(t *testing.T) {
			sink := startReceiver(t, jvmRate)
			builds := map[int]jvmBuild{}
			var procs []javaProc
			for _, b := range bs {
				p := b.start(t, mode.opts, "Inline")
				procs = append(procs, p)
				builds[p.pid] = b
			}
			got := map[int]*jvmTally{}
			inl := map[int]*jvmTally{}
			for _, p := range procs {
				got[p.pid] = &jvmTally{tiers: map[string]int{}}
				inl[p.pid] = &jvmTally{tiers: map[string]int{}}
			}
			const n = 1500
			jvmCollect(t, sink, procs, n, 90*time.Second, func(p javaProc, s jvmSample, c int) {
				b := builds[p.pid]
				tl := got[p.pid]
				tl.total += c
				if err := checkJava(s, b, nil); err != nil {
					tl.fail(s, err)
					return
				}
				seq := javaSeq(s, nil)
				full := inlineChain(t, b, marks, false)
				mid := jin(b.method(t, "Inline.mid"), "Inline.mid")
				loop := jin(b.method(t, "Inline.loop"), "Inline.loop")
				var err error
				for _, chain := range [][]jwant{full, append([]jwant{mid}, full[2:]...), append([]jwant{loop}, full[3:]...)} {
					if err = matchChain(seq, chain); err == nil {
						break
					}
				}
				if err != nil {
					tl.fail(s, err)
					return
				}
				tl.whole += c
				tl.tiers[seq[0].Tier] += c
				if !mode.inlined {
					return
				}
				// Inlined: one location holds leaf, mid and loop.
				it := inl[p.pid]
				err = matchChain(seq, inlineChain(t, b, marks, true))
				if err == nil && (seq[0].Loc != seq[2].Loc || seq[2].Tier != "c2") {
					err = fmt.Errorf("leaf, mid and loop in locations %d, %d, %d (%s), want one of C2's", seq[0].Loc, seq[1].Loc, seq[2].Loc, seq[2].Tier)
				}
				if it.whole == 0 && err != nil {
					it.partial += c // warm-up: before C2's code with leaf inlined runs
					return
				}
				it.total += c
				if err != nil {
					it.fail(s, err)
					return
				}
				it.whole += c
			})
			jvmReport(t, "Inline "+mode.name, builds, got, n, 99)
			if mode.inlined {
				// Warm-up samples are reported as partial.
				jvmReport(t, "Inline "+mode.name+", inlined chain after warm-up", builds, inl, n/2, 80)
			}
		})
	}
}

// TestJVMMixedJNIStacks profiles JniBurn: Java (main -> jOuter) calls
// the native method nativeBurn, whose C code (Java_JniBurn_nativeBurn ->
// jniburn_middle, built without frame pointers) calls back into Java
// (jCallback -> jInnerBurn), which burns. At least 95 % of the main
// thread's samples after "ready" carry that whole mixed chain, C functions
// named, Java frames at their lines, the native method's own Java frame
// between jOuter and the C code; at least 99 % carry it or its root side
// (a sample in the JNI transition lacks the leaf's frames). A sample that
// is neither but has a frame found by frame pointers is left out of that
// share and counted apart: the program loads libjniburn.so just before
// "ready", and until its table (or libjvm.so's) is loaded the walk there
// is a guess, as the V8 addon test allows too. At most 5 % of the samples
// may be such.
func TestJVMMixedJNIStacks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver") // before the builds
	var bs []jvmBuild
	for _, j := range jdks(t) {
		bs = append(bs, buildJVM(t, j))
	}
	marks := jvmMarks(t, "JniBurn.java")
	natives := []string{"jniburn_middle", "Java_JniBurn_nativeBurn"}
	sink := startReceiver(t, jvmRate)
	builds := map[int]jvmBuild{}
	var procs []javaProc
	for _, b := range bs {
		p := b.start(t, nil, "JniBurn")
		procs = append(procs, p)
		builds[p.pid] = b
	}
	got := map[int]*jvmTally{}
	for _, p := range procs {
		got[p.pid] = &jvmTally{tiers: map[string]int{}}
	}
	const n = 1500
	jvmCollect(t, sink, procs, n, 90*time.Second, func(p javaProc, s jvmSample, c int) {
		b := builds[p.pid]
		tl := got[p.pid]
		tl.total += c
		if err := checkJava(s, b, natives); err != nil {
			tl.failPending(s, err, c)
			return
		}
		chain := []jwant{jin(b.method(t, "JniBurn.jInnerBurn"), "JniBurn.jInnerBurn"), jat("JniBurn.jCallback", jvmMark(t, marks, "call-inner")),
			{fn: "jniburn_middle", anyLine: true}, {fn: "Java_JniBurn_nativeBurn", anyLine: true}, {fn: "JniBurn.nativeBurn", anyLine: true},
			jat("JniBurn.jOuter", jvmMark(t, marks, "call-native")), jat("JniBurn.main", jvmMark(t, marks, "call-outer"))}
		seq := javaSeq(s, natives)
		if err := matchChain(seq, chain); err == nil {
			tl.whole += c
			tl.tiers[seq[0].Tier] += c
			return
		}
		// The root side: from jCallback or jOuter (at any of their
		// lines), a C function or the native method on.
		for k := 1; k < len(chain)-1; k++ {
			root := slices.Clone(chain[k:])
			switch k {
			case 1:
				root[0] = jin(b.method(t, "JniBurn.jCallback"), "JniBurn.jCallback")
			case 5:
				root[0] = jin(b.method(t, "JniBurn.jOuter"), "JniBurn.jOuter")
			}
			if matchChain(seq, root) == nil {
				tl.partial += c
				return
			}
		}
		tl.failPending(s, matchChain(seq, chain), c)
	})
	jvmReport(t, "JniBurn", builds, got, n, 95)
	for pid, tl := range got {
		// Samples walked before the tables came are judged apart: at
		// most 5 % of them, or the tables came late (or never).
		judged := tl.total - tl.pending
		if share := 100 * float64(tl.whole+tl.partial) / float64(max(judged, 1)); share < 99 {
			t.Errorf("JniBurn, JDK %s: %.2f %% of %d samples whole or their root side, want at least 99 %%; e.g.\n%s",
				builds[pid].jdk.name, share, judged, strings.Join(tl.bad, "\n"))
		}
		if share := 100 * float64(tl.pending) / float64(max(tl.total, 1)); share > 5 {
			t.Errorf("JniBurn, JDK %s: %d of %d samples (%.2f %%) not whole with frames found by frame pointers, want at most 5 %%",
				builds[pid].jdk.name, tl.pending, tl.total, share)
		}
	}
}

// TestJVMNoWrongNames profiles Churn, which deoptimizes and recompiles
// its hot call sites and loads, runs and unloads Plugin classes (their
// code freed and reused) all the time, from its first sample, every
// thread: every named Java frame must be a method of the program, with its
// descriptor, file and a line of its own, or the JDK's, in a file of its
// package (checkName); a name the namer cannot vouch for must be left out
// (an unnamed jvm frame), never replaced by a method's that was there
// before. Unnamed frames are counted; at most 2 % of the samples with Java
// frames may hold one (code freed between the sample and its naming is
// rare: a round frees a few methods every few hundred milliseconds).
func TestJVMNoWrongNames(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver") // before the builds
	var bs []jvmBuild
	for _, j := range jdks(t) {
		bs = append(bs, buildJVM(t, j))
	}
	sink := startReceiver(t, jvmRate)
	builds := map[int]jvmBuild{}
	var procs []javaProc
	for _, b := range bs {
		p := b.start(t, nil, "Churn", b.plugins)
		procs = append(procs, p)
		builds[p.pid] = b
	}
	type count struct{ samples, java, named, unnamedSamples, wrong, plugin int }
	got := map[int64]*count{}
	var bad []string
	for _, p := range procs {
		got[int64(p.pid)] = &count{}
	}
	// Until each JVM gave 1,000 samples with Java frames: a fixed window
	// gives fewer where other work shares the CPUs.
	enough := func() bool {
		for _, cn := range got {
			if cn.java < 1000 || cn.plugin == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(2 * time.Minute)
	read := 0
	for time.Now().Before(deadline) && !enough() {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range jvmFlatten(pd) {
				cn, ok := got[s.PID]
				if !ok {
					continue
				}
				b := builds[int(s.PID)]
				cn.samples += s.Count
				jf := javaFrames(s)
				if len(jf) == 0 {
					continue
				}
				cn.java += s.Count
				hasUnnamed := false
				for _, f := range jf {
					if f.Function == unnamed {
						hasUnnamed = true
						continue
					}
					cn.named += s.Count
					if strings.HasPrefix(f.Function, "Plugin") {
						cn.plugin += s.Count
					}
					if err := checkName(f, b.methods); err != nil {
						cn.wrong += s.Count
						if len(bad) < 8 {
							bad = append(bad, fmt.Sprintf("JDK %s: %v: %s", b.jdk.name, err, jvmFunctions(s)))
						}
					}
				}
				if hasUnnamed {
					cn.unnamedSamples += s.Count
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	for pid, cn := range got {
		j := builds[int(pid)].jdk.name
		t.Logf("Churn, JDK %s: %d samples, %d with java frames (%d named frames, %d in Plugin's classes), %d with an unnamed java frame, %d wrong names",
			j, cn.samples, cn.java, cn.named, cn.plugin, cn.unnamedSamples, cn.wrong)
		if cn.java < 1000 || cn.plugin == 0 {
			t.Errorf("Churn, JDK %s: %d samples with java frames, %d frames of Plugin; want at least 1000 and some", j, cn.java, cn.plugin)
		}
		if cn.wrong > 0 {
			t.Errorf("Churn, JDK %s: %d wrongly named java frames", j, cn.wrong)
		}
		if 100*cn.unnamedSamples > 2*cn.java {
			t.Errorf("Churn, JDK %s: %d of %d samples hold an unnamed java frame, want at most 2 %%", j, cn.unnamedSamples, cn.java)
		}
	}
	if len(bad) > 0 {
		t.Logf("wrong names, e.g.:\n%s", strings.Join(bad, "\n"))
	}
}

// jfrKeys are the keys the comparison with JFR counts for one stack of
// Java frames (leaf first): its leaf method, and its chain: the leaf
// method, then each caller at its line.
func jfrKeys(frames []jframe) (leaf, chain string) {
	if len(frames) == 0 {
		return "", ""
	}
	parts := []string{frames[0].Function}
	for _, f := range frames[1:] {
		parts = append(parts, fmt.Sprintf("%s:%d", f.Function, f.Line))
	}
	return frames[0].Function, strings.Join(parts, " <- ")
}

// TestJVMAgainstJFR profiles, with each JDK, JBurn's mix (two leaves,
// two parts to one) and Inline with DebugNonSafepoints under a JFR
// recording, and compares Sonde's samples of the main thread with JFR's
// over the same window (JFR's first to last sample after "ready"): each
// leaf method and each chain (the leaf method, then each caller, inlined
// ones included, at its line) over 1 % of either's samples has the same
// share in both, within 5 points.
func TestJVMAgainstJFR(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver") // before the builds
	var bs []jvmBuild
	for _, j := range jdks(t) {
		bs = append(bs, buildJVM(t, j))
	}
	for _, tc := range []struct {
		name  string
		opts  []string
		class string
		args  []string
	}{
		{"JBurn-mix", nil, "JBurn", []string{"mix", "20"}},
		{"Inline-DebugNonSafepoints", inlineFlags, "Inline", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink, rcv := startReceiverWith(t, jvmRate)
			type run struct {
				b   jvmBuild
				p   javaProc
				rec string
			}
			var runs []run
			for _, b := range bs {
				rec := filepath.Join(t.TempDir(), tc.class+".jfr")
				p := b.start(t, append([]string{"-XX:StartFlightRecording=filename=" + rec + ",settings=profile"}, tc.opts...), tc.class, tc.args...)
				runs = append(runs, run{b, p, rec})
			}
			for _, r := range runs {
				if tc.args == nil {
					// Inline runs until told: 20 s of its CPU, then
					// SIGTERM, on which JFR writes the recording.
					waitBurning(t, r.p, 20*time.Second)
					if err := r.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
						t.Fatal(err)
					}
				}
				waitExit(t, r.p.cmd, 120*time.Second)
			}
			// Until the receiver exported past the programs' exits; then it
			// is shut down and the sink holds all.
			sondeSamples(t, sink, rcv, func(flatSample) bool { return false })
			for _, r := range runs {
				var jfr []testutil.JFRSample
				for _, s := range testutil.JFRSamples(t, r.b.jdk.home, r.rec, 128) {
					if s.TID == r.p.main && s.Time.After(r.p.ready) {
						jfr = append(jfr, s)
					}
				}
				if len(jfr) < 200 {
					t.Errorf("JDK %s: JFR has %d samples of the main thread, want at least 200", r.b.jdk.name, len(jfr))
					continue
				}
				from, to := jfr[0].Time, jfr[len(jfr)-1].Time
				jLeaf, jChain := map[string]int{}, map[string]int{}
				for _, s := range jfr {
					l, c := jfrKeys(jfrJavaFrames(s))
					jLeaf[l]++
					jChain[c]++
				}
				sLeaf, sChain := map[string]int{}, map[string]int{}
				total := 0
				for _, pd := range sink.AllProfiles() {
					for _, s := range jvmFlatten(pd) {
						if s.PID != int64(r.p.pid) || s.TID != r.p.main || s.Type != "samples" {
							continue
						}
						c := timesIn(s.flatSample, from, to)
						if c == 0 {
							continue
						}
						total += c
						l, ch := jfrKeys(javaFrames(s))
						sLeaf[l] += c
						sChain[ch] += c
					}
				}
				t.Logf("JDK %s: JFR %d samples, Sonde %d in JFR's window %v-%v", r.b.jdk.name, len(jfr), total, from.Format(time.TimeOnly), to.Format(time.TimeOnly))
				t.Logf("  leaves: JFR %s; Sonde %s", topShares(jLeaf, 4), topShares(sLeaf, 4))
				t.Logf("  chains: JFR %s; Sonde %s", topShares(jChain, 4), topShares(sChain, 4))
				if total < 1000 {
					t.Errorf("JDK %s: Sonde has %d samples of the main thread in JFR's window, want at least 1000", r.b.jdk.name, total)
				}
				for what, diff := range map[string][]string{"leaf": compareShares(sLeaf, jLeaf, 1, 5), "chain": compareShares(sChain, jChain, 1, 5)} {
					if len(diff) > 0 {
						t.Errorf("JDK %s: %s shares differ by more than 5 points:\n%s", r.b.jdk.name, what, strings.Join(diff, "\n"))
					}
				}
			}
		})
	}
}
