package profileview

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/sonde-dev/sonde/internal/profile"
)

func TestSamples(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	libc := &profile.Mapping{Start: 0x7f0000000000, Limit: 0x7f0000200000, File: "/lib/libc.so.6"}
	app := &profile.Mapping{Start: 0x400000, Limit: 0x500000, File: "/usr/bin/app"}
	inlined := profile.Frame{Type: profile.FrameNative, Address: 0x401234, Mapping: app, Lines: []profile.Line{
		{Function: "inner", File: "/src/a.c", Line: 3}, {Function: "outer", SystemName: "_Z5outerv", File: "/src/a.c", Line: 9}}}
	kernel := profile.Frame{Type: profile.FrameKernel, Address: 0xffffffff81000010, Lines: []profile.Line{{Function: "do_syscall_64"}}}
	unnamed := profile.Frame{Type: profile.FrameNative, Address: 0x7f0000012345, Mapping: libc}
	res := &profile.Resource{PID: 7, ExecutableName: "app", ContainerID: "c0"}
	b := profile.NewBuilder(profile.Options{SamplesPerSecond: 19})
	for _, ms := range []int{10, 20} {
		b.Add(profile.Sample{Kind: profile.OnCPU, Resource: res, TID: 8, ThreadName: "w", CPU: 1,
			Time: start.Add(time.Duration(ms) * time.Millisecond), Frames: []profile.Frame{kernel, unnamed, inlined}})
	}
	b.Add(profile.Sample{Kind: profile.OffCPU, Resource: res, TID: 8, CPU: 0, Time: start, Value: 500, Frames: []profile.Frame{kernel}})
	pd := b.Flush(start, start.Add(5*time.Second))

	r := NewReader(pd)
	type got struct {
		Type, Unit string
		Period     int64
		Value      int64
		Events     int64
		Frames     []Frame
		Names      []string
		Attrs      []Attr
		Exe        string
	}
	var all []got
	for s := range r.Samples() {
		g := got{Type: s.Type, Unit: s.Unit, Period: s.Period, Value: s.Value, Events: s.Events, Attrs: append([]Attr(nil), s.Attrs...)}
		for _, f := range s.Frames {
			f.Location = 0 // an index of the dictionary's layout
			g.Frames = append(g.Frames, f)
			g.Names = append(g.Names, f.Name())
		}
		if v, ok := s.Resource.Get("process.executable.name"); ok {
			g.Exe = v.AsString()
		}
		if s.Start != uint64(start.UnixNano()) || s.Duration != uint64(5*time.Second) {
			t.Errorf("sample time %d+%d, want the interval's", s.Start, s.Duration)
		}
		all = append(all, g)
	}
	kernelFrame := Frame{Type: "kernel", Function: "do_syscall_64", Address: 0xffffffff81000010}
	want := []got{
		{Type: "samples", Unit: "count", Period: int64(time.Second) / 19, Value: 2, Events: 2, Exe: "app",
			Frames: []Frame{
				kernelFrame,
				{Type: "native", Address: 0x7f0000012345, Mapping: "/lib/libc.so.6"},
				{Type: "native", Function: "inner", File: "/src/a.c", Line: 3, Address: 0x401234, Mapping: "/usr/bin/app"},
				{Type: "native", Function: "outer", SystemName: "_Z5outerv", File: "/src/a.c", Line: 9, Address: 0x401234, Mapping: "/usr/bin/app"},
			},
			Names: []string{"do_syscall_64", "[libc.so.6]", "inner", "outer"},
			Attrs: []Attr{{"thread.id", "8"}, {"thread.name", "w"}, {"cpu.logical_number", "1"}}},
		{Type: "off_cpu", Unit: "nanoseconds", Value: 500, Events: 1, Exe: "app",
			Frames: []Frame{kernelFrame}, Names: []string{"do_syscall_64"},
			Attrs: []Attr{{"thread.id", "8"}, {"cpu.logical_number", "0"}}},
	}
	// SystemName falls back to the name where the producer wrote none.
	for i := range all {
		for j := range all[i].Frames {
			if f := &all[i].Frames[j]; f.SystemName == f.Function {
				f.SystemName = ""
			}
		}
	}
	if diff := cmp.Diff(want, all); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
	if r.Invalid != 0 {
		t.Errorf("Invalid = %d on a well-formed export", r.Invalid)
	}
}

// TestOutOfRange: references beyond the dictionary are skipped and counted.
func TestOutOfRange(t *testing.T) {
	pd := pprofile.NewProfiles()
	d := pd.Dictionary()
	d.StringTable().Append("")
	d.StackTable().AppendEmpty()
	st := d.StackTable().AppendEmpty()
	st.LocationIndices().Append(5) // no such location
	p := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	p.SampleType().SetTypeStrindex(9) // no such string
	s := p.Samples().AppendEmpty()
	s.SetStackIndex(1)
	s.AttributeIndices().Append(3)              // no such attribute
	p.Samples().AppendEmpty().SetStackIndex(42) // no such stack

	r := NewReader(pd)
	n := 0
	for s := range r.Samples() {
		n++
		if len(s.Frames) != 0 || len(s.Attrs) != 0 || s.Type != "" {
			t.Errorf("sample with invalid references resolved to %+v", s)
		}
	}
	if n != 1 {
		t.Errorf("yielded %d samples, want 1 (the other's stack is out of range)", n)
	}
	// string 9 (type, and unit 0 is valid), location 5, attribute 3, stack 42.
	if r.Invalid != 4 {
		t.Errorf("Invalid = %d, want 4", r.Invalid)
	}
}
