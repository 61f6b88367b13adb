package v8

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// nodeBin is one Node binary the tests run.
type nodeBin struct {
	name string
	path string
}

// nodes returns the Node binaries to test: Debian's /usr/bin/node (20)
// and npm's official 18, 20, 22, 24 and 26 (testutil.NodeBinary installs
// them once). A missing one skips, or fails under CI=true.
func nodes(t *testing.T) []nodeBin {
	t.Helper()
	var out []nodeBin
	if _, err := os.Stat("/usr/bin/node"); err == nil {
		out = append(out, nodeBin{"debian-20", "/usr/bin/node"})
	} else if testutil.InCI() {
		t.Errorf("/usr/bin/node is missing: %v", err)
	}
	for _, m := range testutil.NodeMajors {
		out = append(out, nodeBin{fmt.Sprintf("npm-%d", m), testutil.NodeBinary(t, m)})
	}
	return out
}

// startNode runs testdata/script with node and waits for its "ready" line.
func startNode(t *testing.T, node, script string, flags ...string) *exec.Cmd {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("testdata", script))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, append(flags, src)...)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	return cmd
}

// findVM finds the V8 of pid.
func findVM(t *testing.T, pid int) (*VM, *python.ProcMem) {
	t.Helper()
	procs := process.NewTable("/proc", zap.NewNop(), process.Options{})
	p, err := procs.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := python.OpenMem("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.Close(t, mem) })
	vm, err := Find(p, mem)
	if err != nil {
		t.Fatalf("find v8 of %d: %v", pid, err)
	}
	return vm, mem
}

// snapshot stops thread tid with ptrace (PTRACE_SEIZE, PTRACE_INTERRUPT),
// reads its registers, walks its V8 frames from rip and rbp as the eBPF
// walker would, and lets it go on.
func snapshot(tid int, k *Kernel, mem Memory) ([]WalkedFrame, WalkStop, uint64, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		return nil, 0, 0, fmt.Errorf("seize %d: %w", tid, err)
	}
	defer func() { _ = unix.PtraceDetach(tid) }()
	if err := unix.PtraceInterrupt(tid); err != nil {
		return nil, 0, 0, fmt.Errorf("interrupt %d: %w", tid, err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		return nil, 0, 0, fmt.Errorf("wait %d: %w", tid, err)
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &regs); err != nil {
		return nil, 0, 0, fmt.Errorf("regs %d: %w", tid, err)
	}
	pc, sp, fp := userRegs(&regs)
	frames, stop, _ := k.Walk(mem, jitOf(tid), pc, sp, fp)
	return frames, stop, pc, nil
}

// lineOfText returns the 1-based line of the first line of path holding
// text.
func lineOfText(t *testing.T, path, text string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return int64(i + 1)
		}
	}
	t.Fatalf("%s: no line holds %q", path, text)
	return 0
}

// jitOf returns whether a pc of process (or thread) pid is in executable
// memory no file backs, from its maps.
func jitOf(pid int) func(uint64) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil
	}
	ms, err := process.ParseMaps(strings.NewReader(string(b)))
	if err != nil {
		return nil
	}
	var jit []process.Mapping
	for _, m := range ms {
		if m.Path == "" && strings.Contains(m.Perms, "x") {
			jit = append(jit, m)
		}
	}
	return func(pc uint64) bool {
		for _, m := range jit {
			if pc >= m.Start && pc < m.End {
				return true
			}
		}
		return false
	}
}
