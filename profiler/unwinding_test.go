package profiler

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// recordingKernel keeps what the preparer set, as the tracer's maps
// would: each pid's mappings, the prepared pids and the filter decisions.
type recordingKernel struct {
	mappings map[uint32]map[tracer.Mapping]bool
	known    map[uint32]bool
	filters  map[uint32]uint64
}

func (k *recordingKernel) Filter(pid uint32, until uint64) error {
	k.filters[pid] = until
	return nil
}

func (k *recordingKernel) Unfilter(pid uint32) error {
	delete(k.filters, pid)
	return nil
}

func (k *recordingKernel) LoadTable(_ uint32, rows []tracer.Row, copied func(int)) error {
	if copied != nil {
		copied(len(rows))
	}
	return nil
}
func (k *recordingKernel) UnloadTable(uint32) error { return nil }

func (k *recordingKernel) SetMappings(pid uint32, old, mappings []tracer.Mapping) error {
	for _, m := range old {
		delete(k.mappings[pid], m)
	}
	for _, m := range mappings {
		if k.mappings[pid] == nil {
			k.mappings[pid] = map[tracer.Mapping]bool{}
		}
		k.mappings[pid][m] = true
	}
	k.known[pid] = true
	return nil
}

func (k *recordingKernel) ForgetProcess(pid uint32, old []tracer.Mapping) error {
	_ = k.SetMappings(pid, old, nil)
	delete(k.known, pid)
	return nil
}

// A process that exits before or while the preparer handles it costs one
// count of gone: no error, at most one debug line, nothing set for it in
// the kernel (mappings, filter decision) and nothing held in the Loader.
// It is the cached Process of the table (read while it ran), a pid the
// table never read, or a process prepared while it ran and gone when it is
// prepared again; with filters that decide nothing and without.
func TestPreparerProcessGone(t *testing.T) {
	if _, err := os.Stat("/proc/self/map_files"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	t.Run("no filters", func(t *testing.T) { testPreparerProcessGone(t, bin, Filters{}) })
	t.Run("filters", func(t *testing.T) {
		testPreparerProcessGone(t, bin, Filters{ExcludeExecutables: []string{"/nonexistent/*"}})
	})
}

func testPreparerProcessGone(t *testing.T, bin string, filters Filters) {
	core, logs := observer.New(zap.DebugLevel)
	log := zap.New(core)
	procs := process.NewTable("/proc", log, process.Options{})
	k := &recordingKernel{mappings: map[uint32]map[tracer.Mapping]bool{}, known: map[uint32]bool{}, filters: map[uint32]uint64{}}
	filter := newProcFilter(&Options{Filters: filters})
	p := newPreparer(log, k, procs, symbolize.New(log, symbolize.Options{}), filter, 0, []string{})

	start := func() *exec.Cmd {
		t.Helper()
		cmd := testutil.StartWorkload(t, bin)
		// Read it once libc is mapped: main's loop runs.
		waitMapped(t, procs, cmd.Process.Pid, "libc.so")
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		t.Helper()
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		// As the eBPF side does at the exit: a decision set before it goes.
		delete(k.filters, uint32(cmd.Process.Pid))
	}
	// One process stays, sharing the tables.
	keep := start()
	p.handle(prepareWork{keep.Process.Pid, prepareUnknown})
	p.loader.Wait() // its new files' tables are loaded in the background
	if !p.loader.Prepared(keep.Process.Pid) {
		t.Fatalf("running process %d not prepared", keep.Process.Pid)
	}
	if until, ok := k.filters[uint32(keep.Process.Pid)]; ok != filter.active || until != 0 {
		t.Fatalf("running process %d: filter decision %d set %v, want 0 set %v", keep.Process.Pid, until, ok, filter.active)
	}
	base := p.loader.Stats()
	logs.TakeAll()

	check := func(what string, pid int, wantGone uint64) {
		t.Helper()
		if got := p.gone.Load(); got != wantGone {
			t.Errorf("%s: gone = %d, want %d", what, got, wantGone)
		}
		if n, known := len(k.mappings[uint32(pid)]), k.known[uint32(pid)]; n != 0 || known {
			t.Errorf("%s: the kernel holds %d mappings for pid %d, known %v; want none", what, n, pid, known)
		}
		if until, ok := k.filters[uint32(pid)]; ok {
			t.Errorf("%s: the kernel holds the filter decision %d for pid %d", what, until, pid)
		}
		if p.loader.Prepared(pid) {
			t.Errorf("%s: the Loader still holds pid %d", what, pid)
		}
		if s := p.loader.Stats(); s.Processes != base.Processes || s.Tables != base.Tables || s.Failures != base.Failures {
			t.Errorf("%s: Loader stats %+v, want %+v", what, s, base)
		}
		entries := logs.TakeAll()
		if len(entries) > 1 {
			t.Errorf("%s: %d log lines, want at most one", what, len(entries))
			for _, e := range entries {
				t.Logf("  %v %s %v", e.Level, e.Message, e.ContextMap())
			}
		}
		for _, e := range entries {
			if e.Level > zap.DebugLevel {
				t.Errorf("%s: logged %v %q", what, e.Level, e.Message)
			}
		}
	}

	// Read into the table while it ran; gone when its request is handled.
	cmd := start()
	kill(cmd)
	p.handle(prepareWork{cmd.Process.Pid, prepareUnknown})
	check("cached, then gone", cmd.Process.Pid, 1)

	// Never read: the table finds it gone.
	cmd = exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(procs.Procfs() + "/" + strconv.Itoa(cmd.Process.Pid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("reaped pid %d: %v", cmd.Process.Pid, err)
	}
	p.handle(prepareWork{cmd.Process.Pid, prepareUnknown})
	check("never read", cmd.Process.Pid, 2)

	// Prepared while it ran, gone when sampled outside its mappings.
	cmd = start()
	p.handle(prepareWork{cmd.Process.Pid, prepareUnknown})
	if len(k.mappings[uint32(cmd.Process.Pid)]) == 0 {
		t.Fatalf("running process %d: no mappings set", cmd.Process.Pid)
	}
	kill(cmd)
	p.handle(prepareWork{cmd.Process.Pid, prepareUnknown})
	check("prepared, then gone", cmd.Process.Pid, 3)

	if n := len(k.mappings[uint32(keep.Process.Pid)]); n == 0 || !k.known[uint32(keep.Process.Pid)] {
		t.Errorf("the running process lost its mappings (%d left)", n)
	}
}

// TableLoaded is told, for each file whose table a preparation newly
// loads, how long after the process's first miss the load came: the
// time between the miss and the end of the preparation, or 0 when no
// sample missed before. Files already loaded for another process are not
// new, and say nothing.
func TestPreparerTableDelay(t *testing.T) {
	if _, err := os.Stat("/proc/self/map_files"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	log := zap.NewNop()
	procs := process.NewTable("/proc", log, process.Options{})
	k := &recordingKernel{mappings: map[uint32]map[tracer.Mapping]bool{}, known: map[uint32]bool{}, filters: map[uint32]uint64{}}
	p := newPreparer(log, k, procs, symbolize.New(log, symbolize.Options{}), newProcFilter(&Options{}), 0, []string{})
	var delays []time.Duration
	p.tableLoaded = func(d time.Duration) { delays = append(delays, d) }
	// prepare handles an unknown-sample request for cmd, after a miss at
	// missed if set, and returns the delays reported and the tables built,
	// with the times just before and after the handling.
	prepare := func(cmd *exec.Cmd, missed time.Time) (got []time.Duration, built uint64, before, after time.Time) {
		t.Helper()
		pid := cmd.Process.Pid
		waitMapped(t, procs, pid, "libc.so")
		if !missed.IsZero() {
			p.misses.note(pid, missed)
		}
		delays = delays[:0]
		b := p.loader.Stats().Built
		before = time.Now()
		p.handle(prepareWork{pid, prepareUnknown})
		p.loader.Wait() // new files' tables are loaded in the background
		after = time.Now()
		if !p.loader.Prepared(pid) {
			t.Fatalf("running process %d not prepared", pid)
		}
		return append([]time.Duration(nil), delays...), p.loader.Stats().Built - b, before, after
	}

	nofp := testutil.BuildWorkload(t, testutil.CChainNoFP)
	missed := time.Now().Add(-2 * time.Second)
	got, built, before, after := prepare(testutil.StartWorkload(t, nofp), missed)
	if built == 0 || uint64(len(got)) != built {
		t.Fatalf("after a miss: %d delays reported for %d tables built, want one each (and some built)", len(got), built)
	}
	for _, d := range got {
		if lo, hi := before.Sub(missed), after.Sub(missed); d < lo || d > hi {
			t.Errorf("after a miss: delay %v, want between %v and %v", d, lo, hi)
		}
	}

	// A second process of the same program finds its files' tables loaded.
	if got, built, _, _ := prepare(testutil.StartWorkload(t, nofp), time.Now()); len(got) != 0 || built != 0 {
		t.Errorf("same files again: %d delays reported, %d tables built; want none", len(got), built)
	}

	// Another program, prepared before any miss: its new tables came in time.
	other := testutil.BuildWorkload(t, testutil.Throw)
	got, built, _, _ = prepare(testutil.StartWorkload(t, other), time.Time{})
	if built == 0 || uint64(len(got)) != built {
		t.Fatalf("without a miss: %d delays reported for %d tables built, want one each (and some built)", len(got), built)
	}
	for _, d := range got {
		if d != 0 {
			t.Errorf("without a miss: delay %v, want 0", d)
		}
	}
}

// waitMapped waits until pid maps a file whose path contains name.
func waitMapped(t *testing.T, procs *process.Table, pid int, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		proc, err := procs.Refresh(pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range proc.Mappings {
			if strings.Contains(m.Path, name) {
				return
			}
		}
		runtime.Gosched()
	}
	t.Fatalf("pid %d never mapped %s", pid, name)
}

// The first miss of a process is its earliest, whatever the order the
// reader sees them in; taking it forgets it; the log is bounded.
func TestMissLog(t *testing.T) {
	var m missLog
	t0 := time.Unix(1000, 0)
	m.note(1, t0.Add(2*time.Second))
	m.note(1, t0)
	m.note(1, t0.Add(time.Second))
	if got, ok := m.take(1); !ok || !got.Equal(t0) {
		t.Errorf("take(1) = %v, %v; want %v, true", got, ok, t0)
	}
	if _, ok := m.take(1); ok {
		t.Error("a taken miss is still there")
	}
	for pid := range maxMisses + 10 {
		m.note(pid+2, t0)
	}
	if n := len(m.first); n != maxMisses {
		t.Errorf("%d misses kept, want the bound %d", n, maxMisses)
	}
	if d := tableDelay(t0, true, t0.Add(-time.Second)); d != 0 {
		t.Errorf("a load before the miss: delay %v, want 0", d)
	}
}
