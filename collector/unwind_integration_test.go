package collector_test

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/profiler"
	"github.com/sonde-dev/sonde/tracer"
)

// completeShare profiles pid and returns how many of its main thread's
// samples match, of every sample it exported from the first one on, over
// at least n samples: a new program's first samples, taken before its
// tables are loaded, count like the rest (their stacks are unwound from
// snapshots, DESIGN.md data flow 2-3). bad holds a few that did not match.
//
// A Go program's main thread also runs the scheduler on its system stack,
// more often on a busy machine (preemption, hand-offs of a locked thread).
// Such a stack ends at runtime.mcall or runtime.morestack, the system
// stack's true bottom: it is whole, but not the workload's chain, so it is
// reported apart and left out of the share. So is the Go runtime starting
// up on the main thread before main.main runs (runtime.rt0_go's
// schedinit; runtime.main before it calls main.main): no chain of the
// workload's can be on that stack yet.
func completeShare(t *testing.T, sink *consumertest.ProfilesSink, pid, n int, match func([]frame) bool) (complete, total int, bad []flatSample) {
	t.Helper()
	scheduler, startup := 0, 0
	defer func() {
		if scheduler > 0 {
			t.Logf("%d samples of pid %d were the Go scheduler on the system stack, whole down to runtime.mcall or runtime.morestack; not counted", scheduler, pid)
		}
		if startup > 0 {
			t.Logf("%d samples of pid %d were the Go runtime starting up, before main.main; not counted", startup, pid)
		}
	}()
	deadline := time.Now().Add(120 * time.Second)
	read := 0
	for total < n && time.Now().Before(deadline) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range flatten(pd) {
				// The main thread: a Go program's runtime threads
				// (sysmon, GC workers) run other code.
				if s.PID != int64(pid) || s.TID != int64(pid) {
					continue
				}
				ok := match(s.Frames)
				if user := userNames(s.Frames); !ok && len(user) > 0 &&
					(user[len(user)-1] == "runtime.mcall" || user[len(user)-1] == "runtime.morestack") {
					scheduler += s.Count
					continue
				}
				if user := userNames(s.Frames); !ok && goStartingUp(user) {
					startup += s.Count
					continue
				}
				total += s.Count
				if ok {
					complete += s.Count
				} else {
					bad = append(bad, s)
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	if total < n {
		t.Logf("pid %d: %d samples of %d counted; its main thread had run %v on CPU",
			pid, total, n, threadCPU(pid, pid))
	}
	return complete, total, bad
}

// goStartingUp says whether user, a stack's user function names leaf
// first, is the Go runtime's start-up before main.main: it ends at
// runtime.rt0_go (schedinit and what it calls), or runs in runtime.main
// with no main.main above it.
func goStartingUp(user []string) bool {
	if len(user) == 0 {
		return false
	}
	if user[len(user)-1] == "runtime.rt0_go" {
		return true
	}
	return slices.Contains(user, "runtime.main") && !slices.Contains(user, "main.main")
}

// threadCPU is the CPU time thread tid of pid has run, from its stat file
// (0 if it cannot be read).
func threadCPU(pid, tid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces): state is the 3rd
	// field, utime and stime the 14th and 15th, in clock ticks (100 Hz).
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// userNames are the names of the user frames, leaf first.
func userNames(frames []frame) []string {
	var user []string
	for _, f := range frames {
		if f.Type != "kernel" {
			user = append(user, f.Function)
		}
	}
	return user
}

// fullChain reports whether the user frames, read from main toward the
// leaf, follow chain (leaf first) for as long as either lasts: a sample in b
// reads b, a, main; one in c reads c, b, a, main. Frames beyond the whole
// chain on the leaf side (a runtime's helpers called from the leaf) and
// frames below main (libc's start-up code) may follow. A function's cold
// part, which GCC moves out of line as "<function>.cold" (the throw in c,
// the catch in a), reads as the function: it is that function's code.
func fullChain(frames []frame, chain []string) bool {
	user := userNames(frames)
	for i, name := range user {
		if base, _, cold := strings.Cut(name, ".cold"); cold {
			user[i] = base
		}
	}
	return followsChain(user, chain)
}

// followsChain is fullChain on user frames of any comparable kind.
func followsChain[T comparable](user, chain []T) bool {
	i := slices.Index(user, chain[len(chain)-1])
	if i < 0 {
		return false
	}
	k := len(chain) - 1
	for j := i; j >= 0 && k >= 0; j, k = j-1, k-1 {
		if user[j] != chain[k] {
			return false
		}
	}
	return true
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestUnwindWithoutFramePointers(t *testing.T) {
	cChain := []string{"c", "b", "a", "main"}
	for _, tc := range []struct {
		name  string
		chain []string
		args  func(t *testing.T) []string
		// also, when set, must hold for a sample to count as complete.
		also func(user []string) bool
	}{
		{name: testutil.CChainNoFP, chain: cChain},
		{name: testutil.CChainStripped, chain: cChain},
		// The leaf is frameless: a frame-pointer walk from it skips beta.
		{name: testutil.GoLeaf, chain: []string{"main.leaf", "main.beta", "main.alpha", "main.main"}},
		// The callback's stack crosses glibc's qsort internals.
		{name: testutil.QSort, chain: []string{"b", "main"}, also: func(user []string) bool {
			return user[0] != "c" || slices.Index(user, "b") >= 2
		}},
		// C++ that throws from c and catches in a.
		{name: testutil.Throw, chain: cChain},
		// A handler's stack crosses the signal frame into the code it
		// interrupted, a or b.
		{name: testutil.Signal, chain: []string{"a", "main"}, also: func(user []string) bool {
			if user[0] != "handler" {
				return true
			}
			// handler, the signal frame, then a (or b, a).
			return slices.Index(user, "a") >= 2
		}},
		{name: testutil.Recurse, chain: append(append([]string{"burn"}, repeat("rec", 200)...), "main")},
		// The library is loaded after the process, and the profiler, start.
		{name: testutil.DLOpen, chain: []string{"lib_inner", "lib_outer", "main"}, args: func(t *testing.T) []string {
			return []string{testutil.BuildWorkload(t, testutil.DLOpenLib)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := startReceiver(t, 499)
			bin := testutil.BuildWorkload(t, tc.name)
			var args []string
			if tc.args != nil {
				args = tc.args(t)
			}
			cmd := testutil.StartWorkload(t, bin, args...)
			match := func(frames []frame) bool {
				return fullChain(frames, tc.chain) && (tc.also == nil || tc.also(userNames(frames)))
			}
			complete, total, bad := completeShare(t, sink, cmd.Process.Pid, 1500, match)
			share := 100 * float64(complete) / float64(max(total, 1))
			t.Logf("%s: %d of %d samples (%.2f %%) carry the full chain down to main, from the program's first sample",
				tc.name, complete, total, share)
			for i, s := range bad {
				if i == 5 {
					break
				}
				t.Logf("  incomplete: %s", functions(s.Frames))
			}
			if total < 1500 || share < 99.5 {
				t.Errorf("%s: %.2f %% of %d samples complete, want at least 99.5 %% of at least 1500", tc.name, share, total)
			}
		})
	}
}

// A stack deeper than the unwinder's frame limit ends there: its leaf-most
// tracer.MaxUserFrames frames, then the truncation marker. The unwinder
// walks it in one bpf_loop (5.17+) or in runs joined by tail calls: no frame
// may be lost or repeated where they join, and none of the bottom reported.
func TestUnwindStopsAtFrameLimit(t *testing.T) {
	sink := startReceiver(t, 499)
	bin := testutil.BuildWorkload(t, testutil.Recurse)
	cmd := testutil.StartWorkload(t, bin, "400")
	match := func(frames []frame) bool {
		user := userNames(frames)
		if len(user) != tracer.MaxUserFrames+1 || user[len(user)-1] != profiler.TruncatedFrame {
			return false
		}
		// The leaf is burn, or rec between its calls.
		if user[0] != "burn" && user[0] != "rec" {
			return false
		}
		for _, f := range user[1 : len(user)-1] {
			if f != "rec" {
				return false
			}
		}
		return true
	}
	complete, total, bad := completeShare(t, sink, cmd.Process.Pid, 1500, match)
	share := 100 * float64(complete) / float64(max(total, 1))
	t.Logf("%d of %d samples (%.2f %%) hold %d frames of the recursion, then %s",
		complete, total, share, tracer.MaxUserFrames, profiler.TruncatedFrame)
	for i, s := range bad {
		if i == 5 {
			break
		}
		t.Logf("  not cut at the limit (%d user frames): %s", len(userNames(s.Frames)), functions(s.Frames))
	}
	if total < 1500 || share < 99.5 {
		t.Errorf("%.2f %% of %d samples cut at the frame limit, want at least 99.5 %% of at least 1500", share, total)
	}
}

// cgoHash matches the hash cgo puts in the names it generates
// (_cgo_<hash>_Cfunc_f in C, main._cgoexp_<hash>_f in Go); it derives from
// the build directory, so the expected chains name it <hash>.
var cgoHash = regexp.MustCompile(`(_cgo_|_cgoexp_)[0-9a-f]{12}_`)

// typedChain is fullChain for chains whose frames must also have the right
// type (go or native), with cgo's hashes replaced by <hash>.
func typedChain(frames []frame, chain []frame) bool {
	return followsChain(typedUser(frames), chain)
}

// typedUser are the user frames, leaf first, with cgo's hashes replaced by
// <hash>.
func typedUser(frames []frame) []frame {
	var user []frame
	for _, f := range frames {
		if f.Type != "kernel" {
			user = append(user, frame{cgoHash.ReplaceAllString(f.Function, "${1}<hash>_"), f.Type})
		}
	}
	return user
}

// inCgocallBookkeeping reports whether frames, read from main toward the
// leaf, follow chain down to a runtime.cgocall or runtime.cgocallbackg and
// from there go on in the Go runtime alone (and the vDSO it reads the
// clock from): those call entersyscall, exitsyscall and reentersyscall
// around the calls that the chain follows, and a sample taken in them is a
// whole stack that is not on the chain.
func inCgocallBookkeeping(frames []frame, chain []frame) bool {
	user := typedUser(frames)
	j := slices.Index(user, chain[len(chain)-1])
	if j < 0 {
		return false
	}
	k := len(chain) - 1
	for j >= 0 && k >= 0 && user[j] == chain[k] {
		j, k = j-1, k-1
	}
	if j < 0 || k < 0 || chain[k+1] != (frame{"runtime.cgocall", "go"}) && chain[k+1] != (frame{"runtime.cgocallbackg", "go"}) {
		return false
	}
	for ; j >= 0; j-- {
		f := user[j]
		runtime := f.Type == "go" && (strings.HasPrefix(f.Function, "runtime.") || strings.HasPrefix(f.Function, "internal/runtime/"))
		vdso := j == 0 && f.Type == "native" && strings.HasPrefix(f.Function, "__vdso_")
		if !runtime && !vdso {
			return false
		}
	}
	return true
}

// A Go program and its C half call each other on the hot path: Go calls C
// through cgo (runtime.cgocall switches to the thread's system stack, g0)
// and C calls back into Go (crosscall2 and runtime.cgocallback switch back
// to the goroutine's stack). The unwinder must cross both switches in both
// directions, through C without frame pointers, to reach main.main.
func TestUnwindCgo(t *testing.T) {
	g := func(name string) frame { return frame{name, "go"} }
	c := func(name string) frame { return frame{name, "native"} }
	// From the callback down to main.main, leaf first, as the binary's code
	// has it (objdump -d): each cgo call goes main._Cfunc_f ->
	// runtime.cgocall -> runtime.asmcgocall (assembly; it switches to the
	// system stack) -> the C wrapper _cgo_<hash>_Cfunc_f -> f. The export
	// goes through the C wrapper goCallback -> crosscall2 ->
	// runtime.cgocallback (back to the goroutine's stack) ->
	// runtime.cgocallbackg (its ABI0 wrapper, which the pclntab names like
	// the function) -> runtime.cgocallbackg -> runtime.cgocallbackg1 ->
	// _cgoexp_<hash>_goCallback -> main.goCallback.
	callback := []frame{
		g("main.goInner"), g("main.goCallback"), g("_cgoexp_<hash>_goCallback"),
		g("runtime.cgocallbackg1"), g("runtime.cgocallbackg"), g("runtime.cgocallbackg"), g("runtime.cgocallback"),
		g("crosscall2"), c("goCallback"), c("c_middle"), c("c_outer"), c("_cgo_<hash>_Cfunc_c_outer"),
		g("runtime.asmcgocall"), g("runtime.cgocall"), g("main._Cfunc_c_outer"), g("main.goOuter"), g("main.main"),
	}
	for _, tc := range []struct {
		name  string
		arg   string
		chain []frame
	}{
		// C under Go under C under Go.
		{name: "c-leaf", arg: "c", chain: append([]frame{
			c("c_leaf"), c("_cgo_<hash>_Cfunc_c_leaf"),
			g("runtime.asmcgocall"), g("runtime.cgocall"), g("main._Cfunc_c_leaf"),
		}, callback...)},
		// Go under C under Go.
		{name: "go-leaf", arg: "go", chain: append([]frame{g("main.goLeaf")}, callback...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := startReceiver(t, 499)
			bin := testutil.BuildWorkload(t, testutil.GoCgo)
			cmd := testutil.StartWorkload(t, bin, tc.arg)
			match := func(frames []frame) bool {
				return typedChain(frames, tc.chain) || inCgocallBookkeeping(frames, tc.chain)
			}
			complete, total, bad := completeShare(t, sink, cmd.Process.Pid, 1500, match)
			share := 100 * float64(complete) / float64(max(total, 1))
			t.Logf("%s %s: %d of %d samples (%.2f %%) carry the full chain down to main.main with the right frame types, from the program's first sample",
				testutil.GoCgo, tc.name, complete, total, share)
			for i, s := range bad {
				if i == 5 {
					break
				}
				t.Logf("  incomplete: %s", functions(s.Frames))
			}
			if total < 1500 || share < 99.5 {
				t.Errorf("%s %s: %.2f %% of %d samples complete, want at least 99.5 %% of at least 1500; want (leaf first) %s",
					testutil.GoCgo, tc.name, share, total, functions(tc.chain))
			}
		})
	}
}

// A library swapped by dlclose and dlopen usually lands where the last one
// was. Its frames must never be unwound with the old library's table nor
// named with its symbols. Where the kernel lets the unwinder look at the
// live mapping (bpf_find_vma), it checks each process entry against it and,
// for a library whose table it already holds, unwinds from that table at
// once while user space re-reads the process's maps. So: no sample may mix
// the libraries, and once each library was seen whole (its first load is
// the warm-up every new file has), at least 99 % of its samples are whole.
func TestUnwindAcrossDLClose(t *testing.T) {
	sink := startReceiver(t, 499)
	bin := testutil.BuildWorkload(t, testutil.DLSwap)
	libA := testutil.BuildWorkload(t, testutil.DLSwapA)
	libB := testutil.BuildWorkload(t, testutil.DLSwapB)
	cmd := testutil.StartWorkload(t, bin, libA, libB, "1500")
	pid := cmd.Process.Pid

	chains := map[byte][]string{
		'a': {"a_inner", "a_outer", "run", "main"},
		'b': {"b_inner", "b_outer", "run", "main"},
	}
	inLib := func(name string) byte {
		if len(name) > 2 && name[1] == '_' && (name[0] == 'a' || name[0] == 'b') &&
			(name[2:] == "inner" || name[2:] == "outer") {
			return name[0]
		}
		return 0
	}
	var total, complete, mixed, warmup int
	var bad []flatSample
	completeBy := map[byte]int{}
	seen := map[byte]bool{} // a whole sample of the library was seen
	deadline := time.Now().Add(60 * time.Second)
	read := 0
	// At least four phases: each library is loaded twice or more, mostly at
	// one address.
	for (completeBy['a'] < 1000 || completeBy['b'] < 1000) && time.Now().Before(deadline) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range flatten(pd) {
				if s.PID != int64(pid) {
					continue
				}
				var lib byte
				for _, name := range userNames(s.Frames) {
					switch l := inLib(name); {
					case l == 0:
					case lib == 0:
						lib = l
					case l != lib:
						mixed += s.Count
						t.Errorf("frames of both libraries in one sample: %s", functions(s.Frames))
					}
				}
				if lib == 0 {
					continue // in dlopen, dlclose or the loop
				}
				whole := fullChain(s.Frames, chains[lib])
				if !seen[lib] {
					seen[lib] = whole
					warmup += s.Count
					continue
				}
				total += s.Count
				if whole {
					complete += s.Count
					completeBy[lib] += s.Count
				} else if len(bad) < 8 {
					bad = append(bad, s)
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	share := 100 * float64(complete) / float64(max(total, 1))
	t.Logf("dlswap: %d of %d samples in the libraries (%.2f %%) carry the full chain (a: %d, b: %d) after %d warm-up samples of their first loads; %d mixed",
		complete, total, share, completeBy['a'], completeBy['b'], warmup, mixed)
	for _, s := range bad {
		t.Logf("  incomplete: %s", functions(s.Frames))
	}
	if completeBy['a'] < 1000 || completeBy['b'] < 1000 {
		t.Errorf("complete samples in a: %d, in b: %d; want at least 1000 of each", completeBy['a'], completeBy['b'])
	}
	if share < 99 {
		t.Errorf("%.2f %% of %d samples complete, want at least 99 %%", share, total)
	}
}
