package process

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestRealCommandLineAndNamespacePID reads a sleeper started in a new PID
// namespace, where it is PID 1, with a command line of several arguments.
func TestRealCommandLineAndNamespacePID(t *testing.T) {
	testutil.RequireRoot(t, "a process in a new PID namespace")
	bin := buildSleeper(t)
	cmd := exec.Command(bin, "ns-worker", "--flag=x", "two words")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	s := startSleeperCmd(t, cmd)

	tab := NewTable("", nil, Options{CommandLine: true})
	p, err := tab.Get(s.pid)
	if err != nil {
		t.Fatalf("Get(%d) = %v", s.pid, err)
	}
	// The oracle for the command line is the argv the test passed.
	if want := strings.Join(cmd.Args, " "); p.CommandLine != want {
		t.Errorf("CommandLine = %q, want %q", p.CommandLine, want)
	}
	if p.PID != s.pid || p.NamespacePID != 1 {
		t.Errorf("PID %d NamespacePID %d, want %d (host) and 1 (the first process of its namespace)", p.PID, p.NamespacePID, s.pid)
	}

	// The test itself lives in the namespace procfs belongs to.
	self, err := NewTable("", nil, Options{}).Get(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if self.NamespacePID != 0 || self.CommandLine != "" {
		t.Errorf("self: NamespacePID %d CommandLine %q, want 0 and \"\" (option off)", self.NamespacePID, self.CommandLine)
	}
}

// TestRealContainerIDFromCgroups moves a sleeper into real cgroups whose
// paths are those container runtimes create, and reads its container id.
func TestRealContainerIDFromCgroups(t *testing.T) {
	testutil.RequireRoot(t, "creating cgroups")
	bin := buildSleeper(t)
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
			s := startSleeper(t, bin, "w")
			if err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(s.pid)), 0); err != nil {
				t.Fatalf("move %d into %s: %v", s.pid, dir, err)
			}
			cg := testutil.CgroupOf(s.pid)
			p, err := NewTable("", nil, Options{}).Get(s.pid)
			if err != nil {
				t.Fatalf("Get(%d) = %v", s.pid, err)
			}
			if p.ContainerID != tt.Want {
				t.Errorf("ContainerID = %q, want %q; /proc/%d/cgroup:\n%s", p.ContainerID, tt.Want, s.pid, cg)
			}
			if !strings.HasSuffix(p.CgroupPath, "/"+tt.Rel) || !strings.Contains(cg, ":"+p.CgroupPath+"\n") {
				t.Errorf("CgroupPath = %q, want the path ending in %q that /proc/%d/cgroup shows:\n%s", p.CgroupPath, tt.Rel, s.pid, cg)
			}
		})
	}
}
