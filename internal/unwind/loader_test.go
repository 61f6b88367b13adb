package unwind

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

func identifyFile(path string) (elfx.FileID, error) {
	f, err := os.Open(path)
	if err != nil {
		return elfx.FileID{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return elfx.FileID{}, err
	}
	return elfx.ComputeFileID(f, fi.Size())
}

// The loader shares a file's table between processes, keeps it while any
// process maps it, and evicts unreferenced tables, least recently used
// first, when the budget needs room.
func TestLoaderSharesAndEvicts(t *testing.T) {
	testutil.RequirePrivileges(t, "loading unwind tables")
	tr, err := tracer.New(tracer.Options{SamplesPerSecond: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	procs := process.NewTable("/proc", nil, process.Options{})
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	start := func() *process.Process {
		cmd := testutil.StartWorkload(t, bin)
		// Wait until the dynamic loader has mapped libc: the process is
		// then in main's loop.
		for {
			p, err := procs.Refresh(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range p.Mappings {
				if m.Executable() && len(m.Path) > 0 && contains(m.Path, "libc.so") {
					return p
				}
			}
		}
	}

	// A budget that holds libc's table and the workload's, not two libcs.
	budget := int64(600 << 10)
	l := NewLoader(tr, identifyFile, zaptest.NewLogger(t), LoaderOptions{BudgetBytes: budget})
	a, b := start(), start()
	if err := l.Prepare(a); err != nil {
		t.Fatal(err)
	}
	first := l.Stats()
	if err := l.Prepare(b); err != nil {
		t.Fatal(err)
	}
	second := l.Stats()
	if first.Tables < 2 || second.Tables != first.Tables || second.Built != first.Built {
		t.Fatalf("after one process: %+v; after a second of the same binary: %+v; want the same tables, shared", first, second)
	}
	if second.Bytes > budget {
		t.Errorf("tables take %d bytes, budget %d", second.Bytes, budget)
	}

	// Forgetting both leaves the tables loaded (a new process may map the
	// same files) but evictable.
	if err := l.Forget(a.PID); err != nil {
		t.Fatal(err)
	}
	if err := l.Forget(b.PID); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Tables != second.Tables || s.Processes != 0 {
		t.Errorf("after forgetting both: %+v", s)
	}
	// With a budget that fits exactly one process's tables, a process of
	// another binary makes room by evicting the unreferenced ones.
	exact := NewLoader(tr, identifyFile, zaptest.NewLogger(t), LoaderOptions{BudgetBytes: second.Bytes})
	if err := exact.Prepare(a); err != nil {
		t.Fatal(err)
	}
	if err := exact.Forget(a.PID); err != nil {
		t.Fatal(err)
	}
	static := testutil.BuildC(t, "static", []string{"-O2", "-static", "-fomit-frame-pointer"}, testutil.WorkloadSource(t, testutil.CChain))
	cmd := testutil.StartWorkload(t, static)
	sp, err := procs.Get(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := exact.Prepare(sp); err != nil {
		t.Fatal(err)
	}
	if s := exact.Stats(); s.Evicted == 0 || s.Bytes > second.Bytes || s.Tables == 0 {
		t.Errorf("budget %d bytes after a new binary: %+v; want unreferenced tables evicted to fit it", second.Bytes, s)
	}

	// A table larger than the whole budget is refused and counted.
	small := NewLoader(tr, identifyFile, zaptest.NewLogger(t), LoaderOptions{BudgetBytes: 4 << 10})
	if err := small.Prepare(a); err != nil {
		t.Fatal(err)
	}
	if s := small.Stats(); s.OverBudget == 0 || s.Bytes > 4<<10 {
		t.Errorf("4 KiB budget: %+v, want libc refused as over budget", s)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// recordingKernel keeps what the Loader set, as the tracer's maps would:
// loaded tables, each pid's mappings and the prepared pids. It is used
// from one goroutine.
type recordingKernel struct {
	t        *testing.T
	tables   map[uint32]int // id -> rows
	mappings map[uint32]map[tracer.Mapping]bool
	known    map[uint32]bool
}

func newRecordingKernel(t *testing.T) *recordingKernel {
	return &recordingKernel{t: t, tables: map[uint32]int{}, mappings: map[uint32]map[tracer.Mapping]bool{}, known: map[uint32]bool{}}
}

func (k *recordingKernel) LoadTable(id uint32, rows []tracer.Row) error {
	k.tables[id] = len(rows)
	return nil
}

func (k *recordingKernel) UnloadTable(id uint32) error {
	delete(k.tables, id)
	return nil
}

func (k *recordingKernel) SetMappings(pid uint32, old, mappings []tracer.Mapping) error {
	for _, m := range old {
		if !k.mappings[pid][m] {
			k.t.Errorf("pid %d: removing %+v, which was never set", pid, m)
		}
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

// holds reports what the kernel keeps for pid.
func (k *recordingKernel) holds(pid int) (mappings int, known bool) {
	return len(k.mappings[uint32(pid)]), k.known[uint32(pid)]
}

// refs returns the Loader's reference count of every file it knows.
func (l *Loader) refs() map[elfx.FileID]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[elfx.FileID]int{}
	for id, lf := range l.files {
		out[id] = lf.refs
	}
	return out
}

// startWithLibc starts bin and reads it once the dynamic loader has mapped
// libc: the process is then in main's loop.
func startWithLibc(t *testing.T, procs *process.Table, bin string) (*process.Process, *exec.Cmd) {
	t.Helper()
	cmd := testutil.StartWorkload(t, bin)
	for {
		p, err := procs.Refresh(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Mappings {
			if m.Executable() && contains(m.Path, "libc.so") {
				return p, cmd
			}
		}
	}
}

// killAndReap ends a workload and waits for it: its /proc entry is gone.
func killAndReap(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// A process that exits before or while the Loader prepares it costs only
// an error matching process.ErrGone: nothing stays set for it in the
// kernel, the Loader forgets it, the tables it shares keep their other
// users' references, and a file whose path vanished mid-build is not
// recorded as unusable for the next process that maps it.
func TestLoaderProcessGone(t *testing.T) {
	if _, err := os.Stat("/proc/self/map_files"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	procs := process.NewTable("/proc", nil, process.Options{})
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	k := newRecordingKernel(t)
	core, logs := observer.New(zap.DebugLevel)
	l := NewLoader(k, identifyFile, zap.New(core), LoaderOptions{})

	// Another process of the same binary holds the tables.
	keep, _ := startWithLibc(t, procs, bin)
	if err := l.Prepare(keep); err != nil {
		t.Fatal(err)
	}
	before, stats := l.refs(), l.Stats()
	if stats.Tables < 2 || stats.Processes != 1 {
		t.Fatalf("after preparing one process: %+v", stats)
	}
	logs.TakeAll()

	check := func(what string, pid int, err error) {
		t.Helper()
		if !errors.Is(err, process.ErrGone) {
			t.Errorf("%s: Prepare = %v, want an error matching process.ErrGone", what, err)
		}
		if n, known := k.holds(pid); n != 0 || known {
			t.Errorf("%s: the kernel holds %d mappings for pid %d, known %v; want none", what, n, pid, known)
		}
		if l.Prepared(pid) {
			t.Errorf("%s: the Loader still holds pid %d", what, pid)
		}
		if diff := cmp.Diff(before, l.refs()); diff != "" {
			t.Errorf("%s: table references (-before +after):\n%s", what, diff)
		}
		if s := l.Stats(); s.Processes != 1 || s.Tables != stats.Tables || s.Failures != stats.Failures {
			t.Errorf("%s: stats %+v, want those before it %+v", what, s, stats)
		}
		if n := logs.Len(); n > 1 {
			t.Errorf("%s: %d log lines, want at most one: %v", what, n, logs.All())
		}
		for _, e := range logs.TakeAll() {
			if e.Level > zap.DebugLevel {
				t.Errorf("%s: logged %v %q", what, e.Level, e.Message)
			}
		}
	}

	// Read, then gone before Prepare.
	p, cmd := startWithLibc(t, procs, bin)
	killAndReap(t, cmd)
	check("exited before Prepare", p.PID, l.Prepare(p))

	// Prepared while running, gone before it is prepared again (a refresh
	// after dlopen): what was set for it goes.
	p, cmd = startWithLibc(t, procs, bin)
	if err := l.Prepare(p); err != nil {
		t.Fatal(err)
	}
	if n, known := k.holds(p.PID); n == 0 || !known {
		t.Fatalf("running process: the kernel holds %d mappings, known %v", n, known)
	}
	killAndReap(t, cmd)
	check("exited between two Prepares", p.PID, l.Prepare(p))

	// Gone while its first file's table is built: identify still opened
	// the file, building it finds the path gone. A fresh Loader has no
	// table of this binary yet.
	p, cmd = startWithLibc(t, procs, bin)
	k2 := newRecordingKernel(t)
	killed := false
	dying := func(path string) (elfx.FileID, error) {
		id, err := identifyFile(path)
		if !killed {
			killed = true
			killAndReap(t, cmd)
		}
		return id, err
	}
	l2 := NewLoader(k2, dying, zap.New(core), LoaderOptions{})
	err := l2.Prepare(p)
	if !errors.Is(err, process.ErrGone) || l2.Prepared(p.PID) {
		t.Errorf("exited while building: Prepare = %v, prepared %v; want ErrGone, not prepared", err, l2.Prepared(p.PID))
	}
	if n, known := k2.holds(p.PID); n != 0 || known {
		t.Errorf("exited while building: the kernel holds %d mappings, known %v; want none", n, known)
	}
	if s := l2.Stats(); s.Failures != 0 || s.Processes != 0 {
		t.Errorf("exited while building: %+v; want no file recorded as failed", s)
	}
	again, _ := startWithLibc(t, procs, bin)
	if err := l2.Prepare(again); err != nil {
		t.Fatal(err)
	}
	for m := range k2.mappings[uint32(again.PID)] {
		if m.Table == 0 {
			t.Errorf("the next process of the binary: mapping %#x-%#x has no table", m.Start, m.End)
		}
	}
	if n := logs.Len(); n > 1 {
		t.Errorf("exited while building: %d log lines, want at most one: %v", n, logs.All())
	}
}
