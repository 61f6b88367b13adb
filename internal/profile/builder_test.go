package profile

import (
	"bytes"
	"encoding/json"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pprofile"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// build adds samples to a fresh Builder and flushes them.
func build(t testing.TB, opts Options, samples []Sample) pprofile.Profiles {
	t.Helper()
	b := NewBuilder(opts)
	for _, s := range samples {
		b.Add(s)
	}
	p := b.Flush(testStart, testEnd)
	if err := validate(p); err != nil {
		t.Fatalf("validate: %v", err)
	}
	if err := checkDeduplicated(p); err != nil {
		t.Fatalf("deduplication: %v", err)
	}
	return p
}

func TestString(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  string
		want string
	}{
		{"kernel", FrameKernel.String(), "kernel"},
		{"native", FrameNative.String(), "native"},
		{"go", FrameGo.String(), "go"},
		{"rust", FrameRust.String(), "rust"},
		{"cpython", FrameCPython.String(), "cpython"},
		{"jvm", FrameJVM.String(), "jvm"},
		{"v8js", FrameV8JS.String(), "v8js"},
		{"php", FramePHP.String(), "php"},
		{"perl", FramePerl.String(), "perl"},
		{"ruby", FrameRuby.String(), "ruby"},
		{"unknown frame", FrameUnknown.String(), ""},
		{"frame out of range", FrameType(99).String(), ""},
		{"on-CPU", OnCPU.String(), "on_cpu"},
		{"off-CPU", OffCPU.String(), "off_cpu"},
		{"kind out of range", Kind(7).String(), "kind(7)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}

// TestFlushMatchesOracle compares the decoded output with what a naive
// aggregation of the input implies.
func TestFlushMatchesOracle(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		samples []Sample
	}{
		{"hand-made", Options{SamplesPerSecond: 19, ScopeVersion: "v1.2.3"}, handMadeSamples()},
		{"random 2k", Options{SamplesPerSecond: 99}, randomSamples(rand.New(rand.NewPCG(1, 2)), 2000)},
		{"random capped", Options{SamplesPerSecond: 499, MaxSamples: 300, MaxFrames: 3}, randomSamples(rand.New(rand.NewPCG(3, 4)), 1000)},
		{"no frequency", Options{}, randomSamples(rand.New(rand.NewPCG(5, 6)), 50)},
		// More distinct locations than the location cache has slots.
		{"deep stacks", Options{SamplesPerSecond: 19}, deepSamples(600, 40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(t, tc.opts, tc.samples)
			want := expect(tc.opts, tc.samples, testStart, testEnd)
			if diff := diffDecoded(want, decode(p)); diff != "" {
				t.Errorf("decoded profiles (-want +got):\n%s", diff)
			}
		})
	}
}

// deepSamples returns n samples over n/2 distinct stacks of depth frames,
// with n/2*depth distinct locations.
func deepSamples(n, depth int) []Sample {
	res := &Resource{PID: 9, ExecutableName: "deep"}
	m := &Mapping{Start: 0x10000, Limit: 1 << 40, File: "/deep", FileID: "d"}
	var out []Sample
	for i := range n {
		s := Sample{Resource: res, TID: 9, Time: at(i), Value: 1}
		for j := range depth {
			addr := m.Start + uint64((i%(n/2))*depth+j)*4
			s.Frames = append(s.Frames, Frame{Type: FrameNative, Address: addr, Mapping: m,
				Lines: []Line{{Function: "f", Line: int64(j)}}})
		}
		out = append(out, s)
	}
	return out
}

func TestResourceAttributes(t *testing.T) {
	samples := handMadeSamples()
	p := build(t, Options{ScopeVersion: "v0.4.0"}, samples)
	want := []map[string]any{
		{
			"process.pid":                             int64(4242),
			"process.executable.name":                 "server",
			"process.executable.path":                 "/usr/bin/server",
			"container.id":                            "3f1c0ffee0",
			"service.name":                            "checkout",
			"process.environment_variable.DEPLOY_ENV": "prod",
			"process.environment_variable.REGION":     "eu-west-1",
			"process.command_line":                    "/usr/bin/server --port 8080",
			"sonde.process.namespace_pid":             int64(7),
		},
		{"process.pid": int64(777), "process.executable.name": "worker", "process.executable.path": "/opt/worker/bin/worker"},
		{"process.pid": int64(0)},
	}
	var got []map[string]any
	for _, rp := range p.ResourceProfiles().All() {
		got = append(got, rp.Resource().Attributes().AsRaw())
		if n := rp.ScopeProfiles().Len(); n != 1 {
			t.Errorf("resource %v: %d ScopeProfiles, want 1", rp.Resource().Attributes().AsRaw(), n)
			continue
		}
		sc := rp.ScopeProfiles().At(0).Scope()
		if sc.Name() != "github.com/sonde-dev/sonde" || sc.Version() != "v0.4.0" {
			t.Errorf("scope = %q %q, want github.com/sonde-dev/sonde v0.4.0", sc.Name(), sc.Version())
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resource attributes (-want +got):\n%s", diff)
	}
}

func TestProfileTypes(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind Kind
		hz   int
		want dProfile
	}{
		{"on-CPU 19 Hz", OnCPU, 19, dProfile{SampleType: "samples", SampleUnit: "count", PeriodType: "cpu", PeriodUnit: "nanoseconds", Period: int64(time.Second) / 19}},
		{"on-CPU 1 kHz", OnCPU, 1000, dProfile{SampleType: "samples", SampleUnit: "count", PeriodType: "cpu", PeriodUnit: "nanoseconds", Period: int64(time.Second) / 1000}},
		{"off-CPU", OffCPU, 19, dProfile{SampleType: "off_cpu", SampleUnit: "nanoseconds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(t, Options{SamplesPerSecond: tc.hz}, []Sample{{Kind: tc.kind, Time: at(1), Value: 7}})
			d := decode(p)
			if len(d) != 1 || len(d[0].Profiles) != 1 {
				t.Fatalf("got %d resources, want 1 with 1 profile: %+v", len(d), d)
			}
			got := d[0].Profiles[0]
			got.Samples = nil
			tc.want.Time, tc.want.Duration = uint64(testStart.UnixNano()), uint64(5*time.Second)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("profile (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDedup checks which samples become one output sample.
func TestDedup(t *testing.T) {
	res := &Resource{PID: 1, ExecutableName: "x"}
	m := &Mapping{Start: 0x1000, Limit: 0x2000, File: "/x", GNUBuildID: "ab"}
	mCopy := *m
	frame := func(m *Mapping, line int64) []Frame {
		return []Frame{{Type: FrameNative, Address: 0x1010, Mapping: m, Lines: []Line{{Function: "f", File: "x.c", Line: line}}}}
	}
	base := Sample{Resource: res, TID: 2, ThreadName: "t", CPU: 0, Time: at(1), Value: 1, Frames: frame(m, 3)}
	with := func(f func(*Sample)) Sample {
		s := base
		s.Time = at(2)
		s.Frames = frame(m, 3) // fresh, so f may change it
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name  string
		other Sample
		// want is the number of timestamps of each output sample.
		want []int
	}{
		{"identical", with(func(*Sample) {}), []int{2}},
		{"equal mapping behind another pointer", with(func(s *Sample) { s.Frames = frame(&mCopy, 3) }), []int{2}},
		{"equal resource behind another pointer", with(func(s *Sample) { s.Resource = &Resource{PID: 1, ExecutableName: "x"} }), []int{2}},
		{"other value", with(func(s *Sample) { s.Value = 1 }), []int{2}},
		{"other thread", with(func(s *Sample) { s.TID = 3 }), []int{1, 1}},
		{"other thread name", with(func(s *Sample) { s.ThreadName = "u" }), []int{1, 1}},
		{"other CPU", with(func(s *Sample) { s.CPU = 1 }), []int{1, 1}},
		{"other line", with(func(s *Sample) { s.Frames = frame(m, 4) }), []int{1, 1}},
		{"other kind", with(func(s *Sample) { s.Kind = OffCPU }), []int{1, 1}},
		{"other process", with(func(s *Sample) { s.Resource = &Resource{PID: 2, ExecutableName: "x"} }), []int{1, 1}},
		{"other executable name", with(func(s *Sample) { s.Resource = &Resource{PID: 1, ExecutableName: "y"} }), []int{1, 1}},
		{"other executable path", with(func(s *Sample) { s.Resource = &Resource{PID: 1, ExecutableName: "x", ExecutablePath: "/x"} }), []int{1, 1}},
		{"other container", with(func(s *Sample) { s.Resource = &Resource{PID: 1, ExecutableName: "x", ContainerID: "c"} }), []int{1, 1}},
		{"other service", with(func(s *Sample) { s.Resource = &Resource{PID: 1, ExecutableName: "x", ServiceName: "s"} }), []int{1, 1}},
		{"other command line", with(func(s *Sample) { s.Resource = &Resource{PID: 1, ExecutableName: "x", CommandLine: "x -v"} }), []int{1, 1}},
		{"other namespace pid", with(func(s *Sample) { s.Resource = &Resource{PID: 1, ExecutableName: "x", NamespacePID: 1} }), []int{1, 1}},
		{"other environment", with(func(s *Sample) {
			s.Resource = &Resource{PID: 1, ExecutableName: "x", EnvVars: map[string]string{"A": "1"}}
		}), []int{1, 1}},
		{"empty environment", with(func(s *Sample) {
			s.Resource = &Resource{PID: 1, ExecutableName: "x", EnvVars: map[string]string{}}
		}), []int{2}},
		{"other build id", with(func(s *Sample) {
			m2 := *m
			m2.GNUBuildID = "cd"
			s.Frames = frame(&m2, 3)
		}), []int{1, 1}},
		{"other frame type", with(func(s *Sample) { s.Frames[0].Type = FrameGo }), []int{1, 1}},
		{"other function", with(func(s *Sample) { s.Frames[0].Lines[0].Function = "g" }), []int{1, 1}},
		{"extra inline line", with(func(s *Sample) { s.Frames[0].Lines = append(s.Frames[0].Lines, Line{Function: "f"}) }), []int{1, 1}},
		{"no mapping", with(func(s *Sample) { s.Frames[0].Mapping = nil }), []int{1, 1}},
		{"other address", with(func(s *Sample) { s.Frames[0].Address++ }), []int{1, 1}},
		{"no frames", with(func(s *Sample) { s.Frames = nil }), []int{1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(t, Options{}, []Sample{base, tc.other})
			var got []int
			for _, r := range decode(p) {
				for _, prof := range r.Profiles {
					for _, s := range prof.Samples {
						got = append(got, len(s.Times))
						if len(s.Values) != len(s.Times) {
							t.Errorf("%d values for %d timestamps", len(s.Values), len(s.Times))
						}
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("timestamps per sample (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStackOrder checks that a stack resolves to the frames in leaf-first
// order and each inline level to its own line, innermost first.
func TestStackOrder(t *testing.T) {
	frames := []Frame{
		{Type: FrameKernel, Address: 0xffffffff81000000, Lines: []Line{{Function: "leaf_in_kernel"}}},
		{Type: FrameNative, Address: 0x2000, Lines: []Line{{Function: "inlined", Line: 1}, {Function: "caller", Line: 2}}},
		{Type: FrameGo, Address: 0x3000, Lines: []Line{{Function: "main.root", Line: 3}}},
	}
	p := build(t, Options{}, []Sample{{TID: 1, Time: at(1), Frames: frames}})
	d := decode(p)
	var got [][]string
	for _, f := range d[0].Profiles[0].Samples[0].Frames {
		names := []string{f.Attrs[attrFrameType].(string)}
		for _, l := range f.Lines {
			names = append(names, l.Function)
		}
		got = append(got, names)
	}
	want := [][]string{{"kernel", "leaf_in_kernel"}, {"native", "inlined", "caller"}, {"go", "main.root"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("frames (-want +got):\n%s", diff)
	}
}

// TestTier checks that a runtime's tier becomes the location attribute
// sonde.frame.tier, and that the same code at two tiers is two locations.
func TestTier(t *testing.T) {
	method := []Line{{Function: "JBurn.jGammaBurn", File: "JBurn.java", Line: 12}}
	samples := []Sample{
		{TID: 1, Time: at(1), Frames: []Frame{{Type: FrameJVM, Address: 0x7f00, Lines: method, Tier: "interpreted"}}},
		{TID: 1, Time: at(2), Frames: []Frame{{Type: FrameJVM, Address: 0x7f00, Lines: method, Tier: "c2"}}},
		{TID: 1, Time: at(3), Frames: []Frame{{Type: FrameJVM, Address: 0x7f00, Lines: method, Tier: "c2"}}},
		{TID: 1, Time: at(4), Frames: []Frame{{Type: FrameNative, Address: 0x7f00, Lines: method}}},
	}
	d := decode(build(t, Options{}, samples))
	got := map[string]int{}
	for _, s := range d[0].Profiles[0].Samples {
		f := s.Frames[0]
		tier, _ := f.Attrs[attrTier].(string)
		got[f.Attrs[attrFrameType].(string)+"/"+tier] += len(s.Times)
	}
	want := map[string]int{"jvm/interpreted": 1, "jvm/c2": 2, "native/": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples by frame type and tier (-want +got):\n%s", diff)
	}
}

func TestEmptyFlush(t *testing.T) {
	b := NewBuilder(Options{SamplesPerSecond: 19})
	p := b.Flush(testStart, testEnd)
	if n := p.ResourceProfiles().Len(); n != 0 {
		t.Errorf("got %d ResourceProfiles, want 0", n)
	}
	if err := validate(p); err != nil {
		t.Errorf("validate: %v", err)
	}
	if n := p.Dictionary().StringTable().Len(); n != 1 {
		t.Errorf("string table has %d entries, want only the empty string", n)
	}
}

// TestFlushResets checks that consecutive intervals are independent: a
// flushed Profiles does not change when the builder is reused, and the next
// interval holds only its own samples.
func TestFlushResets(t *testing.T) {
	b := NewBuilder(Options{SamplesPerSecond: 19})
	first := handMadeSamples()
	for _, s := range first {
		b.Add(s)
	}
	if got, want := b.Len(), len(first); got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	p1 := b.Flush(testStart, testEnd)
	if b.Len() != 0 {
		t.Fatalf("Len after Flush = %d, want 0", b.Len())
	}
	before := decode(p1)

	second := randomSamples(rand.New(rand.NewPCG(7, 8)), 500)
	for _, s := range second {
		b.Add(s)
	}
	p2 := b.Flush(testStart, testEnd)

	if diff := diffDecoded(before, decode(p1)); diff != "" {
		t.Errorf("first interval changed after reuse (-before +after):\n%s", diff)
	}
	for _, tc := range []struct {
		name    string
		p       pprofile.Profiles
		samples []Sample
	}{{"first", p1, first}, {"second", p2, second}} {
		t.Run(tc.name, func(t *testing.T) {
			if err := validate(tc.p); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if err := checkDeduplicated(tc.p); err != nil {
				t.Fatalf("deduplication: %v", err)
			}
			want := expect(Options{SamplesPerSecond: 19}, tc.samples, testStart, testEnd)
			if diff := diffDecoded(want, decode(tc.p)); diff != "" {
				t.Errorf("decoded (-want +got):\n%s", diff)
			}
		})
	}
	if got, want := b.Stats(), (Stats{Added: uint64(len(first) + len(second))}); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}

// TestCallerMayReuseInputs changes everything the caller handed to Add after
// the call; the output must reflect the values at the time of Add.
func TestCallerMayReuseInputs(t *testing.T) {
	res := &Resource{PID: 5, ExecutableName: "a", EnvVars: map[string]string{"K": "v"}}
	m := &Mapping{Start: 1, Limit: 100, File: "/a"}
	frames := []Frame{{Type: FrameNative, Address: 10, Mapping: m, Lines: []Line{{Function: "f"}}}}
	want := expect(Options{}, []Sample{{Resource: res, Time: at(1), Frames: frames}}, testStart, testEnd)

	b := NewBuilder(Options{})
	b.Add(Sample{Resource: res, Time: at(1), Frames: frames})
	res.EnvVars["K"] = "changed"
	res.ExecutableName = "b"
	*m = Mapping{File: "/b"}
	frames[0].Lines[0].Function = "g"
	frames[0].Address = 11

	p := b.Flush(testStart, testEnd)
	if diff := diffDecoded(want, decode(p)); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
}

func TestLimits(t *testing.T) {
	long := make([]Frame, 10)
	for i := range long {
		long[i] = Frame{Type: FrameNative, Address: uint64(i)}
	}
	for _, tc := range []struct {
		name      string
		opts      Options
		samples   []Sample
		wantStats Stats
		wantLen   int
	}{
		{
			name:      "interval full",
			opts:      Options{MaxSamples: 2},
			samples:   []Sample{{Time: at(1)}, {Time: at(2)}, {Time: at(3)}},
			wantStats: Stats{Added: 2, Dropped: 1},
			wantLen:   2,
		},
		{
			name:      "stack too deep",
			opts:      Options{MaxFrames: 4},
			samples:   []Sample{{Time: at(1), Frames: long}, {Time: at(2), Frames: long[:4]}},
			wantStats: Stats{Added: 2, Truncated: 1},
			wantLen:   2,
		},
		{
			name:      "unknown kind",
			opts:      Options{},
			samples:   []Sample{{Kind: 2, Time: at(1)}, {Kind: OffCPU, Time: at(2)}},
			wantStats: Stats{Added: 1, Invalid: 1},
			wantLen:   1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuilder(tc.opts)
			for _, s := range tc.samples {
				b.Add(s)
			}
			if got := b.Len(); got != tc.wantLen {
				t.Errorf("Len = %d, want %d", got, tc.wantLen)
			}
			if diff := cmp.Diff(tc.wantStats, b.Stats()); diff != "" {
				t.Errorf("Stats (-want +got):\n%s", diff)
			}
			p := b.Flush(testStart, testEnd)
			if err := validate(p); err != nil {
				t.Fatalf("validate: %v", err)
			}
			if diff := diffDecoded(expect(tc.opts, tc.samples, testStart, testEnd), decode(p)); diff != "" {
				t.Errorf("decoded (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProtoRoundTrip checks that the OTLP protobuf encoding preserves every
// resolved value, and that encoding what was decoded gives the same bytes.
func TestProtoRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []Sample
	}{
		{"hand-made", handMadeSamples()},
		{"random", randomSamples(rand.New(rand.NewPCG(9, 10)), 1000)},
		{"empty", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(t, Options{SamplesPerSecond: 19, ScopeVersion: "v9"}, tc.samples)
			want := decode(p)
			// The marshaler moves resource attribute strings into the string
			// table of what it is given; marshal a copy to keep p intact.
			c := pprofile.NewProfiles()
			p.CopyTo(c)
			var m pprofile.ProtoMarshaler
			buf, err := m.MarshalProfiles(c)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			var u pprofile.ProtoUnmarshaler
			got, err := u.UnmarshalProfiles(buf)
			if err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if err := validate(got); err != nil {
				t.Fatalf("validate after round trip: %v", err)
			}
			if diff := diffDecoded(want, decode(got)); diff != "" {
				t.Errorf("decoded after round trip (-want +got):\n%s", diff)
			}
			again, err := m.MarshalProfiles(got)
			if err != nil {
				t.Fatalf("marshal again: %v", err)
			}
			if !bytes.Equal(buf, again) {
				t.Errorf("re-encoding differs: %d bytes, then %d bytes", len(buf), len(again))
			}
		})
	}
}

// TestGolden compares the OTLP/JSON encoding of fixed scenarios with
// testdata/*.golden.json. Run with -update to rewrite them.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []Sample
	}{
		{"handmade", handMadeSamples()},
		{"empty", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := build(t, Options{SamplesPerSecond: 19, ScopeVersion: "v0.1.0"}, tc.samples)
			var m pprofile.JSONMarshaler
			raw, err := m.MarshalProfiles(p)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			var got bytes.Buffer
			if err := json.Indent(&got, raw, "", "  "); err != nil {
				t.Fatalf("indent: %v", err)
			}
			got.WriteByte('\n')
			path := filepath.Join("testdata", tc.name+".golden.json")
			if *update {
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got.String()); diff != "" {
				t.Errorf("%s (-want +got):\n%s", path, diff)
			}
			// The golden file must also decode to what the samples imply.
			var u pprofile.JSONUnmarshaler
			back, err := u.UnmarshalProfiles(want)
			if err != nil {
				t.Fatalf("unmarshal %s: %v", path, err)
			}
			wantDecoded := expect(Options{SamplesPerSecond: 19, ScopeVersion: "v0.1.0"}, tc.samples, testStart, testEnd)
			if diff := diffDecoded(wantDecoded, decode(back)); diff != "" {
				t.Errorf("%s decoded (-want +got):\n%s", path, diff)
			}
		})
	}
}

// Events outside [start, end) widen the profile's window, so that every
// timestamp lies inside it: one before start, one at end itself (the window
// is half-open).
func TestFlushWindowCoversEvents(t *testing.T) {
	for _, tc := range []struct {
		name           string
		times          []time.Time
		wantStart, end time.Time
	}{
		{"inside", []time.Time{at(1), at(2)}, testStart, testEnd},
		{"before start", []time.Time{testStart.Add(-time.Second), at(1)}, testStart.Add(-time.Second), testEnd},
		{"at end", []time.Time{at(1), testEnd}, testStart, testEnd.Add(time.Nanosecond)},
		{"after end", []time.Time{testEnd.Add(time.Second)}, testStart, testEnd.Add(time.Second + time.Nanosecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuilder(Options{SamplesPerSecond: 19})
			for _, ts := range tc.times {
				b.Add(Sample{Resource: &Resource{PID: 1}, TID: 1, Time: ts, Value: 1})
			}
			p := b.Flush(testStart, testEnd)
			if err := Check(p); err != nil {
				t.Fatal(err)
			}
			prof := p.ResourceProfiles().At(0).ScopeProfiles().At(0).Profiles().At(0)
			start := time.Unix(0, int64(prof.Time()))
			end := start.Add(time.Duration(prof.DurationNano()))
			if !start.Equal(tc.wantStart) || !end.Equal(tc.end) {
				t.Errorf("window [%v, %v), want [%v, %v)", start, end, tc.wantStart, tc.end)
			}
		})
	}
}

// A negative line, which symbol data read off a host can hold, is written
// as unknown (0): OTLP lines are not negative. A frame that differs only by
// it is the same location as the one with line 0.
func TestNegativeLineIsUnknown(t *testing.T) {
	frame := func(line int64) Frame {
		return Frame{Type: FrameNative, Address: 0x1234, Lines: []Line{{Function: "f", File: "f.c", Line: line}}}
	}
	p := build(t, Options{}, []Sample{
		{Resource: &Resource{PID: 1}, Frames: []Frame{frame(-118)}, Value: 1, Time: testStart.Add(time.Millisecond)},
		{Resource: &Resource{PID: 1}, Frames: []Frame{frame(0)}, Value: 1, Time: testStart.Add(2 * time.Millisecond)},
	})
	locs := p.Dictionary().LocationTable()
	if locs.Len() != 2 { // entry 0 is the empty one
		t.Fatalf("%d locations, want the empty one and f's", locs.Len())
	}
	if got := locs.At(1).Lines().At(0).Line(); got != 0 {
		t.Errorf("line %d, want 0", got)
	}
}

// Discard throws the interval away: the next interval holds only its own
// samples, as after a Flush.
func TestDiscardResets(t *testing.T) {
	b := NewBuilder(Options{SamplesPerSecond: 19})
	for _, s := range randomSamples(rand.New(rand.NewPCG(9, 10)), 300) {
		b.Add(s)
	}
	b.Discard()
	if b.Len() != 0 {
		t.Fatalf("Len after Discard = %d, want 0", b.Len())
	}
	second := handMadeSamples()
	for _, s := range second {
		b.Add(s)
	}
	p := b.Flush(testStart, testEnd)
	if err := validate(p); err != nil {
		t.Fatalf("validate: %v", err)
	}
	want := expect(Options{SamplesPerSecond: 19}, second, testStart, testEnd)
	if diff := diffDecoded(want, decode(p)); diff != "" {
		t.Errorf("decoded after Discard (-want +got):\n%s", diff)
	}
}
