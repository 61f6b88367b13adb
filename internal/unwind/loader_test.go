package unwind

import (
	"debug/elf"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

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
	tr, procs := newTracer(t)
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	start := func() *process.Process {
		p, _ := startWithLibc(t, procs, bin)
		return p
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

// mapsKernel keeps what the Loader set, as the tracer's maps would:
// loaded tables, each pid's mappings and the prepared pids, and checks
// that only what was set is removed. Unlike recordingKernel it needs no
// tracer. The Loader loads tables from goroutines of its own.
type mapsKernel struct {
	t        *testing.T
	mu       sync.Mutex
	tables   map[uint32]int // id -> rows
	rows     map[uint32][]tracer.Row
	mappings map[uint32]map[tracer.Mapping]bool
	known    map[uint32]bool
}

func newMapsKernel(t *testing.T) *mapsKernel {
	return &mapsKernel{t: t, tables: map[uint32]int{}, rows: map[uint32][]tracer.Row{}, mappings: map[uint32]map[tracer.Mapping]bool{}, known: map[uint32]bool{}}
}

func (k *mapsKernel) LoadTable(id uint32, rows []tracer.Row, copied func(int)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.tables[id] = len(rows)
	k.rows[id] = slices.Clone(rows)
	if copied != nil {
		copied(len(rows))
	}
	return nil
}

func (k *mapsKernel) UnloadTable(id uint32) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.tables, id)
	delete(k.rows, id)
	return nil
}

func (k *mapsKernel) SetMappings(pid uint32, old, mappings []tracer.Mapping) error {
	k.mu.Lock()
	defer k.mu.Unlock()
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

func (k *mapsKernel) ForgetProcess(pid uint32, old []tracer.Mapping) error {
	_ = k.SetMappings(pid, old, nil)
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.known, pid)
	return nil
}

// holds reports what the kernel keeps for pid.
func (k *mapsKernel) holds(pid int) (mappings int, known bool) {
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
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p, err := procs.Refresh(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Mappings {
			if m.Executable() && contains(m.Path, "libc.so") {
				return p, cmd
			}
		}
		runtime.Gosched()
	}
	t.Fatalf("pid %d never mapped libc", cmd.Process.Pid)
	return nil, nil
}

// killAndReap ends a workload and waits for it: its /proc entry is gone.
func killAndReap(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// A process prepared again (a dlopen or dlclose made it read its maps
// again) keeps the files of the mappings it still has without finding them
// again; a new mapping, or the same pid started anew, is looked up.
func TestLoaderPrepareAgainKeepsUnchangedFiles(t *testing.T) {
	if _, err := os.Stat("/proc/self/maps"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	procs := process.NewTable("/proc", nil, process.Options{})
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	var mu sync.Mutex
	looked := map[string]int{}
	identify := func(path string) (elfx.FileID, error) {
		mu.Lock()
		looked[path]++
		mu.Unlock()
		return identifyFile(path)
	}
	lookups := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range looked {
			n += c
		}
		return n
	}
	k := newMapsKernel(t)
	l := NewLoader(k, identify, zaptest.NewLogger(t), LoaderOptions{})
	p, _ := startWithLibc(t, procs, bin)
	if err := l.Prepare(p); err != nil {
		t.Fatal(err)
	}
	first, refs, set := lookups(), l.refs(), maps.Clone(k.mappings[uint32(p.PID)])
	if first < 2 {
		t.Fatalf("first Prepare looked up %d files, want the binary and libc at least", first)
	}

	if err := l.Prepare(p); err != nil {
		t.Fatal(err)
	}
	if n := lookups() - first; n != 0 {
		t.Errorf("Prepare of unchanged mappings looked up %d files, want none: %v", n, looked)
	}
	if diff := cmp.Diff(refs, l.refs()); diff != "" {
		t.Errorf("table references after preparing again (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(set, k.mappings[uint32(p.PID)]); diff != "" {
		t.Errorf("mappings set after preparing again (-before +after):\n%s", diff)
	}

	// One library less and the binary's text at another place: only that
	// mapping is looked up.
	moved := *p
	moved.Mappings = nil
	var libc, text string
	for _, m := range p.Mappings {
		switch {
		case m.Executable() && contains(m.Path, "libc.so"):
			libc = m.Path
			continue
		case m.Executable() && m.Path == bin:
			text = m.Path
			m.Start, m.End = m.Start+0x1000, m.End+0x1000
		}
		moved.Mappings = append(moved.Mappings, m)
	}
	if libc == "" || text == "" {
		t.Fatalf("no libc or binary text in %+v", p.Mappings)
	}
	before := lookups()
	if err := l.Prepare(&moved); err != nil {
		t.Fatal(err)
	}
	if n := lookups() - before; n != 1 {
		t.Errorf("Prepare with one mapping moved looked up %d files, want 1: %v", n, looked)
	}

	// The same pid, started anew, is another process: none of its
	// mappings is taken for the old one's.
	l.mu.Lock()
	set2 := slices.Clone(l.procs[p.PID])
	l.mu.Unlock()
	for _, m := range moved.Mappings {
		if !m.Executable() || !m.FileBacked() {
			continue
		}
		key := tracer.FileKey{Major: unix.Major(m.Dev), Minor: unix.Minor(m.Dev), Inode: m.Inode}
		if _, lf := unchangedMapping(set2, moved.StartTime, m, key); lf == nil {
			t.Errorf("mapping %#x-%#x of the process as set: not found", m.Start, m.End)
		}
		if _, lf := unchangedMapping(set2, moved.StartTime+1, m, key); lf != nil {
			t.Errorf("mapping %#x-%#x of a process started later: taken for the old one's", m.Start, m.End)
		}
	}
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
	k := newMapsKernel(t)
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
	k2 := newMapsKernel(t)
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

// recordingKernel loads into the real tracer and keeps what the Loader
// asked it to load, so a test can read the rows back.
type recordingKernel struct {
	*tracer.Tracer
	mu       sync.Mutex
	tables   map[uint32][]tracer.Row
	mappings map[uint32][]tracer.Mapping
}

func (k *recordingKernel) LoadTable(id uint32, rows []tracer.Row, copied func(int)) error {
	k.mu.Lock()
	k.tables[id] = slices.Clone(rows)
	k.mu.Unlock()
	return k.Tracer.LoadTable(id, rows, copied)
}

func (k *recordingKernel) SetMappings(pid uint32, old, mappings []tracer.Mapping) error {
	k.mu.Lock()
	k.mappings[pid] = slices.Clone(mappings)
	k.mu.Unlock()
	return k.Tracer.SetMappings(pid, old, mappings)
}

// tableOfKernelRows turns kernel rows, relative to base, back into a Table.
func tableOfKernelRows(t *testing.T, rows []tracer.Row, base uint64) *Table {
	t.Helper()
	cfa := map[uint8]CFAType{tracer.CFAUnknown: CFAUnknown, tracer.CFASP: CFASP, tracer.CFAFP: CFAFP,
		tracer.CFAPLT: CFAPLT, tracer.CFASignal: CFASignal, tracer.CFAEnd: CFAEnd}
	fp := map[uint8]FPRule{tracer.FPSame: FPSame, tracer.FPOffset: FPOffset, tracer.FPUnknown: FPUnknown}
	tab := &Table{}
	for _, kr := range rows {
		ct, cfaOff, ft, fpOff := tracer.RowRule(kr)
		c, ok1 := cfa[ct]
		f, ok2 := fp[ft]
		if !ok1 || !ok2 {
			t.Fatalf("kernel row %+v has an unknown rule", kr)
		}
		r := Row{PC: base + uint64(kr.Pc), CFA: c, CFAOffset: cfaOff, FP: f}
		if f == FPOffset {
			r.FPOffset = int16(fpOff) // kernel rows hold ±1 KiB
		}
		switch c {
		case CFASP, CFAFP, CFAPLT:
		default:
			r.CFAOffset, r.FP = 0, FPSame // unused by such rules: zero as Row documents
			if c == CFASignal {
				r.FP = FPUnknown
			}
		}
		tab.Rows = append(tab.Rows, r)
	}
	return tab
}

// execMapping waits until pid maps path executable and returns the process
// as it is then.
func execMapping(t *testing.T, procs *process.Table, pid int, path string) (*process.Process, process.Mapping) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		p, err := procs.Refresh(pid)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range p.Mappings {
			if m.Executable() && m.Path == path {
				return p, m
			}
		}
		runtime.Gosched()
	}
	t.Fatalf("pid %d never mapped %s executable", pid, path)
	return nil, process.Mapping{}
}

// A binary whose only CFI is the .debug_frame of its separate debug file
// (found by build id in DebugDirs) gets that CFI as its kernel table, row
// for row as readelf interprets the debug file; without the debug file it
// has no table.
func TestLoaderSeparateDebugFile(t *testing.T) {
	testutil.RequirePrivileges(t, "loading unwind tables")
	objcopy := testutil.RequireTool(t, "objcopy")
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	// Without unwind tables GCC writes the functions' CFI to .debug_frame;
	// the start files' .eh_frame goes too, so the binary keeps no CFI.
	full := testutil.BuildC(t, "full", []string{"-O2", "-g", "-Dmain=frames_main", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-Wl,--build-id"},
		filepath.Join("testdata", "frames.c"), filepath.Join("testdata", "frames_loop.c"))
	dir := t.TempDir()
	debugPath, bin := filepath.Join(dir, "full.debug"), filepath.Join(dir, "frames-nocfi")
	run(objcopy, "--only-keep-debug", full, debugPath)
	run(testutil.RequireTool(t, "strip"), "--strip-all", "--remove-section=.eh_frame", "--remove-section=.eh_frame_hdr", "-o", bin, full)
	if fdes := parseReadelf(t, bin); len(fdes) != 0 {
		t.Fatalf("oracle: the stripped binary still has %d FDEs", len(fdes))
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	id, err := elfx.GNUBuildID(ef)
	ef.Close()
	if err != nil || len(id) < 4 {
		t.Fatalf("build id %q, %v", id, err)
	}
	debugDir := t.TempDir()
	byID := filepath.Join(debugDir, ".build-id", id[:2], id[2:]+".debug")
	if err := os.MkdirAll(filepath.Dir(byID), 0o755); err != nil {
		t.Fatal(err)
	}
	run("cp", debugPath, byID)
	fileID, err := identifyFile(bin)
	if err != nil {
		t.Fatal(err)
	}

	tr, procs := newTracer(t)
	cmd := testutil.StartWorkload(t, bin)
	p, binMapping := execMapping(t, procs, cmd.Process.Pid, bin)

	// prepare returns the table the Loader set for bin's mapping.
	prepare := func(t *testing.T, dirs []string) (*Loader, *recordingKernel, tracer.Mapping) {
		t.Helper()
		k := &recordingKernel{Tracer: tr, tables: map[uint32][]tracer.Row{}, mappings: map[uint32][]tracer.Mapping{}}
		l := NewLoader(k, identifyFile, zaptest.NewLogger(t), LoaderOptions{DebugDirs: dirs})
		if err := l.Prepare(p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { forget(t, l, p.PID) })
		for _, m := range k.mappings[uint32(p.PID)] {
			if m.Start == binMapping.Start {
				return l, k, m
			}
		}
		t.Fatalf("no mapping set at %#x: %+v", binMapping.Start, k.mappings)
		return nil, nil, tracer.Mapping{}
	}

	t.Run("found by build id", func(t *testing.T) {
		l, k, m := prepare(t, []string{t.TempDir(), debugDir})
		rows, ok := k.tables[m.Table]
		if m.Table == 0 || !ok || int(m.Rows) != len(rows) {
			t.Fatalf("mapping %+v: no table loaded (tables %v)", m, slices.Collect(maps.Keys(k.tables)))
		}
		lf := l.files[fileID]
		if lf == nil || lf.debug != byID {
			t.Fatalf("file record %+v, want a table from %s", lf, byID)
		}
		if s := l.Stats(); s.DebugFiles == 0 {
			t.Errorf("stats %+v: no table counted as built from a debug file", s)
		}
		if m.NoTable {
			t.Errorf("mapping %+v with a table is marked as never having one", m)
		}
		// A Finder reads the same debug file, and finds the table's rows.
		fd, err := NewFinder(bin, []string{t.TempDir(), debugDir}, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		for i, r := range rows {
			off := lf.base + uint64(r.Pc)
			if got, ok := fd.Row(off); !ok || got.Rule != r.Rule || got.CfaOffset != r.CfaOffset || got.FpOffset8 != r.FpOffset8 {
				t.Errorf("row %d at offset %#x: finder %+v (found %v), table %+v", i, off, got, ok, r)
			}
		}
		// Rows are keyed by file offset; readelf speaks ELF addresses.
		tab := tableOfKernelRows(t, rows, lf.base)
		segs := readelfSegments(t, bin)
		oracleLookup(t, byVaddr(tab, segs), tab.Stats, debugPath, ".debug_frame")
		// And nothing beyond the debug file's FDEs: every row with a rule
		// lies in one of them, but for the end of the stack at the
		// program's entry, which has none here (EndAtEntry).
		fdes := parseReadelf(t, debugPath)
		ef, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		entry := ef.Entry
		ef.Close()
		for _, r := range tab.Rows {
			if r.CFA == CFAUnknown {
				continue
			}
			if pc, _ := vaddrAt(segs, r.PC); r.CFA == CFAEnd && pc == entry {
				continue
			}
			pc, ok := vaddrAt(segs, r.PC)
			if !ok || !slices.ContainsFunc(fdes, func(f readelfFDE) bool { return f.begin <= pc && pc < f.end }) {
				t.Errorf("row %+v (address %#x, in code %v) lies outside every FDE of the debug file", r, pc, ok)
			}
		}
	})
	t.Run("not searched", func(t *testing.T) {
		l, k, m := prepare(t, []string{})
		if m.Table != 0 || !m.NoTable {
			t.Errorf("mapping %+v has a table (%d rows) without the debug file, or is not marked as never having one", m, len(k.tables[m.Table]))
		}
		if lf := l.files[fileID]; lf == nil || !errors.Is(lf.err, ErrNoCFI) {
			t.Errorf("file record %+v, want ErrNoCFI", lf)
		}
		if s := l.Stats(); s.NoCFI == 0 || s.DebugFiles != 0 {
			t.Errorf("stats %+v, want the file counted as without CFI", s)
		}
	})
}

// A table refused because the tables of running processes fill the budget
// leaves its file to frame pointers, is said once in the log and counted;
// when one of those processes ends, the refused table is built again,
// loaded, and the processes that map it are pointed at it.
func TestLoaderRetriesRefused(t *testing.T) {
	if _, err := os.Stat("/proc/self/map_files"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	procs := process.NewTable("/proc", nil, process.Options{})
	dynamic := testutil.BuildWorkload(t, testutil.CChainNoFP)
	static := testutil.BuildC(t, "static", []string{"-O2", "-static", "-fomit-frame-pointer"}, testutil.WorkloadSource(t, testutil.CChain))

	// The budget holds exactly the tables of the dynamic binary's process.
	probe := NewLoader(newMapsKernel(t), identifyFile, zaptest.NewLogger(t), LoaderOptions{DebugDirs: []string{}})
	a, _ := startWithLibc(t, procs, dynamic)
	if err := probe.Prepare(a); err != nil {
		t.Fatal(err)
	}
	budget := probe.Stats().Bytes

	k := &gatedKernel{mapsKernel: newMapsKernel(t), entered: make(chan uint32, 64), release: make(chan struct{})}
	k.open.Store(true)
	core, logs := observer.New(zap.InfoLevel)
	l := NewLoader(k, identifyFile, zap.New(core), LoaderOptions{BudgetBytes: budget, DebugDirs: []string{}})
	if err := l.Prepare(a); err != nil {
		t.Fatal(err)
	}
	var bs []*process.Process
	for range 2 {
		cmd := testutil.StartWorkload(t, static)
		_, _ = execMapping(t, procs, cmd.Process.Pid, static)
		b, err := procs.Refresh(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Prepare(b); err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	tables := func(pid int) (with, without int) {
		for m := range k.mappings[uint32(pid)] {
			if m.Table != 0 {
				with++
			} else {
				without++
			}
		}
		return with, without
	}
	s := l.Stats()
	if s.Refused != 1 || s.OverBudget != 1 || s.Bytes > budget {
		t.Errorf("with the budget full: %+v; want the static binary's table refused once, counted, the budget kept", s)
	}
	for _, b := range bs {
		if with, without := tables(b.PID); with != 0 || without == 0 {
			t.Errorf("pid %d: %d mappings with a table, %d without; want none with one", b.PID, with, without)
		}
	}
	if n := logs.FilterMessageSnippet("budget").Len(); n != 1 {
		t.Errorf("%d log lines about the budget, want 1: %v", n, logs.All())
	}

	// The retried table's load waits in the kernel without the Loader's
	// lock: Stats answers meanwhile.
	k.open.Store(false)
	forgot := make(chan error, 1)
	go func() { forgot <- l.Forget(a.PID) }()
	select {
	case <-k.entered:
	case err := <-forgot:
		t.Fatalf("Forget returned (%v) without loading the refused table", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the refused table's load did not start")
	}
	stats := make(chan LoaderStats, 1)
	go func() { stats <- l.Stats() }()
	select {
	case <-stats:
	case <-time.After(30 * time.Second):
		t.Fatal("Stats waited for the retried table's load: it holds the Loader's lock")
	}
	close(k.release)
	if err := <-forgot; err != nil {
		t.Fatal(err)
	}
	s = l.Stats()
	if s.Refused != 0 || s.Retried != 1 || s.Bytes > budget {
		t.Errorf("after the first process ended: %+v; want the refused table loaded, within budget", s)
	}
	fileID, err := identifyFile(static)
	if err != nil {
		t.Fatal(err)
	}
	lf := l.files[fileID]
	for _, b := range bs {
		if with, without := tables(b.PID); with == 0 || without != 0 {
			t.Errorf("pid %d after the retry: %d mappings with a table, %d without; want all with one", b.PID, with, without)
		}
		for m := range k.mappings[uint32(b.PID)] {
			if lf == nil || m.Table != lf.id || m.Bias != m.FileBias+lf.base || int(m.Rows) != len(k.rows[m.Table]) {
				t.Errorf("pid %d mapping %+v does not point at the static binary's table (%+v)", b.PID, m, lf)
			}
		}
	}
}

// forget has l forget pid, failing t if that fails.
func forget(t *testing.T, l *Loader, pid int) {
	t.Helper()
	if err := l.Forget(pid); err != nil {
		t.Errorf("forget %d: %v", pid, err)
	}
}

// With Background, Prepare sets a process's mappings at once and leaves its
// new files' tables to a goroutine, which loads them and points the
// process's mappings at them; a second process of the same files gets the
// tables from Prepare itself.
func TestLoaderBackground(t *testing.T) {
	testutil.RequirePrivileges(t, "loading unwind tables")
	tr, procs := newTracer(t)
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	start := func() *process.Process {
		p, _ := startWithLibc(t, procs, bin)
		return p
	}
	var mu sync.Mutex
	loaded := map[int]int{} // pid -> tables loaded for it
	missed := time.Now().Add(-time.Second)
	var stamps []time.Time
	l := NewLoader(tr, identifyFile, zaptest.NewLogger(t), LoaderOptions{
		Background: true,
		Since:      func() time.Time { return missed },
		Loaded: func(since time.Time, pids []int, _ bool) {
			mu.Lock()
			defer mu.Unlock()
			stamps = append(stamps, since)
			for _, pid := range pids {
				loaded[pid]++
			}
		},
	})
	a := start()
	if err := l.Prepare(a); err != nil {
		t.Fatal(err)
	}
	if !l.Prepared(a.PID) {
		t.Fatalf("pid %d not prepared", a.PID)
	}
	l.Wait()
	first := l.Stats()
	if first.Deferred < 2 || first.Built < 2 || first.BuiltLater != first.Built || first.Pending != 0 {
		t.Fatalf("after the background build: %+v; want every table built there, none pending", first)
	}
	mu.Lock()
	if loaded[a.PID] != int(first.Built) || len(stamps) != int(first.Built) {
		t.Errorf("Loaded told of %d tables for pid %d (%d calls), want %d", loaded[a.PID], a.PID, len(stamps), first.Built)
	}
	for _, s := range stamps {
		if !s.Equal(missed) {
			t.Errorf("Loaded stamp %v, want Since's %v", s, missed)
		}
	}
	mu.Unlock()
	// Every mapping of a file with a table points at it.
	check := func(pid int) {
		t.Helper()
		l.mu.Lock()
		defer l.mu.Unlock()
		with := 0
		for _, pm := range l.procs[pid] {
			if pm.file.id == 0 {
				continue
			}
			with++
			if pm.m.Table != pm.file.id || pm.m.Rows != pm.file.rows || pm.m.Bias != pm.m.FileBias+pm.file.base {
				t.Errorf("pid %d: mapping %+v, want table %d of %d rows, base %#x", pid, pm.m, pm.file.id, pm.file.rows, pm.file.base)
			}
		}
		if with < 2 {
			t.Errorf("pid %d: %d mappings with a table, want the program's and libc's", pid, with)
		}
	}
	check(a.PID)

	b := start()
	if err := l.Prepare(b); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Built != first.Built || s.Deferred != first.Deferred || s.Pending != 0 {
		t.Errorf("a second process of the same files: %+v, want nothing new (%+v)", s, first)
	}
	check(b.PID)
}

// A background build lets go of its table's rows once they are copied
// into the kernel, while the install still waits for its grace period: a
// big table's rows are never held beside the next build's.
func TestLoaderFreesRowsBeforeInstall(t *testing.T) {
	procs := process.NewTable("/proc", nil, process.Options{})
	static := testutil.BuildC(t, "static", []string{"-O2", "-static", "-fomit-frame-pointer"}, testutil.WorkloadSource(t, testutil.CChain))
	cmd := testutil.StartWorkload(t, static)
	p, _ := execMapping(t, procs, cmd.Process.Pid, static)
	k := &gatedKernel{mapsKernel: newMapsKernel(t), entered: make(chan uint32, 64), release: make(chan struct{})}
	l := NewLoader(k, identifyFile, zaptest.NewLogger(t), LoaderOptions{Background: true, DebugDirs: []string{}})
	defer l.Close()
	before := mappedBuffers.Load()
	if err := l.Prepare(p); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the static binary's table was not loaded")
	}
	// The load waits in the gate, after filled.
	if n := mappedBuffers.Load() - before; n != 0 {
		t.Errorf("%d build buffers mapped while the install waits, want 0", n)
	}
	if len(k.rows) != 1 {
		t.Fatalf("kernel holds %d tables, want the static binary's", len(k.rows))
	}
	for id, rows := range k.rows {
		if len(rows) < 100 {
			t.Errorf("table %d: %d rows; want a whole static binary's", id, len(rows))
		}
	}
	close(k.release)
	l.Wait()
	if s := l.Stats(); s.Tables != 1 || s.BuiltLater != 1 {
		t.Errorf("after the install: %+v; want the table loaded in the background", s)
	}
}

// Close stops the background builds before the kernel side goes away: it
// returns once no build or load is under way, with nothing left queued,
// and the goroutines have ended.
func TestLoaderCloseStopsBackground(t *testing.T) {
	p, _ := startWithLibc(t, process.NewTable("/proc", nil, process.Options{}), testutil.BuildWorkload(t, testutil.CChainNoFP))
	k := newMapsKernel(t)
	l := NewLoader(k, identifyFile, zaptest.NewLogger(t), LoaderOptions{Background: true})
	if err := l.Prepare(p); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Deferred < 2 {
		t.Fatalf("%+v: want the program's and libc's tables left to the background", s)
	}
	l.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.building[laneAny] || l.building[laneSmall] || l.inBuild != 0 || l.loading != 0 || len(l.pending) != 0 || l.stats.Pending != 0 {
		t.Errorf("after Close: building %v, %d in build, %d loading, %d queued (gauge %d); want nothing", l.building, l.inBuild, l.loading, len(l.pending), l.stats.Pending)
	}
	l.startBuilds()
	if l.building[laneAny] || l.building[laneSmall] {
		t.Error("a lane started after Close")
	}
}

// A file deferred by a Prepare waits for that Prepare to set its process's
// mappings: a lane already running would otherwise find no process mapping
// it, drop it, and leave the process without its table for good.
func TestDeferredWaitsForItsPrepare(t *testing.T) {
	l := NewLoader(newMapsKernel(t), identifyFile, zaptest.NewLogger(t), LoaderOptions{Background: true})
	defer l.Close()
	if lf := l.deferFile(elfx.FileID{1}, 4096); lf == nil || !lf.deferred {
		t.Fatalf("deferFile: %+v, want a deferred file", lf)
	}
	l.mu.Lock()
	if i, j := l.next(laneAny), l.next(laneSmall); i >= 0 || j >= 0 {
		t.Errorf("lanes may take a file before its Prepare ended (%d, %d)", i, j)
	}
	l.queueDeferred()
	if i := l.next(laneAny); i < 0 || !l.building[laneAny] {
		t.Errorf("after its Prepare: next %d, lane running %v; want it taken", i, l.building[laneAny])
	}
	l.mu.Unlock()
}

// A deferred file whose only path vanished (its process exited, and the
// Loader has not been told yet: the exit record waits behind the samples)
// is given up, not tried again at once, in a loop that held a CPU for as
// long as the exit took to reach the Loader; with a second process that
// maps it, its table is built from that one's path.
func TestDeferredPathVanished(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(t.TempDir(), "gone")
	for _, tc := range []struct {
		name  string
		paths []string
		built bool
	}{
		{"no other process", []string{gone}, false},
		{"another process maps it", []string{gone, self}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newMapsKernel(t)
			l := NewLoader(k, identifyFile, zaptest.NewLogger(t), LoaderOptions{Background: true})
			defer l.Close()
			id := elfx.FileID{7}
			lf := l.deferFile(id, 4096)
			if lf == nil {
				t.Fatal("deferFile: nil")
			}
			l.mu.Lock()
			for i, path := range tc.paths {
				m := tracer.Mapping{Start: 0x400000, End: 0x500000}
				if err := k.SetMappings(uint32(100+i), nil, []tracer.Mapping{m}); err != nil {
					t.Fatal(err)
				}
				l.procs[100+i] = []procMapping{{m: m, file: lf, path: path}}
			}
			l.queueDeferred()
			l.mu.Unlock()
			done := make(chan struct{})
			go func() { l.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("the lanes still build after 30 s: %+v", l.Stats())
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			if got := l.files[id] == lf && lf.err == nil && !lf.deferred; got != tc.built {
				t.Errorf("built from another path: %v (err %v, deferred %v), want %v; stats %+v", got, lf.err, lf.deferred, tc.built, l.stats)
			}
			if l.stats.Pending != 0 {
				t.Errorf("pending %d, want 0", l.stats.Pending)
			}
		})
	}
}

// gatedKernel holds each LoadTable, once it has copied the rows, until the
// test lets it go, as the kernel's grace period does after installing a
// table.
type gatedKernel struct {
	*mapsKernel
	open    atomic.Bool // loads pass without waiting
	entered chan uint32
	release chan struct{}
}

func (k *gatedKernel) LoadTable(id uint32, rows []tracer.Row, copied func(int)) error {
	err := k.mapsKernel.LoadTable(id, rows, copied)
	if !k.open.Load() {
		k.entered <- id
		<-k.release
	}
	return err
}

// A table goes into the kernel without the Loader's lock: while a load
// waits, the resolver's File and the telemetry's Stats still answer, and
// the process's next file is built meanwhile. Prepare returns only once
// its loads are done, with every table in the process's mappings.
func TestLoaderLoadsOutsideLock(t *testing.T) {
	if _, err := os.Stat("/proc/self/map_files"); err != nil {
		t.Skipf("no procfs: %v", err)
	}
	procs := process.NewTable("/proc", nil, process.Options{})
	p, _ := startWithLibc(t, procs, testutil.BuildWorkload(t, testutil.CChainNoFP))
	k := &gatedKernel{mapsKernel: newMapsKernel(t), entered: make(chan uint32, 64), release: make(chan struct{})}
	l := NewLoader(k, identifyFile, zaptest.NewLogger(t), LoaderOptions{DebugDirs: []string{}})
	done := make(chan error, 1)
	go func() { done <- l.Prepare(p) }()

	// Both the program's and libc's loads start before either ends: the
	// second file was built while the first one's load waited.
	for i := range 2 {
		select {
		case <-k.entered:
		case err := <-done:
			t.Fatalf("Prepare returned (%v) before its loads were let go", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("load %d did not start while the first one waited", i+1)
		}
	}
	s := l.Stats() // blocks if a load holds the lock
	if s.Tables != 0 || s.Bytes == 0 {
		t.Errorf("while loading: %+v; want no table loaded yet, their bytes reserved", s)
	}
	select {
	case err := <-done:
		t.Fatalf("Prepare returned (%v) before its loads were let go", err)
	default:
	}
	close(k.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s = l.Stats()
	with := 0
	for m := range k.mappings[uint32(p.PID)] {
		if m.Table != 0 {
			with++
			if _, ok := l.File(m.File); !ok {
				t.Errorf("mapping %+v: handle unknown", m)
			}
		}
	}
	if s.Tables < 2 || with < 2 || len(k.tables) != s.Tables {
		t.Errorf("after Prepare: %+v, %d mappings with a table, kernel holds %d; want at least 2, all of them set", s, with, len(k.tables))
	}
}

// With Demand, Prepare builds no table: a process's mappings are set at
// once without tables, and a file's table is built in the background once
// Want said so Demand times, then its mappings point at it; Loaded is told
// of it as built on demand. WantProcess builds every lazy file of a process
// at once.
func TestLoaderOnDemand(t *testing.T) {
	testutil.RequirePrivileges(t, "loading unwind tables")
	tr, procs := newTracer(t)
	bin := testutil.BuildWorkload(t, testutil.CChainNoFP)
	var asked []int64
	var told, toldOnDemand int
	var mu sync.Mutex
	l := NewLoader(tr, identifyFile, zaptest.NewLogger(t), LoaderOptions{
		Background: true,
		Loaded: func(_ time.Time, _ []int, onDemand bool) {
			mu.Lock()
			if onDemand {
				toldOnDemand++
			} else {
				told++
			}
			mu.Unlock()
		},
		Demand: func(size int64) int {
			asked = append(asked, size)
			return 3
		},
	})
	p, _ := startWithLibc(t, procs, bin)
	if err := l.Prepare(p); err != nil {
		t.Fatal(err)
	}
	l.Wait()
	if s := l.Stats(); s.Built != 0 || s.Tables != 0 || s.Lazy < 2 || s.Pending != 0 {
		t.Fatalf("after Prepare: %+v; want no table, the program and libc lazy", s)
	}
	if l.Pending(p.PID) {
		t.Error("a process with only lazy files is pending")
	}
	for _, size := range asked {
		if size <= 0 {
			t.Errorf("Demand asked with %d bytes of unwind information", size)
		}
	}
	binID, err := identifyFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	mappingOf := func(id elfx.FileID) tracer.Mapping {
		t.Helper()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, pm := range l.procs[p.PID] {
			if l.handles[pm.file.handle] == id {
				return pm.m
			}
		}
		t.Fatalf("no mapping of %s", id)
		return tracer.Mapping{}
	}
	if m := mappingOf(binID); m.Table != 0 || m.NoTable {
		t.Fatalf("lazy file's mapping %+v: want no table, and not marked as never having one", m)
	}
	l.Want(binID, 1)
	l.Want(binID, 1)
	l.Wait()
	if s := l.Stats(); s.Built != 0 {
		t.Fatalf("two of three wants built a table: %+v", s)
	}
	l.Want(binID, 1)
	l.Want(binID, 5) // past its demand: nothing more
	l.Wait()
	s := l.Stats()
	if s.Built != 1 || s.OnDemand != 1 || s.Tables != 1 {
		t.Fatalf("after three wants: %+v; want one table built on demand", s)
	}
	if m := mappingOf(binID); m.Table == 0 {
		t.Errorf("mapping %+v does not point at the table built on demand", m)
	}
	mu.Lock()
	if told != 0 || toldOnDemand != 1 {
		t.Errorf("Loaded was told of %d tables built on demand as built ahead, %d as on demand; want 0, 1", told, toldOnDemand)
	}
	mu.Unlock()
	l.WantProcess(p.PID)
	l.Wait()
	if s := l.Stats(); s.Lazy != 0 || s.Tables < 2 || s.OnDemand != uint64(s.Tables) {
		t.Errorf("after WantProcess: %+v; want every file's table built, none lazy", s)
	}
	forget(t, l, p.PID)
}

// newTracer loads the eBPF objects, closed when t ends, and returns them
// with a process table of /proc.
func newTracer(t *testing.T) (*tracer.Tracer, *process.Table) {
	t.Helper()
	tr, err := tracer.New(tracer.Options{SamplesPerSecond: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.Close(t, tr) })
	return tr, process.NewTable("/proc", nil, process.Options{})
}
