//go:build linux

package profiler

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// A program whose library's constructor burns CPU is sampled inside ld.so:
// ctor_spin <- ctor <- call_init <- _dl_init <- _dl_start_user, the last
// an untyped label of ld.so's hand-written entry code. Every frame of the
// chain is named, ld.so's from its separate debug file (libc6-dbg), as
// perf names them.
func TestStackThroughLdSoNamed(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	if _, err := os.Stat("/usr/lib/debug/.build-id"); err != nil {
		t.Skipf("no debug files (libc6-dbg): %v", err)
	}
	lib := testutil.BuildC(t, "libldsoctor.so", []string{"-O1", "-g", "-shared", "-fPIC"}, filepath.Join("testdata", "ldso_ctor.c"))
	bin := testutil.BuildC(t, "ldso-ctor", []string{"-O1", "-Wl,-rpath," + filepath.Dir(lib)}, filepath.Join("testdata", "ldso_main.c"), lib)
	_, sink := startProfiler(t, 99, func(o *Options) {
		o.Filters.IncludeExecutables = []string{"ldso-ctor"}
	})
	var through, named int
	var last []testFrame
	deadline := time.Now().Add(60 * time.Second)
	for named < 20 && time.Now().Before(deadline) {
		cmd := testutil.StartWorkload(t, bin)
		_ = cmd.Wait()
		sink.waitFor(len(sink.all())+2, 5*time.Second)
		through, named = 0, 0
		for _, pd := range sink.all() {
			for pid := range pidsOf(pd) {
				for _, st := range stacksOf(pd, int(pid)) {
					i := -1
					for j, f := range st {
						if f.name == "_dl_init" {
							i = j
						}
					}
					if i < 0 || i+1 >= len(st) {
						continue
					}
					through++
					last = st
					if f := st[i+1]; f.name == "_dl_start_user" && filepath.Base(f.mapping) == "ld-linux-x86-64.so.2" {
						named++
					}
				}
			}
		}
	}
	t.Logf("%d samples through _dl_init with a caller, %d of them with ld.so's _dl_start_user named; one: %+v", through, named, last)
	if through == 0 {
		t.Fatal("no sample through _dl_init with a caller: nothing was exercised")
	}
	if named != through {
		t.Errorf("%d of %d samples through _dl_init have their caller named _dl_start_user in ld.so", named, through)
	}
}
