package collector_test

import (
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// completeShare profiles pid and returns how many of its main thread's
// samples match.
//
// A new process is unwound by frame pointers until its tables are loaded
// (DESIGN.md, data flow 2-3). Those warm-up samples are counted apart: the
// share is measured from the first export after a complete sample shows the
// tables are in, over at least n samples.
func completeShare(t *testing.T, sink *consumertest.ProfilesSink, pid, n int, match func([]frame) bool) (complete, total, warmup int, bad []flatSample) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	read := 0
	warm := false
	for total < n && time.Now().Before(deadline) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			wasWarm := warm
			for _, s := range flatten(pd) {
				// The main thread: a Go program's runtime threads
				// (sysmon, GC workers) run other code.
				if s.PID != int64(pid) || s.TID != int64(pid) {
					continue
				}
				ok := match(s.Frames)
				if !wasWarm {
					warmup += s.Count
					warm = warm || ok
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
	return complete, total, warmup, bad
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
// frames below main (libc's start-up code) may follow.
func fullChain(frames []frame, chain []string) bool {
	user := userNames(frames)
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
			complete, total, warmup, bad := completeShare(t, sink, cmd.Process.Pid, 1500, match)
			share := 100 * float64(complete) / float64(max(total, 1))
			t.Logf("%s: %d of %d samples (%.2f %%) carry the full chain down to main (after %d warm-up samples before its tables were loaded)",
				tc.name, complete, total, share, warmup)
			for i, s := range bad {
				if i == 5 {
					break
				}
				t.Logf("  incomplete: %s", functions(s.Frames))
			}
			if total < 1500 || share < 99 {
				t.Errorf("%s: %.2f %% of %d samples complete, want at least 99 %% of at least 1500", tc.name, share, total)
			}
		})
	}
}

// A library swapped by dlclose and dlopen usually lands where the last one
// was. Its frames must never be unwound with the old library's table nor
// named with its symbols: the unwinder checks each mapping entry against the
// live mapping (where the kernel allows) and user space then re-reads the
// process's maps. Samples taken between the swap and that re-read (tens of
// milliseconds per phase on a busy machine) may be incomplete, never wrong:
// no sample may mix the libraries, and at least 90 % must be complete.
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
	var total, complete, mixed int
	var bad []flatSample
	completeBy := map[byte]int{}
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
				total += s.Count
				if fullChain(s.Frames, chains[lib]) {
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
	t.Logf("dlswap: %d of %d samples in the libraries (%.2f %%) carry the full chain (a: %d, b: %d); %d mixed",
		complete, total, share, completeBy['a'], completeBy['b'], mixed)
	for _, s := range bad {
		t.Logf("  incomplete: %s", functions(s.Frames))
	}
	if completeBy['a'] < 1000 || completeBy['b'] < 1000 {
		t.Errorf("complete samples in a: %d, in b: %d; want at least 1000 of each", completeBy['a'], completeBy['b'])
	}
	if share < 90 {
		t.Errorf("%.2f %% of %d samples complete, want at least 90 %%", share, total)
	}
}
