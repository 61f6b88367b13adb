package php

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestNamerLive names the frames of a live burn.php the way the walker
// reports them, and refuses a check word that is not the function's.
func TestNamerLive(t *testing.T) {
	cmd := startPHP(t, testutil.PHP82(t), "closure")
	pid := cmd.Process.Pid
	in, mem := findInterp(t, pid)
	n := NewNamer("/proc", 0)
	if err := n.Add(pid, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Forget(pid) })
	// The stack is read while PHP runs: one taken inside the closure
	// (where burn.php spends its time), for the closure's case below.
	var frames []StackFrame
	var err error
	hasClosure := func() bool {
		return slices.ContainsFunc(frames, func(f StackFrame) bool { return strings.Contains(f.Name, "{closure}") })
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if frames, err = in.Stack(mem, VMRegs{}); err == nil && len(frames) >= 2 && hasClosure() {
			break
		}
	}
	if err != nil || len(frames) < 2 || !hasClosure() {
		t.Fatalf("stack %v: %v", frames, err)
	}
	for round := 0; round < 2; round++ { // read, then from the cache
		for _, sf := range frames {
			got, err := n.Name(pid, sf.Kind, sf.Addr, sf.Word)
			if err != nil {
				t.Fatalf("%s: %v", sf.Name, err)
			}
			if got.Name != sf.Name || got.File != sf.File || got.Line != sf.Line {
				t.Errorf("named %+v, want %+v", got, sf)
			}
			if _, err := n.Name(pid, sf.Kind, sf.Addr, sf.Word^1); !errors.Is(err, ErrStale) {
				t.Errorf("%s with another check word: %v, want ErrStale", sf.Name, err)
			}
		}
	}
	s := n.Stats()
	if s.Named != uint64(2*len(frames)) || s.Stale != uint64(2*len(frames)) || s.Entries == 0 || s.Bytes <= 0 {
		t.Errorf("stats %+v after %d frames twice", s, len(frames))
	}
	// A function whose memory no longer holds it (named at an address
	// beside it): a closure is named after the one read before with the
	// same opcodes (its Closure object freed, its code alive); another
	// function is not named.
	closures := 0
	for _, sf := range frames {
		if sf.Kind != KindFunction {
			continue
		}
		got, err := n.Name(pid, sf.Kind, sf.Addr+8, sf.Word)
		if strings.Contains(sf.Name, "{closure}") {
			closures++
			if err != nil || got.Name != sf.Name || got.File != sf.File || got.Line != sf.Line {
				t.Errorf("%s freed: named %+v, %v; want it named by its code", sf.Name, got, err)
			}
		} else if err == nil {
			t.Errorf("%s freed: named %+v", sf.Name, got)
		}
	}
	if closures == 0 || n.Stats().ByCode != uint64(closures) {
		t.Errorf("%d closures in %v; stats %+v", closures, frames, n.Stats())
	}
}

// TestNamerBound keeps the cache within its bound, evicting the least
// recently used functions.
func TestNamerBound(t *testing.T) {
	img := seedImage()
	n := NewNamer("/proc", 400)
	r := NewReader(sliceMem{base: 0x1000, b: img}, layouts[2])
	p := &namerProc{in: &Interp{Layout: layouts[2]}, r: r}
	fn, err := r.Function(0x1000, KindFunction)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		n.mu.Lock()
		_, err := n.funcLocked(p, entryKey{pid: i, addr: 0x1000, kind: KindFunction}, fn.Check)
		n.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	s := n.Stats()
	if s.Bytes > 400 || s.Evictions == 0 || s.Entries != int(s.Bytes/fn.memSize()) {
		t.Errorf("stats %+v, function of %d bytes, bound 400", s, fn.memSize())
	}
}
