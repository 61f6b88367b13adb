//go:build linux

package collector_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/profiler"
)

// v8Functions formats the frames of s for a failure message: JavaScript
// frames as Function:line[tier] (inline levels joined by <i<), others as
// name(type).
func v8Functions(s jvmSample) string {
	var b []string
	for i, l := range s.Locs {
		switch {
		case l.Type == "v8js" && len(l.Lines) == 0:
			b = append(b, fmt.Sprintf("%s[%s]", unnamed, l.Tier))
		case l.Type == "v8js":
			var in []string
			for _, ln := range l.Lines {
				in = append(in, fmt.Sprintf("%s@%s:%d", ln.Function, filepath.Base(ln.File), ln.Line))
			}
			b = append(b, fmt.Sprintf("%s[%s]", strings.Join(in, "<i<"), l.Tier))
		default:
			fn := s.Frames[i].Function
			if fn == "" {
				fn = unnamed
			}
			b = append(b, fmt.Sprintf("%s(%s)", fn, l.Type))
		}
	}
	return strings.Join(b, " <- ")
}

// buildAddon builds internal/v8/testdata/addon.c as a Node addon with the
// system compiler against Debian's Node headers (package nodejs), with the
// flags node-gyp's release build takes from Node's common.gypi (-O3
// -fno-omit-frame-pointer; GCC still builds a leaf without a frame). One
// build serves every Node: N-API's ABI is stable.
func buildAddon(t *testing.T) string {
	t.Helper()
	const inc = "/usr/include/node"
	if _, err := os.Stat(filepath.Join(inc, "node_api.h")); err != nil {
		if testutil.InCI() {
			t.Fatalf("node's headers (CI=true: the tests need them): %v", err)
		}
		t.Skipf("node's headers: %v", err)
	}
	src, err := filepath.Abs("../internal/v8/testdata/addon.c")
	if err != nil {
		t.Fatal(err)
	}
	return testutil.BuildC(t, "addon.node", []string{"-O3", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-I", inc}, src)
}

// mixedWant is one frame of a mixed chain: a JavaScript function (with
// its script's base name) or a native one.
type mixedWant struct {
	fn, script string // script is "" for a native frame
}

// matchMixed checks that the stack of s, kernel frames left out, starts at
// want[0] and holds every want in order, JavaScript ones as v8js frames (or
// inline levels) with their script, a line and a tier, native ones as
// native frames; that every frame from the leaf down to node::Start is named
// and none marks the stack cut short; and that node::Start is below want.
func matchMixed(s jvmSample, want []mixedWant) error {
	return matchMixedTo(s, want, "node::Start")
}

// matchMixedTo is matchMixed with another native root than node::Start
// (a function name's prefix).
func matchMixedTo(s jvmSample, want []mixedWant, root string) error {
	k := 0
	first := true
	for i, l := range s.Locs {
		if l.Type == "kernel" {
			continue
		}
		fn := s.Frames[i].Function
		lines := l.Lines
		if l.Type != "v8js" || len(lines) == 0 {
			lines = []jvmLine{{Function: fn}}
		}
		for _, ln := range lines {
			if ln.Function == "" || ln.Function == profiler.TruncatedFrame {
				return fmt.Errorf("frame %d unnamed or cut short (%q) before %s", i, ln.Function, wantName(want, k, root))
			}
			if k == len(want) {
				if l.Type == "native" && strings.HasPrefix(ln.Function, root) {
					return nil
				}
				continue
			}
			w := want[k]
			if ln.Function != w.fn {
				if first {
					return fmt.Errorf("leaf %s, want %s", ln.Function, w.fn)
				}
				continue
			}
			first = false
			switch {
			case w.script == "" && l.Type != "native":
				return fmt.Errorf("%s is a %s frame, want native", w.fn, l.Type)
			case w.script != "" && l.Type != "v8js":
				return fmt.Errorf("%s is a %s frame, want v8js", w.fn, l.Type)
			case w.script != "" && (filepath.Base(ln.File) != w.script || ln.Line <= 0 || l.Tier == ""):
				return fmt.Errorf("%s at %s:%d tier %q", w.fn, ln.File, ln.Line, l.Tier)
			}
			k++
		}
	}
	if k < len(want) {
		return fmt.Errorf("chain ends before %s", want[k].fn)
	}
	return fmt.Errorf("no %s below the chain", root)
}

func wantName(want []mixedWant, k int, root string) string {
	if k < len(want) {
		return want[k].fn
	}
	return root
}

// v8Leaf is the innermost function of s, kernel frames left out.
func v8Leaf(s jvmSample) string {
	for i, l := range s.Locs {
		if l.Type == "kernel" {
			continue
		}
		if l.Type == "v8js" && len(l.Lines) > 0 {
			return l.Lines[0].Function
		}
		return s.Frames[i].Function
	}
	return ""
}

// v8Tally counts one leaf's samples of one process from the walker's
// first sample of it (start: the process's first sample with a named
// JavaScript frame); early counts the leaf's samples before.
type v8Tally struct {
	start       uint64
	leaf, whole int
	early       int
	pending     int // leaf samples left out as pend says
	tiers       map[string]int
	bad         []string
	badAt       []uint64 // the times of the samples in bad
}

func newV8Tally(start uint64) *v8Tally { return &v8Tally{start: start, tiers: map[string]int{}} }

func (tl *v8Tally) add(s jvmSample, err error) {
	tl.addPending(s, err, false)
}

// addPending is add for a sample that, when pending, is counted apart.
func (tl *v8Tally) addPending(s jvmSample, err error, pending bool) {
	n := 0
	for _, ts := range s.Times {
		if ts < tl.start {
			tl.early++
		} else {
			n++
		}
	}
	if n == 0 {
		return
	}
	if pending && err != nil {
		tl.pending += n
		return
	}
	tl.leaf += n
	if err != nil {
		if len(tl.bad) < 5 {
			tl.bad = append(tl.bad, fmt.Sprintf("%v: %s", err, v8Functions(s)))
			tl.badAt = append(tl.badAt, s.Times[len(s.Times)-1])
		}
		return
	}
	tl.whole += n
	for _, l := range s.Locs {
		if l.Type == "v8js" && l.Tier != "stub" {
			tl.tiers[l.Tier] += n
			break
		}
	}
}

// report logs tl and fails the test when it has fewer than n samples or
// fewer than minWhole percent whole.
func (tl *v8Tally) report(t *testing.T, what string, n int, minWhole float64) {
	t.Helper()
	share := 100 * float64(tl.whole) / float64(max(tl.leaf, 1))
	pending := ""
	if tl.pending > 0 {
		pending = fmt.Sprintf(", %d more not whole with the leaf's caller found by frame pointers (%.2f %% whole with them)",
			tl.pending, 100*float64(tl.whole)/float64(max(tl.leaf+tl.pending, 1)))
	}
	t.Logf("%s: %d of %d leaf samples whole (%.2f %%), %d before the process's first JavaScript frame%s; tiers of the innermost JavaScript frame %v",
		what, tl.whole, tl.leaf, share, tl.early, pending, tl.tiers)
	for i, b := range tl.bad {
		t.Logf("  not whole (%v after the first JavaScript frame): %s", time.Duration(tl.badAt[i]-tl.start).Round(time.Millisecond), b)
	}
	if tl.leaf < n {
		t.Errorf("%s: %d leaf samples, want %d", what, tl.leaf, n)
	}
	if share < minWhole {
		t.Errorf("%s: %.2f %% of %d leaf samples whole, want %.0f %%", what, share, tl.leaf, minWhole)
	}
}

// v8Samples gathers the samples of the processes in names as the sink
// receives them, until done says there are enough or limit passes.
func v8Samples(sink *consumertest.ProfilesSink, names map[int64]string, limit time.Duration, done func(map[int64][]jvmSample) bool) map[int64][]jvmSample {
	got := map[int64][]jvmSample{}
	deadline := time.Now().Add(limit)
	read := 0
	for time.Now().Before(deadline) && !done(got) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range jvmFlatten(pd) {
				if _, ok := names[s.PID]; ok && s.Type == "samples" {
					got[s.PID] = append(got[s.PID], s)
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	return got
}

// v8Start is the time of the earliest of ss with a named JavaScript frame:
// the walker has the process from then on (0: none).
func v8Start(ss []jvmSample) uint64 {
	var start uint64
	for _, s := range ss {
		named := false
		for _, l := range s.Locs {
			named = named || (l.Type == "v8js" && len(l.Lines) > 0)
		}
		if !named {
			continue
		}
		for _, ts := range s.Times {
			if start == 0 || ts < start {
				start = ts
			}
		}
	}
	return start
}

// callerByFP reports whether the leaf's caller, kernel frames left out,
// was found by the frame-pointer fallback: the leaf's file had no unwind
// table loaded yet (a library loaded after the process was prepared).
func callerByFP(s jvmSample) bool {
	for i, l := range s.Locs {
		if l.Type != "kernel" {
			return i+1 < len(s.ByFP) && s.ByFP[i+1]
		}
	}
	return false
}

// leafCount counts the samples in ss whose leaf (v8Leaf) is leaf.
func leafCount(ss []jvmSample, leaf string) int {
	n := 0
	for _, s := range ss {
		if v8Leaf(s) == leaf {
			n += s.Count
		}
	}
	return n
}

// TestV8AddonStacks runs addon.js with a native addon (addon.c, built in
// the test) on every Node, all started after the receiver, in turn
// calling JavaScript back from C and burning in C called from JavaScript.
// From each process's first sample in a leaf, at least 99 % of each
// leaf's samples carry the whole mixed chain, leaf first: main → jsOuter
// → sonde_addon_call (C) → napi_call_function (node) → jsCallback →
// jsLeafBurn, and main → jsOuterC → sonde_addon_burn (C) →
// sonde_addon_spin; JavaScript frames with addon.js and a line, the
// addon's C functions named from its symbols, every frame named, and
// node's C++ frames down to node::Start. Samples whose leaf's caller the
// frame-pointer fallback found (the addon's unwind table not read yet, a
// second or so after it is loaded) are counted apart. Once jsOuter,
// jsOuterC and main run compiled code the stacks hold V8 code on both
// sides of a native stretch, which the kernel side does not recognise
// yet when the VMA check is busy (docs/v8.md): the test fails until it
// does.
func TestV8AddonStacks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	builds := nodeBuilds(t)
	addon := buildAddon(t)
	script, err := filepath.Abs("../internal/v8/testdata/addon.js")
	if err != nil {
		t.Fatal(err)
	}
	chains := map[string][]mixedWant{
		"jsLeafBurn": {{"jsLeafBurn", "addon.js"}, {"jsCallback", "addon.js"}, {"napi_call_function", ""},
			{"sonde_addon_call", ""}, {"jsOuter", "addon.js"}, {"main", "addon.js"}},
		"sonde_addon_spin": {{"sonde_addon_spin", ""}, {"sonde_addon_burn", ""}, {"jsOuterC", "addon.js"}, {"main", "addon.js"}},
	}
	sink := startReceiver(t, jvmRate)
	names := map[int64]string{}
	for _, b := range builds {
		cmd := exec.Command(b.bin, script, addon)
		cmd.Stderr = os.Stderr
		testutil.StartReady(t, cmd, 30*time.Second)
		names[int64(cmd.Process.Pid)] = b.name
	}
	const n = 300
	all := v8Samples(sink, names, 3*time.Minute, func(got map[int64][]jvmSample) bool {
		for pid := range names {
			for leaf := range chains {
				if leafCount(got[pid], leaf) < n+50 { // the slack: start-up's
					return false
				}
			}
		}
		return true
	})
	for pid, name := range names {
		start := v8Start(all[pid])
		for leaf, want := range chains {
			tl := newV8Tally(start)
			for _, s := range all[pid] {
				if v8Leaf(s) == leaf {
					tl.addPending(s, matchMixed(s, want), callerByFP(s))
				}
			}
			tl.report(t, "addon.js, "+name+", leaf "+leaf, n, 99)
		}
	}
}

// TestV8AsyncStacks runs async.js on every Node, all started after the
// receiver: on the main thread, round after round, an await chain, a
// promise reaction and a timer, each with its own CPU-bound leaf, and in a
// worker thread a known chain. From each process's first sample with a
// JavaScript frame, at least 99 % of each leaf's samples carry the
// running function's whole synchronous stack, leaf first, every frame
// named, JavaScript frames with async.js and a line: awaitLeafBurn ←
// awaitInner ← awaitMiddle (resumed by the microtask queue; awaitOuter,
// which awaits it, is not on the stack) ← V8's MicrotaskQueue; thenLeafBurn
// ← thenCallback ← the MicrotaskQueue; timerLeafBurn ← timerMiddle ←
// timerTick ← node's timers (node::Environment::RunTimers); all down to
// node::Start on the main thread; and in the worker thread (another
// thread of the process, its own isolate) wGammaBurn ← wBeta ← wAlpha ←
// wMain down to node::worker::Worker::Run.
func TestV8AsyncStacks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	builds := nodeBuilds(t)
	script, err := filepath.Abs("../internal/v8/testdata/async.js")
	if err != nil {
		t.Fatal(err)
	}
	type leafWant struct {
		chain  []mixedWant
		root   string
		worker bool
		absent string // a function not on the synchronous stack
	}
	js := func(fn string) mixedWant { return mixedWant{fn, "async.js"} }
	leaves := map[string]leafWant{
		"awaitLeafBurn": {chain: []mixedWant{js("awaitLeafBurn"), js("awaitInner"), js("awaitMiddle"),
			{"v8::internal::MicrotaskQueue::RunMicrotasks", ""}}, root: "node::Start", absent: "awaitOuter"},
		"thenLeafBurn": {chain: []mixedWant{js("thenLeafBurn"), js("thenCallback"),
			{"v8::internal::MicrotaskQueue::RunMicrotasks", ""}}, root: "node::Start"},
		"timerLeafBurn": {chain: []mixedWant{js("timerLeafBurn"), js("timerMiddle"), js("timerTick"),
			{"node::Environment::RunTimers", ""}}, root: "node::Start"},
		"wGammaBurn": {chain: []mixedWant{js("wGammaBurn"), js("wBeta"), js("wAlpha"), js("wMain")},
			root: "node::worker::Worker::Run", worker: true},
	}
	sink := startReceiver(t, jvmRate)
	names := map[int64]string{}
	for _, b := range builds {
		cmd := exec.Command(b.bin, script)
		cmd.Stderr = os.Stderr
		testutil.StartReady(t, cmd, 30*time.Second)
		names[int64(cmd.Process.Pid)] = b.name
	}
	const n = 200
	all := v8Samples(sink, names, 3*time.Minute, func(got map[int64][]jvmSample) bool {
		for pid := range names {
			for leaf := range leaves {
				if leafCount(got[pid], leaf) < n+50 { // the slack: start-up's
					return false
				}
			}
		}
		return true
	})
	for pid, name := range names {
		start := v8Start(all[pid])
		for leaf, want := range leaves {
			tl := newV8Tally(start)
			for _, s := range all[pid] {
				if v8Leaf(s) != leaf {
					continue
				}
				err := matchMixedTo(s, want.chain, want.root)
				switch {
				case err != nil:
				case want.worker != (s.TID != s.PID):
					err = fmt.Errorf("thread %d of process %d, want the worker: %v", s.TID, s.PID, want.worker)
				case want.absent != "" && slices.ContainsFunc(s.Locs, func(l jvmLoc) bool {
					return slices.ContainsFunc(l.Lines, func(ln jvmLine) bool { return ln.Function == want.absent })
				}):
					err = fmt.Errorf("%s on the synchronous stack", want.absent)
				}
				tl.add(s, err)
			}
			tl.report(t, "async.js, "+name+", leaf "+leaf, n, 99)
		}
	}
}
