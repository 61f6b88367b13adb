package profile

import (
	"fmt"
	"testing"
	"time"
)

// mixedStack returns a stack like a busy host's: 10 kernel frames, 30
// native frames over 4 libraries (every third with an inline level), and,
// between them, 3 CPython and 3 JVM frames (two tiers); leaf first. Stacks
// of different variant differ in their leaf-side user frame only.
func mixedStack(libs []*Mapping, variant int) []Frame {
	var frames []Frame
	for i := range 10 {
		frames = append(frames, Frame{Type: FrameKernel, Address: 0xffff_ffff_8100_0000 + uint64(i*64),
			Lines: []Line{{Function: fmt.Sprintf("kfunc_%d", i)}}})
	}
	for i := range 30 {
		m := libs[i%len(libs)]
		addr := m.Start + uint64(i*256)
		if i == 0 {
			addr += uint64(variant * 16)
		}
		f := Frame{Type: FrameNative, Address: addr, Mapping: m,
			Lines: []Line{{Function: fmt.Sprintf("ns::Class::method_%d(int, char const*)", i), File: "src/module.cc", Line: int64(100 + i)}}}
		if i%3 == 0 {
			f.Lines = append([]Line{{Function: "ns::inlined_helper()", File: "src/helper.h", Line: 3}}, f.Lines...)
		}
		frames = append(frames, f)
		switch i {
		case 10, 11, 12:
			frames = append(frames, Frame{Type: FrameCPython, Address: 0x7f12_3456_0000 + uint64(i*0x100),
				Lines: []Line{{Function: fmt.Sprintf("handler_%d", i), File: "/app/server.py", Line: int64(40 + i)}}})
		case 20, 21, 22:
			tier := "c2"
			if i == 22 {
				tier = "interpreted"
			}
			frames = append(frames, Frame{Type: FrameJVM, Address: 0x7f00_1111_0000 + uint64(i*0x100), Tier: tier,
				Lines: []Line{{Function: fmt.Sprintf("com.example.Service.call%d", i), File: "Service.java", Line: int64(i)}}})
		}
	}
	return frames
}

func benchLibs() []*Mapping {
	libs := make([]*Mapping, 4)
	for i := range libs {
		libs[i] = &Mapping{
			Start: uint64(0x7f00_0000_0000 + i<<24), Limit: uint64(0x7f00_0000_0000 + (i+1)<<24),
			File: fmt.Sprintf("/usr/lib/lib%d.so", i), GNUBuildID: fmt.Sprintf("%040x", i), FileID: fmt.Sprintf("%032x", i),
		}
	}
	return libs
}

// BenchmarkAddSample is the aggregate stage of one sample of a 46-frame
// mixed stack: repeated, a stack (and sample) the interval holds already;
// new, a stack the interval has not seen (its leaf frame is new, the rest
// known).
func BenchmarkAddSample(b *testing.B) {
	libs := benchLibs()
	res := &Resource{PID: 1234, ExecutableName: "server", ExecutablePath: "/usr/bin/server",
		EnvVars: map[string]string{"DEPLOY_ENV": "prod"}}
	b.Run("repeated", func(b *testing.B) {
		bld := NewBuilder(Options{SamplesPerSecond: 19})
		s := Sample{Resource: res, TID: 1235, ThreadName: "worker", CPU: 1, Value: 1, Frames: mixedStack(libs, 0), Time: testStart}
		bld.Add(s)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.Time = testStart.Add(time.Duration(i))
			bld.Add(s)
			if bld.Len() == DefaultMaxSamples {
				b.StopTimer()
				bld.Flush(testStart, testEnd)
				b.StartTimer()
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		const distinct = 1 << 14
		stacks := make([][]Frame, distinct)
		for i := range stacks {
			stacks[i] = mixedStack(libs, i)
		}
		bld := NewBuilder(Options{SamplesPerSecond: 19})
		s := Sample{Resource: res, TID: 1235, ThreadName: "worker", CPU: 1, Value: 1}
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if i%distinct == 0 && i > 0 {
				b.StopTimer()
				bld.Flush(testStart, testEnd)
				b.StartTimer()
			}
			s.Frames = stacks[i%distinct]
			s.Time = testStart.Add(time.Duration(i))
			bld.Add(s)
		}
	})
}

// BenchmarkBuildPerStack is the build stage: Flush of an interval of 2000
// distinct 46-frame stacks over 10 processes, each sampled 5 times, given
// per distinct stack (ns/stack, allocs/stack) as well as per Flush.
func BenchmarkBuildPerStack(b *testing.B) {
	const distinct, repeat = 2000, 5
	libs := benchLibs()
	stacks := make([][]Frame, distinct)
	for i := range stacks {
		stacks[i] = mixedStack(libs, i)
	}
	var samples []Sample
	for r := range repeat {
		for i, st := range stacks {
			pid := int64(100 + i%10)
			samples = append(samples, Sample{
				Resource: &Resource{PID: pid, ExecutableName: fmt.Sprint("proc", pid), ExecutablePath: "/bin/p"},
				TID:      pid, ThreadName: "main", CPU: int64(i % 2), Value: 1, Frames: st,
				Time: testStart.Add(time.Duration(r*distinct+i) * time.Microsecond),
			})
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
		if p.SampleCount() != distinct {
			b.Fatalf("%d samples, want %d", p.SampleCount(), distinct)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/distinct, "ns/stack")
}

// BenchmarkAddKnown is the aggregate stage of a repeated stack added by its
// key (AddKnown): the key of a 46-frame sample as the profiler makes it
// (3 header words, a word per kernel frame, two per user frame).
func BenchmarkAddKnown(b *testing.B) {
	key := make([]uint64, 3+10+2*36)
	for i := range key {
		key[i] = 0x7f00_0000_0000 + uint64(i)*0x140
	}
	bld := NewBuilder(Options{SamplesPerSecond: 19})
	res := &Resource{PID: 1234, ExecutableName: "server"}
	bld.AddKeyed(key, 0, Sample{Resource: res, TID: 1235, ThreadName: "worker", CPU: 1, Frames: mixedStack(benchLibs(), 0), Time: testStart})
	s := Sample{TID: 1235, ThreadName: "worker", CPU: 1}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Time = testStart.Add(time.Duration(i))
		if _, ok := addKnown(bld, key, s); !ok {
			b.Fatal("key not known")
		}
		if bld.Len() == DefaultMaxSamples {
			b.StopTimer()
			bld.Flush(testStart, testEnd)
			bld.AddKeyed(key, 0, Sample{Resource: res, TID: 1235, ThreadName: "worker", CPU: 1, Frames: mixedStack(benchLibs(), 0), Time: testStart})
			b.StartTimer()
		}
	}
}
