//go:build amd64

package tracer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// The tests in this file run the unwinder's own functions (native.h: the
// row search table_row/find_row and the per-frame step) in the kernel with
// BPF_PROG_TEST_RUN, through the test programs of support/ebpf/testrun.c,
// on tables loaded by the loader's code and on stacks crafted in this
// process's memory.

type testrunIO = testrunTestrunIo

// testrun is the loaded test object.
type testrun struct {
	FindRowTest  *ebpf.Program `ebpf:"find_row_test"`
	RowCacheTest *ebpf.Program `ebpf:"row_cache_test"`
	StepTest     *ebpf.Program `ebpf:"step_test"`
	SnapshotTest *ebpf.Program `ebpf:"snapshot_test"`
	Tables       *ebpf.Map     `ebpf:"tables"`
	Counters     *ebpf.Map     `ebpf:"counters"`
}

func newTestrun(tb testing.TB) *testrun {
	tb.Helper()
	testutil.RequirePrivileges(tb, "BPF_PROG_TEST_RUN of the unwinder")
	spec, err := loadTestrun()
	if err != nil {
		tb.Fatal(err)
	}
	// The test object declares the tables as the sampler's does, and the
	// loader's limits are those of both.
	sampler, err := support.LoadSonde()
	if err != nil {
		tb.Fatal(err)
	}
	got, want := spec.Maps["tables"], sampler.Maps[support.SondeMapTables]
	if got.MaxEntries != MaxTables || want.MaxEntries != MaxTables ||
		got.InnerMap.ValueSize != uint32(RowSize) || want.InnerMap.ValueSize != uint32(RowSize) {
		tb.Fatalf("tables: test object %d × %d-byte rows, sampler %d × %d, loader %d × %d",
			got.MaxEntries, got.InnerMap.ValueSize, want.MaxEntries, want.InnerMap.ValueSize, MaxTables, RowSize)
	}
	var tr testrun
	if err := spec.LoadAndAssign(&tr, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("load test programs: %+v", ve)
		}
		tb.Fatalf("load test programs: %v", err)
	}
	tb.Cleanup(func() {
		for _, c := range []io.Closer{tr.FindRowTest, tr.RowCacheTest, tr.StepTest, tr.SnapshotTest, tr.Tables, tr.Counters} {
			testutil.Close(tb, c)
		}
	})
	return &tr
}

func ioBytes(io *testrunIO) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(io)), unsafe.Sizeof(*io))
}

// run runs prog once on in and returns what it wrote back.
func (tr *testrun) run(tb testing.TB, prog *ebpf.Program, in testrunIO) testrunIO {
	tb.Helper()
	var out testrunIO
	ret, err := prog.Run(&ebpf.RunOptions{Data: ioBytes(&in), DataOut: ioBytes(&out)})
	if err != nil {
		tb.Fatalf("test run: %v", err)
	}
	if ret != 2 { // XDP_PASS; XDP_ABORTED when the program found no packet or scratch
		tb.Fatalf("test run returned %d, want XDP_PASS", ret)
	}
	return out
}

// counter sums a counter over the CPUs.
func (tr *testrun) counter(tb testing.TB, c support.SondeCounter) uint64 {
	tb.Helper()
	var per []uint64
	if err := tr.Counters.Lookup(uint32(c), &per); err != nil {
		tb.Fatal(err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}

func mustRow(tb testing.TB, pc uint32, cfa uint8, cfaOff int32, fp uint8, fpOff int32) Row {
	tb.Helper()
	r, ok := MakeRow(pc, cfa, cfaOff, fp, fpOff)
	if !ok {
		tb.Fatalf("MakeRow(%#x, %d, %d, %d, %d) refused", pc, cfa, cfaOff, fp, fpOff)
	}
	return r
}

// oracle is the row search on the Go side: the last row at or before rel,
// and where the next row starts (1 << 32 past the last).
func oracle(rows []Row, rel uint64) (Row, uint64, bool) {
	i := sort.Search(len(rows), func(i int) bool { return uint64(rows[i].Pc) > rel })
	if i == 0 {
		return Row{}, 0, false
	}
	next := uint64(1) << 32
	if i < len(rows) {
		next = uint64(rows[i].Pc)
	}
	return rows[i-1], next, true
}

// rowCacheSet is the set of the row cache that offset rel of file's
// table falls in (native.h's cached_row): the test's oracle of which
// offsets share one.
func rowCacheSet(file uint32, rel uint32) uint32 {
	const sets = 2048 / 2 // ROW_CACHE / ROW_CACHE_WAYS
	return (rel ^ rel>>11 ^ file*0x9e3779b1) & (sets - 1)
}

// The row cache keeps both of two offsets that share a set, and a third
// one replaces the one used less recently. A look that finds its row in
// the cache returns the row cached, not the table's: so after the table
// is loaded again with other rows, a hit is told from a search.
func TestRowCacheTwoWays(t *testing.T) {
	tr := newTestrun(t)
	const bias, table, file = 0x7f0012340000, 5, 77
	old := []Row{mustRow(t, 0, CFASP, 8, FPSame, 0)}
	renewed := []Row{mustRow(t, 0, CFASP, 16, FPSame, 0)}
	if err := loadTable(tr.Tables, table, old, nil); err != nil {
		t.Fatal(err)
	}
	// Three offsets of one set.
	a := uint32(0x1230)
	var same []uint32
	for rel := a + 1; len(same) < 2; rel++ {
		if rowCacheSet(file, rel) == rowCacheSet(file, a) {
			same = append(same, rel)
		}
	}
	b, c := same[0], same[1]
	// look returns the CFA offset of the row found for rel: 8 from the
	// first table (cached before it was replaced), 16 from the second.
	look := func(name string, rel uint32) uint16 {
		t.Helper()
		out := tr.run(t, tr.RowCacheTest, testrunIO{Lookup: bias + uint64(rel), Bias: bias, TableId: table, Rows: 1, File: file})
		if out.Found == 0 {
			t.Fatalf("%s (%#x): no row found", name, rel)
		}
		if out.Next != 1<<32 {
			t.Errorf("%s (%#x): the row covers up to %#x, want the end of the table", name, rel, out.Next)
		}
		return out.Row.CfaOffset
	}
	look("a", a)
	look("b", b)
	if err := loadTable(tr.Tables, table, renewed, nil); err != nil {
		t.Fatal(err)
	}
	if got := look("a", a); got != 8 {
		t.Errorf("a after b, which shares its set: CFA offset %d, want the cached 8 (a was replaced)", got)
	}
	if got := look("b", b); got != 8 {
		t.Errorf("b: CFA offset %d, want the cached 8", got)
	}
	// a is now the way used less recently: c replaces it, and b stays.
	if got := look("c", c); got != 16 {
		t.Errorf("c, never looked up: CFA offset %d, want the table's 16", got)
	}
	if got := look("b", b); got != 8 {
		t.Errorf("b after c: CFA offset %d, want the cached 8 (c replaced b, the way used more recently)", got)
	}
	if got := look("a", a); got != 16 {
		t.Errorf("a after c: CFA offset %d, want the table's 16 (c should have replaced a)", got)
	}
	// A mapping without a file handle is searched every time, and what
	// it finds replaces nothing: b's row is still the one cached.
	for range 2 {
		out := tr.run(t, tr.RowCacheTest, testrunIO{Lookup: bias + uint64(b), Bias: bias, TableId: table, Rows: 1})
		if out.Found == 0 || out.Row.CfaOffset != 16 {
			t.Errorf("b of a mapping without a file: found %d, CFA offset %d, want the table's 16", out.Found, out.Row.CfaOffset)
		}
	}
	if got := look("b", b); got != 8 {
		t.Errorf("b after two looks without a file: CFA offset %d, want the cached 8", got)
	}
}

func TestRowSearchTestRun(t *testing.T) {
	tr := newTestrun(t)
	const bias = 0x7f0012340000
	small := []Row{
		mustRow(t, 0x10, CFASP, 8, FPSame, 0),
		mustRow(t, 0x14, CFASP, 16, FPSame, 0),
		mustRow(t, 0x15, CFAFP, 16, FPOffset, -16),
		mustRow(t, 0x40, CFASP, 8, FPSame, 0),
		mustRow(t, 0x1000, CFAEnd, 0, FPSame, 0),
		mustRow(t, 0x1010, CFAUnknown, 0, FPUnknown, 0),
	}
	const smallID, bigID = 1, MaxTables - 1 // the first and the last id there is
	if err := loadTable(tr.Tables, smallID, small, nil); err != nil {
		t.Fatal(err)
	}
	// A table as large as big libraries' (2^20 rows and some: 21 search
	// steps), with random gaps.
	r := rand.New(rand.NewPCG(3, 4))
	big := make([]Row, 1<<20+12345)
	pc := uint32(0x40)
	for i := range big {
		big[i] = mustRow(t, pc, CFASP, int32(8*(i%1000+1)), uint8(i%3), 0)
		pc += 1 + uint32(r.IntN(60))
	}
	if err := loadTable(tr.Tables, bigID, big, nil); err != nil {
		t.Fatal(err)
	}

	if err := loadTable(tr.Tables, 3, make([]Row, MaxTableRows+1), nil); err == nil {
		t.Errorf("a table of %d rows was loaded: the row search does not reach its end", MaxTableRows+1)
	}

	// find returns the row found and where the next one starts.
	find := func(t *testing.T, table uint32, rows uint32, lookup uint64) (Row, uint64, bool) {
		t.Helper()
		out := tr.run(t, tr.FindRowTest, testrunIO{Lookup: lookup, Bias: bias, TableId: table, Rows: rows})
		return Row{Pc: out.Row.Pc, CfaOffset: out.Row.CfaOffset, FpOffset8: out.Row.FpOffset8, Rule: out.Row.Rule}, out.Next, out.Found != 0
	}
	for _, tc := range []struct {
		name   string
		table  uint32
		rows   uint32
		lookup uint64
		want   int // index in small; -1: no row
	}{
		{"first row exactly", smallID, 6, bias + 0x10, 0},
		{"second row exactly", smallID, 6, bias + 0x14, 1},
		{"one-byte row", smallID, 6, bias + 0x15, 2},
		{"between rows", smallID, 6, bias + 0x16, 2},
		{"just before a row", smallID, 6, bias + 0x3f, 2},
		{"last row exactly", smallID, 6, bias + 0x1010, 5},
		{"after the last row", smallID, 6, bias + 0xfffff, 5},
		{"just before the first row", smallID, 6, bias + 0xf, -1},
		{"at the table base, before the first row", smallID, 6, bias, -1},
		{"below the table base", smallID, 6, bias - 1, -1},
		{"4 GiB past the base", smallID, 6, bias + 1<<32, -1},
		{"last 32-bit offset", smallID, 6, bias + 0xffffffff, 5},
		{"empty table", smallID, 0, bias + 0x14, -1},
		{"one-row table", smallID, 1, bias + 0x1010, 0},
		{"no table (id 0)", 0, 6, bias + 0x14, -1},
		{"table id not loaded", 2, 6, bias + 0x14, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, next, ok := find(t, tc.table, tc.rows, tc.lookup)
			if tc.want < 0 {
				if ok {
					t.Errorf("found %+v, want no row", got)
				}
				return
			}
			wantNext := uint64(1) << 32 // the last row of the rows searched
			if tc.want+1 < int(tc.rows) {
				wantNext = uint64(small[tc.want+1].Pc)
			}
			// The row covers at least [its pc, next): up to the next row,
			// or to the end of the lookup's page (the page index's
			// bound), never less than the lookup.
			if rel := tc.lookup - bias; !ok || got != small[tc.want] || next > wantNext || next <= rel {
				t.Errorf("found %+v up to %#x (%v), want row %d %+v up to %#x at most, past %#x", got, next, ok, tc.want, small[tc.want], wantNext, rel)
			}
		})
	}

	t.Run("large table against the Go search", func(t *testing.T) {
		last := uint64(big[len(big)-1].Pc)
		lookups := []uint64{0, 0x3f, 0x40, 0x41, last - 1, last, last + 1, 1<<32 - 1}
		for _, i := range []int{1, 2, 1 << 19, 1 << 20, len(big) - 2} {
			lookups = append(lookups, uint64(big[i].Pc)-1, uint64(big[i].Pc))
		}
		for range 3000 {
			lookups = append(lookups, r.Uint64N(last+100))
		}
		for _, rel := range lookups {
			want, wantNext, wantOK := oracle(big, rel)
			got, next, ok := find(t, bigID, uint32(len(big)), bias+rel)
			if ok != wantOK || got != want || ok && (next > wantNext || next <= rel) {
				t.Fatalf("rel %#x: found %+v up to %#x (%v), the Go search %+v up to %#x (%v)", rel, got, next, ok, want, wantNext, wantOK)
			}
		}
	})
}

// stackPages maps a stack of n pages to craft, followed by a page that
// faults on every read.
func stackPages(t testing.TB, n int) (stack []uint64, base, guard uint64) {
	t.Helper()
	page := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, (n+1)*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Munmap(mem); err != nil {
			t.Error(err)
		}
	})
	if err := unix.Mprotect(mem[n*page:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	// Written in full, so every word is resident: the unwinder's reads do
	// not fault pages in.
	stack = unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), n*page/8)
	for i := range stack {
		stack[i] = 0xdead0000 + uint64(i)
	}
	base = uint64(uintptr(unsafe.Pointer(&mem[0])))
	return stack, base, base + uint64(n*page)
}

func TestUnwindStepTestRun(t *testing.T) {
	tr := newTestrun(t)
	stack, base, guard := stackPages(t, 40)
	word := func(addr uint64) *uint64 { return &stack[(addr-base)/8] }

	const bias = 0x555500000000
	const table, lateTable = 7, 8
	rows := []Row{
		mustRow(t, 0x000, CFASP, 16, FPSame, 0),         // after push rbp
		mustRow(t, 0x100, CFAFP, 16, FPOffset, -16),     // rbp-based frame
		mustRow(t, 0x200, CFASP, 0x20000, FPUnknown, 0), // a 128 KiB frame (offset in words)
		mustRow(t, 0x300, CFAPLT, 8, FPSame, 0),         // .plt stubs
		mustRow(t, 0x400, CFASignal, 0, FPUnknown, 0),   // __restore_rt
		mustRow(t, 0x500, CFAEnd, 0, FPSame, 0),         // _start
		mustRow(t, 0x600, CFAUnknown, 0, FPUnknown, 0),  // a gap
		mustRow(t, 0x700, CFASP, 8, FPOffset, 8),        // rbp saved above the CFA
		mustRow(t, 0x800, CFASP, 0xfff8, FPSame, 0),     // a large offset in bytes
		mustRow(t, 0x900, CFASP, 0x10008, FPOffset, -1024),
	}
	if err := loadTable(tr.Tables, table, rows, nil); err != nil {
		t.Fatal(err)
	}
	if err := loadTable(tr.Tables, lateTable, []Row{mustRow(t, 0x100, CFASP, 8, FPSame, 0)}, nil); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{2, 9} {
		if rows[i].Rule&rowCFAScaled == 0 {
			t.Fatalf("row %+v: a CFA offset past 64 KiB is stored in words", rows[i])
		}
	}

	sp := base + 0x100
	fp := base + 0x200
	*word(sp) = 0x404444                 // RA at CFA-8 for CFA = sp+8
	*word(sp + 8) = 0x401111             // RA at CFA-8 for CFA = sp+16
	*word(sp + 16) = base + 0x380        // RBP at CFA+8 for CFA = sp+8
	*word(fp) = base + 0x300             // saved RBP at CFA-16 for CFA = fp+16
	*word(fp + 8) = 0x402222             // RA at CFA-8 for CFA = fp+16
	*word(sp + 40 + 80) = base + 0x2a0   // signal frame: ucontext at sp, mcontext's rbp
	*word(sp + 40 + 120) = base + 0x2b0  // rsp
	*word(sp + 40 + 128) = 0x7f000040555 // rip
	*word(sp + 0x20000 - 8) = 0x405555   // RA for CFA = sp + 128 KiB
	*word(sp + 0xfff8 - 8) = 0x406666    // RA for CFA = sp + 0xfff8
	*word(sp + 0x10008 - 8) = 0x407777   // RA for CFA = sp + 0x10008
	*word(sp + 0x10008 - 1024) = 0x4242  // RBP at CFA-1024

	type want struct {
		result     uint32
		pc, sp, fp uint64
		adjust     uint32
		flags      uint32
		cfi, fpn   uint32
	}
	const (
		cont     = 0 // STEP_CONTINUE
		done     = 1 // STEP_DONE
		readErr  = uint32(support.SondeSampleFlagsSAMPLE_USER_READ_ERR)
		complete = uint32(support.SondeSampleFlagsSAMPLE_USER_COMPLETE)
		unknown  = uint32(support.SondeSampleFlagsSAMPLE_USER_UNKNOWN_RULE)
		fpFlag   = uint32(support.SondeSampleFlagsSAMPLE_FRAME_POINTERS)
		noAdjust = uint64(support.SondePcFlagsPC_FLAG_NO_ADJUST)
		fpPC     = uint64(support.SondePcFlagsPC_FLAG_FRAME_POINTER)
	)
	for _, tc := range []struct {
		name       string
		pc, lookup uint64 // relative to bias (lookup: as the unwinder computes it)
		sp, fp     uint64
		table      uint32
		want       want
		counter    support.SondeCounter // incremented by the step, if not 0
	}{
		{name: "CFA = RSP + 16, RA at CFA-8, RBP kept",
			pc: 0x10, lookup: 0x10, sp: sp, fp: 0x1234, table: table,
			want: want{cont, 0x401111, sp + 16, 0x1234, 1, 0, 1, 0}},
		{name: "CFA = RBP + 16, RBP saved at CFA-16",
			pc: 0x180, lookup: 0x180, sp: sp, fp: fp, table: table,
			want: want{cont, 0x402222, fp + 16, base + 0x300, 1, 0, 1, 0}},
		{name: "a return address looks up the row before it",
			pc: 0x100, lookup: 0xff, sp: sp, fp: fp, table: table,
			want: want{cont, 0x401111, sp + 16, fp, 1, 0, 1, 0}},
		{name: "CFA offset in words, RBP undefined",
			pc: 0x201, lookup: 0x201, sp: sp, fp: fp, table: table,
			want: want{cont, 0x405555, sp + 0x20000, 0, 1, 0, 1, 0}},
		{name: "a large CFA offset in bytes",
			pc: 0x800, lookup: 0x800, sp: sp, fp: fp, table: table,
			want: want{cont, 0x406666, sp + 0xfff8, fp, 1, 0, 1, 0}},
		{name: "CFA offset in words, RBP far below the CFA",
			pc: 0x9ff, lookup: 0x9ff, sp: sp, fp: fp, table: table,
			want: want{cont, 0x407777, sp + 0x10008, 0x4242, 1, 0, 1, 0}},
		{name: "RBP saved above the CFA",
			pc: 0x700, lookup: 0x700, sp: sp, fp: fp, table: table,
			want: want{cont, 0x404444, sp + 8, base + 0x380, 1, 0, 1, 0}},
		{name: "PLT stub, pc & 15 >= 11: CFA = RSP + 16",
			pc: 0x30b, lookup: 0x30b, sp: sp, fp: fp, table: table,
			want: want{cont, 0x401111, sp + 16, fp, 1, 0, 1, 0}},
		{name: "PLT stub, pc & 15 < 11: CFA = RSP + 8",
			pc: 0x31a, lookup: 0x31a, sp: sp, fp: fp, table: table,
			want: want{cont, 0x404444, sp + 8, fp, 1, 0, 1, 0}},
		{name: "signal frame: registers from the ucontext",
			pc: 0x400, lookup: 0x400, sp: sp, fp: fp, table: table,
			want: want{cont, 0x7f000040555 | noAdjust, base + 0x2b0, base + 0x2a0, 0, 0, 1, 0}},
		{name: "outermost frame",
			pc: 0x500, lookup: 0x500, sp: sp, fp: fp, table: table,
			want: want{done, bias + 0x500, sp, fp, 0, complete, 0, 0}},
		{name: "no usable rule",
			pc: 0x6ff, lookup: 0x6ff, sp: sp, fp: fp, table: table,
			want: want{done, bias + 0x6ff, sp, fp, 0, unknown, 0, 0}, counter: support.SondeCounterCOUNTER_UNWIND_UNKNOWN_RULE},
		{name: "no table: frame pointers",
			pc: 0x10, lookup: 0x10, sp: sp, fp: fp, table: 0,
			want: want{cont, 0x402222 | fpPC, fp + 16, base + 0x300, 1, fpFlag, 0, 1}},
		{name: "before the table's first row: frame pointers",
			pc: 0x10, lookup: 0x10, sp: sp, fp: fp, table: lateTable,
			want: want{cont, 0x402222 | fpPC, fp + 16, base + 0x300, 1, fpFlag, 0, 1}},
		{name: "table not loaded: frame pointers",
			pc: 0x10, lookup: 0x10, sp: sp, fp: fp, table: 9,
			want: want{cont, 0x402222 | fpPC, fp + 16, base + 0x300, 1, fpFlag, 0, 1}},
		{name: "frame pointer below the stack pointer ends the stack",
			pc: 0x10, lookup: 0x10, sp: fp + 8, fp: fp, table: 0,
			want: want{done, bias + 0x10, fp + 8, fp, 0, 0, 0, 0}},
		{name: "frame pointer 0 ends the stack",
			pc: 0x10, lookup: 0x10, sp: sp, fp: 0, table: 0,
			want: want{done, bias + 0x10, sp, 0, 0, 0, 0, 0}},
		{name: "frame link in a page that faults",
			pc: 0x10, lookup: 0x10, sp: sp, fp: guard + 64, table: 0,
			want: want{done, bias + 0x10, sp, guard + 64, 0, readErr, 0, 0}, counter: support.SondeCounterCOUNTER_UNWIND_READ_ERR},
		{name: "return address in a page that faults",
			pc: 0x10, lookup: 0x10, sp: guard - 8, fp: fp, table: table,
			want: want{done, bias + 0x10, guard - 8, fp, 0, readErr, 0, 0}, counter: support.SondeCounterCOUNTER_UNWIND_READ_ERR},
		{name: "saved RBP in a page that faults",
			pc: 0x700, lookup: 0x700, sp: guard - 8, fp: fp, table: table,
			// The failed read clears the register it was reading into.
			want: want{done, bias + 0x700, guard - 8, 0, 0, readErr, 0, 0}, counter: support.SondeCounterCOUNTER_UNWIND_READ_ERR},
		{name: "signal frame in a page that faults",
			pc: 0x400, lookup: 0x400, sp: guard - 64, fp: fp, table: table,
			want: want{done, bias + 0x400, guard - 64, fp, 0, readErr, 0, 0}, counter: support.SondeCounterCOUNTER_UNWIND_READ_ERR},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before uint64
			if tc.counter != 0 {
				before = tr.counter(t, tc.counter)
			}
			in := testrunIO{Pc: bias + tc.pc, Lookup: bias + tc.lookup, Sp: tc.sp, Fp: tc.fp, Bias: bias, TableId: tc.table, Rows: uint32(len(rows))}
			out := tr.run(t, tr.StepTest, in)
			got := want{out.Result, out.OutPc, out.OutSp, out.OutFp, out.Adjust, out.Flags, out.FramesCfi, out.FramesFp}
			if got != tc.want {
				t.Errorf("step from pc %#x sp %#x fp %#x:\n got %#x\nwant %#x", in.Pc, in.Sp, in.Fp, got, tc.want)
			}
			if tc.counter != 0 {
				if after := tr.counter(t, tc.counter); after != before+1 {
					t.Errorf("counter %d went from %d to %d, want one more", tc.counter, before, after)
				}
			}
		})
	}
}

// The per-call cost of the row search in tables of several sizes, and of
// one step, as the kernel times BPF_PROG_TEST_RUN's repeated runs (ns/call;
// ns/op is the test-run syscall's, setup included).
func BenchmarkRowSearchTestRun(b *testing.B) {
	tr := newTestrun(b)
	for i, n := range []int{16, 4096, 1 << 20} {
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			rows := make([]Row, n)
			for j := range rows {
				rows[j] = mustRow(b, uint32(16*j), CFASP, 8, FPSame, 0)
			}
			id := uint32(i + 1)
			if err := loadTable(tr.Tables, id, rows, nil); err != nil {
				b.Fatal(err)
			}
			in := testrunIO{Lookup: uint64(16*(n/3) + 5), TableId: id, Rows: uint32(n)}
			benchmarkTestRun(b, tr.FindRowTest, in)
		})
	}
}

func BenchmarkStepTestRun(b *testing.B) {
	tr := newTestrun(b)
	const n = 4096
	rows := make([]Row, n)
	for j := range rows {
		rows[j] = mustRow(b, uint32(16*j), CFASP, 16, FPSame, 0)
	}
	if err := loadTable(tr.Tables, 1, rows, nil); err != nil {
		b.Fatal(err)
	}
	// Memory that stays where it is (a Go slice can move with its
	// goroutine's stack).
	stack, sp, _ := stackPages(b, 1)
	stack[1] = 0x401000
	stack[2] = sp + 32
	stack[3] = 0x402000
	b.Run("cfi", func(b *testing.B) {
		benchmarkTestRun(b, tr.StepTest, testrunIO{Pc: 16*(n/3) + 5, Lookup: 16*(n/3) + 5, Sp: sp, Fp: sp + 16, TableId: 1, Rows: n})
	})
	b.Run("frame-pointer", func(b *testing.B) {
		benchmarkTestRun(b, tr.StepTest, testrunIO{Pc: 5, Lookup: 5, Sp: sp, Fp: sp + 16})
	})
}

func benchmarkTestRun(b *testing.B, prog *ebpf.Program, in testrunIO) {
	b.Helper()
	var total time.Duration
	for b.Loop() {
		// One syscall runs the program many times; the kernel reports the
		// mean time per run.
		ret, per, err := prog.Benchmark(ioBytes(&in), 1000, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ret != 2 {
			b.Fatalf("test run returned %d, want XDP_PASS", ret)
		}
		total += per
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/call")
}

// take_snapshot copies the stack from SP a page at a time, up to
// SNAPSHOT_BYTES or the first page it cannot read: here the end of a
// mapping, as at the top of a thread's stack. The header names the frame's
// registers, and the record grows by exactly what was copied.
func TestSnapshotTestRun(t *testing.T) {
	tr := newTestrun(t)
	page := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 8*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	for i := 0; i+8 <= len(mem); i += 8 {
		binary.LittleEndian.PutUint64(mem[i:], uint64(i))
	}
	// The last two pages cannot be read: the stack ends 6 pages in.
	if err := unix.Mprotect(mem[6*page:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	for _, tc := range []struct {
		name   string
		at     int // SP's offset in mem
		frames uint32
		want   int // bytes copied
		// A second region from this offset (0: none), and the bytes
		// copied from it.
		at2, want2 int
	}{
		{name: "to the stack's end", at: 5*page + 104, frames: 3, want: page - 104},
		{name: "across pages", at: 3*page + 8, frames: 1, want: 3*page - 8},
		{name: "capped", at: 8, frames: 200, want: MaxSnapshotBytes},
		{name: "past the end", at: 6 * page, frames: 1},
		{name: "second region, capped", at: 5*page + 104, frames: 2, want: page - 104, at2: page + 16, want2: MaxSnapshot2Bytes},
		{name: "second region to its end", at: 8, frames: 2, want: MaxSnapshotBytes, at2: 5*page + 512, want2: page - 512},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := base + uint64(tc.at)
			in := testrunIO{Pc: 0x401000 | pcFlagNoAdjust, Sp: sp, Fp: sp + 64, SnapFrames: tc.frames}
			if tc.at2 != 0 {
				in.Snap2In = base + uint64(tc.at2)
			}
			out := tr.run(t, tr.SnapshotTest, in)
			if tc.want == 0 {
				if out.SnapAdded != 0 || out.Flags&FlagSnapshot != 0 {
					t.Fatalf("added %d bytes, flags %#x: want no snapshot", out.SnapAdded, out.Flags)
				}
				return
			}
			if int(out.SnapAdded) != snapSize+tc.want+tc.want2 || out.Flags&FlagSnapshot == 0 || int(out.Snap.Bytes2) != tc.want2 {
				t.Fatalf("added %d bytes (flags %#x, second region %d bytes), want a %d-byte header and %d+%d bytes",
					out.SnapAdded, out.Flags, out.Snap.Bytes2, snapSize, tc.want, tc.want2)
			}
			if tc.want2 > 0 && (out.Snap.Sp2 != in.Snap2In || out.Snap2First != uint64(tc.at2)) {
				t.Errorf("second region at %#x, first word %#x; want %#x, %#x", out.Snap.Sp2, out.Snap2First, in.Snap2In, tc.at2)
			}
			if tc.want2 == 0 && out.Snap.Sp2 != 0 {
				t.Errorf("no second region asked for, one at %#x", out.Snap.Sp2)
			}
			h := out.Snap
			if h.Pc != 0x401000|pcFlagNoAdjust || h.Sp != sp || h.Fp != sp+64 || h.Frame != 0 || int(h.Bytes) != tc.want {
				t.Errorf("header %+v", h)
			}
			if out.SnapFirst != uint64(tc.at) || out.SnapLast != uint64(tc.at+tc.want-8) {
				t.Errorf("copied words %#x ... %#x, want %#x ... %#x", out.SnapFirst, out.SnapLast, tc.at, tc.at+tc.want-8)
			}
		})
	}
}
