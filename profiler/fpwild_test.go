//go:build linux

package profiler

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// A frame-pointer walk that reaches data ends there: the word it read as a
// return address (text, or an address nothing maps) is not shown as a
// caller, and the stack is marked cut short. Words at or above 1<<56 are
// stopped by the eBPF side (they would carry PC flag bits); the others by
// the resolver, which finds no executable mapping for them.
func TestFramePointerIntoData(t *testing.T) {
	lib := testutil.BuildC(t, "libfpwild.so", []string{"-O2", "-fPIC", "-shared", "-nostartfiles",
		"-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"},
		"testdata/fpwild_spin.c")
	bin := testutil.BuildC(t, "fpwild", []string{"-O2", "-Wl,-rpath," + filepath.Dir(lib)},
		"testdata/fpwild.c", lib)
	p, s := startProfiler(t, 99)
	for _, tc := range []struct {
		name     string
		word     uint64
		resolver bool // cut by the resolver, not the eBPF side
	}{
		{"text with high bits", 0x22696c2f6e69622f, false}, // "/bin/li\""
		{"text", 0x00696c2f6e69622f, true},                 // "/bin/li"
		{"unmapped address", 0x30a54a7e, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := p.Stats().Resolver.FPOutsideCode
			seen := len(s.all())
			pid := testutil.StartWorkload(t, bin, fmt.Sprintf("%#x", tc.word)).Process.Pid
			var n int
			deadline := time.Now().Add(60 * time.Second)
			for n < 50 && time.Now().Before(deadline) {
				s.waitFor(seen+1, 2*time.Second)
				all := s.all()
				for _, pd := range all[seen:] {
					for _, st := range stacksOf(pd, pid) {
						st = userFrames(st)
						if len(st) == 0 || st[0].name != "spin" {
							continue // still starting
						}
						n++
						if len(st) != 2 || st[0].name != "spin" || st[1].name != TruncatedFrame {
							t.Errorf("stack %+v; want spin then %s", st, TruncatedFrame)
						}
						for _, f := range st {
							if f.addr == tc.word || f.typ == "cpython" {
								t.Errorf("stack %+v shows the data word %#x as a frame", st, tc.word)
							}
						}
					}
				}
				seen = len(all)
			}
			if n < 50 {
				t.Fatalf("%d samples of pid %d in 60 s; want 50", n, pid)
			}
			cut := p.Stats().Resolver.FPOutsideCode - before
			if tc.resolver && cut == 0 {
				t.Errorf("Stats.Resolver.FPOutsideCode did not move over %d stacks", n)
			}
			t.Logf("%d stacks, %d cut by the resolver", n, cut)
		})
	}
}

// userFrames returns st without its kernel frames.
func userFrames(st []testFrame) []testFrame {
	for i, f := range st {
		if f.typ != "kernel" {
			return st[i:]
		}
	}
	return nil
}
