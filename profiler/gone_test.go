package profiler

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// Short-lived processes exit before or while the profiler prepares them:
// each costs at most a count. The profiler keeps delivering intervals, and
// the unwinder's per-process maps (known_slots, known_pids, mappings) keep nothing for
// any of them once their exits are handled.
func TestShortLivedProcessesGone(t *testing.T) {
	p, sink := startProfiler(t, 499)
	// A CPU burner keeps every interval non-empty: an empty interval is not
	// exported.
	testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChain))
	sh := testutil.RequireTool(t, "sh")
	tru := testutil.RequireTool(t, "true")
	const n = 200
	out, err := exec.Command(sh, "-c", `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do "$0" & echo $!; wait; i=$((i+1)); done`, tru).Output()
	if err != nil {
		t.Fatalf("shell loop: %v", err)
	}
	dead := map[int64]bool{}
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("shell loop printed %q", f)
		}
		dead[pid] = true
	}
	if len(dead) != n {
		t.Fatalf("%d distinct pids from %d processes", len(dead), n)
	}

	// The reader may lag behind the ring buffer: wait for intervals until
	// one of them holds samples of the processes, two intervals on.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	exported := len(sink.all())
	sampled := map[int64]bool{}
	read := 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); <-tick.C {
		all := sink.all()
		for _, pd := range all[read:] {
			for pid := range pidsOf(pd) {
				if dead[pid] {
					sampled[pid] = true
				}
			}
		}
		read = len(all)
		if len(sampled) > 0 && read >= exported+2 {
			break
		}
	}
	if read < exported+2 {
		t.Fatalf("%d intervals delivered in 20 s after the processes exited, want 2", read-exported)
	}
	if len(sampled) == 0 {
		t.Fatalf("none of the %d processes was sampled: nothing was exercised", n)
	}

	// Their exits reach the preparer in order after their other requests:
	// once it has handled what it had accepted by now, it is done with
	// them.
	queued := p.Stats().Preparer.Queued
	for deadline := time.Now().Add(10 * time.Second); ; <-tick.C {
		if handled := p.Stats().Preparer.Handled; handled >= queued {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the preparer handled fewer than %d requests in 10 s", queued)
		}
	}
	entries, err := p.tracer.ProcessEntries()
	if err != nil {
		t.Fatal(err)
	}
	leaked := map[int64]int{}
	for pid := range dead {
		if e := entries[uint32(pid)]; e > 0 {
			leaked[pid] = e
		}
	}
	t.Logf("%d short-lived processes: %d sampled, %d never prepared (gone within execGrace), %d times a process (of any on the host) was found gone while being prepared; %d still have entries in the unwinder's maps",
		n, len(sampled), p.Stats().Preparer.ExecsSkipped, p.Stats().Preparer.Gone, len(leaked))
	if len(leaked) > 0 {
		t.Errorf("entries (known slots, known_pids and mapping blocks) left for exited pids: %v", leaked)
	}
	// Most of them exit within execGrace of their exec, many unsampled:
	// those are never prepared.
	if skipped := p.Stats().Preparer.ExecsSkipped; skipped < n/4 {
		t.Errorf("%d of %d short-lived processes skipped preparation, want at least %d", skipped, n, n/4)
	}
}
