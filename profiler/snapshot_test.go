//go:build linux

package profiler

import (
	"maps"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
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

// wants records what the resolver asks of the Loader's demand.
type wants struct {
	handles map[uint32]elfx.FileID
	n       map[elfx.FileID]int
}

func (w *wants) File(h uint32) (elfx.FileID, bool) { id, ok := w.handles[h]; return id, ok }
func (w *wants) Prepared(int) bool                 { return true }
func (w *wants) Want(id elfx.FileID, n int)        { w.n[id] += n }

// A stack without a snapshot (off-CPU, or its snapshot skipped) that the
// eBPF side went on by frame pointers from, or ended in, for want of a
// table counts toward that file's table as an unfinished walk would; a
// whole stack, a Python frame and a frame of no known file count nothing.
func TestWantTableWithoutSnapshot(t *testing.T) {
	lib, bin := elfx.FileID{1}, elfx.FileID{2}
	fp := tracer.FrameFromFramePointer
	cases := []struct {
		name  string
		flags []tracer.FrameFlags
		files []uint32
		whole bool
		want  map[elfx.FileID]int
	}{
		{"frame pointers after the lib", []tracer.FrameFlags{0, 0, fp, fp}, []uint32{7, 9, 7, 7}, false, map[elfx.FileID]int{lib: unfinishedWant}},
		{"ends in the lib", []tracer.FrameFlags{0, 0}, []uint32{7, 9}, false, map[elfx.FileID]int{lib: unfinishedWant}},
		{"whole", []tracer.FrameFlags{0, fp, fp}, []uint32{9, 7, 7}, true, map[elfx.FileID]int{}},
		{"python", []tracer.FrameFlags{tracer.FrameRuntime, fp}, []uint32{0, 7}, false, map[elfx.FileID]int{}},
		{"unknown file", []tracer.FrameFlags{0, fp}, []uint32{0, 7}, false, map[elfx.FileID]int{}},
	}
	for _, c := range cases {
		w := &wants{handles: map[uint32]elfx.FileID{7: bin, 9: lib}, n: map[elfx.FileID]int{}}
		r := &resolver{unwinder: w}
		rec := &tracer.Record{User: make([]uint64, len(c.flags)), UserFlags: c.flags}
		for i, h := range c.files {
			rec.User[i] = 0x1000 * uint64(i+1)
			rec.UserFiles = append(rec.UserFiles, tracer.FileRef{File: h, Offset: 0x10})
		}
		if c.whole {
			rec.Flags |= tracer.FlagUserComplete
		}
		r.wantTable(rec)
		if !maps.Equal(w.n, c.want) {
			t.Errorf("%s: wanted %v, want %v", c.name, w.n, c.want)
		}
	}
}
