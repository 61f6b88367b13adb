package collector_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// frame is one resolved frame: the innermost function name and the frame type.
type frame struct {
	Function string
	Type     string
}

// flatSample is one sample read back through the dictionary, as a consumer
// of the OTLP output sees it.
type flatSample struct {
	Resource   map[string]any // the resource's attributes, shared by its samples
	PID        int64
	ExeName    string
	ExePath    string
	TID        int64
	ThreadName string
	CPU        int64
	Frames     []frame  // leaf first
	Files      []string // source file of each frame's innermost line
	Lines      []int64  // line of each frame's innermost line
	ByFP       []bool   // each frame was found by the frame-pointer walk (sonde.frame.unwinder)
	Count      int
	Type       string   // the profile's sample type: "samples" (on-CPU) or "off_cpu"
	Times      []uint64 // the sample's timestamps (Unix ns)
	Values     []int64  // its values, parallel to Times
}

func flatten(pd pprofile.Profiles) []flatSample {
	dict := pd.Dictionary()
	strs := dict.StringTable()
	attr := func(indices []int32, key string) (any, bool) {
		for _, i := range indices {
			kv := dict.AttributeTable().At(int(i))
			if strs.At(int(kv.KeyStrindex())) == key {
				return kv.Value().AsRaw(), true
			}
		}
		return nil, false
	}
	var out []flatSample
	for _, rp := range pd.ResourceProfiles().All() {
		res := rp.Resource().Attributes()
		base := flatSample{Resource: res.AsRaw()}
		if v, ok := res.Get("process.pid"); ok {
			base.PID = v.Int()
		}
		if v, ok := res.Get("process.executable.name"); ok {
			base.ExeName = v.Str()
		}
		if v, ok := res.Get("process.executable.path"); ok {
			base.ExePath = v.Str()
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				typ := strs.At(int(prof.SampleType().TypeStrindex()))
				for _, s := range prof.Samples().All() {
					fs := base
					fs.Type = typ
					fs.Times = s.TimestampsUnixNano().AsRaw()
					fs.Values = s.Values().AsRaw()
					idx := s.AttributeIndices().AsRaw()
					if v, ok := attr(idx, "thread.id"); ok {
						fs.TID = v.(int64)
					}
					if v, ok := attr(idx, "thread.name"); ok {
						fs.ThreadName = v.(string)
					}
					if v, ok := attr(idx, "cpu.logical_number"); ok {
						fs.CPU = v.(int64)
					}
					fs.Count = s.TimestampsUnixNano().Len()
					stack := dict.StackTable().At(int(s.StackIndex()))
					for _, li := range stack.LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						f := frame{}
						if v, ok := attr(loc.AttributeIndices().AsRaw(), "profile.frame.type"); ok {
							f.Type = v.(string)
						}
						file, line := "", int64(0)
						if loc.Lines().Len() > 0 {
							ln := loc.Lines().At(0)
							fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
							f.Function = strs.At(int(fn.NameStrindex()))
							file, line = strs.At(int(fn.FilenameStrindex())), ln.Line()
						}
						fs.Frames = append(fs.Frames, f)
						fs.Files = append(fs.Files, file)
						fs.Lines = append(fs.Lines, line)
						v, ok := attr(loc.AttributeIndices().AsRaw(), "sonde.frame.unwinder")
						fs.ByFP = append(fs.ByFP, ok && v == "frame_pointer")
					}
					out = append(out, fs)
				}
			}
		}
	}
	return out
}

// hasChain reports whether want appears as consecutive frames of got.
func hasChain(got []frame, want []frame) bool {
	for i := 0; i+len(want) <= len(got); i++ {
		if slices.Equal(got[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

func functions(frames []frame) string {
	var names []string
	for _, f := range frames {
		names = append(names, fmt.Sprintf("%s(%s)", f.Function, f.Type))
	}
	return strings.Join(names, " <- ")
}

// startReceiver runs the real receiver in-process with a sink consumer;
// configure, when given, edits the configuration first.
func startReceiver(t *testing.T, sps int, configure ...func(*collector.Config)) *consumertest.ProfilesSink {
	t.Helper()
	sink, _ := startReceiverWith(t, sps, configure...)
	return sink
}

// startReceiverWith is startReceiver that also returns the receiver.
func startReceiverWith(t *testing.T, sps int, configure ...func(*collector.Config)) (*consumertest.ProfilesSink, xreceiver.Profiles) {
	t.Helper()
	testutil.RequirePrivileges(t, "the sonde receiver")
	f := collector.NewFactory().(xreceiver.Factory)
	cfg := f.CreateDefaultConfig().(*collector.Config)
	cfg.SamplesPerSecond = sps
	cfg.ReporterInterval = 500 * time.Millisecond
	for _, c := range configure {
		c(cfg)
	}
	sink := new(consumertest.ProfilesSink)
	set := receivertest.NewNopSettings(metadata.Type)
	set.Logger = zaptest.NewLogger(t)
	rcv, err := f.CreateProfiles(context.Background(), set, cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	if err := rcv.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rcv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		// Every interval the receiver handed over, the last partial one
		// included, satisfies the profiling SIG's conformance rules.
		for i, pd := range sink.AllProfiles() {
			if err := profile.Check(pd); err != nil {
				t.Errorf("interval %d does not conform: %v", i, err)
			}
		}
	})
	return sink, rcv
}

// waitForSample polls the sink until a sample matches or the deadline passes,
// and returns the matching sample and everything seen for pid.
func waitForSample(t *testing.T, sink *consumertest.ProfilesSink, pid int, timeout time.Duration, match func(flatSample) bool) (flatSample, []flatSample) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var seen []flatSample
	read := 0
	for time.Now().Before(deadline) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range flatten(pd) {
				if s.PID != int64(pid) {
					continue
				}
				seen = append(seen, s)
				if match(s) {
					return s, seen
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	t.Errorf("no matching sample for pid %d within %v; %d samples seen for it:", pid, timeout, len(seen))
	for i, s := range seen {
		if i == 10 {
			break
		}
		t.Logf("  %s", functions(s.Frames))
	}
	return flatSample{}, seen
}

// waitForExport returns once the sink holds more than n exports, or after
// at most limit. The receiver exports every reporter_interval.
func waitForExport(sink *consumertest.ProfilesSink, n int, limit time.Duration) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	end := time.After(limit)
	for len(sink.AllProfiles()) <= n {
		select {
		case <-tick.C:
		case <-end:
			return
		}
	}
}

func TestCChainWithFramePointers(t *testing.T) {
	sink := startReceiver(t, 199)
	bin := testutil.BuildWorkload(t, testutil.CChain)
	cmd := testutil.StartWorkload(t, bin)
	pid := cmd.Process.Pid

	chain := []frame{{"c", "native"}, {"b", "native"}, {"a", "native"}, {"main", "native"}}
	s, _ := waitForSample(t, sink, pid, 20*time.Second, func(s flatSample) bool { return hasChain(s.Frames, chain) })
	if s.PID == 0 {
		return
	}
	if s.ExeName != "cchain" || s.ExePath != bin {
		t.Errorf("executable = %q at %q, want cchain at %q", s.ExeName, s.ExePath, bin)
	}
	if s.TID != int64(pid) || s.ThreadName != "cchain" {
		t.Errorf("thread = %d %q, want %d %q", s.TID, s.ThreadName, pid, "cchain")
	}
	// Stacks are leaf first: kernel frames (the sample may interrupt the
	// return to user mode), then the user leaf.
	var user []frame
	for i, f := range s.Frames {
		if f.Type != "kernel" {
			user = s.Frames[i:]
			break
		}
	}
	for _, f := range user {
		if f.Type == "kernel" {
			t.Errorf("kernel frame %+v below a user frame in %s", f, functions(s.Frames))
		}
	}
	if len(user) == 0 || user[0] != chain[0] {
		t.Errorf("user leaf frame of %s, want %+v (stacks are leaf first)", functions(s.Frames), chain[0])
	}
}

func TestGoChain(t *testing.T) {
	sink := startReceiver(t, 199)
	bin := testutil.BuildWorkload(t, testutil.GoChain)
	cmd := testutil.StartWorkload(t, bin)
	pid := cmd.Process.Pid

	chain := []frame{{"main.gamma", "go"}, {"main.beta", "go"}, {"main.alpha", "go"}, {"main.main", "go"}}
	s, _ := waitForSample(t, sink, pid, 20*time.Second, func(s flatSample) bool { return hasChain(s.Frames, chain) })
	if s.PID == 0 {
		return
	}
	if s.ExeName != "gochain" {
		t.Errorf("process.executable.name = %q, want gochain", s.ExeName)
	}
	if s.ThreadName != "gochain" {
		t.Errorf("thread.name = %q, want gochain", s.ThreadName)
	}
}

func TestKernelFramesOfSyscalls(t *testing.T) {
	sink := startReceiver(t, 199)
	bin := testutil.BuildWorkload(t, testutil.Syscalls)
	cmd := testutil.StartWorkload(t, bin)
	pid := cmd.Process.Pid

	s, _ := waitForSample(t, sink, pid, 20*time.Second, func(s flatSample) bool {
		return len(s.Frames) > 0 && s.Frames[0].Type == "kernel" &&
			hasChain(s.Frames, []frame{{"spin_syscalls", "native"}, {"main", "native"}})
	})
	if s.PID == 0 {
		return
	}
	for _, f := range s.Frames {
		if f.Type == "kernel" && f.Function == "" {
			t.Errorf("unnamed kernel frame in %s", functions(s.Frames))
		}
	}
}
