package profiler

import (
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// TestResolveResource builds the resource of a real child process: every
// attribute the process table reads reaches the sample's resource. It needs
// no privileges: the child is ours.
func TestResolveResource(t *testing.T) {
	// A shell that waits on a child keeps its own command line, whose
	// last argument has a space ($0 of the script).
	sh := testutil.RequireTool(t, "sh")
	cmd := exec.Command(sh, "-c", "sleep 600; :", "extra arg")
	cmd.Env = []string{"OTEL_RESOURCE_ATTRIBUTES=service.name=cart%2Fv2", "DEPLOY=blue", "OTHER=x"}
	testutil.StartCmd(t, cmd)
	pid := cmd.Process.Pid
	testutil.WaitExec(t, pid, cmd.Args)

	procs := process.NewTable("/proc", nil, process.Options{EnvVars: []string{"DEPLOY", "UNSET"}, CommandLine: true})
	p, err := procs.Get(pid)
	if err != nil {
		t.Fatalf("Get(%d) = %v", pid, err)
	}
	r := newResolver(zap.NewNop(), procs, nil, true, nil)
	var s profile.Sample
	r.resolve(&tracer.Record{Type: tracer.RecordSample, PID: uint32(pid), TID: uint32(pid), Comm: "sleep"}, &s)
	want := profile.Resource{
		PID:            int64(pid),
		ExecutableName: p.Name,
		ExecutablePath: p.ExePath,
		ContainerID:    p.ContainerID, // whatever the test's own cgroup says
		ServiceName:    "cart/v2",
		EnvVars:        map[string]string{"DEPLOY": "blue"},
		CommandLine:    strings.Join(cmd.Args, " "),
	}
	if diff := cmp.Diff(&want, s.Resource); diff != "" {
		t.Errorf("resource (-want +got):\n%s", diff)
	}
	if p.Comm != "sh" {
		t.Errorf("process read is %s (%s), want the shell child", p.Comm, p.ExePath)
	}
}

// startSleep starts sleep 600 as a child and waits for its exec.
func startSleep(t *testing.T) (int, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(testutil.RequireTool(t, "sleep"), "600")
	testutil.StartCmd(t, cmd)
	testutil.WaitExec(t, cmd.Process.Pid, cmd.Args)
	return cmd.Process.Pid, cmd
}

// A process read again (a refresh after dlopen or dlclose) keeps the open
// files it still maps: the resolver does not open them again, and releases
// only the files it no longer maps.
func TestResolveRefreshKeepsMappedFiles(t *testing.T) {
	pid, _ := startSleep(t)
	procs := process.NewTable("/proc", nil, process.Options{})
	p, err := procs.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	syms := symbolize.New(nil, symbolize.Options{})
	r := newResolver(zap.NewNop(), procs, syms, true, nil)
	e := r.entry(pid, p)
	var files []process.Mapping
	for _, m := range p.Mappings {
		if m.FileBacked() {
			if fe := r.file(e, m); fe.err != nil {
				t.Fatalf("%s: %v", m.Path, fe.err)
			}
			files = append(files, m)
		}
	}
	if len(files) < 2 {
		t.Fatalf("sleep maps %d files, want the binary and its libraries", len(files))
	}
	opened, held := syms.Stats(), maps.Clone(e.files)

	// Read again without its last library.
	gone := files[len(files)-1]
	q := *p
	q.Mappings = slices.DeleteFunc(slices.Clone(p.Mappings), func(m process.Mapping) bool { return m.Path == gone.Path })
	e2 := r.entry(pid, &q)
	for _, m := range files[:len(files)-1] {
		if m.Path == gone.Path {
			continue
		}
		key := fileKey{dev: m.Dev, inode: m.Inode, path: m.Path}
		if e2.files[key] != held[key] {
			t.Errorf("%s: the new entry opened it again", m.Path)
		}
		if fe := r.file(e2, m); fe != held[key] {
			t.Errorf("%s: named by another file entry after the refresh", m.Path)
		}
	}
	s := syms.Stats()
	if s.FilesOpened+s.OpenHits != opened.FilesOpened+opened.OpenHits {
		t.Errorf("opens after the refresh: %d, before %d; want none", s.FilesOpened+s.OpenHits, opened.FilesOpened+opened.OpenHits)
	}
	if s.OpenFiles != opened.OpenFiles-1 {
		t.Errorf("files open after %s went: %d, want %d", gone.Path, s.OpenFiles, opened.OpenFiles-1)
	}
	r.forget(pid)
	if n := syms.Stats().OpenFiles; n != 0 {
		t.Errorf("files open after forgetting the process: %d, want 0", n)
	}
}

// TestResolveGoneProcess: a process that exits before it is read keeps its
// samples, attributed by what the kernel recorded.
func TestResolveGoneProcess(t *testing.T) {
	procs := process.NewTable(t.TempDir(), nil, process.Options{})
	r := newResolver(zap.NewNop(), procs, nil, true, nil)
	var s profile.Sample
	rec := tracer.Record{Type: tracer.RecordSample, PID: 4242, TID: 4243, Comm: "short-lived", Flags: tracer.FlagUserComplete,
		User: []uint64{0x401000, 0x401234}, UserFlags: []tracer.FrameFlags{tracer.FrameInterrupted, 0}}
	r.resolve(&rec, &s)
	if diff := cmp.Diff(&profile.Resource{PID: 4242, ExecutableName: "short-lived"}, s.Resource); diff != "" {
		t.Errorf("resource (-want +got):\n%s", diff)
	}
	if len(s.Frames) != 2 || s.Frames[0].Address != 0x401000 || s.TID != 4243 || s.ThreadName != "short-lived" {
		t.Errorf("sample = %+v, want both user frames and the thread kept", s)
	}
	if got := r.stats.processGone.Load(); got != 1 {
		t.Errorf("processGone = %d, want 1", got)
	}
}

// The samples the kernel takes while a process finishes its exit come
// after its exit record, when /proc no longer has it: they carry the
// resource the process had, its executable's path included, not one named
// by the thread alone. A sample long after the exit is another process's.
func TestResolveAfterExit(t *testing.T) {
	pid, cmd := startSleep(t)
	procs := process.NewTable("/proc", nil, process.Options{})
	r := newResolver(zap.NewNop(), procs, nil, true, nil)
	t0 := time.Now()
	var s profile.Sample
	r.resolve(&tracer.Record{Type: tracer.RecordSample, PID: uint32(pid), TID: uint32(pid), Comm: "sleep", Time: t0}, &s)
	before := *s.Resource
	if before.ExecutablePath == "" {
		t.Fatalf("live process's resource %+v has no path", before)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	r.exit(pid, t0.Add(time.Millisecond))

	r.resolve(&tracer.Record{Type: tracer.RecordSample, PID: uint32(pid), TID: uint32(pid), Comm: "sleep", Time: t0.Add(2 * time.Millisecond)}, &s)
	if diff := cmp.Diff(&before, s.Resource); diff != "" {
		t.Errorf("sample right after the exit: resource (-want +got):\n%s", diff)
	}
	r.resolve(&tracer.Record{Type: tracer.RecordSample, PID: uint32(pid), TID: uint32(pid), Comm: "other", Time: t0.Add(time.Minute)}, &s)
	if diff := cmp.Diff(&profile.Resource{PID: int64(pid), ExecutableName: "other"}, s.Resource); diff != "" {
		t.Errorf("sample a minute after the exit: resource (-want +got):\n%s", diff)
	}
}

// A gone process has no mappings left to check a frame against: a frame
// the frame-pointer chain found where the unwinder saw no file may be a
// word of data, so the stack ends before it, marked cut short.
func TestResolveGoneProcessFramePointerWithoutFile(t *testing.T) {
	procs := process.NewTable(t.TempDir(), nil, process.Options{})
	r := newResolver(zap.NewNop(), procs, nil, true, nil)
	var s profile.Sample
	rec := tracer.Record{Type: tracer.RecordSample, PID: 4242, TID: 4243, Comm: "short-lived", Flags: tracer.FlagFramePointers,
		User:      []uint64{0x401000, 0x30a54a7e, 0x401234},
		UserFlags: []tracer.FrameFlags{tracer.FrameInterrupted, tracer.FrameFromFramePointer, tracer.FrameFromFramePointer}}
	r.resolve(&rec, &s)
	if len(s.Frames) != 2 || s.Frames[0].Address != 0x401000 || s.Frames[1].Lines[0].Function != TruncatedFrame {
		t.Errorf("frames = %+v, want the leaf then %s", s.Frames, TruncatedFrame)
	}
	if got := r.stats.fpOutside.Load(); got != 1 {
		t.Errorf("fpOutside = %d, want 1", got)
	}
}

// A sample whose user stack did not reach its outermost frame gets a
// [truncated] frame on the root side, and is counted; whole stacks and
// samples without user frames get none.
func TestResolveMarksTruncated(t *testing.T) {
	procs := process.NewTable(t.TempDir(), nil, process.Options{})
	user := []uint64{0x401000, 0x401234}
	flags := []tracer.FrameFlags{tracer.FrameInterrupted, 0}
	for _, tc := range []struct {
		name      string
		rec       tracer.Record
		truncated bool
	}{
		{"whole", tracer.Record{Flags: tracer.FlagUserComplete, User: user, UserFlags: flags}, false},
		{"stopped at an unknown rule", tracer.Record{Flags: tracer.FlagUnknownRule, User: user, UserFlags: flags}, true},
		{"frame-pointer chain ended", tracer.Record{Flags: tracer.FlagFramePointers, User: user, UserFlags: flags}, true},
		{"frame limit", tracer.Record{Flags: tracer.FlagUserTruncated, User: user, UserFlags: flags}, true},
		{"no user stack", tracer.Record{Flags: tracer.FlagUserStackErr}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newResolver(zap.NewNop(), procs, nil, true, nil)
			rec := tc.rec
			rec.Type, rec.PID, rec.TID, rec.Comm = tracer.RecordSample, 4242, 4243, "gone"
			var s profile.Sample
			r.resolve(&rec, &s)
			want := len(rec.User)
			if tc.truncated {
				want++
			}
			if len(s.Frames) != want {
				t.Fatalf("%d frames, want %d: %+v", len(s.Frames), want, s.Frames)
			}
			if want == 0 {
				return
			}
			last := s.Frames[len(s.Frames)-1]
			isMark := len(last.Lines) == 1 && last.Lines[0].Function == TruncatedFrame && last.Address == 0 && last.Mapping == nil
			if isMark != tc.truncated {
				t.Errorf("root-side frame %+v: [truncated] %v, want %v", last, isMark, tc.truncated)
			}
			if got, want := r.stats.truncated.Load(), map[bool]uint64{true: 1}[tc.truncated]; got != want {
				t.Errorf("truncated = %d, want %d", got, want)
			}
		})
	}
}

// A stack whose outermost frame is a function that only ever starts
// stacks is whole, however it was unwound; one that ends anywhere else, or
// in a root function inlined into another, is not.
func TestEndsAtStackRoot(t *testing.T) {
	frame := func(names ...string) profile.Frame {
		f := profile.Frame{Type: profile.FrameNative}
		for _, n := range names {
			f.Lines = append(f.Lines, profile.Line{Function: n})
		}
		return f
	}
	leaf := frame("main.leaf")
	for _, tc := range []struct {
		frames []profile.Frame
		want   bool
	}{
		{[]profile.Frame{leaf, frame("main.main"), frame("runtime.main"), frame("runtime.goexit")}, true},
		{[]profile.Frame{leaf, frame("runtime.goexit.abi0")}, true},
		{[]profile.Frame{leaf, frame("runtime.mstart")}, true},
		{[]profile.Frame{leaf, frame("main"), frame("__libc_start_call_main"), frame("__libc_start_main_impl"), frame("_start")}, true},
		{[]profile.Frame{leaf, frame("start_thread"), frame("clone3")}, true},
		{[]profile.Frame{leaf, frame("main.main")}, false},
		{[]profile.Frame{leaf, frame("runtime.goexit", "main.wrapper")}, false},
		{[]profile.Frame{leaf, {Type: profile.FrameNative, Address: 0x401000}}, false},
		{nil, false},
	} {
		if got := endsAtStackRoot(tc.frames); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.frames, got, tc.want)
		}
	}
}
