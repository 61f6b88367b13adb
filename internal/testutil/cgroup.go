package testutil

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// CgroupHierarchy is a mounted cgroup hierarchy that tests may create
// cgroups in and move their own processes into.
type CgroupHierarchy struct {
	// Mount is where the hierarchy is mounted (/sys/fs/cgroup on a unified
	// host, /sys/fs/cgroup/unified and /sys/fs/cgroup/<controller> on a
	// hybrid one).
	Mount string
	// V2 marks the unified (cgroup2) hierarchy.
	V2 bool
	// Options are the v1 hierarchy's controllers or name ("name=systemd",
	// "pids"); "" for v2.
	Options string
}

// harmlessV1 are the v1 hierarchies whose new cgroups do not limit the
// processes moved into them, in order of preference. A fresh cpuset cgroup
// has no CPUs, so a process cannot even join it; memory, cpu, blkio and
// devices cgroups could change how a workload runs.
var harmlessV1 = []string{"name=systemd", "pids", "freezer", "perf_event", "net_cls"}

// CgroupHierarchies returns the writable cgroup v2 hierarchy and a v1
// hierarchy from harmlessV1, as /proc/self/mountinfo lists them; ok is false
// for one this host does not mount (read-write).
func CgroupHierarchies(tb testing.TB) (v2 CgroupHierarchy, v2ok bool, v1 CgroupHierarchy, v1ok bool) {
	tb.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		tb.Fatalf("read mountinfo: %v", err)
	}
	defer f.Close()
	v1Rank := len(harmlessV1)
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 6 || len(sf) < 3 || pf[3] != "/" || slices.Contains(strings.Split(pf[5], ","), "ro") {
			continue
		}
		switch sf[0] {
		case "cgroup2":
			if !v2ok {
				v2, v2ok = CgroupHierarchy{Mount: pf[4], V2: true}, true
			}
		case "cgroup":
			for _, opt := range strings.Split(sf[2], ",") {
				if i := slices.Index(harmlessV1, opt); i >= 0 && i < v1Rank {
					v1, v1ok, v1Rank = CgroupHierarchy{Mount: pf[4], Options: opt}, true, i
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("read mountinfo: %v", err)
	}
	return v2, v2ok, v1, v1ok
}

var cgroupSeq atomic.Uint64

// MakeCgroup creates the cgroup rel ("system.slice/docker-<id>.scope",
// parents created as needed) in h, below a directory unique to this test
// process, and returns its directory. When the test ends, processes still in
// the created cgroups are moved back to the hierarchy's root and the
// cgroups are removed, deepest first; start workloads after MakeCgroup so
// that their own cleanups (kill and reap) run before. Creating cgroups needs
// root; without it the test skips, or fails under CI=true.
func MakeCgroup(tb testing.TB, h CgroupHierarchy, rel string) string {
	tb.Helper()
	top := filepath.Join(h.Mount, fmt.Sprintf("sonde-test-%d-%d", os.Getpid(), cgroupSeq.Add(1)))
	dirs := []string{top}
	for _, seg := range strings.Split(strings.Trim(rel, "/"), "/") {
		dirs = append(dirs, filepath.Join(dirs[len(dirs)-1], seg))
	}
	var made []string
	tb.Cleanup(func() {
		for i := len(made) - 1; i >= 0; i-- {
			if err := removeCgroup(h.Mount, made[i]); err != nil {
				tb.Errorf("remove cgroup: %v", err)
			}
		}
	})
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			if InCI() {
				tb.Fatalf("create cgroup %s (CI=true: a test that needs cgroups must get them): %v", d, err)
			}
			tb.Skipf("cannot create cgroup %s: %v", d, err)
		}
		made = append(made, d)
	}
	return dirs[len(dirs)-1]
}

// removeCgroup moves what is left in dir to the root cgroup at mount and
// removes dir. The kernel refuses (EBUSY) while a task in it is still being
// torn down, so that is retried until a deadline.
func removeCgroup(mount, dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, pid := range strings.Fields(string(b)) {
				// The process may exit meanwhile; rmdir says if it mattered.
				_ = os.WriteFile(filepath.Join(mount, "cgroup.procs"), []byte(pid), 0)
			}
		}
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("rmdir %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CommandInCgroup returns a command that runs path with args inside the
// cgroup at dir: a shell writes its own pid to the cgroup's cgroup.procs and
// then execs path, so no instruction of path runs outside the cgroup. Start
// it with StartCmd; the command's Process is the shell, which becomes path.
func CommandInCgroup(dir, path string, args ...string) *exec.Cmd {
	script := `echo $$ >"$0" || exit 125; exec "$@"`
	return exec.Command("/bin/sh", append([]string{"-c", script, filepath.Join(dir, "cgroup.procs"), path}, args...)...)
}

// CgroupOf returns the lines of /proc/PID/cgroup, for messages and oracles.
func CgroupOf(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// ContainerCgroup is a cgroup path, relative to its hierarchy's mount, of
// the form a container runtime gives its containers.
type ContainerCgroup struct {
	Name string
	V2   bool   // in the unified hierarchy, else in a v1 one
	Rel  string // path below the hierarchy's mount
	Want string // the container.id it names; "" for none
}

// ContainerCgroups returns the cgroup paths of the common container
// runtimes (Docker, containerd under Kubernetes, CRI-O and its conmon,
// Podman), on cgroup v2 and v1, for a fresh random 64-hex-digit id.
func ContainerCgroups(tb testing.TB) []ContainerCgroup {
	tb.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	id := hex.EncodeToString(b)
	uid := "0f3b6a2c_1a2b_4c3d_9e8f_" + id[:12]
	return []ContainerCgroup{
		{"docker systemd (v2)", true, "system.slice/docker-" + id + ".scope", id},
		{"containerd kubernetes systemd (v2)", true,
			"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice/cri-containerd-" + id + ".scope", id},
		{"cri-o (v2)", true, "machine.slice/crio-" + id + ".scope", id},
		{"cri-o conmon is no container (v2)", true, "machine.slice/crio-conmon-" + id + ".scope", ""},
		{"podman (v2)", true, "machine.slice/libpod-" + id + ".scope/container", id},
		{"docker cgroupfs (v1)", false, "docker/" + id, id},
		{"containerd kubernetes cgroupfs (v1)", false, "kubepods/burstable/pod" + uid + "/" + id, id},
	}
}
