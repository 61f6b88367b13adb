package profiler

import (
	"context"
	"testing"
	"time"
)

// burn burns CPU in one goroutine until ctx ends.
func burn(ctx context.Context) {
	for n := 0; ctx.Err() == nil; n++ {
		for i := range 1 << 16 {
			n ^= i
		}
	}
}

// In a real run, a thread that burns CPU in one loop has most of its
// samples added as repeats of a stack resolved before in their interval:
// the eBPF side's frames of a prepared process are keyed.
func TestRepeatedStacksInRealRun(t *testing.T) {
	p, s := startProfiler(t, 499)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go burn(ctx)
	// Until the first repeat, or 20 s: the test binary's own tables and
	// symbols come first, and its samples are keyed only once its frames
	// resolve through them (a CI machine's first run builds them cold).
	deadline := time.Now().Add(20 * time.Second)
	for s.waitFor(len(s.all())+1, 5*time.Second); p.Stats().Repeated == 0 && time.Now().Before(deadline); {
		s.waitFor(len(s.all())+1, 5*time.Second)
	}
	st := p.Stats()
	t.Logf("%d samples, %d repeats (%.1f %%), %d not keyed for want of room", st.Samples, st.Repeated,
		100*float64(st.Repeated)/float64(max(st.Samples, 1)), st.Unkeyed)
	if st.Repeated == 0 {
		t.Fatal("no sample was added as a repeat")
	}
}
