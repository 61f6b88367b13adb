package collector_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// threadByName returns the TID of the thread of pid whose comm is name, read
// from /proc: the oracle for thread.id and thread.name.
func threadByName(t *testing.T, pid int, name string) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		dirs, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*")
		for _, d := range dirs {
			if b, err := os.ReadFile(d + "/comm"); err == nil && strings.TrimSpace(string(b)) == name {
				tid, err := strconv.ParseInt(filepath.Base(d), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return tid
			}
		}
		time.Sleep(10 * time.Millisecond) // poll: the workload names its thread after it starts
	}
	t.Fatalf("pid %d has no thread named %q", pid, name)
	return 0
}

// environWithout returns the test's environment without the variables the
// attribution test sets, so the workload's environment holds only the test's
// values (a process reads the first of two equal names).
func environWithout(prefixes ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		keep := true
		for _, p := range prefixes {
			keep = keep && !strings.HasPrefix(kv, p)
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}

// TestAttributionResource runs a workload that declares a service name, sets
// a variable listed in include_env_vars, has a command line of several
// arguments, burns CPU in a named thread, and is the first process of its
// own PID namespace; its resource and samples must say all of that.
func TestAttributionResource(t *testing.T) {
	sink := startReceiver(t, 199, func(c *collector.Config) {
		c.IncludeEnvVars = []string{"SONDE_TEST_DEPLOY", "SONDE_TEST_UNSET"}
		c.IncludeCommandLine = true
	})
	bin := testutil.BuildWorkload(t, testutil.Threads)
	cmd := exec.Command(bin, "sonde-burner", "--mode=fast", "two words")
	cmd.Env = append(environWithout("OTEL_", "SONDE_TEST_"),
		"OTEL_SERVICE_NAME=checkout",
		// OTEL_SERVICE_NAME wins over this, as in the OpenTelemetry SDKs.
		"OTEL_RESOURCE_ATTRIBUTES=service.name=ignored,team=a",
		"SONDE_TEST_DEPLOY=blue green")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	testutil.StartCmd(t, cmd)
	pid := cmd.Process.Pid
	burner := threadByName(t, pid, "sonde-burner")

	// Samples from before the exec (the forked test binary) have another
	// executable; those after it carry the workload's attribution.
	_, seen := waitForSample(t, sink, pid, 20*time.Second, func(s flatSample) bool {
		return s.ExePath == bin && s.ThreadName == "sonde-burner" &&
			hasChain(s.Frames, []frame{{"burn", "native"}, {"spin", "native"}})
	})
	want := map[string]any{
		"process.pid":             int64(pid),
		"process.executable.name": "threads",
		"process.executable.path": bin,
		"service.name":            "checkout",
		"process.environment_variable.SONDE_TEST_DEPLOY": "blue green",
		"process.command_line":                           strings.Join(cmd.Args, " "),
		"sonde.process.namespace_pid":                    int64(1),
	}
	var checked int
	for _, s := range seen {
		if s.ExePath != bin {
			continue
		}
		checked++
		got := s.Resource
		// The test's own container, when CI runs in one, is inherited; the
		// container tests below check container.id.
		if _, ok := got["container.id"]; ok {
			got = maps(got)
			delete(got, "container.id")
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("resource of the workload (-want +got):\n%s", diff)
		}
		if s.ThreadName == "sonde-burner" && s.TID != burner {
			t.Errorf("sample of thread %q has thread.id %d, /proc says %d", s.ThreadName, s.TID, burner)
		}
		// burn runs only after the thread named itself.
		if hasChain(s.Frames, []frame{{"burn", "native"}, {"spin", "native"}}) && s.ThreadName != "sonde-burner" {
			t.Errorf("sample in burn has thread %d %q, want %d sonde-burner", s.TID, s.ThreadName, burner)
		}
	}
	if checked == 0 {
		t.Fatalf("no sample of pid %d ran %s", pid, bin)
	}
	if burner == int64(pid) {
		t.Fatalf("the burning thread is the main thread: the workload does not test thread names")
	}
}

// maps returns a shallow copy of m.
func maps(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestAttributionContainerID moves workloads into real cgroups laid out as
// container runtimes lay them out, without a container engine, and checks the
// container.id of their resources.
func TestAttributionContainerID(t *testing.T) {
	testutil.RequireRoot(t, "creating cgroups")
	sink := startReceiver(t, 199)
	bin := testutil.BuildWorkload(t, testutil.CChain)
	v2, v2ok, v1, v1ok := testutil.CgroupHierarchies(t)
	for _, tt := range testutil.ContainerCgroups(t) {
		t.Run(tt.Name, func(t *testing.T) {
			h, ok := v1, v1ok
			if tt.V2 {
				h, ok = v2, v2ok
			}
			if !ok {
				t.Skipf("this host mounts no writable cgroup hierarchy of that version (v2 %v, v1 %v)", v2ok, v1ok)
			}
			dir := testutil.MakeCgroup(t, h, tt.Rel)
			cmd := testutil.CommandInCgroup(dir, bin)
			testutil.StartCmd(t, cmd)
			pid := cmd.Process.Pid

			// The shell joins the cgroup before it execs the workload, so
			// every sample that ran the workload's executable must carry the
			// container id.
			_, seen := waitForSample(t, sink, pid, 20*time.Second, func(s flatSample) bool { return s.ExePath == bin })
			cg := testutil.CgroupOf(pid)
			if !strings.Contains(cg, "/"+tt.Rel+"\n") {
				t.Fatalf("/proc/%d/cgroup does not show %s:\n%s", pid, tt.Rel, cg)
			}
			var checked int
			for _, s := range seen {
				if s.ExePath != bin {
					continue
				}
				checked++
				got, ok := s.Resource["container.id"]
				switch {
				case tt.Want == "" && ok:
					t.Errorf("resource has container.id %q, want none; /proc/%d/cgroup:\n%s", got, pid, cg)
				case tt.Want != "" && got != tt.Want:
					t.Errorf("resource has container.id %v, want %q; /proc/%d/cgroup:\n%s", got, tt.Want, pid, cg)
				}
			}
			if checked == 0 {
				t.Errorf("no sample of pid %d ran %s", pid, bin)
			}
		})
	}
}
