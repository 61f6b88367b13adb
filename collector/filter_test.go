package collector

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
)

func TestFilterMatches(t *testing.T) {
	nginx := &process.Process{Name: "nginx", ExePath: "/usr/sbin/nginx", CgroupPath: "/system.slice/nginx.service"}
	app := &process.Process{Name: "app", ExePath: "/opt/app/bin/app", ContainerID: "0123abcd",
		CgroupPath: "/kubepods.slice/kubepods-pod1.slice/cri-containerd-0123abcd.scope"}
	kworker := &process.Process{Name: "kworker/0:1", KernelThread: true}
	for _, tc := range []struct {
		name string
		cfg  FiltersConfig
		want map[*process.Process]bool
	}{
		{"no rules", FiltersConfig{}, map[*process.Process]bool{nginx: true, app: true, kworker: false}},
		{"include by name", FiltersConfig{IncludeExecutables: []string{"ngin*"}}, map[*process.Process]bool{nginx: true, app: false}},
		{"include by path", FiltersConfig{IncludeExecutables: []string{"/opt/app/bin/*"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"a name glob does not match a path", FiltersConfig{IncludeExecutables: []string{"/usr/sbin"}}, map[*process.Process]bool{nginx: false}},
		{"exclude wins", FiltersConfig{IncludeExecutables: []string{"*"}, ExcludeExecutables: []string{"nginx"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"containers only", FiltersConfig{Containers: containersOnly}, map[*process.Process]bool{nginx: false, app: true}},
		{"host only", FiltersConfig{Containers: containersNone}, map[*process.Process]bool{nginx: true, app: false}},
		{"cgroup prefix", FiltersConfig{IncludeCgroups: []string{"/kubepods.slice/"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"cgroup prefix is by path element", FiltersConfig{IncludeCgroups: []string{"/kubepods"}}, map[*process.Process]bool{app: false}},
		{"exclude cgroup", FiltersConfig{ExcludeCgroups: []string{"/system.slice"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"kernel threads kept", FiltersConfig{IncludeKernelThreads: true}, map[*process.Process]bool{kworker: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newProcFilter(&Config{Filters: tc.cfg})
			for p, want := range tc.want {
				if got := f.matches(p); got != want {
					t.Errorf("%s: matches = %v, want %v", p.Name, got, want)
				}
			}
		})
	}
}

// A young process is excluded until it comes of age, then decided again.
func TestFilterMinProcessAge(t *testing.T) {
	f := newProcFilter(&Config{FilterMinProcessAge: time.Hour})
	self, err := process.NewTable("/proc", nil, process.Options{}).Get(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	d := f.decide(self)
	age := processAge(self)
	if !d.excluded || d.until == 0 || d.kernelUntil() != uint64(d.until) {
		t.Fatalf("decision for a %v-old process with a 1h minimum = %+v, want excluded until it is 1h old", age, d)
	}
	if wait := d.until - monotonic(); wait > time.Hour-age+time.Second || wait < time.Hour-age-time.Minute {
		t.Errorf("excluded for %v more, want about %v", wait, time.Hour-age)
	}
	if !f.excluded(self.PID) {
		t.Error("excluded() = false for the decided process")
	}
	f.forget(self.PID)
	if f.excluded(self.PID) {
		t.Error("excluded() = true after forget")
	}
	if d := newProcFilter(&Config{FilterMinProcessAge: time.Nanosecond}).decide(self); d.excluded {
		t.Errorf("decision for a process older than the minimum = %+v, want included", d)
	}
}

// samplesByPID counts the samples of each process in pds.
func samplesByPID(pds []pprofile.Profiles) map[int64]int {
	n := make(map[int64]int)
	for _, pd := range pds {
		for _, rp := range pd.ResourceProfiles().All() {
			pid, _ := rp.Resource().Attributes().Get("process.pid")
			for _, sp := range rp.ScopeProfiles().All() {
				for _, prof := range sp.Profiles().All() {
					for _, s := range prof.Samples().All() {
						n[pid.Int()] += s.TimestampsUnixNano().Len()
					}
				}
			}
		}
	}
	return n
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// An excluded executable produces no samples and costs the kernel no
// unwinding, from its first instruction; an included one is profiled.
func TestFiltersExcludeBeforeAnyWork(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	dir := t.TempDir()
	included, excluded := filepath.Join(dir, "burn-included"), filepath.Join(dir, "burn-excluded")
	copyFile(t, bin, included)
	copyFile(t, bin, excluded)

	cfg := createDefaultConfig()
	cfg.SamplesPerSecond = 499
	cfg.ReporterInterval = 500 * time.Millisecond
	cfg.Filters.ExcludeExecutables = []string{"burn-excl*"}
	sink := new(consumertest.ProfilesSink)
	set := receivertest.NewNopSettings(metadata.Type)
	set.Logger = zaptest.NewLogger(t)
	r, err := newProfilesReceiver(set, cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })

	in := testutil.StartWorkload(t, included).Process.Pid
	out := testutil.StartWorkload(t, excluded).Process.Pid
	deadline := time.Now().Add(30 * time.Second)
	var counts map[int64]int
	for time.Now().Before(deadline) {
		counts = samplesByPID(sink.AllProfiles())
		if counts[int64(in)] >= 500 {
			break
		}
		waitForProfiles(sink, len(sink.AllProfiles())+1, time.Until(deadline))
	}
	if counts[int64(in)] < 500 {
		t.Fatalf("included process: %d samples, want at least 500", counts[int64(in)])
	}
	if counts[int64(out)] != 0 {
		t.Errorf("excluded process: %d samples, want none", counts[int64(out)])
	}
	inCost, _, err := r.tracer.Cost(uint32(in))
	if err != nil {
		t.Fatal(err)
	}
	outCost, ok, err := r.tracer.Cost(uint32(out))
	if err != nil || !ok {
		t.Fatalf("excluded process's cost: ok=%v, %v", ok, err)
	}
	t.Logf("kernel cost: included %+v, excluded %+v", inCost, outCost)
	if outCost.Filtered == 0 || outCost.Samples != 0 || outCost.Frames != 0 {
		t.Errorf("excluded process cost %+v, want only filtered samples: no samples sent, no frames unwound", outCost)
	}
	if inCost.Samples == 0 || inCost.Frames < 4*inCost.Samples {
		t.Errorf("included process cost %+v, want samples of at least 4 frames (main, a, b, c)", inCost)
	}
}

// waitForProfiles waits until the sink holds n profiles or max passes.
func waitForProfiles(sink *consumertest.ProfilesSink, n int, max time.Duration) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	end := time.After(max)
	for len(sink.AllProfiles()) < n {
		select {
		case <-tick.C:
		case <-end:
			return
		}
	}
}
