package profiler

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

func TestFilterMatches(t *testing.T) {
	nginx := &process.Process{Name: "nginx", ExePath: "/usr/sbin/nginx", CgroupPath: "/system.slice/nginx.service"}
	app := &process.Process{Name: "app", ExePath: "/opt/app/bin/app", ContainerID: "0123abcd",
		CgroupPath: "/kubepods.slice/kubepods-pod1.slice/cri-containerd-0123abcd.scope"}
	kworker := &process.Process{Name: "kworker/0:1", KernelThread: true}
	for _, tc := range []struct {
		name string
		cfg  Filters
		want map[*process.Process]bool
	}{
		{"no rules", Filters{}, map[*process.Process]bool{nginx: true, app: true, kworker: false}},
		{"include by name", Filters{IncludeExecutables: []string{"ngin*"}}, map[*process.Process]bool{nginx: true, app: false}},
		{"include by path", Filters{IncludeExecutables: []string{"/opt/app/bin/*"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"a name glob does not match a path", Filters{IncludeExecutables: []string{"/usr/sbin"}}, map[*process.Process]bool{nginx: false}},
		{"exclude wins", Filters{IncludeExecutables: []string{"*"}, ExcludeExecutables: []string{"nginx"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"containers only", Filters{Containers: ContainersOnly}, map[*process.Process]bool{nginx: false, app: true}},
		{"host only", Filters{Containers: ContainersNone}, map[*process.Process]bool{nginx: true, app: false}},
		{"cgroup prefix", Filters{IncludeCgroups: []string{"/kubepods.slice/"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"cgroup prefix is by path element", Filters{IncludeCgroups: []string{"/kubepods"}}, map[*process.Process]bool{app: false}},
		{"exclude cgroup", Filters{ExcludeCgroups: []string{"/system.slice"}}, map[*process.Process]bool{nginx: false, app: true}},
		{"kernel threads kept", Filters{IncludeKernelThreads: true}, map[*process.Process]bool{kworker: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newProcFilter(&Options{Filters: tc.cfg})
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
	f := newProcFilter(&Options{FilterMinProcessAge: time.Hour})
	self, err := process.NewTable("/proc", nil, process.Options{}).Get(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	d := f.decide(self)
	age := processAge(self)
	if !d.excluded || d.comesOfAge == 0 || d.kernelUntil() != uint64(d.comesOfAge) {
		t.Fatalf("decision for a %v-old process with a 1h minimum = %+v, want excluded until it is 1h old", age, d)
	}
	if wait := d.comesOfAge.sub(monotonic()); wait > time.Hour-age+time.Second || wait < time.Hour-age-time.Minute {
		t.Errorf("excluded for %v more, want about %v", wait, time.Hour-age)
	}
	// Until it comes of age, the process keeps the decision taken on
	// first sight: the same deadline, not one taken again.
	if again := f.decide(self); again != d {
		t.Errorf("second decision for the same process = %+v, want the first, %+v", again, d)
	}
	if d := newProcFilter(&Options{FilterMinProcessAge: time.Nanosecond}).decide(self); d.excluded {
		t.Errorf("decision for a process older than the minimum = %+v, want included", d)
	}
}

// A decision holds for one process image: an exec (same pid and start
// time, a new executable) is decided again only once the decision is
// forgotten, as the preparer does on exec; a reused pid (a new start time)
// is decided again at once.
func TestFilterForget(t *testing.T) {
	f := newProcFilter(&Options{Filters: Filters{ExcludeExecutables: []string{"victim"}}})
	victim := &process.Process{PID: 4242, StartTime: 1000, Name: "victim", ExePath: "/bin/victim"}
	if d := f.decide(victim); !d.excluded || d.kernelUntil() != tracer.ExcludeForever {
		t.Fatalf("decision for an excluded executable = %+v, want excluded for good", d)
	}
	exec := &process.Process{PID: 4242, StartTime: 1000, Name: "other", ExePath: "/bin/other"}
	if d := f.decide(exec); !d.excluded {
		t.Errorf("decision for the same image before forget = %+v, want the cached exclusion", d)
	}
	f.forget(exec.PID)
	if d := f.decide(exec); d.excluded {
		t.Errorf("decision after forget for an executable no rule excludes = %+v, want included", d)
	}
	reused := &process.Process{PID: 4242, StartTime: 2000, Name: "victim", ExePath: "/bin/victim"}
	if d := f.decide(reused); !d.excluded {
		t.Errorf("decision for a reused pid running the excluded executable = %+v, want excluded", d)
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
	testutil.RequirePrivileges(t, "the sonde profiler")
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	dir := t.TempDir()
	included, excluded := filepath.Join(dir, "burn-included"), filepath.Join(dir, "burn-excluded")
	copyFile(t, bin, included)
	copyFile(t, bin, excluded)

	p, sink := startProfiler(t, 499, func(o *Options) {
		o.Filters.ExcludeExecutables = []string{"burn-excl*"}
		o.countCosts = true
	})

	in := testutil.StartWorkload(t, included).Process.Pid
	out := testutil.StartWorkload(t, excluded).Process.Pid
	deadline := time.Now().Add(30 * time.Second)
	var counts map[int64]int
	for time.Now().Before(deadline) {
		counts = samplesByPID(sink.all())
		if counts[int64(in)] >= 500 {
			break
		}
		sink.waitFor(len(sink.all())+1, time.Until(deadline))
	}
	if counts[int64(in)] < 500 {
		st := p.Stats()
		t.Fatalf("included process: %d samples, want at least 500 (lag %v, %d records queued, %d samples resolved)",
			counts[int64(in)], st.Lag, st.Queued, st.Samples)
	}
	if counts[int64(out)] != 0 {
		t.Errorf("excluded process: %d samples, want none", counts[int64(out)])
	}
	inCost, _, err := p.tracer.Cost(uint32(in))
	if err != nil {
		t.Fatal(err)
	}
	outCost, ok, err := p.tracer.Cost(uint32(out))
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
