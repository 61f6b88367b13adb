package unwind

import (
	"os"
	"testing"

	"go.uber.org/zap/zaptest"

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
