//go:build linux

package profiler

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// ccSource is a C file that keeps cc1 busy for a few tenths of a second at
// -O2: many small functions the optimizer inlines and unrolls.
func ccSource(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "static int f%d(int *a, int n) { int s = 0; for (int i = 0; i < n; i++) s += a[i] * %d + (s >> 3); return s; }\n", i, i+1)
	}
	b.WriteString("int all(int *a, int n) { int s = 0;\n")
	for i := range 100 {
		fmt.Fprintf(&b, "s += f%d(a, n);\n", i)
	}
	b.WriteString("return s; }\n")
	path := filepath.Join(t.TempDir(), "storm.c")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// In a storm of short compiles, every frame of every cc1 has its mapping:
// none of libc's (the caller of main) comes unmapped because the process
// was read while the dynamic loader had not mapped it yet, or while it
// exited.
func TestCompileStormFramesMapped(t *testing.T) {
	gcc := testutil.RequireTool(t, "gcc")
	p, sink := startProfiler(t, 99, func(o *Options) {
		o.Filters.IncludeExecutables = []string{"cc1"}
	})
	src := ccSource(t)
	out := t.TempDir()
	const compiles, parallel = 40, 2
	start := time.Now()
	sem := make(chan struct{}, parallel)
	errs := make(chan error, compiles)
	for i := range compiles {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			cmd := exec.Command(gcc, "-O2", "-c", "-o", filepath.Join(out, fmt.Sprintf("%d.o", i)), src)
			if b, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("gcc: %w: %s", err, b)
				return
			}
			errs <- nil
		}()
	}
	for range compiles {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	// Every interval holding the storm's samples is emitted.
	n := len(sink.all())
	sink.waitFor(n+3, 30*time.Second)

	type perProc struct{ samples, unmapped, cutAboveMain, exiting, exitingUnmapped, execing, truncatedAboveMain int }
	procs := map[int64]*perProc{}
	for _, pd := range sink.all() {
		for _, rp := range pd.ResourceProfiles().All() {
			name, _ := rp.Resource().Attributes().Get("process.executable.name")
			if name.Str() != "cc1" {
				continue
			}
			pid, _ := rp.Resource().Attributes().Get("process.pid")
			pp := procs[pid.Int()]
			if pp == nil {
				pp = &perProc{}
				procs[pid.Int()] = pp
			}
			for _, st := range stacksOf(pd, int(pid.Int())) {
				pp.samples++
				// Taken while the kernel finished the exit, after the
				// exit record; or while the exec was loading the new
				// image, whose frames are the old image's.
				exiting, execing := hasFrame(st, "do_exit", "kernel"), inExecve(st)
				if exiting {
					pp.exiting++
				}
				bad := false
				for i, f := range st {
					if f.typ == "native" && f.mapping == "" {
						bad = true
						if i > 0 && st[i-1].name == "main" {
							pp.cutAboveMain++
						}
					}
				}
				for i, f := range st {
					// main, its caller in libc, then the cut: the
					// kernel side had no table for libc's mapping yet.
					if f.name == "main" && i+2 < len(st) && st[i+2].name == TruncatedFrame {
						pp.truncatedAboveMain++
					}
				}
				switch {
				case bad && execing:
					pp.execing++
					t.Logf("cc1 %d, during its exec (frames of the image it replaces): %+v", pid.Int(), st)
				case bad && exiting:
					pp.exitingUnmapped++
					t.Logf("cc1 %d, during its exit: %+v", pid.Int(), st)
				case bad:
					pp.unmapped++
					t.Logf("cc1 %d: %+v", pid.Int(), st)
				}
			}
		}
	}
	var total perProc
	for _, pp := range procs {
		total.samples += pp.samples
		total.unmapped += pp.unmapped
		total.cutAboveMain += pp.cutAboveMain
		total.exiting += pp.exiting
		total.exitingUnmapped += pp.exitingUnmapped
		total.execing += pp.execing
		total.truncatedAboveMain += pp.truncatedAboveMain
	}
	st := p.Stats()
	t.Logf("%d compiles in %v: %d cc1 processes sampled, %d samples: %d with an unmapped frame (%d right above main); "+
		"%d taken during the exit, %d of them with an unmapped frame; %d during the exec with the old image's frames; "+
		"%d cut right above main's caller (not asserted: the kernel side's mappings of a process prepared before ld.so mapped libc); resolver %+v",
		compiles, took.Round(time.Millisecond), len(procs), total.samples, total.unmapped, total.cutAboveMain,
		total.exiting, total.exitingUnmapped, total.execing, total.truncatedAboveMain, st.Resolver)
	if len(procs) < compiles/2 {
		t.Fatalf("only %d of %d cc1 processes sampled: the storm was not exercised", len(procs), compiles)
	}
	if total.unmapped > 0 || total.cutAboveMain > 0 {
		t.Errorf("%d of %d cc1 samples have a native frame without a mapping (%d right above main)", total.unmapped, total.samples, total.cutAboveMain)
	}
	if total.exitingUnmapped > 0 {
		t.Errorf("%d of the %d samples taken during the exit have a native frame without a mapping", total.exitingUnmapped, total.exiting)
	}
}

// inExecve reports whether st was taken in the execve system call, before
// the new image replaced the old.
func inExecve(st []testFrame) bool {
	for _, f := range st {
		if f.typ == "kernel" && strings.Contains(f.name, "execve") {
			return true
		}
	}
	return false
}
