package profile

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestOffCPUProfileShape checks the output contract for off-CPU samples: a
// second Profile (off_cpu/nanoseconds, no period) in the process's one
// ScopeProfiles, next to its on-CPU Profile, with the same sample
// attributes, one value per wait and the waits of one stack and thread
// merged into one sample.
func TestOffCPUProfileShape(t *testing.T) {
	server := &Resource{PID: 10, ExecutableName: "server", ExecutablePath: "/srv/server"}
	sleeper := &Resource{PID: 20, ExecutableName: "sleeper"}
	sched := Frame{Type: FrameKernel, Address: 0xffffffff81000100, Lines: []Line{{Function: "__schedule"}}}
	work := Frame{Type: FrameNative, Address: 0x401000, Lines: []Line{{Function: "work"}}}
	wait := []Frame{sched, {Type: FrameNative, Address: 0x402000, Lines: []Line{{Function: "wait"}}}}
	samples := []Sample{
		{Resource: server, Kind: OnCPU, TID: 11, ThreadName: "w", CPU: 0, Time: at(1), Frames: []Frame{work}},
		{Resource: server, Kind: OffCPU, TID: 11, ThreadName: "w", CPU: 1, Time: at(2), Value: int64(200 * time.Millisecond), Frames: wait},
		{Resource: server, Kind: OffCPU, TID: 11, ThreadName: "w", CPU: 1, Time: at(3), Value: int64(300 * time.Millisecond), Frames: wait},
		// A zero-length wait keeps its 0 (on-CPU samples count 1 instead).
		{Resource: sleeper, Kind: OffCPU, TID: 21, CPU: 0, Time: at(4), Value: 0, Frames: wait},
	}
	p := build(t, Options{SamplesPerSecond: 19, ScopeVersion: "v1"}, samples)

	frames := func(fs ...Frame) []dFrame {
		var out []dFrame
		for _, f := range fs {
			out = append(out, dFrame{Address: f.Address, Lines: f.Lines, Attrs: map[string]any{"profile.frame.type": f.Type.String()}})
		}
		return out
	}
	offCPU := func(samples ...dSample) dProfile {
		return dProfile{SampleType: "off_cpu", SampleUnit: "nanoseconds", Time: uint64(testStart.UnixNano()),
			Duration: uint64(testEnd.Sub(testStart)), Samples: samples}
	}
	want := []dResource{
		{
			Attrs: map[string]any{"process.pid": int64(10), "process.executable.name": "server", "process.executable.path": "/srv/server"},
			Scope: ScopeName, Version: "v1",
			Profiles: []dProfile{
				{
					SampleType: "samples", SampleUnit: "count", PeriodType: "cpu", PeriodUnit: "nanoseconds",
					Period: int64(time.Second) / 19, Time: uint64(testStart.UnixNano()), Duration: uint64(testEnd.Sub(testStart)),
					Samples: []dSample{{
						Attrs:  map[string]any{"thread.id": int64(11), "thread.name": "w", "cpu.logical_number": int64(0)},
						Frames: frames(work), Values: []int64{1}, Times: []uint64{uint64(at(1).UnixNano())},
					}},
				},
				offCPU(dSample{
					Attrs:  map[string]any{"thread.id": int64(11), "thread.name": "w", "cpu.logical_number": int64(1)},
					Frames: frames(wait...), Values: []int64{int64(200 * time.Millisecond), int64(300 * time.Millisecond)},
					Times: []uint64{uint64(at(2).UnixNano()), uint64(at(3).UnixNano())},
				}),
			},
		},
		{
			Attrs: map[string]any{"process.pid": int64(20), "process.executable.name": "sleeper"},
			Scope: ScopeName, Version: "v1",
			Profiles: []dProfile{offCPU(dSample{
				Attrs:  map[string]any{"thread.id": int64(21), "cpu.logical_number": int64(0)},
				Frames: frames(wait...), Values: []int64{0}, Times: []uint64{uint64(at(4).UnixNano())},
			})},
		},
	}
	if diff := cmp.Diff(want, decode(p)); diff != "" {
		t.Errorf("decoded profiles (-want +got):\n%s", diff)
	}
}
