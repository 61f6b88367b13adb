//go:build linux

package profiler

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/jvm"
	"github.com/sonde-dev/sonde/internal/perl"
	"github.com/sonde-dev/sonde/internal/php"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/ruby"
	"github.com/sonde-dev/sonde/internal/v8"
)

// memFiles lists the /proc/PID/mem files this process has open, one entry
// per file descriptor.
func memFiles(t *testing.T) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var open []string
	for _, fd := range fds {
		target, _ := os.Readlink("/proc/self/fd/" + fd.Name())
		if strings.HasPrefix(target, "/proc/") && strings.HasSuffix(target, "/mem") {
			open = append(open, target)
		}
	}
	return open
}

// memFilesOpen counts this process's file descriptors open on pid's
// /proc/PID/mem.
func memFilesOpen(t *testing.T, pid int) int {
	t.Helper()
	want := fmt.Sprintf("/proc/%d/mem", pid)
	n := 0
	for _, f := range memFiles(t) {
		if f == want {
			n++
		}
	}
	return n
}

// Every runtime's namer keeps the memory file of each process it names
// open until the process is forgotten; Close lets go of them all.
func TestNamersCloseMemoryFiles(t *testing.T) {
	pid := os.Getpid()
	pyN, jvmN, perlN := python.NewNamer("/proc", 0), jvm.NewNamer("/proc", 0), perl.NewNamer("/proc", 0)
	v8N, phpN, rubyN := v8.NewNamer("/proc", 0), php.NewNamer("/proc", 0), ruby.NewNamer("/proc", 0)
	namers := []struct {
		name  string
		add   func() error
		close func()
	}{
		{"python", func() error { return pyN.Add(pid, &python.Interp{}) }, pyN.Close},
		{"jvm", func() error { return jvmN.Add(pid, &jvm.VM{}) }, jvmN.Close},
		{"perl", func() error { return perlN.Add(pid, &perl.Interp{}) }, perlN.Close},
		{"v8", func() error { return v8N.Add(pid, &v8.VM{}) }, v8N.Close},
		{"php", func() error { return phpN.Add(pid, &php.Interp{}) }, phpN.Close},
		{"ruby", func() error { return rubyN.Add(pid, &ruby.Interp{}) }, rubyN.Close},
	}
	before := memFilesOpen(t, pid)
	for _, n := range namers {
		if err := n.add(); err != nil {
			t.Fatalf("%s: Add: %v", n.name, err)
		}
		if got := memFilesOpen(t, pid); got != before+1 {
			t.Fatalf("%s: %d memory files open after Add, want %d", n.name, got, before+1)
		}
		n.close()
		if got := memFilesOpen(t, pid); got != before {
			t.Errorf("%s: %d memory files open after Close, want %d", n.name, got, before)
		}
		n.close() // again: nothing left to close
	}
}

// A profiler that stops lets go of the memory files it named a real
// CPython process's frames through, though the process still runs (a
// receiver shut down, or restarted with a new configuration, in a
// Collector that goes on).
func TestCloseLetsGoOfInterpreterMemory(t *testing.T) {
	bin := pyenvPython(t, "3.11.7")
	pid := startPyWorkload(t, bin, "burn")
	p, _, stop := runProfiler(t, 99)
	deadline := time.Now().Add(30 * time.Second)
	for memFilesOpen(t, pid) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the python process was not set up in 30 s (Stats.Python %+v)", p.Stats().Python)
		}
		time.Sleep(20 * time.Millisecond) // polling the profiler's state, bounded by the deadline
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := memFilesOpen(t, pid); n != 0 {
		t.Errorf("%d memory files of the python process open after Close (all open: %v)", n, memFiles(t))
	}
}
