package profiler

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/tracer"
)

// benchDepth is how deep the user stacks of the per-sample benchmarks are.
const benchDepth = 30

// callersAt returns the return addresses of a real stack of this test
// binary, depth frames deep under its leaf: frames the resolver names from
// the binary's own pclntab, with inline levels where the compiler inlined.
//
//go:noinline
func callersAt(depth int, pcs []uintptr) int {
	if depth > 0 {
		return callersAt(depth-1, pcs) + 0
	}
	return runtime.Callers(1, pcs)
}

// kernelPCs returns n text addresses of the running kernel from
// /proc/kallsyms (none when they read as 0: not root).
func kernelPCs(n int) []uint64 {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return nil
	}
	defer f.Close()
	var pcs []uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() && len(pcs) < n {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || (fields[1] != "T" && fields[1] != "t") || len(fields) > 3 {
			continue
		}
		addr, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil || addr == 0 {
			return nil
		}
		// Spread over the kernel: every 997th function.
		if sc.Text() != "" && len(pcs) == 0 || addr%997 == 0 {
			pcs = append(pcs, addr+4)
		}
	}
	return pcs
}

// benchSample is a sample record of this process as the tracer decodes it:
// 10 kernel frames (when kallsyms can be read) and a user stack of this
// binary benchDepth frames deep, leaf first, without file handles (the
// resolver finds each frame's mapping in the process's maps).
func benchSample(tb testing.TB) *tracer.Record {
	tb.Helper()
	pcs := make([]uintptr, benchDepth+16)
	n := callersAt(benchDepth, pcs)
	if n < benchDepth {
		tb.Fatalf("%d frames", n)
	}
	rec := &tracer.Record{Type: tracer.RecordSample, PID: uint32(os.Getpid()), TID: uint32(os.Getpid()),
		CPU: 1, Comm: "bench", Time: time.Now(), Kernel: kernelPCs(10), Flags: tracer.FlagUserComplete}
	for i, pc := range pcs[:n] {
		rec.User = append(rec.User, uint64(pc))
		var f tracer.FrameFlags
		if i == 0 {
			f = tracer.FrameInterrupted
		}
		rec.UserFlags = append(rec.UserFlags, f)
		rec.UserFiles = append(rec.UserFiles, tracer.FileRef{})
	}
	return rec
}

// benchResolver returns a resolver of this process with every frame of rec
// resolved once (its caches warm), and the process.
func benchResolver(tb testing.TB, rec *tracer.Record) (*resolver, *process.Process) {
	tb.Helper()
	procs := process.NewTable("/proc", nil, process.Options{})
	p, err := procs.Get(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	syms := symbolize.New(nil, symbolize.Options{})
	r := newResolver(zap.NewNop(), procs, syms, true, nil)
	tb.Cleanup(r.close)
	var s profile.Sample
	r.resolveProc(rec, p, nil, &s)
	named := 0
	for _, f := range s.Frames {
		if len(f.Lines) > 0 {
			named++
		}
	}
	if named < benchDepth {
		tb.Fatalf("%d of %d frames named", named, len(s.Frames))
	}
	return r, p
}

// BenchmarkResolveCached is the resolver's part of one sample whose frames
// it named before: each frame's mapping, file and name come from its
// caches.
func BenchmarkResolveCached(b *testing.B) {
	rec := benchSample(b)
	r, p := benchResolver(b, rec)
	var s profile.Sample
	b.ReportAllocs()
	for b.Loop() {
		r.resolveProc(rec, p, nil, &s)
	}
}

// BenchmarkSamplePath is the resolver goroutine's part of one sample, from
// its decoded record to its place in the interval: resolved, the record
// resolved and added whole (a stack new to the interval, or one that
// cannot be keyed: what every sample cost before repeats were keyed);
// repeated, a stack the interval holds already (addSample: a key, a
// lookup and a count).
func BenchmarkSamplePath(b *testing.B) {
	rec := benchSample(b)
	b.Run("resolved", func(b *testing.B) {
		r, proc := benchResolver(b, rec)
		p := pathProfiler(r, rec.Time.Add(-time.Second))
		var s profile.Sample
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			r.resolveProc(rec, proc, nil, &s)
			p.mu.Lock()
			bld := p.intervalFor(s.Time)
			n := bld.Len()
			bld.Add(s)
			p.added(bld, n, StackComplete, false)
			p.mu.Unlock()
			if i%(1<<16) == 0 {
				bld.Discard()
			}
		}
	})
	b.Run("repeated", func(b *testing.B) {
		r, proc := benchResolver(b, rec)
		p := pathProfiler(r, rec.Time.Add(-time.Second))
		var s profile.Sample
		p.addSample(rec, proc, nil, &s)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			p.addSample(rec, proc, nil, &s)
			if i%(1<<16) == 0 {
				b.StopTimer()
				p.open[0].b.Discard()
				p.addSample(rec, proc, nil, &s)
				b.StartTimer()
			}
		}
		if p.repeated == 0 {
			b.Fatal("no sample added as a repeat")
		}
	})
}
