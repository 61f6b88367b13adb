package profiler

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// pathProfiler is a Profiler with only what adding samples needs: r, and
// one interval of an hour from t0.
func pathProfiler(r *resolver, t0 time.Time) *Profiler {
	p := &Profiler{opts: DefaultOptions(), t0: t0, closedEnd: t0, wake: make(chan struct{}, 1), resolver: r}
	p.opts.ReporterInterval = time.Hour
	p.popts = profile.Options{SamplesPerSecond: 19}
	return p
}

// flushAll flushes p's open intervals into one list of profiles.
func flushAll(p *Profiler) []pprofile.Profiles {
	var out []pprofile.Profiles
	for _, iv := range p.open {
		out = append(out, iv.b.Flush(iv.start, iv.end))
	}
	p.open = nil
	return out
}

// leafFiles lists, per output sample, the file of its leaf's mapping and
// how many events it holds: "file×n".
func leafFiles(pd pprofile.Profiles) []string {
	d := pd.Dictionary()
	var out []string
	rps := pd.ResourceProfiles()
	for i := range rps.Len() {
		sps := rps.At(i).ScopeProfiles()
		for j := range sps.Len() {
			ps := sps.At(j).Profiles()
			for k := range ps.Len() {
				ss := ps.At(k).Samples()
				for l := range ss.Len() {
					s := ss.At(l)
					locs := d.StackTable().At(int(s.StackIndex())).LocationIndices()
					file := ""
					if locs.Len() > 0 {
						loc := d.LocationTable().At(int(locs.At(0)))
						file = d.StringTable().At(int(d.MappingTable().At(int(loc.MappingIndex())).FilenameStrindex()))
					}
					out = append(out, file+"×"+string(rune('0'+s.TimestampsUnixNano().Len())))
				}
			}
		}
	}
	return out
}

// Samples added through addSample, repeats by key, come out exactly as the
// same records resolved one by one and added whole.
func TestRepeatedStacksMatchResolved(t *testing.T) {
	rec := benchSample(t)
	t0 := rec.Time.Add(-time.Second)
	keyed, proc := benchResolver(t, rec)
	plain, _ := benchResolver(t, rec)
	p := pathProfiler(keyed, t0)
	ref := profile.NewBuilder(profile.Options{SamplesPerSecond: 19})
	var s profile.Sample
	tail := *rec
	tail.User, tail.UserFlags, tail.UserFiles = rec.User[1:], rec.UserFlags[1:], rec.UserFiles[1:]
	tail.Flags = 0 // not complete: a [truncated] root frame
	truncated := keyed.stats.truncated.Load()
	for i := range 40 {
		r := *rec
		if i%3 == 2 {
			r = tail
		}
		r.TID, r.CPU, r.Time = uint32(100+i%4), uint32(i%2), rec.Time.Add(time.Duration(i)*time.Millisecond)
		if i%5 == 4 {
			r.Comm = "renamed"
		}
		p.addSample(&r, proc, nil, &s)
		plain.resolveProc(&r, proc, nil, &s)
		ref.Add(s)
	}
	if p.repeated != 40-2 {
		t.Errorf("%d samples added as repeats, want 38 (all but the first of each stack)", p.repeated)
	}
	if got, want := keyed.stats.truncated.Load()-truncated, plain.stats.truncated.Load(); got != want {
		t.Errorf("Truncated counted %d times with repeats, %d resolving each", got, want)
	}
	got := flushAll(p)
	if len(got) != 1 {
		t.Fatalf("%d intervals, want 1", len(got))
	}
	want := ref.Flush(p.t0, p.t0.Add(time.Hour))
	if diff := cmp.Diff(protoJSON(t, want), protoJSON(t, got[0])); diff != "" {
		t.Errorf("profiles with repeats (-resolved each +by key):\n%s", diff)
	}
}

func protoJSON(t *testing.T, p pprofile.Profiles) string {
	t.Helper()
	var m pprofile.JSONMarshaler
	b, err := m.MarshalProfiles(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A repeated stack is a lookup and a count: adding it allocates nothing.
func TestRepeatedStackAllocatesNothing(t *testing.T) {
	rec := benchSample(t)
	r, proc := benchResolver(t, rec)
	p := pathProfiler(r, rec.Time.Add(-time.Second))
	var s profile.Sample
	for range 2000 { // room for the events, kept by the flush
		p.addSample(rec, proc, nil, &s)
	}
	p.open[0].b.Flush(p.t0, p.t0.Add(time.Hour))
	p.addSample(rec, proc, nil, &s)
	before := p.repeated
	if n := testing.AllocsPerRun(500, func() { p.addSample(rec, proc, nil, &s) }); n != 0 {
		t.Errorf("a repeated %d-frame stack allocates %v times per sample, want 0", len(rec.Kernel)+len(rec.User), n)
	}
	if p.repeated-before != 501 {
		t.Errorf("%d of 501 samples added as repeats", p.repeated-before)
	}
}

// overlapChild starts a child shell with address randomization off
// (setarch -R), which reads a line and then execs sleep: both executables
// load at the same address. It returns the child's pid and what makes it
// exec sleep (and waits for that).
func overlapChild(t *testing.T) (pid int, execSleep func()) {
	t.Helper()
	setarch := testutil.RequireTool(t, "setarch")
	script := "read x; exec sleep 600"
	cmd := exec.Command(setarch, "-R", "sh", "-c", script)
	w, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartCmd(t, cmd)
	pid = cmd.Process.Pid
	testutil.WaitExec(t, pid, []string{"sh", "-c", script})
	execSleep = func() {
		if _, err := w.Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitExec(t, pid, []string{"sleep", "600"})
	}
	return pid, execSleep
}

// text is the executable mapping of proc's executable.
func text(t *testing.T, proc *process.Process) process.Mapping {
	t.Helper()
	for _, m := range proc.Mappings {
		if m.Path == proc.ExePath && strings.Contains(m.Perms, "x") {
			return m
		}
	}
	t.Fatalf("no executable mapping of %s in %+v", proc.ExePath, proc.Mappings)
	return process.Mapping{}
}

// A process that execs another binary at the same addresses within an
// interval: the same frame words name the new image's code from the exec
// on, never the old image's stack remembered before it.
func TestRepeatedStackAfterExecAtSameAddresses(t *testing.T) {
	pid, execSleep := overlapChild(t)
	procs := process.NewTable("/proc", nil, process.Options{})
	syms := symbolize.New(nil, symbolize.Options{})
	r := newResolver(zap.NewNop(), procs, syms, true, nil)
	t.Cleanup(r.close)
	sh, err := procs.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	shText := text(t, sh)
	execSleep()
	// As the reader and the resolver handle the exec record.
	procs.Exec(pid)
	sleep, err := procs.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	sleepText := text(t, sleep)
	lo, hi := max(shText.Start, sleepText.Start), min(shText.End, sleepText.End)
	if lo+0x100 >= hi {
		t.Fatalf("%s at %#x-%#x and %s at %#x-%#x do not overlap: address randomization is on",
			shText.Path, shText.Start, shText.End, sleepText.Path, sleepText.Start, sleepText.End)
	}
	now := time.Now()
	rec := &tracer.Record{Type: tracer.RecordSample, PID: uint32(pid), TID: uint32(pid), Comm: "x", Time: now,
		User: []uint64{lo + 0x40, lo + 0x80}, UserFlags: []tracer.FrameFlags{tracer.FrameInterrupted, 0},
		UserFiles: make([]tracer.FileRef, 2), Flags: tracer.FlagUserComplete}
	p := pathProfiler(r, now.Add(-time.Second))
	var s profile.Sample
	p.addSample(rec, sh, nil, &s)
	p.addSample(rec, sh, nil, &s)
	r.exec(pid)
	p.addSample(rec, sleep, nil, &s)
	p.addSample(rec, sleep, nil, &s)
	p.addSample(rec, sleep, nil, &s)
	if p.repeated != 1+2 {
		t.Errorf("%d repeats, want 3: one of the shell's stack, two of sleep's", p.repeated)
	}
	got := flushAll(p)
	want := []string{shText.Path + "×2", sleepText.Path + "×3"}
	if diff := cmp.Diff(want, leafFiles(got[0])); diff != "" {
		t.Errorf("leaf files per sample (-want +got):\n%s", diff)
	}
}

// A pid used again by another process (another image at the same
// addresses) within an interval, whether or not the exit was seen: each
// sample is named by the process it was read with.
func TestRepeatedStackPIDReused(t *testing.T) {
	// Two processes of different images at the same addresses: the
	// second stands for the first's pid used again.
	pid, execSleep := overlapChild(t)
	other, _ := overlapChild(t)
	execSleep()
	procs := process.NewTable("/proc", nil, process.Options{})
	sleep, err := procs.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := procs.Get(other)
	if err != nil {
		t.Fatal(err)
	}
	shText, sleepText := text(t, sh), text(t, sleep)
	lo, hi := max(shText.Start, sleepText.Start), min(shText.End, sleepText.End)
	if lo+0x100 >= hi {
		t.Fatalf("%s and %s do not overlap: address randomization is on", shText.Path, sleepText.Path)
	}
	for _, exitSeen := range []bool{false, true} {
		syms := symbolize.New(nil, symbolize.Options{})
		r := newResolver(zap.NewNop(), procs, syms, true, nil)
		now := time.Now()
		rec := &tracer.Record{Type: tracer.RecordSample, PID: uint32(pid), TID: uint32(pid), Comm: "x", Time: now,
			User: []uint64{lo + 0x40}, UserFlags: []tracer.FrameFlags{tracer.FrameInterrupted},
			UserFiles: make([]tracer.FileRef, 1), Flags: tracer.FlagUserComplete}
		p := pathProfiler(r, now.Add(-time.Second))
		var s profile.Sample
		p.addSample(rec, sleep, nil, &s)
		p.addSample(rec, sleep, nil, &s)
		if exitSeen {
			r.exit(pid, now)
		}
		p.addSample(rec, sh, nil, &s)
		p.addSample(rec, sh, nil, &s)
		p.addSample(rec, sleep, nil, &s) // one read before the reuse, resolved after
		got := leafFiles(flushAll(p)[0])
		want := []string{sleepText.Path + "×3", shText.Path + "×2"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("exit seen %v: leaf files per sample (-want +got):\n%s", exitSeen, diff)
		}
		r.close()
	}
}
