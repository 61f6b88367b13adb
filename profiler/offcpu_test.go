package profiler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/internal/profile"
)

// joinStats is a snapshot of offCPUStats for comparison.
type joinStats struct {
	Samples, Short, Expired, Evicted, OrphanEnds, Duplicates uint64
	Pending                                                  int
}

func snapshot(j *offCPUJoin) joinStats {
	return joinStats{
		Samples: j.stats.samples.Load(), Short: j.stats.short.Load(), Expired: j.stats.expired.Load(),
		Evicted: j.stats.evicted.Load(), OrphanEnds: j.stats.orphanEnds.Load(),
		Duplicates: j.stats.duplicates.Load(), Pending: j.Len(),
	}
}

var joinEpoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// startSample is what the resolver makes of a start record of tid that left
// the CPU at kernel time ktime, with n frames.
func startSample(tid uint32, ktime uint64, n int) (offCPUKey, profile.Sample) {
	frames := make([]profile.Frame, n)
	for i := range frames {
		frames[i] = profile.Frame{Type: profile.FrameNative, Address: uint64(0x1000 + i)}
	}
	return offCPUKey{tid: tid, start: ktime}, profile.Sample{
		Kind: profile.OffCPU, Resource: &profile.Resource{PID: 7, ExecutableName: "sleeper"},
		TID: int64(tid), ThreadName: "sleeper", CPU: 1, Time: joinEpoch.Add(time.Duration(ktime)), Frames: frames,
	}
}

// offCPUSamples gathers what end hands over, copying the frames (add must not
// keep them).
type offCPUSamples []profile.Sample

func (c *offCPUSamples) add(s profile.Sample) {
	s.Frames = append([]profile.Frame(nil), s.Frames...)
	r := *s.Resource
	s.Resource = &r
	*c = append(*c, s)
}

func TestOffCPUJoinPairs(t *testing.T) {
	j := newOffCPUJoin(16, 1024, time.Minute)
	k, s := startSample(42, 1_000, 3)
	j.start(k, &s)
	// The join owns copies: the resolver reuses its buffers for the next record.
	s.Frames[0].Address = 0xdead
	s.Resource.ExecutableName = "reused"
	s.ThreadName = "reused"

	var got offCPUSamples
	j.end(offCPUKey{tid: 42, start: 999}, time.Second, false, got.add) // another wait of the thread
	j.end(k, 200*time.Millisecond, false, got.add)
	j.end(k, 200*time.Millisecond, false, got.add) // twice: the start is used up

	_, want := startSample(42, 1_000, 3)
	want.Value = int64(200 * time.Millisecond)
	want.Time = joinEpoch.Add(1_000 + 200*time.Millisecond) // when the wait ended
	if diff := cmp.Diff([]profile.Sample{want}, []profile.Sample(got)); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(joinStats{Samples: 1, OrphanEnds: 2}, snapshot(j)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestOffCPUJoinShortWaits(t *testing.T) {
	j := newOffCPUJoin(16, 1024, time.Minute)
	k, s := startSample(1, 10, 2)
	j.start(k, &s)
	var got offCPUSamples
	j.end(k, time.Microsecond, true, got.add)
	// A short end whose start never came is not an orphan: nothing was lost.
	j.end(offCPUKey{tid: 2, start: 10}, time.Microsecond, true, got.add)
	if len(got) != 0 {
		t.Errorf("short waits became samples: %+v", got)
	}
	if diff := cmp.Diff(joinStats{Short: 2}, snapshot(j)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestOffCPUJoinBoundedByEntries(t *testing.T) {
	j := newOffCPUJoin(3, 1024, time.Minute)
	for tid := uint32(1); tid <= 5; tid++ {
		k, s := startSample(tid, uint64(tid), 2)
		j.start(k, &s)
		if j.Len() > 3 {
			t.Fatalf("%d starts pending, bound is 3", j.Len())
		}
	}
	var got offCPUSamples
	for tid := uint32(1); tid <= 5; tid++ {
		j.end(offCPUKey{tid: tid, start: uint64(tid)}, time.Millisecond, false, got.add)
	}
	// The oldest two made room for the newest.
	var tids []int64
	for _, s := range got {
		tids = append(tids, s.TID)
	}
	if diff := cmp.Diff([]int64{3, 4, 5}, tids); diff != "" {
		t.Errorf("threads joined (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(joinStats{Samples: 3, Evicted: 2, OrphanEnds: 2}, snapshot(j)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestOffCPUJoinBoundedByFrames(t *testing.T) {
	j := newOffCPUJoin(100, 10, time.Minute)
	k1, s1 := startSample(1, 1, 4)
	k2, s2 := startSample(2, 2, 4)
	k3, s3 := startSample(3, 3, 4)  // 12 frames: the oldest goes
	k4, s4 := startSample(4, 4, 11) // larger than the whole table
	for _, c := range []struct {
		k offCPUKey
		s *profile.Sample
	}{{k1, &s1}, {k2, &s2}, {k3, &s3}, {k4, &s4}} {
		j.start(c.k, c.s)
		if j.frames > 10 {
			t.Fatalf("%d frames pending, bound is 10", j.frames)
		}
	}
	var got offCPUSamples
	for _, k := range []offCPUKey{k1, k2, k3, k4} {
		j.end(k, time.Millisecond, false, got.add)
	}
	if len(got) != 0 {
		t.Errorf("%d samples joined; the table was emptied for the oversized start, want none", len(got))
	}
	// k4 evicts k2 and k3 to make room, then does not fit itself.
	if diff := cmp.Diff(joinStats{Evicted: 4, OrphanEnds: 4}, snapshot(j)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	if j.frames != 0 {
		t.Errorf("%d frames counted with nothing pending", j.frames)
	}
}

func TestOffCPUJoinExpiry(t *testing.T) {
	const sec = uint64(time.Second)
	j := newOffCPUJoin(16, 1024, 2*time.Second)
	kOld, sOld := startSample(1, 10*sec, 2)
	kMid, sMid := startSample(2, 11*sec, 2)
	j.start(kOld, &sOld)
	j.start(kMid, &sMid)

	var got offCPUSamples
	// An end at 11.7 s: nothing is 2 s old yet.
	j.end(offCPUKey{tid: 9, start: 11*sec + sec/2}, 200*time.Millisecond, false, got.add)
	if diff := cmp.Diff(joinStats{OrphanEnds: 1, Pending: 2}, snapshot(j)); diff != "" {
		t.Errorf("after 11.7 s (-want +got):\n%s", diff)
	}
	// A start at 12.5 s expires the one of 10 s.
	kNew, sNew := startSample(3, 12*sec+sec/2, 2)
	j.start(kNew, &sNew)
	if diff := cmp.Diff(joinStats{OrphanEnds: 1, Expired: 1, Pending: 2}, snapshot(j)); diff != "" {
		t.Errorf("after 12.5 s (-want +got):\n%s", diff)
	}
	// The end of the expired wait comes at 13 s: an orphan.
	j.end(kOld, 3*time.Second, false, got.add)
	// The wait of 11 s ends at 13.5 s, 2.5 s later: it is still pending,
	// so it is reported, though older than 2 s by now.
	j.end(kMid, 2*time.Second+time.Second/2, false, got.add)
	if len(got) != 1 || got[0].TID != 2 || got[0].Value != int64(2*time.Second+time.Second/2) {
		t.Errorf("joined %+v, want only thread 2's wait of 2.5s", got)
	}
	if diff := cmp.Diff(joinStats{Samples: 1, Expired: 1, OrphanEnds: 2, Pending: 1}, snapshot(j)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	// Much later, a record of another thread expires the last one.
	j.end(offCPUKey{tid: 9, start: 20 * sec}, time.Millisecond, true, got.add)
	if diff := cmp.Diff(joinStats{Samples: 1, Short: 1, Expired: 2, OrphanEnds: 2}, snapshot(j)); diff != "" {
		t.Errorf("at 20 s (-want +got):\n%s", diff)
	}
}

func TestOffCPUJoinDuplicateStart(t *testing.T) {
	j := newOffCPUJoin(16, 1024, time.Minute)
	k, s := startSample(5, 100, 2)
	j.start(k, &s)
	_, s2 := startSample(5, 100, 3)
	j.start(k, &s2)
	var got offCPUSamples
	j.end(k, time.Millisecond, false, got.add)
	if len(got) != 1 || len(got[0].Frames) != 3 {
		t.Fatalf("joined %+v, want the newer start (3 frames)", got)
	}
	if diff := cmp.Diff(joinStats{Samples: 1, Duplicates: 1}, snapshot(j)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

func TestOffCPUExpiry(t *testing.T) {
	for _, tc := range []struct {
		interval, want time.Duration
	}{
		{100 * time.Millisecond, 10 * time.Second},
		{5 * time.Second, 15 * time.Second},
		{time.Minute, 3 * time.Minute},
	} {
		if got := offCPUExpiry(tc.interval); got != tc.want {
			t.Errorf("offCPUExpiry(%v) = %v, want %v", tc.interval, got, tc.want)
		}
	}
}

func TestFromScheduler(t *testing.T) {
	k := func(name string) profile.Frame {
		return profile.Frame{Type: profile.FrameKernel, Lines: []profile.Line{{Function: name}}}
	}
	user := profile.Frame{Type: profile.FrameNative, Lines: []profile.Line{{Function: "__schedule"}}}
	names := func(fs []profile.Frame) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.Lines[0].Function)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []profile.Frame
		want []string
	}{
		{"tracing frames above __schedule go", []profile.Frame{k("bpf_prog_x_off_cpu"), k("bpf_trace_run4"), k("__schedule"), k("schedule"), user},
			[]string{"__schedule", "schedule", "__schedule"}},
		{"already the leaf", []profile.Frame{k("__schedule"), k("schedule")}, []string{"__schedule", "schedule"}},
		{"no __schedule: unchanged", []profile.Frame{k("bpf_trace_run4"), k("schedule"), user}, []string{"bpf_trace_run4", "schedule", "__schedule"}},
		{"only user frames are not searched", []profile.Frame{user}, []string{"__schedule"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, names(fromScheduler(tc.in))); diff != "" {
				t.Errorf("frames (-want +got):\n%s", diff)
			}
		})
	}
}
