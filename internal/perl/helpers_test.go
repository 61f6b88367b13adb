package perl

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

// startPerl runs testdata/burn.pl in mode with pl and waits for its
// "ready" line.
func startPerl(t *testing.T, pl testutil.Interpreter, mode string) *exec.Cmd {
	t.Helper()
	src, err := filepath.Abs("testdata/burn.pl")
	if err != nil {
		t.Fatal(err)
	}
	cmd := pl.Command(src, mode)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	return cmd
}

// eachPerl runs f as a subtest for each Perl version the tests run.
func eachPerl(t *testing.T, f func(t *testing.T, pl testutil.Interpreter)) {
	for _, pl := range testutil.Perls(t) {
		t.Run(pl.Version, func(t *testing.T) { f(t, pl) })
	}
}

// findInterp finds the interpreter of pid and opens its memory.
func findInterp(t *testing.T, pid int) (*Interp, *python.ProcMem) {
	t.Helper()
	p := findProc(t, pid)
	mem, err := python.OpenMem("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.Close(t, mem) })
	in, err := Find(p)
	if err != nil {
		t.Fatalf("find perl of %d: %v", pid, err)
	}
	return in, mem
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

// snapshot stops thread tid with ptrace (PTRACE_SEIZE, PTRACE_INTERRUPT),
// reads its Perl stack, and lets it go on.
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
	return in.Stack(mem)
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

// want is one expected frame: a name, a file and the lines it may be at.
type want struct {
	name  string
	file  string
	lines []int64
}

// matchChain checks that frames, innermost first, end with chain after
// an optional main::ready frame (the leaf's loop calls it).
func matchChain(frames []StackFrame, chain []want) error {
	if len(frames) > 0 && frames[0].Name == "main::ready" {
		frames = frames[1:]
	}
	if len(frames) != len(chain) {
		return fmt.Errorf("%d frames, want %d: %s", len(frames), len(chain), describe(frames))
	}
	for i, w := range chain {
		f := frames[i]
		ok := f.Name == w.name && f.File == w.file
		if ok {
			ok = false
			for _, l := range w.lines {
				ok = ok || f.Line == l
			}
		}
		if !ok {
			return fmt.Errorf("frame %d is %s %s:%d, want %s %s:%v: %s", i, f.Name, f.File, f.Line, w.name, w.file, w.lines, describe(frames))
		}
	}
	return nil
}

func describe(frames []StackFrame) string {
	var b strings.Builder
	for _, f := range frames {
		fmt.Fprintf(&b, "\n  %s %s:%d kind %d last %v", f.Name, f.File, f.Line, f.Kind, f.Last)
	}
	return b.String()
}
