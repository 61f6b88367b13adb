package pprofexporter

import (
	stdcmp "cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	pprof "github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/exporter/exportertest"
	"go.opentelemetry.io/collector/exporter/xexporter"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/testutil"
)

const samplesPerSecond = 19

var (
	flushStart = time.Unix(1_700_000_000, 0)
	flushEnd   = flushStart.Add(5 * time.Second)
)

// fixture returns hand-made samples of two processes: inline frames, a
// kernel frame without mapping, an unnamed frame, three kinds of build id,
// on-CPU and off-CPU samples, and events that aggregate into one sample.
func fixture() []profile.Sample {
	app := &profile.Mapping{Start: 0x400000, Limit: 0x480000, Offset: 0x1000, File: "/usr/bin/app", GNUBuildID: "b1d0", GoBuildID: "ignored", FileID: "ignored"}
	libc := &profile.Mapping{Start: 0x7f0000000000, Limit: 0x7f0000200000, File: "/lib/x86_64-linux-gnu/libc.so.6", FileID: "5eed"}
	gobin := &profile.Mapping{Start: 0x400000, Limit: 0x600000, File: "/srv/billing", GoBuildID: "go/id", FileID: "ignored"}

	kernel := profile.Frame{Type: profile.FrameKernel, Address: 0xffffffff81000010, Lines: []profile.Line{{Function: "do_syscall_64"}}}
	inlined := profile.Frame{Type: profile.FrameNative, Address: 0x401234, Mapping: app, Lines: []profile.Line{
		{Function: "hash_byte", File: "/src/hash.c", Line: 12},
		{Function: "hash", SystemName: "_Z4hashPKc", File: "/src/hash.c", Line: 40},
	}}
	mainFrame := profile.Frame{Type: profile.FrameNative, Address: 0x401500, Mapping: app, Lines: []profile.Line{{Function: "main", File: "/src/main.c", Line: 7}}}
	unnamed := profile.Frame{Type: profile.FrameNative, Address: 0x7f0000012345, Mapping: libc}
	goLeaf := profile.Frame{Type: profile.FrameGo, Address: 0x401000, Mapping: gobin, Lines: []profile.Line{{Function: "main.compute", File: "/src/billing/main.go", Line: 21}}}
	goMain := profile.Frame{Type: profile.FrameGo, Address: 0x402000, Mapping: gobin, Lines: []profile.Line{{Function: "main.main", File: "/src/billing/main.go", Line: 9}}}

	checkout := &profile.Resource{PID: 100, ExecutableName: "app", ExecutablePath: "/usr/bin/app", ServiceName: "checkout"}
	billing := &profile.Resource{PID: 200, ExecutableName: "billing", ExecutablePath: "/srv/billing", ServiceName: "billing/v2 (eu)"}
	at := func(ms int) time.Time { return flushStart.Add(time.Duration(ms) * time.Millisecond) }
	return []profile.Sample{
		{Kind: profile.OnCPU, Resource: checkout, TID: 101, ThreadName: "worker", CPU: 0, Time: at(10), Frames: []profile.Frame{inlined, mainFrame}},
		{Kind: profile.OnCPU, Resource: checkout, TID: 101, ThreadName: "worker", CPU: 0, Time: at(60), Frames: []profile.Frame{inlined, mainFrame}},
		{Kind: profile.OnCPU, Resource: checkout, TID: 101, ThreadName: "worker", CPU: 1, Time: at(70), Frames: []profile.Frame{inlined, mainFrame}},
		{Kind: profile.OnCPU, Resource: checkout, TID: 102, CPU: 1, Time: at(80), Frames: []profile.Frame{kernel, unnamed, mainFrame}},
		{Kind: profile.OffCPU, Resource: checkout, TID: 101, ThreadName: "worker", CPU: 0, Time: at(90), Value: 5000, Frames: []profile.Frame{kernel, mainFrame}},
		{Kind: profile.OnCPU, Resource: billing, TID: 201, ThreadName: "billing", CPU: 1, Time: at(100), Frames: []profile.Frame{goLeaf, goMain}},
		{Kind: profile.OnCPU, Resource: billing, TID: 201, ThreadName: "billing", CPU: 1, Time: at(150), Frames: []profile.Frame{goLeaf, goMain}},
		{Kind: profile.OnCPU, Resource: billing, TID: 201, ThreadName: "billing", CPU: 1, Time: at(200), Frames: []profile.Frame{goMain}},
	}
}

// build makes pdata from samples with the real producer.
func build(samples []profile.Sample) pprofile.Profiles {
	b := profile.NewBuilder(profile.Options{SamplesPerSecond: samplesPerSecond, ScopeVersion: "test"})
	for _, s := range samples {
		b.Add(s)
	}
	return b.Flush(flushStart, flushEnd)
}

// sampleView is a pprof sample in comparable form: its stack as one string
// per location, leaf first, and its values by sample type.
type sampleView struct {
	Stack     []string
	Values    map[string]int64
	Labels    map[string][]string
	NumLabels map[string][]int64
}

// sampleTypes of the output contract, by kind.
var sampleTypes = map[profile.Kind]string{profile.OnCPU: "samples/count", profile.OffCPU: "off_cpu/nanoseconds"}

func locationString(addr uint64, file, buildID string, start, limit, offset uint64, lines []string) string {
	return fmt.Sprintf("%#x %s[%s %#x-%#x+%#x] %s", addr, file, buildID, start, limit, offset, strings.Join(lines, " | "))
}

// wantSamples is the oracle: the aggregation the exporter's output must show
// for samples, computed from the input alone. keep selects the resources.
func wantSamples(samples []profile.Sample, keep func(*profile.Resource) bool) []sampleView {
	type key struct {
		pid, tid, cpu int64
		thread, stack string
		kind          profile.Kind
	}
	byKey := map[key]*sampleView{}
	var order []key
	for _, s := range samples {
		if !keep(s.Resource) {
			continue
		}
		var stack []string
		for _, f := range s.Frames {
			var lines []string
			for _, l := range f.Lines {
				lines = append(lines, fmt.Sprintf("%s(%s) %s:%d", l.Function, stdcmp.Or(l.SystemName, l.Function), l.File, l.Line))
			}
			var file, id string
			var start, limit, off uint64
			if m := f.Mapping; m != nil {
				file, id, start, limit, off = m.File, stdcmp.Or(m.GNUBuildID, m.GoBuildID, m.FileID), m.Start, m.Limit, m.Offset
			}
			stack = append(stack, locationString(f.Address, file, id, start, limit, off, lines))
		}
		k := key{s.Resource.PID, s.TID, s.CPU, s.ThreadName, strings.Join(stack, "\n"), s.Kind}
		v := byKey[k]
		if v == nil {
			r := s.Resource
			v = &sampleView{
				Stack:  stack,
				Values: map[string]int64{},
				Labels: map[string][]string{
					"process.executable.name": {r.ExecutableName},
					"process.executable.path": {r.ExecutablePath},
					"service.name":            {r.ServiceName},
					"process.pid":             {fmt.Sprint(r.PID)},
					"thread.id":               {fmt.Sprint(s.TID)},
					"cpu.logical_number":      {fmt.Sprint(s.CPU)},
				},
				NumLabels: map[string][]int64{},
			}
			if s.ThreadName != "" {
				v.Labels["thread.name"] = []string{s.ThreadName}
			}
			byKey[k] = v
			order = append(order, k)
		}
		val := s.Value
		if s.Kind == profile.OnCPU {
			val = 1
		}
		v.Values[sampleTypes[s.Kind]] += val
		v.NumLabels["timestamp"] = append(v.NumLabels["timestamp"], s.Time.UnixNano())
	}
	var out []sampleView
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	return out
}

// viewSamples turns a parsed pprof profile into sampleViews.
func viewSamples(p *pprof.Profile) []sampleView {
	var out []sampleView
	for _, s := range p.Sample {
		v := sampleView{Values: map[string]int64{}, Labels: s.Label, NumLabels: s.NumLabel}
		for i, st := range p.SampleType {
			if s.Value[i] != 0 {
				v.Values[st.Type+"/"+st.Unit] = s.Value[i]
			}
		}
		for _, l := range s.Location {
			var lines []string
			for _, ln := range l.Line {
				lines = append(lines, fmt.Sprintf("%s(%s) %s:%d", ln.Function.Name, ln.Function.SystemName, ln.Function.Filename, ln.Line))
			}
			var file, id string
			var start, limit, off uint64
			if m := l.Mapping; m != nil {
				file, id, start, limit, off = m.File, m.BuildID, m.Start, m.Limit, m.Offset
			}
			v.Stack = append(v.Stack, locationString(l.Address, file, id, start, limit, off, lines))
		}
		out = append(out, v)
	}
	return out
}

var sortViews = cmpopts.SortSlices(func(a, b sampleView) bool {
	return fmt.Sprint(a) < fmt.Sprint(b)
})

// newTestExporter returns an exporter writing into a fresh directory, with
// its log observed.
func newTestExporter(t *testing.T, edit func(*Config)) (*pprofExporter, *observer.ObservedLogs) {
	t.Helper()
	cfg := createDefaultConfig()
	cfg.Directory = t.TempDir()
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	e := newExporter(cfg, zap.New(core), time.Now)
	if err := e.start(t.Context(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	return e, logs
}

// readProfiles parses every pprof file in dir, by name.
func readProfiles(t *testing.T, dir string) map[string]*pprof.Profile {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"+pprofSuffix))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*pprof.Profile{}
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pprof.Parse(r)
		r.Close()
		if err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		out[filepath.Base(f)] = p
	}
	return out
}

func only[V any](t *testing.T, m map[string]V) (string, V) {
	t.Helper()
	if len(m) != 1 {
		t.Fatalf("got %d files %v, want 1", len(m), slices.Sorted(mapsKeys(m)))
	}
	for k, v := range m {
		return k, v
	}
	panic("unreachable")
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestExportMatchesInput(t *testing.T) {
	samples := fixture()
	e, _ := newTestExporter(t, nil)
	if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
		t.Fatal(err)
	}
	name, p := only(t, readProfiles(t, e.cfg.Directory))
	if !strings.HasPrefix(name, filePrefix) || strings.Count(name, "-") != 2 {
		t.Errorf("file name %q: want %s<time>-<seq>%s without a split key", name, filePrefix, pprofSuffix)
	}
	if err := p.CheckValid(); err != nil {
		t.Fatalf("CheckValid: %v", err)
	}

	t.Run("header", func(t *testing.T) {
		type header struct {
			SampleTypes       []string
			DefaultSampleType string
			PeriodType        string
			Period            int64
			TimeNanos         int64
			DurationNanos     int64
		}
		var got header
		for _, st := range p.SampleType {
			got.SampleTypes = append(got.SampleTypes, st.Type+"/"+st.Unit)
		}
		got.DefaultSampleType = p.DefaultSampleType
		if p.PeriodType != nil {
			got.PeriodType = p.PeriodType.Type + "/" + p.PeriodType.Unit
		}
		got.Period, got.TimeNanos, got.DurationNanos = p.Period, p.TimeNanos, p.DurationNanos
		want := header{
			SampleTypes:       []string{sampleTypes[profile.OnCPU], sampleTypes[profile.OffCPU]},
			DefaultSampleType: "samples",
			PeriodType:        "cpu/nanoseconds",
			Period:            int64(time.Second) / samplesPerSecond,
			TimeNanos:         flushStart.UnixNano(),
			DurationNanos:     int64(flushEnd.Sub(flushStart)),
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("profile header (-want +got):\n%s", diff)
		}
	})

	t.Run("samples", func(t *testing.T) {
		want := wantSamples(samples, func(*profile.Resource) bool { return true })
		if diff := cmp.Diff(want, viewSamples(p), sortViews); diff != "" {
			t.Errorf("samples (-want +got):\n%s", diff)
		}
	})

	t.Run("mappings", func(t *testing.T) {
		type flags struct {
			File                                                   string
			HasFunctions, HasFilenames, HasLineNumbers, HasInlines bool
		}
		var got []flags
		for _, m := range p.Mapping {
			got = append(got, flags{m.File, m.HasFunctions, m.HasFilenames, m.HasLineNumbers, m.HasInlineFrames})
		}
		want := []flags{
			{File: "/usr/bin/app", HasFunctions: true, HasFilenames: true, HasLineNumbers: true, HasInlines: true},
			// The unnamed frame in libc lets pprof try to name it.
			{File: "/lib/x86_64-linux-gnu/libc.so.6"},
			{File: "/srv/billing", HasFunctions: true, HasFilenames: true, HasLineNumbers: true},
		}
		if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b flags) bool { return a.File < b.File })); diff != "" {
			t.Errorf("mappings (-want +got):\n%s", diff)
		}
	})
}

func TestSplit(t *testing.T) {
	samples := fixture()
	for _, tc := range []struct {
		split SplitBy
		// want maps the split key in the file name to the resources of the file.
		want map[string]func(*profile.Resource) bool
	}{
		{SplitService, map[string]func(*profile.Resource) bool{
			"checkout":        func(r *profile.Resource) bool { return r.ServiceName == "checkout" },
			"billing_v2__eu_": func(r *profile.Resource) bool { return r.ServiceName == "billing/v2 (eu)" },
		}},
		{SplitExecutable, map[string]func(*profile.Resource) bool{
			"app":     func(r *profile.Resource) bool { return r.ExecutableName == "app" },
			"billing": func(r *profile.Resource) bool { return r.ExecutableName == "billing" },
		}},
	} {
		t.Run(string(tc.split), func(t *testing.T) {
			e, _ := newTestExporter(t, func(c *Config) { c.SplitBy = tc.split })
			if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
				t.Fatal(err)
			}
			files := readProfiles(t, e.cfg.Directory)
			var keys []string
			for name, p := range files {
				base, _ := profileBase(name)
				parts := strings.SplitN(base, "-", 4)
				key := parts[len(parts)-1]
				keys = append(keys, key)
				keep, ok := tc.want[key]
				if !ok {
					continue
				}
				if diff := cmp.Diff(wantSamples(samples, keep), viewSamples(p), sortViews); diff != "" {
					t.Errorf("%s: samples (-want +got):\n%s", name, diff)
				}
			}
			if diff := cmp.Diff(slices.Sorted(mapsKeys(tc.want)), keys, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Errorf("split keys in file names (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("missing attribute", func(t *testing.T) {
		e, _ := newTestExporter(t, func(c *Config) { c.SplitBy = SplitService })
		anon := []profile.Sample{{Kind: profile.OnCPU, Resource: &profile.Resource{PID: 7}, Frames: fixture()[0].Frames}}
		if err := e.consumeProfiles(t.Context(), build(anon)); err != nil {
			t.Fatal(err)
		}
		name, _ := only(t, readProfiles(t, e.cfg.Directory))
		if !strings.HasSuffix(name, "-"+unknownService+pprofSuffix) {
			t.Errorf("file %q: want the key %q for a resource without service.name", name, unknownService)
		}
	})
}

func TestFolded(t *testing.T) {
	samples := fixture()
	e, _ := newTestExporter(t, func(c *Config) { c.Folded = true })
	if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
		t.Fatal(err)
	}
	name, _ := only(t, readProfiles(t, e.cfg.Directory))
	got, err := os.ReadFile(filepath.Join(e.cfg.Directory, strings.TrimSuffix(name, pprofSuffix)+foldedSuffix))
	if err != nil {
		t.Fatal(err)
	}
	// Oracle: on-CPU events per root-first stack, named by executable.
	counts := map[string]int{}
	for _, s := range samples {
		if s.Kind != profile.OnCPU {
			continue
		}
		names := []string{s.Resource.ExecutableName}
		for _, f := range slices.Backward(s.Frames) {
			if len(f.Lines) == 0 {
				names = append(names, "["+filepath.Base(f.Mapping.File)+"]")
			}
			for _, l := range slices.Backward(f.Lines) {
				names = append(names, l.Function)
			}
		}
		counts[strings.Join(names, ";")]++
	}
	var want []string
	for stack, n := range counts {
		want = append(want, fmt.Sprintf("%s %d", stack, n))
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")); diff != "" {
		t.Errorf("folded lines (-want +got):\n%s", diff)
	}
}

func TestLogTop(t *testing.T) {
	samples := fixture()
	e, logs := newTestExporter(t, func(c *Config) { c.LogTop = 3 })
	if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
		t.Fatal(err)
	}
	entries := logs.FilterMessageSnippet("top 3 functions").All()
	if len(entries) != 1 {
		t.Fatalf("got %d summary log entries, want 1; all: %v", len(entries), logs.All())
	}
	msg := entries[0].Message
	// Oracle for on-CPU: flat counts of leaf functions.
	flat := map[string]int{}
	total := 0
	for _, s := range samples {
		if s.Kind == profile.OnCPU {
			flat[s.Frames[0].Lines[0].Function]++
			total++
		}
	}
	for _, want := range []string{
		fmt.Sprintf("top 3 functions of %d samples (count)", total),
		fmt.Sprintf("%12d %5.1f%%", flat["hash_byte"], 100*float64(flat["hash_byte"])/float64(total)),
		"top 3 functions of 5000 off_cpu (nanoseconds)",
		"by flat:", "by cum:", "hash_byte", "main.compute",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("summary lacks %q:\n%s", want, msg)
		}
	}
	// main is on the stack of every checkout on-CPU sample: its cum is 4.
	if !regexpLine(msg, "main", 0, 4) {
		t.Errorf("summary has no line for main with cum 4:\n%s", msg)
	}
	if files := entries[0].ContextMap()["files"]; files == nil {
		t.Errorf("summary has no files field: %v", entries[0].ContextMap())
	}

	t.Run("off", func(t *testing.T) {
		e, logs := newTestExporter(t, nil)
		if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
			t.Fatal(err)
		}
		if n := logs.FilterMessageSnippet("functions").Len(); n != 0 {
			t.Errorf("log_top 0 logged %d summaries, want 0", n)
		}
	})
}

// regexpLine reports whether text has a summary row for fn with these flat
// and cum values.
func regexpLine(text, fn string, flat, cum int64) bool {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 5 && f[4] == fn && f[0] == fmt.Sprint(flat) && f[2] == fmt.Sprint(cum) {
			return true
		}
	}
	return false
}

func TestRotation(t *testing.T) {
	samples := fixture()
	t.Run("by count", func(t *testing.T) {
		e, _ := newTestExporter(t, func(c *Config) { c.MaxFiles = 3; c.Folded = true })
		unrelated := filepath.Join(e.cfg.Directory, "notes.txt")
		if err := os.WriteFile(unrelated, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		var written []string
		for range 5 {
			before := readProfiles(t, e.cfg.Directory)
			if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
				t.Fatal(err)
			}
			for name := range readProfiles(t, e.cfg.Directory) {
				if _, ok := before[name]; !ok {
					written = append(written, name)
				}
			}
		}
		if len(written) != 5 {
			t.Fatalf("5 exports wrote %d new files: %v", len(written), written)
		}
		got := slices.Sorted(mapsKeys(readProfiles(t, e.cfg.Directory)))
		if diff := cmp.Diff(written[2:], got); diff != "" {
			t.Errorf("kept files (-want +got):\n%s", diff)
		}
		folded, _ := filepath.Glob(filepath.Join(e.cfg.Directory, "*"+foldedSuffix))
		if len(folded) != 3 {
			t.Errorf("kept %d folded files, want 3 (removed with their pprof twin)", len(folded))
		}
		if _, err := os.Stat(unrelated); err != nil {
			t.Errorf("rotation touched a file it did not write: %v", err)
		}
	})
	t.Run("by age", func(t *testing.T) {
		e, _ := newTestExporter(t, func(c *Config) { c.MaxFiles = 0; c.MaxAge = time.Hour })
		if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
			t.Fatal(err)
		}
		old, _ := only(t, readProfiles(t, e.cfg.Directory))
		stale := time.Now().Add(-2 * time.Hour)
		if err := os.Chtimes(filepath.Join(e.cfg.Directory, old), stale, stale); err != nil {
			t.Fatal(err)
		}
		if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
			t.Fatal(err)
		}
		name, _ := only(t, readProfiles(t, e.cfg.Directory))
		if name == old {
			t.Errorf("the profile older than max_age, %s, was kept", old)
		}
	})
}

func TestWriteErrorIsReturned(t *testing.T) {
	e, _ := newTestExporter(t, nil)
	// The directory turns into a file: every write must fail, and say so.
	if err := os.RemoveAll(e.cfg.Directory); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfg.Directory, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := e.consumeProfiles(t.Context(), build(fixture()))
	if !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("consumeProfiles into a file = %v, want an error wrapping ENOTDIR", err)
	}
}

func TestEmptyExportWritesNothing(t *testing.T) {
	e, _ := newTestExporter(t, nil)
	if err := e.consumeProfiles(t.Context(), build(nil)); err != nil {
		t.Fatal(err)
	}
	if files, _ := os.ReadDir(e.cfg.Directory); len(files) != 0 {
		t.Errorf("an empty export wrote %d files", len(files))
	}
}

// TestFactoryLifecycle runs the exporter the way the Collector does.
func TestFactoryLifecycle(t *testing.T) {
	f := NewFactory().(xexporter.Factory)
	cfg := f.CreateDefaultConfig().(*Config)
	cfg.Directory = filepath.Join(t.TempDir(), "new", "dir")
	exp, err := f.CreateProfiles(t.Context(), exportertest.NewNopSettings(f.Type()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := exp.Start(t.Context(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	if err := exp.ConsumeProfiles(t.Context(), build(fixture())); err != nil {
		t.Fatal(err)
	}
	if err := exp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	only(t, readProfiles(t, cfg.Directory))
}

// TestGoToolPprof checks a written file with the reference reader.
func TestGoToolPprof(t *testing.T) {
	goTool := testutil.RequireTool(t, "go")
	samples := fixture()
	e, _ := newTestExporter(t, nil)
	if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
		t.Fatal(err)
	}
	name, _ := only(t, readProfiles(t, e.cfg.Directory))
	path := filepath.Join(e.cfg.Directory, name)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-top"}, []string{"Type: samples", "hash_byte", "main.compute", "main.main", "main"}},
		{[]string{"-top", "-sample_index=off_cpu"}, []string{"Type: off_cpu", "do_syscall_64"}},
		{[]string{"-traces"}, []string{"hash_byte", "(inline)", "thread.name:  worker"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), goTool, append([]string{"tool", "pprof"}, append(tc.args, path)...)...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go tool pprof %v: %v\n%s", tc.args, err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("go tool pprof %v output lacks %q:\n%s", tc.args, w, out)
				}
			}
		})
	}
}

// TestFileModes checks the mode of every file written against file_mode and
// the process's umask, as the kernel combines them for any new file. The
// umask is process-wide, so this test does not run in parallel.
func TestFileModes(t *testing.T) {
	tests := []struct {
		name     string
		umask    int
		mode     FileMode // 0: the default
		wantFile os.FileMode
		wantDir  os.FileMode
	}{
		{"default under umask 022", 0o022, 0, 0o600, 0o700},
		{"default under umask 077", 0o077, 0, 0o600, 0o700},
		{"0644 under umask 022", 0o022, 0o644, 0o644, 0o755},
		{"0644 under umask 077", 0o077, 0o644, 0o600, 0o700},
		{"0660 under umask 002", 0o002, 0o660, 0o660, 0o770},
		{"0666 under umask 027", 0o027, 0o666, 0o640, 0o750},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := syscall.Umask(tt.umask)
			t.Cleanup(func() { syscall.Umask(old) })
			// A directory the exporter creates, below one the test owns.
			dir := filepath.Join(t.TempDir(), "profiles")
			e, _ := newTestExporter(t, func(c *Config) {
				c.Directory = dir
				c.Folded = true
				if tt.mode != 0 {
					c.FileMode = tt.mode
				}
			})
			if err := e.consumeProfiles(t.Context(), build(fixture())); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.Mode().Perm(); got != tt.wantDir {
				t.Errorf("directory mode = %#o, want %#o", got, tt.wantDir)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var suffixes []string
			for _, de := range entries {
				info, err := de.Info()
				if err != nil {
					t.Fatal(err)
				}
				if got := info.Mode().Perm(); got != tt.wantFile {
					t.Errorf("%s mode = %#o, want %#o", de.Name(), got, tt.wantFile)
				}
				suffixes = append(suffixes, filepath.Ext(de.Name()))
			}
			slices.Sort(suffixes)
			if diff := cmp.Diff([]string{".folded", ".gz"}, suffixes); diff != "" {
				t.Errorf("files written (-want +got):\n%s", diff)
			}
		})
	}
}
