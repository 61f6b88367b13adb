//go:build linux

package profiler

import (
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// Frames in the vDSO are named: by its exported functions where one covers
// the PC (readelf on the same image is the oracle), "[vdso]" in its static
// helpers, and the stack goes on below them down to main.
func TestVDSOFramesNamed(t *testing.T) {
	_, funcs := testutil.VDSO(t)
	exported := map[string]bool{symbolize.VDSOPath: true}
	for _, f := range funcs {
		exported[f.Name] = true
	}
	bin := testutil.BuildC(t, testutil.VDSOLoop, []string{"-O2"}, testutil.WorkloadSource(t, testutil.VDSOLoop))
	_, s := startProfiler(t, 99)
	pid := testutil.StartWorkload(t, bin).Process.Pid

	var inVDSO, bySymbol, truncated int
	deadline := time.Now().Add(60 * time.Second)
	for seen := 0; inVDSO < 150 && time.Now().Before(deadline); {
		all := s.all()
		for _, pd := range all[seen:] {
			for _, st := range stacksOf(pd, pid) {
				var named string
				for i, f := range st {
					if f.mapping != symbolize.VDSOPath {
						continue
					}
					if !exported[f.name] {
						t.Errorf("a [vdso] frame named %q, not a function of the vdso (readelf: %v) nor [vdso]", f.name, funcs)
					}
					if named == "" {
						named = f.name
						// A stack cut short says so (the vDSO has no
						// unwind table in the kernel yet: frame pointers
						// there, which its code does not always keep);
						// every other goes on to main.
						switch {
						case hasFrame(st, TruncatedFrame, ""):
							truncated++
						case !hasFrame(st[i:], "main", ""):
							t.Errorf("stack %v: main is not below the vdso frame", st)
						}
					}
				}
				if named != "" {
					inVDSO++
					if named != symbolize.VDSOPath {
						bySymbol++
					}
				}
			}
		}
		seen = len(all)
		s.waitFor(seen+1, 2*time.Second)
	}
	if inVDSO < 150 || bySymbol == 0 {
		t.Fatalf("%d samples of pid %d in the vdso, %d of them named by a vdso symbol; want 150, and some", inVDSO, pid, bySymbol)
	}
	t.Logf("%d samples in the vdso, %d named by its symbols, %d truncated", inVDSO, bySymbol, truncated)
}
