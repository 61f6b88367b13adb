package tracer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

func TestMappingKeysTileTheRange(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ranges := [][2]uint64{
		{0x400000, 0x401000},
		{0x7f0000001000, 0x7f0000203000},
		{0x1, 0x2},
		{0x0, 0x10},
		{0x1234, 0x98765},
		{0xffffffffff600000, 0xffffffffff601000},
	}
	for range 200 {
		a, b := r.Uint64N(1<<47), r.Uint64N(1<<47)
		if a > b {
			a, b = b, a
		}
		if a != b {
			ranges = append(ranges, [2]uint64{a, b})
		}
	}
	for _, rg := range ranges {
		next := rg[0]
		keys := mappingKeys(7, rg[0], rg[1])
		if len(keys) > 128 {
			t.Errorf("%#x-%#x: %d keys, want at most 128", rg[0], rg[1], len(keys))
		}
		for _, k := range keys {
			var b [8]byte
			binary.NativeEndian.PutUint64(b[:], k.AddrBe)
			start := binary.BigEndian.Uint64(b[:])
			size := uint64(1) << (96 - k.Prefixlen)
			if k.Pid != 7 || start != next || start%size != 0 {
				t.Fatalf("%#x-%#x: block %#x/%d does not continue at %#x aligned", rg[0], rg[1], start, k.Prefixlen, next)
			}
			next = start + size
		}
		if next != rg[1] {
			t.Errorf("%#x-%#x: blocks end at %#x", rg[0], rg[1], next)
		}
	}
}

// The kernel's trie finds, for every address, the mapping that covers it.
func TestMappingsLookupInKernel(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	const pid = 4242
	ms := []Mapping{
		{Start: 0x400000, End: 0x401234, Bias: 0x400000, Table: 3, Rows: 10},
		{Start: 0x401234, End: 0x5f0000, Bias: 0x1000, Table: 4, Rows: 20},
		{Start: 0x7f1200003000, End: 0x7f1200187000, Bias: 0x7f1200000000, Table: 5, Rows: 30},
	}
	if err := tr.SetMappings(pid, nil, ms); err != nil {
		t.Fatal(err)
	}
	lookup := func(pid uint32, addr uint64) (support.SondeMappingInfo, bool) {
		var info support.SondeMappingInfo
		key := support.SondeMappingKey{Prefixlen: 96, Pid: pid, AddrBe: bigEndian64(addr)}
		err := tr.objs.Mappings.Lookup(key, &info)
		return info, err == nil
	}
	for _, m := range ms {
		for _, addr := range []uint64{m.Start, m.Start + 1, (m.Start + m.End) / 2, m.End - 1} {
			got, ok := lookup(pid, addr)
			if !ok || got.TableId != m.Table || got.Bias != m.Bias || got.Rows != m.Rows {
				t.Errorf("lookup %#x = %+v, %v; want table %d", addr, got, ok, m.Table)
			}
		}
	}
	for _, addr := range []uint64{0x3fffff, 0x5f0000, 0x7f1200002fff, 0x7f1200187000} {
		if got, ok := lookup(pid, addr); ok {
			t.Errorf("lookup %#x = %+v, want no mapping", addr, got)
		}
	}
	if _, ok := lookup(pid+1, 0x400000); ok {
		t.Error("another pid sees this pid's mapping")
	}
	if err := tr.ForgetProcess(pid, ms); err != nil {
		t.Fatal(err)
	}
	if _, ok := lookup(pid, 0x400000); ok {
		t.Error("mapping still found after ForgetProcess")
	}
	var it = tr.objs.Mappings.Iterate()
	var k support.SondeMappingKey
	var v support.SondeMappingInfo
	if it.Next(&k, &v) {
		t.Errorf("trie not empty after ForgetProcess: %+v", k)
	}
}

// Re-setting a process's mappings leaves the trie holding exactly the new
// ones: kept mappings, changed ones, dropped ones and added ones alike.
func TestSetMappingsReplaces(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	const pid = 4242
	first := []Mapping{
		{Start: 0x400000, End: 0x401234, Bias: 0x400000, Table: 3, Rows: 10},
		{Start: 0x401234, End: 0x5f0000, Bias: 0x1000, Table: 4, Rows: 20},
		{Start: 0x7f1200003000, End: 0x7f1200187000, Bias: 0x7f1200000000, Table: 5, Rows: 30},
	}
	second := []Mapping{
		first[0], // kept
		{Start: 0x401234, End: 0x5f0000, Bias: 0x1000, Table: 9, Rows: 21},                     // same range, new table
		{Start: 0x7f1200003000, End: 0x7f1200100000, Bias: 0x7f1200000000, Table: 5, Rows: 30}, // shrunk
		{Start: 0x7f1300000000, End: 0x7f1300081000, Bias: 0x7f1300000000, Table: 6, Rows: 5},  // added
	}
	contents := func() map[support.SondeMappingKey]support.SondeMappingInfo {
		got := map[support.SondeMappingKey]support.SondeMappingInfo{}
		it := tr.objs.Mappings.Iterate()
		var k support.SondeMappingKey
		var v support.SondeMappingInfo
		for it.Next(&k, &v) {
			got[k] = v
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	expect := func(ms []Mapping) map[support.SondeMappingKey]support.SondeMappingInfo {
		want := map[support.SondeMappingKey]support.SondeMappingInfo{}
		for _, m := range ms {
			for _, k := range mappingKeys(pid, m.Start, m.End) {
				want[k] = support.SondeMappingInfo{Start: m.Start, End: m.End, Bias: m.Bias, TableId: m.Table, Rows: m.Rows}
			}
		}
		return want
	}
	if err := tr.SetMappings(pid, nil, first); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(expect(first), contents()); diff != "" {
		t.Fatalf("first set (-want +got):\n%s", diff)
	}
	if err := tr.SetMappings(pid, first, second); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(expect(second), contents()); diff != "" {
		t.Errorf("second set (-want +got):\n%s", diff)
	}
	if err := tr.SetMappings(pid, second, first); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(expect(first), contents()); diff != "" {
		t.Errorf("back to the first (-want +got):\n%s", diff)
	}
}

// A process's entries are of one generation, and what a CPU cached of
// them is used only under it: setting entries that differ moves it, and
// setting the same ones again (a process read anew whose code did not
// move) keeps it, while the fingerprint is taken anew either way.
func TestSetMappingsGeneration(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	const pid = 4243
	known := func() support.SondeKnownProc {
		t.Helper()
		k, err := tr.knownEntry(pid)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	a := []Mapping{{Start: 0x400000, End: 0x500000, Bias: 0x400000, Table: 3, Rows: 10}}
	b := []Mapping{{Start: 0x400000, End: 0x500000, Bias: 0x400000, Table: 4, Rows: 12}}
	if err := tr.SetMappings(pid, nil, a); err != nil {
		t.Fatal(err)
	}
	gen := known().Gen
	if gen == 0 {
		t.Fatal("first entries of generation 0")
	}
	// As the eBPF side leaves it after a stack: a fingerprint taken.
	k := known()
	k.Fp = 12345
	if err := tr.putKnown(pid, k, true); err != nil {
		t.Fatal(err)
	}
	if err := tr.SetMappings(pid, a, a); err != nil {
		t.Fatal(err)
	}
	if k := known(); k.Gen != gen || k.Fp != 0 {
		t.Errorf("the same entries again: generation %d, fingerprint %d; want %d, 0", k.Gen, k.Fp, gen)
	}
	for _, step := range []struct {
		name     string
		old, new []Mapping
	}{
		{"a table changed", a, b},
		{"a mapping dropped", b, nil},
		{"a mapping added", nil, a},
	} {
		if err := tr.SetMappings(pid, step.old, step.new); err != nil {
			t.Fatal(err)
		}
		if got := known().Gen; got == gen {
			t.Errorf("%s: generation stays %d", step.name, gen)
		} else {
			gen = got
		}
	}
}

func TestLoadTable(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	var rows []Row
	for _, r := range []struct {
		pc     uint32
		cfa    uint8
		cfaOff int32
		fp     uint8
		fpOff  int32
	}{{0, CFASP, 8, FPSame, 0}, {4, CFASP, 16, FPSame, 0}, {40, CFAFP, 16, FPOffset, -16}} {
		row, ok := MakeRow(r.pc, r.cfa, r.cfaOff, r.fp, r.fpOff)
		if !ok {
			t.Fatalf("MakeRow%+v refused", r)
		}
		rows = append(rows, row)
	}
	// copied tells of every row before the table is installed; what the
	// caller then does to rows does not reach it.
	want := slices.Clone(rows)
	var calls []int
	copied := func(n int) {
		calls = append(calls, n)
		if n < len(rows) {
			return
		}
		var inner *ebpf.Map
		if err := tr.objs.Tables.Lookup(uint32(1), &inner); err == nil {
			_ = inner.Close()
			t.Error("table 1 installed before all its rows were copied")
		}
		clear(rows)
	}
	if err := tr.LoadTable(1, rows, copied); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(calls, []int{len(rows)}) {
		t.Errorf("copied told %v, want [%d]", calls, len(rows))
	}
	var inner *ebpf.Map
	if err := tr.objs.Tables.Lookup(uint32(1), &inner); err != nil {
		t.Fatalf("table 1 after LoadTable: %v", err)
	}
	defer func() { _ = inner.Close() }()
	// The memory a table is counted as is what the kernel says it takes.
	checkMemory := func(id uint32, rows []Row) {
		t.Helper()
		var inner *ebpf.Map
		if err := tr.objs.Tables.Lookup(id, &inner); err != nil {
			t.Fatalf("table %d: %v", id, err)
		}
		defer func() { _ = inner.Close() }()
		info, err := inner.Info()
		if err != nil {
			t.Fatalf("table %d: %v", id, err)
		}
		if mem, ok := info.Memlock(); !ok || int64(mem) != TableKernelBytes(TableEntries(rows)) {
			t.Errorf("table %d takes %d bytes (known %v), TableKernelBytes says %d", id, mem, ok, TableKernelBytes(TableEntries(rows)))
		}
	}
	checkMemory(1, want)
	for i, w := range want {
		var got Row
		if err := inner.Lookup(uint32(i), &got); err != nil || got != w {
			t.Errorf("row %d = %+v (%v), want %+v", i, got, err, w)
		}
	}
	// A table of several chunks is told of each.
	big := make([]Row, 2*fillChunk+5)
	for i := range big {
		big[i], _ = MakeRow(uint32(i)*4, CFASP, 8, FPSame, 0)
	}
	var told []int
	if err := tr.LoadTable(2, big, func(n int) { told = append(told, n) }); err != nil {
		t.Fatal(err)
	}
	if w := []int{fillChunk, 2 * fillChunk, len(big)}; !slices.Equal(told, w) {
		t.Errorf("copied told %v for %d rows, want %v", told, len(big), w)
	}
	checkMemory(2, big)
	// Every row went in, the last chunk's too, and the page index after
	// them.
	var inner2 *ebpf.Map
	if err := tr.objs.Tables.Lookup(uint32(2), &inner2); err != nil {
		t.Fatalf("table 2 after LoadTable: %v", err)
	}
	defer func() { _ = inner2.Close() }()
	index := pageIndex(big)
	for i, w := range append(slices.Clone(big), index...) {
		var got Row
		if err := inner2.Lookup(uint32(i), &got); err != nil || got != w {
			t.Fatalf("table 2 entry %d = %+v (%v), want %+v", i, got, err, w)
		}
	}
	calls = nil
	if err := tr.LoadTable(0, want, copied); err == nil {
		t.Error("LoadTable(0) succeeded; id 0 means no table")
	}
	if len(calls) != 0 {
		t.Errorf("copied told %v by a failed load, want nothing", calls)
	}
	if err := tr.UnloadTable(1); err != nil {
		t.Fatal(err)
	}
	if err := tr.UnloadTable(1); err != nil {
		t.Errorf("second UnloadTable = %v, want nil", err)
	}
}

// BenchmarkLoadTable loads a table the size of a big C++ binary's (GCC's
// cc1plus has about 520,000 rows) into the kernel.
func BenchmarkLoadTable(b *testing.B) {
	testutil.RequirePrivileges(b, "loading unwind tables")
	tr, err := New(Options{SamplesPerSecond: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tr.Close() }()
	rows := make([]Row, 520_000)
	for i := range rows {
		rows[i], _ = MakeRow(uint32(i)*16, CFASP, 8, FPSame, 0)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := tr.LoadTable(1, rows, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(TableEntries(rows)), "entries")
}

// ProcessEntries counts a prepared pid once and each block of its mappings
// once; a forgotten pid has none.
func TestProcessEntries(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	ms := map[uint32][]Mapping{
		4242: {{Start: 0x400000, End: 0x401234, Table: 3, Rows: 10}},
		4343: {{Start: 0x7f1200003000, End: 0x7f1200187000, Table: 5, Rows: 30}, {Start: 0x7f1300000000, End: 0x7f1300001000}},
	}
	want := map[uint32]int{}
	for pid, m := range ms {
		if err := tr.SetMappings(pid, nil, m); err != nil {
			t.Fatal(err)
		}
		want[pid] = 1
		for _, mm := range m {
			want[pid] += len(mappingKeys(pid, mm.Start, mm.End))
		}
	}
	got, err := tr.ProcessEntries()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ProcessEntries (-want +got):\n%s", diff)
	}
	if err := tr.ForgetProcess(4242, ms[4242]); err != nil {
		t.Fatal(err)
	}
	delete(want, 4242)
	if got, err = tr.ProcessEntries(); err != nil || !cmp.Equal(want, got) {
		t.Errorf("after forgetting 4242: %v, %v; want %v", got, err, want)
	}
}

// A row packs every rule real code has in 8 bytes, and refuses what it
// cannot hold rather than keep a wrong offset.
func TestMakeRow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfa    uint8
		cfaOff int32
		fp     uint8
		fpOff  int32
		ok     bool
	}{
		{"function entry", CFASP, 8, FPSame, 0, true},
		{"frame pointer set", CFAFP, 16, FPOffset, -16, true},
		{"odd offset in bytes", CFASP, 65535, FPSame, 0, true},
		{"large frame in words", CFASP, 65536 + 8, FPOffset, -1024, true},
		{"largest frame", CFASP, 8 * 65535, FPOffset, 1016, true},
		{"frame too large", CFASP, 8 * 65536, FPSame, 0, false},
		{"large odd frame", CFASP, 65537, FPSame, 0, false},
		{"negative cfa offset", CFASP, -8, FPSame, 0, false},
		{"rbp slot beyond reach", CFAFP, 16, FPOffset, -1032, false},
		{"rbp slot unaligned", CFAFP, 16, FPOffset, -12, false},
		{"signal frame", CFASignal, 0, FPUnknown, 0, true},
		{"end", CFAEnd, 0, FPSame, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := MakeRow(0x1234, tc.cfa, tc.cfaOff, tc.fp, tc.fpOff)
			if ok != tc.ok {
				t.Fatalf("MakeRow ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			cfa, cfaOff, fp, fpOff := RowRule(r)
			if tc.fp != FPOffset {
				tc.fpOff = 0
			}
			if r.Pc != 0x1234 || cfa != tc.cfa || cfaOff != tc.cfaOff || fp != tc.fp || fpOff != tc.fpOff {
				t.Errorf("RowRule(%+v) = %d %d %d %d, want %d %d %d %d", r, cfa, cfaOff, fp, fpOff, tc.cfa, tc.cfaOff, tc.fp, tc.fpOff)
			}
		})
	}
	if RowKernelBytes != 8 {
		t.Errorf("a row takes %d bytes in the kernel, want 8", RowKernelBytes)
	}
}

// Without filters, samples do not look decisions up, so Filter refuses to
// set one rather than have it ignored.
func TestFilterNeedsFilters(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	if err := tr.Filter(4242, ExcludeForever); !errors.Is(err, ErrFiltersOff) {
		t.Errorf("Filter with filters off = %v, want ErrFiltersOff", err)
	}
	on := newTracer(t, Options{SamplesPerSecond: 1, FilterPending: time.Second})
	if err := on.Filter(4242, ExcludeForever); err != nil {
		t.Errorf("Filter with filters on: %v", err)
	}
}

// A table's page index names, for each page from the first row's to
// the last's, the row that covers the page's first byte; an odd count
// leaves the last slot's high half as no entry. A table sparser than a row
// per page gets none.
func TestPageIndex(t *testing.T) {
	row := func(pc uint32) Row { return Row{Pc: pc} }
	entry := func(slots []Row, p int) uint32 {
		s := slots[p/2]
		if p%2 == 0 {
			return s.Pc
		}
		return uint32(s.CfaOffset) | uint32(uint8(s.FpOffset8))<<16 | uint32(s.Rule)<<24
	}
	const pg = 1 << rowPageShift
	rows := []Row{row(0x10), row(pg / 2), row(pg), row(pg + 4), row(3*pg - 4), row(3*pg + 1)}
	slots := pageIndex(rows)
	if len(slots) != 2 || TableEntries(rows) != len(rows)+2 {
		t.Fatalf("%d index slots (%d entries in all) for 4 pages, want 2 (%d)", len(slots), TableEntries(rows), len(rows)+2)
	}
	// Page 0 starts before the first row (its row is checked against the
	// lookup), page 1 at row 2, page 2 in row 3, page 3 in row 4.
	for p, want := range []uint32{0, 2, 3, 4} {
		if got := entry(slots, p); got != want {
			t.Errorf("page %d: row %d, want %d", p, got, want)
		}
	}
	odd := pageIndex(rows[:5]) // pages 0-2
	if len(odd) != 2 || entry(odd, 3) != rowPageNone {
		t.Errorf("3 pages: %d slots, last entry %#x; want 2 slots and no entry after page 2", len(odd), entry(odd, 3))
	}
	if sparse := []Row{row(0), row(256 * pg)}; pageIndex(sparse) != nil || TableEntries(sparse) != 2 {
		t.Errorf("a table of 2 rows over 257 pages got an index")
	}
	if pageIndex(nil) != nil {
		t.Error("an empty table got an index")
	}
}

// A process's known entry carries the runtimes whose walkers are set,
// so that its stacks look in those runtimes' maps only: kept when its
// mappings are set again or it is forgotten and prepared again, cleared by
// Forget and by exec and exit, whose walkers the eBPF side drops.
func TestKnownEntryCarriesRuntimes(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	const pid = 4242
	ms := []Mapping{{Start: 0x400000, End: 0x401234, Bias: 0x400000, Table: 3, Rows: 10}}
	runtimes := func() (uint32, bool) {
		t.Helper()
		k, err := tr.knownEntry(pid)
		if err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return 0, false
			}
			t.Fatal(err)
		}
		return k.Runtimes, true
	}
	const py, rb = 1 << support.SondeRuntimeIdRUNTIME_PYTHON, 1 << support.SondeRuntimeIdRUNTIME_RUBY
	step := func(what string, do func() error, want uint32) {
		t.Helper()
		if err := do(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got, ok := runtimes(); !ok || got != want {
			t.Errorf("after %s: runtimes %#x (entry %v), want %#x", what, got, ok, want)
		}
	}
	// Set before the process is prepared: the entry it gets carries it.
	if err := tr.SetPython(pid, PythonProc{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := runtimes(); ok {
		t.Fatal("SetPython made a known entry")
	}
	step("SetMappings", func() error { return tr.SetMappings(pid, nil, ms) }, py)
	step("SetRuby", func() error { return tr.SetRuby(pid, RubyProc{}) }, py|rb)
	step("SetMappings again", func() error { return tr.SetMappings(pid, ms, ms) }, py|rb)
	step("ForgetPython", func() error { return tr.ForgetPython(pid) }, rb)
	if err := tr.ForgetProcess(pid, ms); err != nil {
		t.Fatal(err)
	}
	step("prepared again", func() error { return tr.SetMappings(pid, nil, ms) }, rb)
	step("SetPython", func() error { return tr.SetPython(pid, PythonProc{}) }, py|rb)
	for _, typ := range []RecordType{RecordExec, RecordExit} {
		if err := tr.noteTask(&Record{Type: typ, PID: pid}, nil); err != nil {
			t.Fatal(err)
		}
		step(fmt.Sprintf("record %v, then SetMappings", typ), func() error { return tr.SetMappings(pid, ms, ms) }, 0)
		step("SetPython", func() error { return tr.SetPython(pid, PythonProc{}) }, py)
	}
}

// A process whose address space keeps changing is not trusted, so each
// stack checks the entries it uses against the live VMAs. The VMA a CPU
// looked up is kept on the entry, where every CPU checks it with plain
// reads instead of looking it up again (bpf_find_vma's unlock is an IPI).
func TestEntryKeepsTheVMAFound(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 499})
	if !tr.CheckedMappings() {
		t.Skip("the kernel has no bpf_find_vma: entries are not checked")
	}
	text := ownText(t)
	pid := uint32(os.Getpid())
	m := Mapping{Start: text.start, End: text.end, FileBias: text.start - text.offset, Inode: text.inode}
	if err := tr.SetMappings(pid, nil, []Mapping{m}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.ForgetProcess(pid, []Mapping{m}) })
	stop := make(chan struct{})
	defer close(stop)
	<-burn(stop, false)
	// The first stack after SetMappings takes the address space's sequence
	// as the entries' fingerprint, and any change after it leaves them
	// untrusted: a page mapped and unmapped at each look is enough.
	//
	// The text is held as several prefix blocks of the trie, each with its
	// own copy of the entry: the VMA is kept on the block a sample's PC was
	// in, so every block is looked at.
	var info support.SondeMappingInfo
	keys := mappingKeys(pid, text.start, text.end)
	found := func() bool {
		for _, k := range keys {
			if err := tr.objs.Mappings.Lookup(k, &info); err != nil {
				t.Fatal(err)
			}
			if info.Vma != 0 {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(20 * time.Second)
	for !found() && time.Now().Before(deadline) {
		b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Munmap(b); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if info.Vma == 0 {
		c, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		t.Fatalf("no stack kept the VMA of %+v on its entry's %d blocks in 20 s (samples %d, frames by frame pointers %d, VMA check busy %d, stale entries %d)",
			text, len(keys), c.Samples, c.FramesFP, c.VMACheckBusy, c.StaleMappings)
	}
	if info.Vstart != text.start || info.Vend != text.end {
		t.Errorf("entry keeps VMA %#x-%#x, the executable's text is %#x-%#x", info.Vstart, info.Vend, text.start, text.end)
	}
	// Where VMAs have a write sequence, the entry keeps it, and checks
	// read the VMA's first cache line alone while it holds: a text mapped
	// at exec was write-locked as it was linked, so it is never the value
	// of a VMA no writer has locked.
	if kernelVMAHasLockSeq(t) && (info.Vseq == 0 || info.Vseq == ^uint32(0)) {
		t.Errorf("entry keeps VMA sequence %#x, want the text's vm_lock_seq", info.Vseq)
	}
	t.Logf("entry keeps VMA %#x %#x-%#x, sequence %#x", info.Vma, info.Vstart, info.Vend, info.Vseq)
}

// kernelVMAHasLockSeq says whether the kernel's struct vm_area_struct has
// vm_lock_seq (per-VMA locks: 6.4 on, where the kernel is built with them).
func kernelVMAHasLockSeq(t *testing.T) bool {
	t.Helper()
	return kernelMember(t, "vm_area_struct", "vm_lock_seq") != nil
}

// kernelMMHasLockSeq says whether the kernel's struct mm_struct has the
// sequence the eBPF side takes a process's fingerprint from
// (mm_fingerprint: a seqcount_t mm_lock_seq, 6.13 on).
func kernelMMHasLockSeq(t *testing.T) bool {
	t.Helper()
	m := kernelMember(t, "mm_struct", "mm_lock_seq")
	if m == nil {
		return false
	}
	_, ok := btf.UnderlyingType(m.Type).(*btf.Struct)
	return ok
}

// kernelMember returns member name of the kernel's struct strct, or nil;
// members of its anonymous structs and unions are its own.
func kernelMember(t *testing.T, strct, name string) *btf.Member {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	var s *btf.Struct
	if err := spec.TypeByName(strct, &s); err != nil {
		t.Fatal(err)
	}
	var find func(ms []btf.Member) *btf.Member
	find = func(ms []btf.Member) *btf.Member {
		for i := range ms {
			m := &ms[i]
			if m.Name == name {
				return m
			}
			if m.Name != "" {
				continue
			}
			var found *btf.Member
			switch u := btf.UnderlyingType(m.Type).(type) {
			case *btf.Struct:
				found = find(u.Members)
			case *btf.Union:
				found = find(u.Members)
			}
			if found != nil {
				return found
			}
		}
		return nil
	}
	return find(s.Members)
}

func TestKnownSlotsFor(t *testing.T) {
	for _, tc := range []struct{ maxProcesses, pidMax, want uint32 }{
		{65536, 32768, 32768},     // every pid its own slot
		{65536, 4194304, 65536},   // bounded
		{4 << 20, 4 << 20, 65536}, // bounded
		{1000, 4194304, 1024},     // a power of two
		{65536, 0, 65536},         // pid_max not known
		{3, 5, 4},
		{1, 0, 1},
		{0, 0, 1},
	} {
		if got := knownSlotsFor(tc.maxProcesses, tc.pidMax); got != tc.want {
			t.Errorf("knownSlotsFor(%d, %d) = %d, want %d", tc.maxProcesses, tc.pidMax, got, tc.want)
		}
	}
}

// A process whose slot in known_slots another one holds has its entry in
// known_pids, where the eBPF side finds it: its first stack takes the
// fingerprint there, and the other's slot is left as it was. Once the slot
// is free, setting its entries again moves the entry there, and known_pids
// keeps none.
func TestKnownEntryInSharedSlot(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 499})
	if !kernelMMHasLockSeq(t) {
		t.Skip("the kernel's mm_struct has no mm_lock_seq sequence: stacks take no fingerprint to find the entry by")
	}
	ch := records(t, tr)
	pid := uint32(os.Getpid())
	other := pid + tr.knownMask + 1 // the same slot
	text := ownText(t)
	mine := []Mapping{{Start: text.start, End: text.end, FileBias: text.start - text.offset, Inode: text.inode, NoTable: true}}
	theirs := []Mapping{{Start: 0x400000, End: 0x401000, Bias: 0x400000, Table: 3, Rows: 10}}
	if err := tr.SetMappings(other, nil, theirs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.ForgetProcess(other, theirs) })
	if err := tr.SetMappings(pid, nil, mine); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.ForgetProcess(pid, mine) })
	inSlot := func() (support.SondeKnownProc, error) {
		var k support.SondeKnownProc
		err := tr.objs.KnownSlots.Lookup(pid&tr.knownMask, &k)
		return k, err
	}
	inHash := func() (support.SondeKnownProc, error) {
		var k support.SondeKnownProc
		err := tr.objs.KnownPids.Lookup(pid, &k)
		return k, err
	}
	if k, err := inSlot(); err != nil || k.Pid != other {
		t.Fatalf("slot holds pid %d (%v), want the first one set, %d", k.Pid, err, other)
	}
	if _, err := inHash(); err != nil {
		t.Fatalf("no known_pids entry for the pid whose slot is taken: %v", err)
	}
	entries, err := tr.ProcessEntries()
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + len(mappingKeys(pid, text.start, text.end)); entries[pid] != want {
		t.Errorf("%d entries for the pid, want %d", entries[pid], want)
	}
	stop := make(chan struct{})
	defer close(stop)
	tid := <-burn(stop, false)
	fingerprinted := func(where string, read func() (support.SondeKnownProc, error)) {
		t.Helper()
		waitFor(t, ch, 10*time.Second, "stack taking its fingerprint in "+where, func(r Record) bool {
			if r.Type != RecordSample || int(r.TID) != tid {
				return false
			}
			k, err := read()
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			return k.Fp != 0
		})
	}
	fingerprinted("known_pids", inHash)
	if k, err := inSlot(); err != nil || k.Pid != other || k.Fp != 0 {
		t.Errorf("the other pid's slot: %+v (%v), want its own, without a fingerprint", k, err)
	}

	if err := tr.ForgetProcess(other, theirs); err != nil {
		t.Fatal(err)
	}
	if err := tr.SetMappings(pid, mine, mine); err != nil {
		t.Fatal(err)
	}
	if k, err := inSlot(); err != nil || k.Pid != pid || k.Fp != 0 {
		t.Fatalf("slot after the other pid left: %+v (%v), want the pid's, without a fingerprint yet", k, err)
	}
	if _, err := inHash(); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("known_pids still holds the pid (%v)", err)
	}
	fingerprinted("its slot", inSlot)
}

// textMapping is the executable mapping of this test binary.
type textMapping struct{ start, end, offset, inode uint64 }

func ownText(t *testing.T) textMapping {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != exe || !strings.Contains(f[1], "x") {
			continue
		}
		var m textMapping
		if _, err := fmt.Sscanf(f[0]+" "+f[2]+" "+f[4], "%x-%x %x %d", &m.start, &m.end, &m.offset, &m.inode); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return m
	}
	t.Fatalf("no executable mapping of %s in /proc/self/maps", exe)
	return textMapping{}
}

// Each CPU's unwinders keep their rows in their own part of the row cache,
// a plain array of every possible CPU's entries one after another (the
// off-CPU unwinder's half only where it is on): a stack sampled on the
// last online CPU leaves the rows it found in that CPU's part.
func TestRowCacheOfEachCPU(t *testing.T) {
	spec, err := support.LoadSonde()
	if err != nil {
		t.Fatal(err)
	}
	perCPU := spec.Maps[support.SondeMapRowCache].MaxEntries / 2 // ROW_CACHE: one unwinder's
	possible, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	off := newTracer(t, Options{SamplesPerSecond: 19, OffCPUThreshold: 1})
	if got, want := off.objs.RowCache.MaxEntries(), 2*perCPU*uint32(possible); got != want {
		t.Errorf("row cache with off-CPU on holds %d entries, want %d (%d CPUs)", got, want, possible)
	}
	if err := off.Close(); err != nil {
		t.Fatal(err)
	}

	tr := newTracer(t, Options{SamplesPerSecond: 499})
	if got, want := tr.objs.RowCache.MaxEntries(), perCPU*uint32(possible); got != want {
		t.Fatalf("row cache holds %d entries, want %d (%d CPUs)", got, want, possible)
	}
	cpus, err := onlineCPUs()
	if err != nil {
		t.Fatal(err)
	}
	cpu := cpus[len(cpus)-1]
	// One row for the whole text, as a table of Go code built with frame
	// pointers has after each prologue.
	const table, file = 9, 77
	row, ok := MakeRow(0, CFAFP, 16, FPOffset, -16)
	if !ok {
		t.Fatal("MakeRow refused the frame-pointer rule")
	}
	if err := tr.LoadTable(table, []Row{row}, nil); err != nil {
		t.Fatal(err)
	}
	text := ownText(t)
	pid := uint32(os.Getpid())
	m := Mapping{Start: text.start, End: text.end, Bias: text.start, FileBias: text.start - text.offset,
		Inode: text.inode, Table: table, Rows: 1, File: file}
	if err := tr.SetMappings(pid, nil, []Mapping{m}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.ForgetProcess(pid, []Mapping{m}) })

	stop := make(chan struct{})
	defer close(stop)
	pinned := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		pinned <- unix.SchedSetaffinity(0, &set)
		for x := 0; ; x++ {
			select {
			case <-stop:
				return
			default:
			}
			for i := range 100000 {
				x += i
			}
		}
	}()
	if err := <-pinned; err != nil {
		t.Fatal(err)
	}
	first := uint32(cpu) * perCPU
	var e support.SondeRowCacheEntry
	found := func() bool {
		for i := first; i < first+perCPU; i++ {
			if err := tr.objs.RowCache.Lookup(i, &e); err != nil {
				t.Fatal(err)
			}
			if e.File == file && e.TableId == table {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(20 * time.Second)
	for !found() {
		if time.Now().After(deadline) {
			c, err := tr.Counters()
			if err != nil {
				t.Fatal(err)
			}
			t.Fatalf("no row of table %d in CPU %d's part of the row cache (entries %d..%d) in 20 s (samples %d, frames by CFI %d, by frame pointers %d)",
				table, cpu, first, first+perCPU-1, c.Samples, c.FramesCFI, c.FramesFP)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e.Row != row {
		t.Errorf("CPU %d cached row %+v, the table's is %+v", cpu, e.Row, row)
	}
}

// The pace notify_unknown allows per process (record.h): NOTIFY_GAP_NS, and
// NOTIFY_STALE_GAP_NS for a stale entry or a V8 process's second mapping of
// its builtins.
const (
	notifyGap      = time.Second
	notifyStaleGap = 50 * time.Millisecond
)

// A V8 process maps its builtins a second time as it starts, after the
// exec that had user space read it. Until user space has an entry for that
// mapping, frames there in a stack that has had its one look at a VMA
// cannot be placed, and are taken for compiled code: it is asked for at a
// stale entry's pace, not once a second. Every stack that finds it in a
// CPU's mapping cache asks too, so a first sighting within the gap (after
// which the CPU keeps it) does not leave it unasked for.
//
// remap maps the page of its own text that holds a loop again and runs the
// loop there; the test gives it entries for every other file mapping, tells
// the kernel it runs a V8 whose builtins are that text, and marks it as
// asked about just now.
func TestV8SecondMappingAskedForSoon(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 499})
	if !tr.CheckedMappings() {
		t.Skip("the kernel has no bpf_find_vma: no V8 walker")
	}
	cmd := exec.Command(testutil.BuildC(t, "remap", []string{"-O2"}, "testdata/remap.c"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartCmd(t, cmd)
	sc := bufio.NewScanner(stdout)
	var copyAt uint64
	if !sc.Scan() {
		t.Fatalf("remap said nothing: %v", sc.Err())
	}
	if _, err := fmt.Sscanf(sc.Text(), "%x", &copyAt); err != nil {
		t.Fatalf("remap said %q: %v", sc.Text(), err)
	}
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("remap said %q, want ready", sc.Text())
	}
	pid := uint32(cmd.Process.Pid)
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	maps, err := process.ParseMaps(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var second, text process.Mapping
	var entries []Mapping
	for _, m := range maps {
		if m.Start == copyAt {
			second = m
		} else if m.Inode != 0 {
			entries = append(entries, Mapping{Start: m.Start, End: m.End, FileBias: m.Start - m.Offset, Inode: m.Inode, NoTable: true})
		}
	}
	for _, m := range maps {
		if m.Start != copyAt && m.Inode == second.Inode && strings.Contains(m.Perms, "x") {
			text = m
		}
	}
	if second.Inode == 0 || text.Inode == 0 || second.Offset < text.Offset || second.Offset >= text.Offset+(text.End-text.Start) {
		t.Fatalf("remap's second mapping %+v is not of its text %+v", second, text)
	}
	if err := tr.SetMappings(pid, nil, entries); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.ForgetProcess(pid, entries) })
	v8 := V8Proc{Nbuiltins: 1, BuiltinInode: text.Inode, BuiltinOffStart: text.Offset, BuiltinOffEnd: text.Offset + (text.End - text.Start)}
	v8.BuiltinStart[0], v8.BuiltinEnd[0] = text.Start, text.End
	if err := tr.SetV8(pid, v8); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.ForgetV8(pid) })

	notices := make(chan Record, 64)
	go func() {
		for {
			var rec Record
			if err := tr.ReadNotice(&rec); err != nil {
				return // closed at the end of the test
			}
			if rec.PID == pid {
				notices <- rec
			}
		}
	}()
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		t.Fatal(err)
	}
	asked := uint64(now.Nano())
	if err := tr.objs.Notified.Put(pid, asked); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "run\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case rec := <-notices:
			if rec.KTime < asked {
				continue // asked about before the mark (a new process)
			}
			after := time.Duration(rec.KTime - asked)
			t.Logf("asked about remap's second mapping %v after the last time", after)
			if after < notifyStaleGap || after >= notifyGap {
				t.Errorf("asked about remap %v after the last time, want within [%v, %v)", after, notifyStaleGap, notifyGap)
			}
			return
		case <-deadline:
			c, _ := tr.Counters()
			t.Fatalf("no notice for remap in 10 s of running in its second mapping (samples %d, unknown sent %d, V8 samples %d)",
				c.Samples, c.UnknownSent, c.V8Samples)
		}
	}
}
