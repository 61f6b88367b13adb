package unwind

import (
	"debug/elf"
	"errors"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// funcIndex names addresses of a non-PIE binary by its ELF function
// symbols.
type funcIndex []elf.Symbol

func newFuncIndex(t *testing.T, path string) funcIndex {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	var idx funcIndex
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Size > 0 {
			idx = append(idx, s)
		}
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i].Value < idx[j].Value })
	return idx
}

// name returns the function holding pc; "" outside every function.
func (x funcIndex) name(pc uint64) string {
	i := sort.Search(len(x), func(i int) bool { return x[i].Value > pc })
	if i == 0 || pc >= x[i-1].Value+x[i-1].Size {
		return ""
	}
	return x[i-1].Name
}

// The eBPF unwinder, with the Loader's table of a Go binary, ends the
// stacks of the runtime's system stack at the switch that led there for
// good (runtime.mcall) or at the thread's start (runtime.mstart), and
// calls them complete; no frame lies past an end. It crosses the calls on
// the system stack (runtime.systemstack, runtime.asmcgocall) back to the
// goroutine's stack: none is ever the outermost frame, and the stacks
// through them reach a bottom, complete.
func TestUnwinderEndsGoStacks(t *testing.T) {
	testutil.RequirePrivileges(t, "sampling with the eBPF unwinder")
	ends := stackEndSymbols(t, stackBottomSwitches...)
	crossings := map[string]bool{"runtime.systemstack.abi0": true, "runtime.asmcgocall.abi0": true}
	bin := testutil.BuildGo(t, "g0work", filepath.Join("testdata", "g0work"))
	idx := newFuncIndex(t, bin)

	tr, err := tracer.New(tracer.Options{SamplesPerSecond: 499})
	if err != nil {
		t.Fatal(err)
	}
	defer testutil.Close(t, tr)
	recs := make(chan tracer.Record, 1024)
	go func() {
		defer close(recs)
		for {
			var rec tracer.Record
			if err := tr.ReadInto(&rec); err != nil {
				if !errors.Is(err, tracer.ErrClosed) {
					t.Errorf("ReadInto: %v", err)
				}
				return
			}
			if rec.Type == tracer.RecordSample {
				rec.User, rec.UserFlags = slices.Clone(rec.User), slices.Clone(rec.UserFlags)
				recs <- rec
			}
		}
	}()

	procs := process.NewTable("/proc", nil, process.Options{})
	cmd := testutil.StartWorkload(t, bin)
	p, _ := execMapping(t, procs, cmd.Process.Pid, bin)
	l := NewLoader(tr, identifyFile, zaptest.NewLogger(t), LoaderOptions{DebugDirs: []string{}})
	if err := l.Prepare(p); err != nil {
		t.Fatal(err)
	}
	defer forget(t, l, p.PID)
	// Samples taken before the tables were in are the frame-pointer walk's
	// (a leaf alone where the walk finds no frame pointer): not checked.
	prepared := time.Now()

	// Enough samples that ended on the system stack, and that crossed from
	// it to the goroutine's stack, or the deadline.
	const want = 20
	endedAt, elsewhere := map[string]int{}, map[string]int{}
	systemEnds, crossed, checked := 0, 0, 0
	deadline := time.After(30 * time.Second)
	for systemEnds < want || crossed < want {
		var rec tracer.Record
		select {
		case r, ok := <-recs:
			if !ok {
				t.Fatal("tracer closed")
			}
			rec = r
		case <-deadline:
			t.Fatalf("after %d samples of the workload, %d ended on the system stack (by end function: %v), %d crossed from it to a goroutine's bottom; want %d of each",
				checked, systemEnds, endedAt, crossed, want)
		}
		if rec.PID != uint32(p.PID) || len(rec.User) == 0 || rec.Time.Before(prepared) || slices.ContainsFunc(rec.UserFlags, func(f tracer.FrameFlags) bool { return f&tracer.FrameFromFramePointer != 0 }) {
			continue // another process, or not unwound by the tables
		}
		checked++
		names := make([]string, len(rec.User))
		for i, pc := range rec.User {
			if rec.UserFlags[i]&tracer.FrameInterrupted == 0 {
				pc-- // a return address: the call is before it
			}
			names[i] = idx.name(pc)
		}
		for i, n := range names[:len(names)-1] {
			if ends[n] {
				t.Errorf("frame %d of %d is the stack end %s: stack %v", i, len(names), n, names)
			}
		}
		last := names[len(names)-1]
		if crossings[last] {
			t.Errorf("stack ends in %s, which the unwinder crosses: %v", last, names)
		}
		if !ends[last] {
			// Stopped elsewhere (the vDSO, a read error): not this
			// test's business, but shown.
			elsewhere[last]++
			continue
		}
		if rec.Flags&tracer.FlagUserComplete == 0 {
			t.Errorf("stack ending in %s not flagged complete (flags %#x): %v", last, rec.Flags, names)
		}
		endedAt[last]++
		switch last {
		case "runtime.mcall", "runtime.mstart.abi0":
			systemEnds++
		}
		if slices.Contains(names, "runtime.systemstack.abi0") {
			crossed++
		}
	}
	t.Logf("%d samples unwound by tables; complete stacks by end function: %v; %d crossed runtime.systemstack to the bottom; other outermost frames: %v",
		checked, endedAt, crossed, elsewhere)
}
