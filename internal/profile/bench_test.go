package profile

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// benchStacks returns n distinct stacks of depth frames (10 kernel frames,
// then native frames, every third with an inline level) over shared mappings.
func benchStacks(n, depth int) [][]Frame {
	libs := make([]*Mapping, 4)
	for i := range libs {
		libs[i] = &Mapping{
			Start: uint64(0x7f00_0000_0000 + i<<24), Limit: uint64(0x7f00_0000_0000 + (i+1)<<24),
			File: fmt.Sprintf("/usr/lib/lib%d.so", i), GNUBuildID: fmt.Sprintf("%040x", i), FileID: fmt.Sprintf("%032x", i),
		}
	}
	stacks := make([][]Frame, n)
	for s := range stacks {
		frames := make([]Frame, depth)
		for i := range frames {
			if i < 10 {
				frames[i] = Frame{Type: FrameKernel, Address: 0xffff_ffff_8100_0000 + uint64(i*64),
					Lines: []Line{{Function: fmt.Sprintf("kfunc_%d", i)}}}
				continue
			}
			m := libs[i%len(libs)]
			// The leaf-side user frame differs per stack; callers are shared.
			addr := m.Start + uint64(i*256)
			if i == 10 {
				addr += uint64(s * 16)
			}
			f := Frame{Type: FrameNative, Address: addr, Mapping: m,
				Lines: []Line{{Function: fmt.Sprintf("ns::func_%d_%d()", i, addr%7), File: "src/f.cc", Line: int64(i)}}}
			if i%3 == 0 {
				f.Lines = append([]Line{{Function: "inlined_helper", File: "src/h.h", Line: 3}}, f.Lines...)
			}
			frames[i] = f
		}
		stacks[s] = frames
	}
	return stacks
}

// BenchmarkAdd measures Add of a 30-frame sample once its strings, frames
// and stack are known (the steady state within an interval).
func BenchmarkAdd(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("stacks=%d", n), func(b *testing.B) {
			stacks := benchStacks(n, 30)
			res := &Resource{PID: 1234, ExecutableName: "server", ExecutablePath: "/usr/bin/server",
				EnvVars: map[string]string{"DEPLOY_ENV": "prod"}}
			bld := NewBuilder(Options{SamplesPerSecond: 19})
			s := Sample{Resource: res, TID: 1235, ThreadName: "worker", Value: 1}
			for i, st := range stacks { // warm up: intern everything once
				s.Frames = st
				s.Time = testStart.Add(time.Duration(i))
				bld.Add(s)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				s.Frames = stacks[i%n]
				s.CPU = int64(i & 1)
				s.Time = testStart.Add(time.Duration(i))
				bld.Add(s)
				if bld.Len() == DefaultMaxSamples {
					b.StopTimer()
					bld.Flush(testStart, testEnd)
					b.StartTimer()
				}
			}
		})
	}
}

// BenchmarkFlush measures Flush of an interval of 10k sample events: 20
// processes, 500 distinct 30-frame stacks, 4 threads per process.
func BenchmarkFlush(b *testing.B) {
	const events = 10_000
	stacks := benchStacks(500, 30)
	rng := rand.New(rand.NewPCG(1, 1))
	samples := make([]Sample, events)
	for i := range samples {
		pid := int64(rng.IntN(20))
		samples[i] = Sample{
			Kind:     Kind(min(rng.IntN(10), 1)),
			Resource: &Resource{PID: 100 + pid, ExecutableName: fmt.Sprint("proc", pid), ExecutablePath: "/bin/p"},
			TID:      100 + pid*10 + int64(rng.IntN(4)), CPU: int64(rng.IntN(2)),
			Time: testStart.Add(time.Duration(i) * time.Microsecond), Value: 1,
			Frames: stacks[rng.IntN(len(stacks))],
		}
	}
	bld := NewBuilder(Options{SamplesPerSecond: 19})
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for _, s := range samples {
			bld.Add(s)
		}
		b.StartTimer()
		p := bld.Flush(testStart, testEnd)
		if p.SampleCount() == 0 {
			b.Fatal("empty profile")
		}
	}
}
