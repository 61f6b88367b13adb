package ruby

import (
	"errors"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestNamer names the frames of live stacks as the walker reports them
// (iseq, pc) and compares with what Stack read.
func TestNamer(t *testing.T) {
	eachRuby(t, testNamer)
}

func testNamer(t *testing.T, rb testutil.Ruby) {
	cmd := startRuby(t, rb, "class")
	pid := cmd.Process.Pid
	in, mem := findInterp(t, pid)
	n := NewNamer("/proc", 0)
	defer n.Forget(pid)
	if err := n.Add(pid, in); err != nil {
		t.Fatal(err)
	}
	var frames []StackFrame
	deadline := time.Now().Add(10 * time.Second)
	for len(frames) < 6 && time.Now().Before(deadline) {
		frames, _ = snapshot(pid, in, mem)
	}
	if len(frames) < 6 {
		t.Fatalf("stack of %d frames: %+v", len(frames), frames)
	}
	for i, f := range frames {
		for range 2 { // read, then cached
			got, err := n.Name(pid, KindIseq, f.Iseq, f.Word)
			if err != nil || got.Name != f.Name || got.File != f.File || got.Line != f.Line {
				t.Fatalf("frame %d: %+v, %v; want %s %s:%d", i, got, err, f.Name, f.File, f.Line)
			}
		}
	}
	f := frames[len(frames)-1]
	past := f.Word&^(uint64(PosUnknown)<<48) | uint64(PosUnknown-1)<<48
	if _, err := n.Name(pid, KindIseq, f.Iseq, past); !errors.Is(err, ErrStale) {
		t.Errorf("a position outside the iseq: %v, want ErrStale", err)
	}
	if _, err := n.Name(pid, KindIseq, f.Iseq, f.Word^1<<32); !errors.Is(err, ErrStale) {
		t.Errorf("another body's check: %v, want ErrStale", err)
	}
	if _, err := n.Name(pid+1<<22, KindIseq, f.Iseq, f.Word); err == nil {
		t.Error("a process not added was named")
	}
	s := n.Stats()
	if s.Named != uint64(2*len(frames)) || s.Stale != 2 || s.Unreadable != 1 || s.Entries == 0 || s.Bytes == 0 {
		t.Errorf("stats %+v after %d frames named twice", s, len(frames))
	}
	// The same process prepared again keeps what is cached of it; an
	// unknown one is to be added.
	if !n.Update(pid, in) || n.Stats().Entries != s.Entries {
		t.Errorf("update of a known process: %d entries cached, want %d", n.Stats().Entries, s.Entries)
	}
	if n.Update(pid+1<<22, in) {
		t.Error("a process not added was updated")
	}
	// Samples resolved after the process exited are named from what was
	// read while it lived (their lines are not known any more).
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	for i, f := range frames {
		got, err := n.Name(pid, KindIseq, f.Iseq, f.Word)
		if err != nil || got.Name != f.Name || got.File != f.File {
			t.Fatalf("frame %d after exit: %+v, %v; want %s %s", i, got, err, f.Name, f.File)
		}
	}
}
