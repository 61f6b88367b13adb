package ruby

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// startRuby runs testdata/burn.rb in mode with rb and waits for its
// "ready" line.
func startRuby(t *testing.T, rb testutil.Ruby, mode string) *exec.Cmd {
	t.Helper()
	src, err := filepath.Abs("testdata/burn.rb")
	if err != nil {
		t.Fatal(err)
	}
	cmd := rb.Command(src, mode)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	return cmd
}

// eachRuby runs f as a subtest for each Ruby version the tests run.
func eachRuby(t *testing.T, f func(t *testing.T, rb testutil.Ruby)) {
	for _, rb := range testutil.Rubies(t) {
		t.Run(rb.Version, func(t *testing.T) { f(t, rb) })
	}
}

// findProc reads pid from /proc.
func findProc(t *testing.T, pid int) *process.Process {
	t.Helper()
	p, err := process.NewTable("/proc", zap.NewNop(), process.Options{}).Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// findInterp finds the VM of pid.
func findInterp(t *testing.T, pid int) (*Interp, *python.ProcMem) {
	t.Helper()
	p := findProc(t, pid)
	mem, err := python.OpenMem("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.Close(t, mem) })
	in, err := Find(p, mem)
	if err != nil {
		t.Fatalf("find ruby of %d: %v", pid, err)
	}
	return in, mem
}

// snapshot stops thread tid with ptrace (PTRACE_SEIZE, PTRACE_INTERRUPT),
// reads its thread pointer and its Ruby stack, and lets it go on.
func snapshot(tid int, in *Interp, mem Memory) ([]StackFrame, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(tid); err != nil {
		return nil, fmt.Errorf("seize %d: %w", tid, err)
	}
	defer func() { _ = unix.PtraceDetach(tid) }()
	if err := unix.PtraceInterrupt(tid); err != nil {
		return nil, fmt.Errorf("interrupt %d: %w", tid, err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tid, &ws, unix.WALL, nil); err != nil {
		return nil, fmt.Errorf("wait %d: %w", tid, err)
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &regs); err != nil {
		return nil, fmt.Errorf("regs %d: %w", tid, err)
	}
	tp, ok := threadPointer(&regs)
	if !ok {
		return nil, fmt.Errorf("thread %d: no thread pointer on %s", tid, runtime.GOARCH)
	}
	ec, err := in.EC(mem, tp)
	if err != nil {
		return nil, err
	}
	return in.Stack(mem, ec)
}

// threads lists pid's thread ids.
func threads(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out
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
