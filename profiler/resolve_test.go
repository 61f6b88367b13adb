package profiler

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
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

// TestResolveGoneProcess: a process that exits before it is read keeps its
// samples, attributed by what the kernel recorded.
func TestResolveGoneProcess(t *testing.T) {
	procs := process.NewTable(t.TempDir(), nil, process.Options{})
	r := newResolver(zap.NewNop(), procs, nil, true, nil)
	var s profile.Sample
	rec := tracer.Record{Type: tracer.RecordSample, PID: 4242, TID: 4243, Comm: "short-lived",
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
