package profile

import (
	"maps"
	"math/rand/v2"
	"slices"
	"time"
)

// expect builds the decoded form Flush must produce for samples by a
// deliberately naive route, independent of the builder: linear searches with
// deep equality over the input values, no encodings and no indices.
func expect(opts Options, samples []Sample, start, end time.Time) []dResource {
	maxSamples, maxFrames := opts.MaxSamples, opts.MaxFrames
	if maxSamples <= 0 {
		maxSamples = DefaultMaxSamples
	}
	if maxFrames <= 0 {
		maxFrames = DefaultMaxFrames
	}
	type group struct {
		res     Resource
		samples [numKinds][]dSample
	}
	var groups []*group
	accepted := 0
	for _, s := range samples {
		if s.Kind >= numKinds || accepted >= maxSamples {
			continue
		}
		accepted++
		var r Resource
		if s.Resource != nil {
			r = *s.Resource
		}
		var g *group
		for _, c := range groups {
			if sameOracleResource(c.res, r) {
				g = c
				break
			}
		}
		if g == nil {
			r.EnvVars = maps.Clone(r.EnvVars)
			g = &group{res: r}
			groups = append(groups, g)
		}

		frames := s.Frames
		if len(frames) > maxFrames {
			frames = frames[:maxFrames]
		}
		want := dSample{Attrs: map[string]any{attrThreadID: s.TID, attrCPU: s.CPU}}
		if s.ThreadName != "" {
			want.Attrs[attrThreadName] = s.ThreadName
		}
		for _, f := range frames {
			want.Frames = append(want.Frames, expectFrame(f))
		}
		v := s.Value
		if s.Kind == OnCPU && v == 0 {
			v = 1
		}
		list := &g.samples[s.Kind]
		i := 0
		for ; i < len(*list); i++ {
			got := (*list)[i]
			if maps.Equal(got.Attrs, want.Attrs) && slices.EqualFunc(got.Frames, want.Frames, sameFrame) {
				break
			}
		}
		if i == len(*list) {
			*list = append(*list, want)
		}
		(*list)[i].Values = append((*list)[i].Values, v)
		(*list)[i].Times = append((*list)[i].Times, uint64(s.Time.UnixNano()))
	}

	var out []dResource
	for _, g := range groups {
		r := dResource{Attrs: expectResourceAttrs(g.res), Scope: ScopeName, Version: opts.ScopeVersion}
		for k := range Kind(numKinds) {
			if len(g.samples[k]) == 0 {
				continue
			}
			p := dProfile{Time: uint64(start.UnixNano()), Duration: uint64(end.Sub(start)), Samples: g.samples[k]}
			switch k {
			case OnCPU:
				p.SampleType, p.SampleUnit, p.PeriodType, p.PeriodUnit = "samples", "count", "cpu", "nanoseconds"
				if opts.SamplesPerSecond > 0 {
					p.Period = int64(time.Second) / int64(opts.SamplesPerSecond)
				}
			case OffCPU:
				p.SampleType, p.SampleUnit = "off_cpu", "nanoseconds"
			}
			r.Profiles = append(r.Profiles, p)
		}
		out = append(out, r)
	}
	return out
}

// sameFrame compares decoded frames field by field (cmp.Equal is too slow
// for the quadratic search above).
func sameFrame(a, b dFrame) bool {
	return a.Address == b.Address && maps.Equal(a.Attrs, b.Attrs) && slices.Equal(a.Lines, b.Lines) &&
		a.Mapping.Start == b.Mapping.Start && a.Mapping.Limit == b.Mapping.Limit &&
		a.Mapping.Offset == b.Mapping.Offset && a.Mapping.File == b.Mapping.File &&
		maps.Equal(a.Mapping.Attrs, b.Mapping.Attrs)
}

func sameOracleResource(a, b Resource) bool {
	return a.PID == b.PID && a.ExecutableName == b.ExecutableName && a.ExecutablePath == b.ExecutablePath &&
		a.ContainerID == b.ContainerID && a.ServiceName == b.ServiceName && maps.Equal(a.EnvVars, b.EnvVars) &&
		a.CommandLine == b.CommandLine && a.NamespacePID == b.NamespacePID
}

func expectResourceAttrs(r Resource) map[string]any {
	m := map[string]any{attrPID: r.PID}
	for k, v := range map[string]string{
		attrExeName: r.ExecutableName, attrExePath: r.ExecutablePath,
		attrContainerID: r.ContainerID, attrServiceName: r.ServiceName,
		"process.command_line": r.CommandLine,
	} {
		if v != "" {
			m[k] = v
		}
	}
	if r.NamespacePID != 0 {
		m["sonde.process.namespace_pid"] = r.NamespacePID
	}
	for k, v := range r.EnvVars {
		m["process.environment_variable."+k] = v
	}
	return m
}

func expectFrame(f Frame) dFrame {
	d := dFrame{Address: f.Address, Lines: append([]Line(nil), f.Lines...)}
	if t := f.Type.String(); t != "" {
		d.Attrs = map[string]any{attrFrameType: t}
	}
	if f.FramePointer {
		if d.Attrs == nil {
			d.Attrs = map[string]any{}
		}
		d.Attrs[attrUnwinder] = unwinderFramePointer
	}
	if m := f.Mapping; m != nil {
		d.Mapping = dMapping{Start: m.Start, Limit: m.Limit, Offset: m.Offset, File: m.File}
		for k, v := range map[string]string{attrBuildIDGNU: m.GNUBuildID, attrBuildIDGo: m.GoBuildID, attrFileID: m.FileID} {
			if v != "" {
				if d.Mapping.Attrs == nil {
					d.Mapping.Attrs = map[string]any{}
				}
				d.Mapping.Attrs[k] = v
			}
		}
	}
	return d
}

// Fixed scenario: three processes (one declared twice through distinct but
// equal Resources), a sample of an unknown process, shared and distinct
// stacks, inline lines, kernel, native and Go frames, equal mappings behind
// distinct pointers, on-CPU and off-CPU samples.
var (
	testStart = time.Unix(1_700_000_000, 0)
	testEnd   = testStart.Add(5 * time.Second)
)

func at(ms int) time.Time { return testStart.Add(time.Duration(ms) * time.Millisecond) }

func handMadeSamples() []Sample {
	server := &Resource{
		PID: 4242, ExecutableName: "server", ExecutablePath: "/usr/bin/server",
		ContainerID: "3f1c0ffee0", ServiceName: "checkout",
		EnvVars:     map[string]string{"DEPLOY_ENV": "prod", "REGION": "eu-west-1"},
		CommandLine: "/usr/bin/server --port 8080", NamespacePID: 7,
	}
	serverAgain := &Resource{
		PID: 4242, ExecutableName: "server", ExecutablePath: "/usr/bin/server",
		ContainerID: "3f1c0ffee0", ServiceName: "checkout",
		EnvVars:     map[string]string{"REGION": "eu-west-1", "DEPLOY_ENV": "prod"},
		CommandLine: "/usr/bin/server --port 8080", NamespacePID: 7,
	}
	worker := &Resource{PID: 777, ExecutableName: "worker", ExecutablePath: "/opt/worker/bin/worker"}

	libc := &Mapping{
		Start: 0x7f3a_1000_0000, Limit: 0x7f3a_1018_0000, Offset: 0x28000,
		File:       "/usr/lib/x86_64-linux-gnu/libc.so.6",
		GNUBuildID: "4f536ac1cd2e8806aac5a1b3d8a5b4ea1e3a1fd6", FileID: "a1b2c3d4e5f60718293a4b5c6d7e8f90",
	}
	libcAgain := *libc
	serverExe := &Mapping{
		Start: 0x5555_5555_4000, Limit: 0x5555_5556_0000, Offset: 0x1000, File: "/usr/bin/server",
		GNUBuildID: "0123456789abcdef0123456789abcdef01234567", FileID: "00112233445566778899aabbccddeeff",
	}
	workerExe := &Mapping{
		Start: 0x40_1000, Limit: 0x4a_0000, Offset: 0x1000, File: "/opt/worker/bin/worker",
		GoBuildID: "Xq9h/abcDEF/ghiJKL/mnoPQR", FileID: "ffeeddccbbaa99887766554433221100",
	}

	kSyscall := Frame{Type: FrameKernel, Address: 0xffff_ffff_8100_1234, Lines: []Line{{Function: "do_syscall_64"}}}
	kEntry := Frame{Type: FrameKernel, Address: 0xffff_ffff_8200_00b0, Lines: []Line{{Function: "entry_SYSCALL_64_after_hwframe"}}}
	kSched := Frame{Type: FrameKernel, Address: 0xffff_ffff_8110_0042, Lines: []Line{{Function: "schedule"}}}
	// memcpy and copy_chunk are inlined into write_all.
	nWrite := Frame{Type: FrameNative, Address: 0x7f3a_1001_2345, Mapping: libc, Lines: []Line{
		{Function: "memcpy", File: "string/memcpy.c", Line: 12},
		{Function: "copy_chunk", File: "io/chunk.c", Line: 40},
		{Function: "write_all", File: "io/write.c", Line: 88},
	}}
	nWriteAgain := nWrite
	nWriteAgain.Mapping = &libcAgain
	nHandle := Frame{Type: FrameNative, Address: 0x5555_5555_5abc, Mapping: serverExe, Lines: []Line{
		{Function: "server::handle(request const&)", SystemName: "_ZN6server6handleERK7request", File: "src/handle.cc", Line: 211},
	}}
	nMain := Frame{Type: FrameNative, Address: 0x5555_5555_4f00, Mapping: serverExe, Lines: []Line{
		{Function: "main", File: "src/main.cc", Line: 9},
	}}
	nUnnamed := Frame{Type: FrameNative, Address: 0x7f3a_1009_9999, Mapping: libc}
	gHash := Frame{Type: FrameGo, Address: 0x45_6789, Mapping: workerExe, Lines: []Line{
		{Function: "crypto/sha256.block", File: "/usr/local/go/src/crypto/sha256/sha256block.go", Line: 30},
		{Function: "crypto/sha256.(*digest).Write", File: "/usr/local/go/src/crypto/sha256/sha256.go", Line: 190},
	}}
	gWork := Frame{Type: FrameGo, Address: 0x40_2345, Mapping: workerExe, Lines: []Line{
		{Function: "main.work", File: "/src/worker/main.go", Line: 21},
	}}
	gMain := Frame{Type: FrameGo, Address: 0x40_2000, Mapping: workerExe, Lines: []Line{
		{Function: "main.main", File: "/src/worker/main.go", Line: 10},
	}}
	unknown := Frame{Address: 0xdead_beef}
	// The same frame found by the frame-pointer fallback is another location.
	nMainByFP := nMain
	nMainByFP.FramePointer = true

	serverStack := []Frame{kSyscall, kEntry, nWrite, nHandle, nMain}
	serverStackAgain := []Frame{kSyscall, kEntry, nWriteAgain, nHandle, nMain}
	return []Sample{
		{Resource: server, TID: 4243, ThreadName: "http-1", CPU: 0, Time: at(10), Value: 1, Frames: serverStack},
		{Resource: worker, TID: 777, ThreadName: "worker", CPU: 1, Time: at(15), Value: 1, Frames: []Frame{gHash, gWork, gMain}},
		// Same stack content through other pointers, same thread: merges.
		{Resource: serverAgain, TID: 4243, ThreadName: "http-1", CPU: 0, Time: at(60), Frames: serverStackAgain},
		// Other thread: its own sample.
		{Resource: server, TID: 4244, ThreadName: "http-2", CPU: 0, Time: at(61), Value: 1, Frames: serverStack},
		// Same thread, other CPU: its own sample.
		{Resource: server, TID: 4243, ThreadName: "http-1", CPU: 1, Time: at(110), Value: 1, Frames: serverStack},
		{Resource: server, Kind: OffCPU, TID: 4244, ThreadName: "http-2", CPU: 1, Time: at(120), Value: 2_500_000,
			Frames: []Frame{kSched, kSyscall, kEntry, nUnnamed, nHandle, nMain}},
		{Resource: worker, Kind: OffCPU, TID: 778, CPU: 0, Time: at(130), Value: 40_000_000, Frames: []Frame{kSched, gWork, gMain}},
		{Resource: server, TID: 4245, ThreadName: "http-3", CPU: 1, Time: at(140), Value: 1, Frames: []Frame{nWrite, nHandle, nMainByFP}},
		{Resource: worker, TID: 777, ThreadName: "worker", CPU: 1, Time: at(160), Value: 1, Frames: []Frame{gHash, gWork, gMain}},
		// A kernel thread of no known process, and a sample without frames.
		{TID: 12, ThreadName: "kworker/0:1", CPU: 0, Time: at(200), Value: 1, Frames: []Frame{kSched}},
		{Resource: worker, TID: 779, CPU: 0, Time: at(210), Value: 1},
		{Resource: worker, TID: 779, CPU: 0, Time: at(220), Value: 1, Frames: []Frame{unknown, gMain}},
		{Resource: server, Kind: OffCPU, TID: 4244, ThreadName: "http-2", CPU: 1, Time: at(300), Value: 1_000_000,
			Frames: []Frame{kSched, kSyscall, kEntry, nUnnamed, nHandle, nMain}},
	}
}

// randomSamples draws n samples from small pools so that processes, stacks,
// frames and mappings repeat, sometimes behind distinct pointers.
func randomSamples(rng *rand.Rand, n int) []Sample {
	var resources []*Resource
	for i := range 6 {
		r := &Resource{PID: int64(1000 + i%4), ExecutableName: []string{"a", "b", "c"}[i%3], ExecutablePath: "/bin/x"}
		if i%2 == 0 {
			r.EnvVars = map[string]string{"A": "1", "B": string(rune('0' + i%3))}
		}
		resources = append(resources, r)
	}
	resources = append(resources, nil)
	var mappings []*Mapping
	for i := range 8 {
		m := &Mapping{Start: uint64(i%4) << 32, Limit: uint64(i%4)<<32 + 1<<20, File: "/lib/" + string(rune('a'+i%4))}
		if i%4 != 3 {
			m.GNUBuildID = "gnu" + m.File
		}
		mappings = append(mappings, m)
	}
	mappings = append(mappings, nil)
	names := []string{"f", "g", "h", "ns::k()", "", "runtime.main"}
	var frames []Frame
	for i := range 40 {
		f := Frame{Type: FrameType(i % 4), Address: uint64(0x1000 + i%25*16), Mapping: mappings[rng.IntN(len(mappings))]}
		for j := range rng.IntN(4) {
			f.Lines = append(f.Lines, Line{Function: names[(i+j)%len(names)], File: "f.c", Line: int64(rng.IntN(3))})
		}
		frames = append(frames, f)
	}
	out := make([]Sample, 0, n)
	for i := range n {
		s := Sample{
			Kind: Kind(rng.IntN(2)), Resource: resources[rng.IntN(len(resources))],
			TID: int64(rng.IntN(3)), ThreadName: []string{"", "t1", "t2"}[rng.IntN(3)], CPU: int64(rng.IntN(2)),
			Time: testStart.Add(time.Duration(i) * time.Millisecond), Value: int64(rng.IntN(3)),
		}
		for range rng.IntN(8) {
			s.Frames = append(s.Frames, frames[rng.IntN(len(frames))])
		}
		out = append(out, s)
	}
	return out
}
