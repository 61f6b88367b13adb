package collector_test

import (
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// completeShare profiles pid and returns how many of its samples carry the
// full chain: the user frames from the leaf down to main are a suffix of
// chain (leaf first), so a sample in b reads b, a, main and one in c reads
// c, b, a, main; frames below main (libc's start-up code) may follow.
//
// A new process is unwound by frame pointers until its tables are loaded
// (DESIGN.md, data flow 2-3). Those warm-up samples are counted apart: the
// share is measured from the first export after a complete sample shows the
// tables are in, over at least n samples.
func completeShare(t *testing.T, sink *consumertest.ProfilesSink, pid, n int, chain []string) (complete, total, warmup int, bad []flatSample) {
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
				ok := fullChain(s.Frames, chain)
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

func fullChain(frames []frame, chain []string) bool {
	var user []string
	for _, f := range frames {
		if f.Type != "kernel" {
			user = append(user, f.Function)
		}
	}
	i := slices.Index(user, chain[len(chain)-1])
	if i < 0 {
		return false
	}
	return i < len(chain) && slices.Equal(user[:i+1], chain[len(chain)-1-i:])
}

func TestUnwindWithoutFramePointers(t *testing.T) {
	cChain := []string{"c", "b", "a", "main"}
	for _, tc := range []struct {
		name  string
		chain []string
	}{
		{testutil.CChainNoFP, cChain},
		{testutil.CChainStripped, cChain},
		// The leaf is frameless: a frame-pointer walk from it skips beta.
		{testutil.GoLeaf, []string{"main.leaf", "main.beta", "main.alpha", "main.main"}},
	} {
		name, chain := tc.name, tc.chain
		t.Run(name, func(t *testing.T) {
			sink := startReceiver(t, 499)
			bin := testutil.BuildWorkload(t, name)
			cmd := testutil.StartWorkload(t, bin)
			complete, total, warmup, bad := completeShare(t, sink, cmd.Process.Pid, 1500, chain)
			share := 100 * float64(complete) / float64(max(total, 1))
			t.Logf("%s: %d of %d samples (%.2f %%) carry the full chain down to main (after %d warm-up samples before its tables were loaded)",
				name, complete, total, share, warmup)
			for i, s := range bad {
				if i == 5 {
					break
				}
				t.Logf("  incomplete: %s", functions(s.Frames))
			}
			if total < 1500 || share < 99 {
				t.Errorf("%s: %.2f %% of %d samples complete, want at least 99 %% of at least 1500", name, share, total)
			}
		})
	}
}
