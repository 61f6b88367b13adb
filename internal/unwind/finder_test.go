package unwind

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// finderFiles are real files of every kind a table is built from: glibc
// (and its loader, whose entry has no CFI), Go with and without cgo (and
// with it for arm64, where the cross compiler is), a C++
// compiler with hundreds of thousands of rows, and every linker layout.
func finderFiles(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{
		"libc":   "/lib/x86_64-linux-gnu/libc.so.6",
		"ld.so":  "/lib64/ld-linux-x86-64.so.2",
		"go-cgo": testutil.BuildWorkload(t, testutil.GoCgo),
		"go":     testutil.BuildWorkload(t, testutil.GoChain),
	}
	if exe, err := os.Executable(); err == nil {
		files["go-test-binary"] = exe
	}
	// arm64's cgo call and callback, whose rows come from their code.
	if _, err := exec.LookPath(testutil.CrossCC); err == nil || testutil.InCI() {
		files["go-cgo-arm64"] = testutil.BuildWorkloadARM64(t, testutil.GoCall)
		files["go-callback-arm64"] = testutil.BuildWorkloadARM64(t, testutil.GoCgo)
	}
	if out, err := exec.Command("g++", "-print-prog-name=cc1plus").Output(); err == nil {
		if p := filepath.Clean(string(out[:len(out)-1])); filepath.IsAbs(p) {
			files["cc1plus"] = p
		}
	}
	for _, l := range testutil.Layouts() {
		files[l.Name] = testutil.BuildLayout(t, l)
	}
	return files
}

// A Finder's row at a file offset is the row the file's table holds there,
// for every row of the table: at its first offset, and just before the
// next row.
func TestFinderMatchesTable(t *testing.T) {
	for name, path := range finderFiles(t) {
		t.Run(name, func(t *testing.T) {
			if _, err := os.Stat(path); err != nil {
				t.Skipf("no %s here: %v", path, err)
			}
			lf, rows, mem := buildFile(path, nil, zap.NewNop())
			if lf.err != nil {
				t.Fatalf("build: %v", lf.err)
			}
			// The kernel rows alias the build's buffers: copy them out.
			rows = append([]tracer.Row(nil), rows...)
			mem.run()
			fd, err := NewFinder(path, nil, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			defer fd.Close()
			if off := lf.base; off > 0 {
				if _, ok := fd.Row(off - 1); ok {
					t.Errorf("offset %#x, below the table: the finder has a row", off-1)
				}
			}
			checked, bad := 0, 0
			for i, r := range rows {
				offs := []uint64{lf.base + uint64(r.Pc)}
				if i+1 < len(rows) && rows[i+1].Pc > r.Pc+1 {
					offs = append(offs, lf.base+uint64(rows[i+1].Pc)-1)
				}
				for _, off := range offs {
					got, ok := fd.Row(off)
					checked++
					if !ok || got.Rule != r.Rule || got.CfaOffset != r.CfaOffset || got.FpOffset8 != r.FpOffset8 {
						bad++
						if bad <= 5 {
							t.Errorf("offset %#x: finder %+v (found %v), table %+v", off, got, ok, r)
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d offsets differ", bad, checked)
			}
			t.Logf("%d rows, %d offsets checked", len(rows), checked)
		})
	}
}

// Offsets past every row and in no executable segment are unknown, not
// missing: the table's closing row covers them.
func TestFinderOutsideCode(t *testing.T) {
	fd, err := NewFinder("/lib/x86_64-linux-gnu/libc.so.6", nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	code := append([]segment(nil), fd.code...)
	sort.Slice(code, func(i, j int) bool { return code[i].off < code[j].off })
	last := code[len(code)-1]
	r, ok := fd.Row(last.off + last.filesz + 4096)
	if !ok || r.Rule&0x0f != tracer.CFAUnknown {
		t.Errorf("past the code: %+v (found %v), want an unknown rule", r, ok)
	}
}

func TestFinderNoCFI(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(path, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := NewFinder(path, nil, zap.NewNop()); err == nil {
		t.Error("a file that is not ELF opened")
	}
}

// A Finder reads a few places of a Go binary's pclntab for each row, and
// each read maps the 64 KiB around it: the pages go every few rows, so
// many rows hold few of them.
func TestFinderHoldsFewPages(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	before := testutil.StatusKiB(t, "RssFile")
	fd, err := NewFinder(self, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if len(fd.code) == 0 || fd.gt == nil {
		t.Fatal("the test binary has no code or no pclntab")
	}
	code := fd.code[0]
	const rows = 200
	for i := range uint64(rows) {
		if _, ok := fd.Row(code.off + i*(code.filesz/rows)); !ok {
			t.Fatalf("no row at file offset %#x of the test binary's code", code.off+i*(code.filesz/rows))
		}
	}
	if grew := testutil.StatusKiB(t, "RssFile") - before; grew > 1024 {
		t.Errorf("a Finder and %d rows of the test binary left %d KiB of file pages in the process, want at most 1024", rows, grew)
	}
}

// A compressed .debug_frame (an unstripped Go binary's) is inflated
// outside the heap: a Finder holds it for its whole life, and in the heap
// it would count twice towards the collector's goal.
func TestFinderInflatesOutsideHeap(t *testing.T) {
	self := testutil.BuildWorkload(t, testutil.GoChain) // go build keeps DWARF, compressed
	f, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	s := f.Section(".debug_frame")
	f.Close()
	if s == nil || s.Flags&elf.SHF_COMPRESSED == 0 {
		t.Fatal("go build wrote no compressed .debug_frame")
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	fd, err := NewFinder(self, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if fd.dbg == nil || uint64(len(fd.dbg.data)) != s.Size {
		t.Fatalf("the Finder's .debug_frame is not the %d inflated bytes", s.Size)
	}
	if grew := int64(heap()) - int64(before); grew > int64(s.Size)/2 {
		t.Errorf("a Finder grew the heap by %d bytes, with %d bytes of .debug_frame inflated: want them outside the heap", grew, s.Size)
	}
	runtime.KeepAlive(fd)
}
