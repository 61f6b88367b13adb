package profilemetricsconnector

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"
	"go.opentelemetry.io/collector/connector/connectortest"
	"go.opentelemetry.io/collector/connector/xconnector"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/connector/profilemetricsconnector/internal/metadata"
	"github.com/sonde-dev/sonde/internal/profile"
)

const samplesPerSecond = 19

var epoch = time.Unix(1_700_000_000, 0)

var (
	goLeaf  = profile.Frame{Type: profile.FrameGo, Address: 0x401000, Lines: []profile.Line{{Function: "main.compute", File: "/src/main.go", Line: 21}}}
	goMain  = profile.Frame{Type: profile.FrameGo, Address: 0x402000, Lines: []profile.Line{{Function: "main.main", File: "/src/main.go", Line: 9}}}
	kernel  = profile.Frame{Type: profile.FrameKernel, Address: 0xffffffff81000010, Lines: []profile.Line{{Function: "do_syscall_64"}}}
	native  = profile.Frame{Type: profile.FrameNative, Address: 0x401500, Lines: []profile.Line{{Function: "hash", File: "/src/hash.c", Line: 7}}}
	pyFrame = profile.Frame{Type: profile.FrameCPython, Address: 0x7000, Lines: []profile.Line{{Function: "fib", File: "/app/fib.py", Line: 3}}}
	stacks  = [][]profile.Frame{{goLeaf, goMain}, {kernel, goMain}, {native}, {kernel, native}, {pyFrame, native}, {kernel, pyFrame, native}}
)

// gen returns n samples over procs, random stacks and kinds.
func gen(rng *rand.Rand, procs []*profile.Resource, n int, at time.Time) []profile.Sample {
	var out []profile.Sample
	for range n {
		s := profile.Sample{Kind: profile.OnCPU, Resource: procs[rng.IntN(len(procs))], TID: 1, Time: at, Frames: stacks[rng.IntN(len(stacks))]}
		if rng.IntN(8) == 0 {
			s.Kind, s.Value = profile.OffCPU, int64(1+rng.IntN(1e6))
		}
		out = append(out, s)
	}
	return out
}

func build(samples []profile.Sample, start time.Time) pprofile.Profiles {
	b := profile.NewBuilder(profile.Options{SamplesPerSecond: samplesPerSecond, ScopeVersion: "test"})
	for _, s := range samples {
		b.Add(s)
	}
	return b.Flush(start, start.Add(5*time.Second))
}

// points returns the last export's data points of metric name as
// "label=value,... -> value" strings.
func points(md pmetric.Metrics, name string) map[string]float64 {
	out := map[string]float64{}
	for _, rm := range md.ResourceMetrics().All() {
		for _, sm := range rm.ScopeMetrics().All() {
			for _, m := range sm.Metrics().All() {
				if m.Name() != name {
					continue
				}
				if !m.Sum().IsMonotonic() || m.Sum().AggregationTemporality() != pmetric.AggregationTemporalityCumulative {
					panic(name + " is not a cumulative monotonic sum")
				}
				for _, dp := range m.Sum().DataPoints().All() {
					var labels []string
					for k, v := range dp.Attributes().All() {
						labels = append(labels, k+"="+v.AsString())
					}
					key := strings.Join(sortStrings(labels), ",")
					if dp.ValueType() == pmetric.NumberDataPointValueTypeDouble {
						out[key] = dp.DoubleValue()
					} else {
						out[key] = float64(dp.IntValue())
					}
				}
			}
		}
	}
	return out
}

func sortStrings(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

func newTest(t *testing.T, edit func(*Config), now *time.Time) (*profileMetrics, *consumertest.MetricsSink) {
	t.Helper()
	cfg := createDefaultConfig()
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	sink := &consumertest.MetricsSink{}
	return newConnector(cfg, zap.NewNop(), sink, func() time.Time { return *now }), sink
}

func last(t *testing.T, sink *consumertest.MetricsSink) pmetric.Metrics {
	t.Helper()
	all := sink.AllMetrics()
	if len(all) == 0 {
		t.Fatal("no metrics emitted")
	}
	return all[len(all)-1]
}

func TestCountsMatchInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	procs := []*profile.Resource{
		{PID: 1, ExecutableName: "billing", ServiceName: "billing", ContainerID: "c0ffee"},
		{PID: 2, ExecutableName: "billing", ServiceName: "billing", ContainerID: "c0ffee"}, // same series as PID 1
		{PID: 3, ExecutableName: "app"},
	}
	now := epoch
	c, sink := newTest(t, nil, &now)
	var all []profile.Sample
	for i := range 4 {
		s := gen(rng, procs, 300, epoch.Add(time.Duration(i)*5*time.Second))
		all = append(all, s...)
		now = epoch.Add(time.Duration(i+1) * 5 * time.Second)
		if err := c.ConsumeProfiles(t.Context(), build(s, epoch.Add(time.Duration(i)*5*time.Second))); err != nil {
			t.Fatal(err)
		}
	}
	// Oracle from the input samples.
	res := func(r *profile.Resource) string {
		l := []string{"process.executable.name=" + r.ExecutableName}
		if r.ServiceName != "" {
			l = append(l, "service.name="+r.ServiceName)
		}
		if r.ContainerID != "" {
			l = append(l, "container.id="+r.ContainerID)
		}
		return strings.Join(l, ",")
	}
	key := func(parts ...string) string {
		return strings.Join(sortStrings(strings.Split(strings.Join(parts, ","), ",")), ",")
	}
	wantSamples, wantCPU, wantTypes, wantOff, wantFns := map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]float64{}
	period := 1e9 / float64(samplesPerSecond)
	for _, s := range all {
		if s.Kind == profile.OffCPU {
			wantOff[key(res(s.Resource))] += float64(s.Value) / 1e9
			continue
		}
		leaf := s.Frames[0].Type.String()
		k := key(res(s.Resource), "profile.frame.type="+leaf)
		wantSamples[k]++
		wantCPU[k] += float64(int64(period)) / 1e9
		seen := map[string]bool{}
		for _, f := range s.Frames {
			if !seen[f.Type.String()] {
				seen[f.Type.String()] = true
				wantTypes[key(res(s.Resource), "profile.frame.type="+f.Type.String())]++
			}
		}
		wantFns[key("process.executable.name="+s.Resource.ExecutableName, "code.function.name="+s.Frames[0].Lines[0].Function, "profile.frame.type="+leaf)]++
	}
	md := last(t, sink)
	approx := cmpopts.EquateApprox(0, 1e-9)
	for _, tc := range []struct {
		name string
		want map[string]float64
	}{
		{metricSamples, wantSamples}, {metricCPUTime, wantCPU}, {metricFrameTypes, wantTypes},
		{metricOffCPU, wantOff}, {metricFunctions, wantFns},
	} {
		if diff := cmp.Diff(tc.want, points(md, tc.name), approx); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var procs []*profile.Resource
	for i := range 10 {
		procs = append(procs, &profile.Resource{PID: int64(i + 1), ExecutableName: fmt.Sprintf("prog%d", i)})
	}
	now := epoch
	c, sink := newTest(t, func(c *Config) { c.MaxSeries = 5; c.TopFunctions = 2; c.MaxFunctions = 3 }, &now)
	samples := gen(rng, procs, 2000, epoch)
	if err := c.ConsumeProfiles(t.Context(), build(samples, epoch)); err != nil {
		t.Fatal(err)
	}
	md := last(t, sink)
	var onCPU float64
	for _, s := range samples {
		if s.Kind == profile.OnCPU {
			onCPU++
		}
	}
	for _, tc := range []struct {
		name      string
		maxSeries int
		total     float64 // what all series together must count; 0 to skip
	}{
		{metricSamples, 5, onCPU},
		{metricFunctions, 2, 0},
	} {
		got := points(md, tc.name)
		overflow, ok := got["otel.metric.overflow=true"]
		if !ok {
			t.Errorf("%s: no overflow series in %v", tc.name, got)
		}
		if len(got) != tc.maxSeries+1 {
			t.Errorf("%s: %d series, want %d and the overflow one: %v", tc.name, len(got), tc.maxSeries, got)
		}
		var sum float64
		for _, v := range got {
			sum += v
		}
		if tc.total > 0 && sum != tc.total {
			t.Errorf("%s: series sum to %v, want every sample (%v) counted, overflow %v included", tc.name, sum, tc.total, overflow)
		}
	}

	// A minute past expire_after, an export of one program leaves its
	// series only.
	now = now.Add(DefaultExpireAfter + time.Minute)
	one := []profile.Sample{{Kind: profile.OnCPU, Resource: procs[0], TID: 1, Time: now, Frames: stacks[0]}}
	if err := c.ConsumeProfiles(t.Context(), build(one, now)); err != nil {
		t.Fatal(err)
	}
	got := points(last(t, sink), metricSamples)
	if _, ok := got["process.executable.name=prog0,profile.frame.type=go"]; len(got) != 1 || !ok {
		t.Errorf("after expiry: %v, want prog0's go series only", got)
	}
}

func TestFactory(t *testing.T) {
	f := NewFactory().(xconnector.Factory)
	sink := &consumertest.MetricsSink{}
	conn, err := f.CreateProfilesToMetrics(t.Context(), connectortest.NewNopSettings(metadata.Type), f.CreateDefaultConfig(), sink)
	if err != nil {
		t.Fatal(err)
	}
	if conn.Capabilities().MutatesData {
		t.Error("the connector says it mutates data")
	}
}

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id               component.ID
		want             *Config
		wantUnmarshalErr string
		wantInvalid      []string
	}{
		{id: component.NewID(metadata.Type), want: createDefaultConfig()},
		{id: component.NewIDWithName(metadata.Type, "custom"), want: func() *Config {
			c := createDefaultConfig()
			c.ResourceAttributes = []string{"service.name", "k8s.namespace.name"}
			c.MaxSeries, c.TopFunctions, c.MaxFunctions, c.ExpireAfter = 100, 5, 50, time.Hour
			return c
		}()},
		{id: component.NewIDWithName(metadata.Type, "invalid_all"), want: func() *Config {
			c := createDefaultConfig()
			c.ResourceAttributes = []string{"", "service.name", "service.name", "profile.frame.type"}
			c.MaxSeries, c.TopFunctions, c.MaxFunctions, c.ExpireAfter = 0, 20, 10, -time.Second
			return c
		}(), wantInvalid: []string{
			"resource_attributes[0]: must not be empty",
			`resource_attributes[2]: "service.name" is listed twice`,
			`resource_attributes[3]: "profile.frame.type" is a label of the connector's own`,
			"max_series: must be between 1 and 1000000, got 0",
			"top_functions: must be between 0 and max_functions (10), got 20",
			"expire_after: must not be negative, got -1s",
		}},
		{id: component.NewIDWithName(metadata.Type, "unknown_key"), wantUnmarshalErr: "max_stacks"},
	}
	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			sub, err := cm.Sub(tt.id.String())
			if err != nil {
				t.Fatal(err)
			}
			cfg := NewFactory().CreateDefaultConfig()
			err = sub.Unmarshal(cfg)
			if tt.wantUnmarshalErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantUnmarshalErr) {
					t.Fatalf("unmarshal error = %v, want one containing %q", err, tt.wantUnmarshalErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, cfg, cmpopts.IgnoreUnexported(Config{})); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			var got []string
			if err := cfg.(*Config).Validate(); err != nil {
				got = strings.Split(err.Error(), "\n")
			}
			if diff := cmp.Diff(tt.wantInvalid, got); diff != "" {
				t.Errorf("Validate messages (-want +got):\n%s", diff)
			}
		})
	}
}
