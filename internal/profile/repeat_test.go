package profile

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

// addKnown adds s by key if b knows the key: Known, then AddKnown.
func addKnown(b *Builder, key []uint64, s Sample) (aux uint32, ok bool) {
	k, ok := b.Known(key)
	if ok {
		b.AddKnown(k, s)
	}
	return k.Aux, ok
}

// protoJSON is p as OTLP JSON, for comparing whole outputs.
func protoJSON(t *testing.T, p pprofile.Profiles) string {
	t.Helper()
	var m pprofile.JSONMarshaler
	b, err := m.MarshalProfiles(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Samples added by key come out exactly as the same samples added whole:
// each keeps its own thread, CPU, time and value, and shares the resource
// and stack of the sample its key was added with.
func TestAddKnownMatchesAdd(t *testing.T) {
	libs := benchLibs()
	resA := &Resource{PID: 10, ExecutableName: "a", EnvVars: map[string]string{"K": "v"}}
	resB := &Resource{PID: 11, ExecutableName: "b"}
	stack0, stack1 := mixedStack(libs, 0), mixedStack(libs, 1)
	at := func(i int) time.Time { return testStart.Add(time.Duration(i) * time.Millisecond) }
	type keyed struct {
		key []uint64
		s   Sample
	}
	samples := []keyed{
		{[]uint64{1, 0}, Sample{Resource: resA, TID: 1, ThreadName: "t1", CPU: 0, Time: at(0), Frames: stack0}},
		{[]uint64{1, 0}, Sample{Resource: resA, TID: 1, ThreadName: "t1", CPU: 0, Time: at(1), Frames: stack0}},
		{[]uint64{1, 0}, Sample{Resource: resA, TID: 2, ThreadName: "t2", CPU: 1, Time: at(2), Frames: stack0}},
		{[]uint64{1, 1}, Sample{Resource: resA, TID: 1, ThreadName: "t1", CPU: 0, Time: at(3), Frames: stack1}},
		{[]uint64{1, 0, 0}, Sample{Resource: resB, TID: 5, ThreadName: "b", CPU: 1, Time: at(4), Frames: stack0}},
		{[]uint64{1, 0}, Sample{Resource: resA, TID: 1, ThreadName: "t1", CPU: 1, Time: at(5), Frames: stack0}},
		{[]uint64{1, 1}, Sample{Kind: OffCPU, Resource: resA, TID: 1, ThreadName: "t1", Time: at(6), Value: 5000, Frames: stack1}},
		{[]uint64{1, 0, 0}, Sample{Resource: resB, TID: 5, ThreadName: "b", CPU: 1, Time: at(7), Frames: stack0}},
	}
	whole := NewBuilder(Options{SamplesPerSecond: 19})
	byKey := NewBuilder(Options{SamplesPerSecond: 19})
	known := 0
	for _, k := range samples {
		whole.Add(k.s)
		bare := k.s
		bare.Resource, bare.Frames = nil, nil
		if _, ok := addKnown(byKey, k.key, bare); ok {
			known++
			continue
		}
		if !byKey.AddKeyed(k.key, 0, k.s) {
			t.Fatalf("AddKeyed(%v) did not keep its key", k.key)
		}
	}
	if known != 5 {
		t.Errorf("%d samples added by key, want 5", known)
	}
	if got := byKey.Stats().Repeated; got != 5 {
		t.Errorf("Stats().Repeated = %d, want 5", got)
	}
	want, got := whole.Flush(testStart, testEnd), byKey.Flush(testStart, testEnd)
	if err := validate(got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(protoJSON(t, want), protoJSON(t, got)); diff != "" {
		t.Errorf("profiles by key (-want +got):\n%s", diff)
	}
}

// A key is compared whole: one that shares a hash bucket, a prefix or all
// but one word with a known key is not known; the aux word comes back; a
// new interval knows no key.
func TestAddKnownExactKey(t *testing.T) {
	b := NewBuilder(Options{})
	s := Sample{Resource: &Resource{PID: 1}, Frames: mixedStack(benchLibs(), 0), Time: testStart}
	if !b.AddKeyed([]uint64{7, 8, 9}, 42, s) {
		t.Fatal("AddKeyed did not keep its key")
	}
	for _, k := range [][]uint64{{7, 8}, {7, 8, 9, 0}, {7, 8, 10}, {0, 8, 9}, {}, nil} {
		if _, ok := addKnown(b, k, Sample{}); ok {
			t.Errorf("Known(%v) found the entry of [7 8 9]", k)
		}
	}
	if aux, ok := addKnown(b, []uint64{7, 8, 9}, Sample{}); !ok || aux != 42 {
		t.Errorf("Known([7 8 9]) = %d, %v; want 42, true", aux, ok)
	}
	if b.Len() != 2 {
		t.Errorf("Len() = %d, want 2", b.Len())
	}
	b.Flush(testStart, testEnd)
	if _, ok := addKnown(b, []uint64{7, 8, 9}, Sample{}); ok {
		t.Error("a key outlived its interval")
	}
}

// Keys that collide in the builder's map chain: each finds its own entry.
func TestAddKnownCollidingHashes(t *testing.T) {
	b := NewBuilder(Options{})
	libs := benchLibs()
	const n = 5000 // enough keys that the chains are exercised by the map's own hashing too
	for i := range n {
		s := Sample{Resource: &Resource{PID: int64(i % 7)}, Frames: mixedStack(libs, i%50), Time: testStart}
		b.AddKeyed([]uint64{uint64(i), uint64(i % 50)}, uint32(i), s)
	}
	// Force every key into one chain: the chains must still tell them apart.
	for h := range b.keyIdx {
		delete(b.keyIdx, h)
	}
	for i := range b.keys {
		b.keys[i].next = int32(i) - 1
	}
	b.keyIdx[b.hashKey([]uint64{0})] = int32(len(b.keys) - 1)
	for _, i := range []int{0, 1, 2499, n - 1} {
		key := []uint64{uint64(i), uint64(i % 50)}
		e := b.findKey(b.hashKey([]uint64{0}), key)
		if e < 0 || b.keys[e].aux != uint32(i) {
			t.Errorf("key %v: entry %d, want the one with aux %d", key, e, i)
		}
	}
}

// Keys are bounded per interval; what is not kept is counted, and the
// sample is added all the same.
func TestAddKeyedBounded(t *testing.T) {
	b := NewBuilder(Options{})
	key := make([]uint64, MaxKeyWords/2+1)
	s := Sample{Resource: &Resource{PID: 1}, Frames: mixedStack(benchLibs(), 0), Time: testStart}
	if !b.AddKeyed(key, 0, s) {
		t.Fatal("the first key was not kept")
	}
	key[0] = 1
	if b.AddKeyed(key, 0, s) {
		t.Error("a key past MaxKeyWords was kept")
	}
	if st := b.Stats(); st.Unkeyed != 1 || st.Added != 2 {
		t.Errorf("Stats() = %+v, want Unkeyed 1, Added 2", st)
	}
}

// A repeated stack is a lookup and a count: Known and AddKnown allocate nothing once
// its sample (thread, CPU) is known and the events have room.
func TestAddKnownAllocatesNothing(t *testing.T) {
	b := NewBuilder(Options{SamplesPerSecond: 19})
	key := make([]uint64, 3+10+2*36)
	for i := range key {
		key[i] = uint64(i) * 0x9e37
	}
	s := Sample{Resource: &Resource{PID: 1, ExecutableName: "x"}, TID: 1, ThreadName: "worker", Frames: mixedStack(benchLibs(), 0), Time: testStart}
	// Grow the events once; a flush keeps their room for the next interval.
	b.AddKeyed(key, 0, s)
	for range 1000 {
		addKnown(b, key, s)
	}
	b.Flush(testStart, testEnd)
	b.AddKeyed(key, 0, s)
	bare := Sample{TID: 1, ThreadName: "worker", Time: testStart.Add(time.Second)}
	if n := testing.AllocsPerRun(500, func() {
		if _, ok := addKnown(b, key, bare); !ok {
			t.Fatal("key not known")
		}
	}); n != 0 {
		t.Errorf("Known and AddKnown allocate %v times per repeated stack, want 0", n)
	}
}
