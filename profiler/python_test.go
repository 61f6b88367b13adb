//go:build linux

package profiler

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// pyenvPython is pyenv's python3 of version, or a skip (a failure in CI).
func pyenvPython(t *testing.T, version string) string {
	t.Helper()
	home, _ := os.UserHomeDir()
	bin := filepath.Join(home, ".pyenv", "versions", version, "bin", "python3")
	if _, err := os.Stat(bin); err != nil {
		if testutil.InCI() {
			t.Fatalf("interpreter %s missing", bin)
		}
		t.Skipf("interpreter %s missing", bin)
	}
	return bin
}

// startPyWorkload runs internal/python/testdata/workload.py in mode under
// bin until the test ends, once it printed that it is ready.
func startPyWorkload(t *testing.T, bin, mode string) int {
	t.Helper()
	wl, err := filepath.Abs(filepath.Join("..", "internal", "python", "testdata", "workload.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, wl, mode)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	testutil.StartCmd(t, cmd)
	t.Cleanup(func() { testutil.Close(t, stdin) })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%s %s: %q, %v", bin, mode, line, err)
	}
	return cmd.Process.Pid
}

// TestPythonUnknownVersion runs real CPython 3.12 interpreters while the
// profiler's layout table hides 3.12: the version is reported once (one log
// line, counted), and its processes keep their native stacks, with the eval
// loop's native frames where Python frames would be. A 3.11 interpreter
// profiled at the same time still gets Python frames.
func TestPythonUnknownVersion(t *testing.T) {
	hidden := pyenvPython(t, "3.12.1")
	known := pyenvPython(t, "3.11.7")
	core, logs := observer.New(zapcore.WarnLevel)
	p, s := startProfiler(t, 99, func(o *Options) {
		o.Logger = zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
		o.pythonLayouts = func(minor int) (python.Layout, error) {
			if minor == 12 {
				return python.Layout{}, fmt.Errorf("python 3.%d: hidden by the test: %w", minor, python.ErrUnknownVersion)
			}
			return python.LayoutFor(minor)
		}
	})
	hiddenPIDs := []int{startPyWorkload(t, hidden, "burn"), startPyWorkload(t, hidden, "burn")}
	knownPID := startPyWorkload(t, known, "burn")

	const n = 30 // samples of each hidden process with the native eval loop named
	evalSamples := map[int]int{}
	var bad []string
	knownPy := false
	deadline := time.Now().Add(60 * time.Second)
	read := 0
	for time.Now().Before(deadline) {
		all := s.all()
		for _, pd := range all[read:] {
			for _, pid := range hiddenPIDs {
				for _, st := range stacksOf(pd, pid) {
					if hasFrame(st, "", "cpython") {
						if len(bad) < 5 {
							bad = append(bad, fmt.Sprintf("pid %d: python frames in %v", pid, st))
						}
						continue
					}
					if hasFrame(st, "_PyEval_EvalFrameDefault", "native") {
						evalSamples[pid]++
					}
				}
			}
			for _, st := range stacksOf(pd, knownPID) {
				knownPy = knownPy || hasFrame(st, "gamma_burn", "cpython")
			}
		}
		read = len(all)
		if knownPy && evalSamples[hiddenPIDs[0]] >= n && evalSamples[hiddenPIDs[1]] >= n {
			break
		}
		s.waitFor(read+1, time.Until(deadline))
	}
	if len(bad) > 0 {
		t.Errorf("a hidden version's process got python frames:\n%s", strings.Join(bad, "\n"))
	}
	for _, pid := range hiddenPIDs {
		if evalSamples[pid] < n {
			t.Errorf("pid %d (hidden 3.12): %d samples with a native _PyEval_EvalFrameDefault frame, want >= %d", pid, evalSamples[pid], n)
		}
	}
	if !knownPy {
		t.Errorf("pid %d (3.11): no sample with a python gamma_burn frame", knownPID)
	}

	var lines []string
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "python version not supported") {
			lines = append(lines, fmt.Sprint(e.ContextMap()))
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "python 3.12") {
		t.Errorf("unsupported version log lines: %q, want one about python 3.12", lines)
	}
	ps := p.Stats().Python
	if ps.UnknownVersions != 1 {
		t.Errorf("Stats.Python.UnknownVersions = %d, want 1", ps.UnknownVersions)
	}
	// Other 3.12 processes on the host count too; ours are two of them.
	if ps.Unsupported < 2 {
		t.Errorf("Stats.Python.Unsupported = %d, want >= 2", ps.Unsupported)
	}
	if ps.Processes < 1 {
		t.Errorf("Stats.Python.Processes = %d, want the 3.11 process at least", ps.Processes)
	}
}

// A process prepared at its exec has mapped its executable but not yet
// libpython: it is not CPython then, and is examined again once its
// mappings have grown; a settled one is not examined twice.
func TestPythonExaminedAgainWhenLibpythonMapped(t *testing.T) {
	bin := pyenvPython(t, "3.12.1") // a shared libpython
	pid := startPyWorkload(t, bin, "burn")
	procs := process.NewTable("/proc", zap.NewNop(), process.Options{})
	full, err := procs.Refresh(pid)
	if err != nil {
		t.Fatal(err)
	}
	atExec := *full
	atExec.Mappings = nil
	for _, m := range full.Mappings {
		if !strings.Contains(m.Path, "libpython") {
			atExec.Mappings = append(atExec.Mappings, m)
		}
	}
	if len(atExec.Mappings) == len(full.Mappings) {
		t.Fatalf("pid %d maps no libpython: %s is not a shared-library build", pid, bin)
	}
	hidden := func(minor int) (python.Layout, error) {
		return python.Layout{}, fmt.Errorf("python 3.%d: hidden by the test: %w", minor, python.ErrUnknownVersion)
	}
	pp := newPythonProcs(zap.NewNop(), nil, "/proc", 1<<20, hidden)
	pp.prepare(&atExec)
	if n := pp.unsupported.Load(); n != 0 {
		t.Fatalf("without libpython mapped: %d unsupported CPython processes, want 0 (not CPython yet)", n)
	}
	pp.prepare(full)
	if n := pp.unsupported.Load(); n != 1 {
		t.Fatalf("once libpython is mapped: %d unsupported CPython processes, want 1", n)
	}
	pp.prepare(full)
	if n := pp.unsupported.Load(); n != 1 {
		t.Errorf("examined twice: %d unsupported CPython processes, want 1", n)
	}
}
