package profiler

import (
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// Every stack the kernel unwound to its root with its tables is unwound
// again from a snapshot of the same stack, taken at its first frame, by the
// resolver with rows read from the files (unwind.Finder): the two must find
// the same frames. The workloads cover the rules the tables hold: C without
// frame pointers, a qsort callback through glibc, C++ exceptions, a signal
// handler's frame, deep recursion, Go with and without cgo, and a
// BOLT-rewritten lld layout; every other process of the host is compared
// too.
func TestSnapshotsMatchKernelUnwinding(t *testing.T) {
	bins := []string{
		testutil.BuildWorkload(t, testutil.CChainNoFP),
		testutil.BuildWorkload(t, testutil.QSort),
		testutil.BuildWorkload(t, testutil.Throw),
		testutil.BuildWorkload(t, testutil.Signal),
		testutil.BuildWorkload(t, testutil.Recurse),
		testutil.BuildWorkload(t, testutil.GoChain),
		testutil.BuildWorkload(t, testutil.GoCgo),
		testutil.BuildLayout(t, testutil.Layout{Name: "c-lld-bolt", Flags: []string{"-fuse-ld=lld", "-Wl,--emit-relocs"}, BOLT: true}),
	}
	p, _ := startProfiler(t, 499, func(o *Options) { o.checkSnapshots = true })
	for _, b := range bins {
		testutil.StartWorkload(t, b)
	}
	const want = 4000
	deadline := time.Now().Add(90 * time.Second)
	var st Stats
	for {
		st = p.Stats()
		if st.Resolver.SnapshotsCompared >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // poll interval of the condition above
	}
	t.Logf("snapshots %d, compared %d, differ %d; kernel: %d sent with a snapshot, %d skipped",
		st.Resolver.Snapshots, st.Resolver.SnapshotsCompared, st.Resolver.SnapshotsDiffer,
		st.Kernel.Snapshots, st.Kernel.SnapshotsSkipped)
	if st.Resolver.SnapshotsCompared < want {
		t.Fatalf("%d stacks compared in 90 s, want %d", st.Resolver.SnapshotsCompared, want)
	}
	if st.Resolver.SnapshotsDiffer != 0 {
		t.Errorf("%d of %d stacks unwound from their snapshot differ from the kernel's (the first are logged)",
			st.Resolver.SnapshotsDiffer, st.Resolver.SnapshotsCompared)
	}
}
