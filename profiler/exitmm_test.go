//go:build linux

package profiler

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// A task that has let go of its address space has no user stack: an
// exiting process's samples taken while the kernel unmaps its memory
// (exit_mmap, after exit_mm cleared the task's mm) show the kernel's work
// alone. Its saved user registers still point into code and a stack being
// unmapped, and unwinding them gave stacks cut short or walked by frame
// pointers past their callers.
func TestExitingTaskHasNoUserStack(t *testing.T) {
	bin := testutil.BuildC(t, "exitmm", []string{"-O2", "-g"}, "testdata/exitmm.c")
	p, s := startProfiler(t, 1000, func(o *Options) {
		o.Filters.IncludeExecutables = []string{bin}
	})
	// A second one, small, keeps intervals coming once the first is gone.
	testutil.StartWorkload(t, bin, "1")
	// Enough memory that unmapping it takes about a tenth of a second
	// here: a hundred samples at 1 kHz.
	cmd := exec.Command(bin, "1024")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartCmd(t, cmd)
	pid := cmd.Process.Pid
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("exitmm: %q, %v", line, err)
	}
	spinning := func(st []testFrame) bool { u := userFrames(st); return len(u) > 0 && u[0].name == "b" }
	waitFor(t, "a sample of the workload in b", 60*time.Second, func() bool {
		for _, pd := range s.all() {
			for _, st := range stacksOf(pd, pid) {
				if spinning(st) {
					return true
				}
			}
		}
		return false
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	before := len(s.all())
	waitFor(t, "the exit's samples emitted", 60*time.Second, func() bool {
		return p.Stats().Queued == 0 && len(s.all()) >= before+2
	})
	all := s.all()
	checkAll(t, all)
	var exiting, withUser, spun int
	for _, pd := range all {
		for _, st := range stacksOf(pd, pid) {
			if spinning(st) {
				spun++
			}
			if !hasFrame(st, "exit_mmap", "kernel") {
				continue
			}
			exiting++
			if u := userFrames(st); len(u) > 0 {
				withUser++
				if withUser <= 5 {
					t.Errorf("a sample in exit_mmap has user frames: %s", describeFrames(st))
				}
			}
		}
	}
	t.Logf("pid %d: %d samples in b, %d in exit_mmap, %d of them with user frames", pid, spun, exiting, withUser)
	if exiting < 10 {
		t.Fatalf("%d samples of pid %d in exit_mmap, want at least 10: the exit was not exercised", exiting, pid)
	}
}

// describeFrames is st's frames' names, leaf first, with their types.
func describeFrames(st []testFrame) string {
	var b strings.Builder
	for i, f := range st {
		if i > 0 {
			b.WriteString(" <- ")
		}
		b.WriteString(f.name + " (" + f.typ + ")")
	}
	return b.String()
}
