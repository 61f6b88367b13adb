package php

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

// startPHP runs testdata/burn.php in mode with php and waits for its
// "ready" line.
func startPHP(t *testing.T, php testutil.Interpreter, mode string, flags ...string) *exec.Cmd {
	t.Helper()
	src, err := filepath.Abs("testdata/burn.php")
	if err != nil {
		t.Fatal(err)
	}
	cmd := php.Command(append(flags, src, mode)...)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	return cmd
}

// eachPHP runs f as a subtest for each PHP version the tests run.
func eachPHP(t *testing.T, f func(t *testing.T, php testutil.Interpreter)) {
	for _, php := range testutil.PHPs(t) {
		t.Run(php.Version, func(t *testing.T) { f(t, php) })
	}
}

// findInterp finds the engine of pid.
func findInterp(t *testing.T, pid int) (*Interp, *python.ProcMem) {
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
	in, err := Find(p, mem)
	if err != nil {
		t.Fatalf("find php of %d: %v", pid, err)
	}
	return in, mem
}

// snapshot stops thread tid with ptrace (PTRACE_SEIZE, PTRACE_INTERRUPT),
// reads its VM registers and its PHP stack, and lets it go on.
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
	return in.Stack(mem, vmRegs(&regs))
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

// findProc reads pid from /proc.
func findProc(t *testing.T, pid int) *process.Process {
	t.Helper()
	p, err := process.NewTable("/proc", zap.NewNop(), process.Options{}).Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
