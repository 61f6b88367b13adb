package collector

import (
	"os/exec"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

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
	// Only the binary is profiled, at a low rate: the reader keeps reading
	// (and the preparer preparing) while the resolver is held, until
	// pendingRecords records wait, however busy the host is.
	cfg := faultConfig(49)
	cfg.Filters.IncludeExecutables = []string{filepath.Base(bin)}
	rc := &recorder{}
	fr := startFaultReceiver(t, cfg, rc.consumer(t), func(r *profilesReceiver) {
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
	// Every frame of the binary carries a mapping named by the binary's
	// real path, with the address range it lies in: never a /proc path of
	// a process that is gone, never an empty range.
	rc.mu.Lock()
	got := rc.got
	rc.mu.Unlock()
	checked := 0
	for _, pd := range got {
		for _, m := range binaryMappings(pd, pids, "sonde_burst_leaf") {
			checked++
			if m.file != bin || m.start >= m.limit || m.addr < m.start || m.addr >= m.limit {
				t.Errorf("frame at %#x has mapping %q [%#x, %#x), want %s around it", m.addr, m.file, m.start, m.limit, bin)
			}
		}
	}
	if checked == 0 {
		t.Error("no frame of the binary found to check its mapping")
	}
	st := fr.r.prof.Stats().Symbols
	t.Logf("symbolizer: %d files loaded, %d open now, %d errors", st.FilesLoaded, st.OpenFiles, st.Errors)
}

// frameMapping is the mapping of one location, as a consumer reads it.
type frameMapping struct {
	addr, start, limit uint64
	file               string
}

// binaryMappings returns the mappings of the locations named fn in the
// samples of pids.
func binaryMappings(pd pprofile.Profiles, pids []int, fn string) []frameMapping {
	dict := pd.Dictionary()
	strs := dict.StringTable()
	var out []frameMapping
	for _, rp := range pd.ResourceProfiles().All() {
		v, ok := rp.Resource().Attributes().Get("process.pid")
		if !ok || !slices.Contains(pids, int(v.Int())) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, p := range sp.Profiles().All() {
				for _, s := range p.Samples().All() {
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						named := false
						for _, ln := range loc.Lines().All() {
							named = named || strs.At(int(dict.FunctionTable().At(int(ln.FunctionIndex())).NameStrindex())) == fn
						}
						if !named {
							continue
						}
						fm := frameMapping{addr: loc.Address()}
						if mi := loc.MappingIndex(); mi > 0 {
							m := dict.MappingTable().At(int(mi))
							fm.start, fm.limit, fm.file = m.MemoryStart(), m.MemoryLimit(), strs.At(int(m.FilenameStrindex()))
						}
						out = append(out, fm)
					}
				}
			}
		}
	}
	return out
}
