package collector

import (
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// Three successive short runs of one binary, each exiting before the next
// starts, are all named, although every one of them is gone (and with it
// its /proc/PID/map_files and /proc/PID/root) by the time its samples are
// resolved: the resolver is held until the last run has exited. The file
// is read through the handle taken while the process lived, never through
// the path of the first process that mapped it.
func TestShortRunsOfOneBinaryAllNamed(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	bin := testutil.BuildC(t, "burst", []string{"-O1", "-fno-omit-frame-pointer"}, filepath.Join("testdata", "shortrun", "burst.c"))

	var held atomic.Bool
	release := make(chan struct{})
	held.Store(true)
	// A low rate: the reader keeps reading (and the preparer preparing)
	// while the resolver is held, until pendingRecords records wait.
	rc := &recorder{}
	fr := startFaultReceiver(t, faultConfig(29), rc.consumer(t), func(r *profilesReceiver) {
		r.beforeResolve = func() {
			if held.Load() {
				<-release
			}
		}
	})
	unhold := func() {
		if held.CompareAndSwap(true, false) {
			close(release)
		}
	}
	t.Cleanup(unhold) // before the receiver's Shutdown

	var pids []int
	for range 3 {
		cmd := exec.Command(bin)
		if err := cmd.Run(); err != nil {
			t.Fatalf("run %s: %v", bin, err)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	unhold()
	for i, pid := range pids {
		rc.waitForInterval(t, 0, pid, "sonde_burst_leaf", 30*time.Second)
		t.Logf("run %d (pid %d) named", i+1, pid)
	}
	st := fr.r.resolver.syms.Stats()
	t.Logf("symbolizer: %d files loaded, %d open now, %d errors", st.FilesLoaded, st.OpenFiles, st.Errors)
}
