package symbolize

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// heapNow is the live heap after a collection.
func heapNow() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// allocatedSince is how many bytes were allocated since ms was read.
func allocatedSince(ms *runtime.MemStats) int64 {
	var now runtime.MemStats
	runtime.ReadMemStats(&now)
	return int64(now.TotalAlloc - ms.TotalAlloc)
}

// A 60 KB program whose .gnu_debugdata inflates to 300 MB: its MiniDebugInfo
// is refused by the per-file cap, once, counted, after inflating no more
// than the cap, and without keeping more than a few MiB; the program is
// still named from .dynsym, and loading it again after an eviction does not
// inflate anything again.
func TestDecompressionBomb(t *testing.T) {
	objcopy := testutil.RequireTool(t, "objcopy")
	xz := testutil.RequireTool(t, "xz")
	dir := t.TempDir()
	bin := testutil.BuildC(t, "cprog", []string{"-O2", "-rdynamic", "-s"}, testdata("cprog.c"))
	// The payload starts like an ELF file and goes on with 300 MB of zeros.
	payload := filepath.Join(dir, "payload.xz")
	out, err := os.Create(payload)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", `{ cat "$1"; head -c 300M /dev/zero; } | "$2" -T1 -1 -c`, "sh", bin, xz)
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("building the payload: %v\n%s", err, stderr.String())
	}
	out.Close()
	run(t, nil, objcopy, "--add-section", ".gnu_debugdata="+payload, bin)
	if fi, err := os.Stat(bin); err != nil || fi.Size() > 200<<10 {
		t.Fatalf("bomb file: %v, %d bytes", err, fi.Size())
	}
	main := pick(t, nmFunctions(t, bin, true), "main")[0]
	off := vaddrToOffset(t, bin, main.addr+1)
	other, otherOffs := cFixture(t)

	s := New(zaptest.NewLogger(t), Options{MaxFiles: 1, DebugDirs: []string{}})
	h, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	heap0 := heapNow()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	lines, err := s.Symbolize(h.ID, off)
	allocated := allocatedSince(&before)
	held := heapNow() - heap0
	if err != nil || len(lines) != 1 || lines[0].Function != "main" {
		t.Fatalf("Symbolize(main) = %+v, %v; want main from .dynsym", lines, err)
	}
	const budget = 64 << 20
	if allocated > budget {
		t.Errorf("loading the bomb allocated %d MiB, want at most %d", allocated>>20, budget>>20)
	}
	if held > 4<<20 {
		t.Errorf("the bomb's symbol data holds %d KiB of heap", held>>10)
	}
	if st := s.Stats(); st.InflateRefused != 1 {
		t.Errorf("InflateRefused = %d, want 1", st.InflateRefused)
	}
	t.Logf("first load allocated %d KiB, holds %d KiB", allocated>>10, held>>10)

	// Another file evicts it (MaxFiles 1); the next lookup loads it again
	// without inflating the payload again.
	oh, err := s.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	defer oh.Release()
	if _, err := s.Symbolize(oh.ID, otherOffs["a"]); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&before)
	if _, err := s.Symbolize(h.ID, off+1); err != nil {
		t.Fatal(err)
	}
	again := allocatedSince(&before)
	st := s.Stats()
	if st.FilesLoaded != 3 || st.FilesEvicted < 2 {
		t.Fatalf("loaded %d, evicted %d: the bomb was not loaded again", st.FilesLoaded, st.FilesEvicted)
	}
	if again > 1<<20 || st.InflateRefused != 1 {
		t.Errorf("loading it again allocated %d KiB and refused %d times in all; want < 1 MiB and 1", again>>10, st.InflateRefused)
	}
}

// LoadedBytes tells the truth: after real files (libc, with its separate
// debug file when libc6-dbg is installed, a C++ program with DWARF, this
// Go test binary) are loaded and used, it matches the memory the
// Symbolizer holds, the live heap and the read-only anonymous mappings
// compressed DWARF is inflated into, and big symbol sources read in place
// cost little.
func TestLoadedBytesMatchesHeap(t *testing.T) {
	cxx := testutil.BuildCXX(t, "cxxprog", []string{"-O2", "-g"}, testdata("cxxprog.cc"))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	files := []string{cxx, self}
	if libc := mappedLibc(t); libc != "" {
		files = append(files, libc)
	}
	heap0, anon0 := heapNow(), anonReadOnlyBytes(t)
	// A budget that admits libc's DWARF (about 8 MB of inflated sections)
	// when its debug file is installed.
	s := New(zaptest.NewLogger(t), Options{MaxSymbolBytes: 128 << 20})
	var handles []*Handle
	var selfBytes int64
	for _, p := range files {
		h, err := s.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		handles = append(handles, h)
		fi, _ := os.Stat(p)
		before := s.Stats().LoadedBytes
		// Lookups across the file, as a profile of it would make.
		for i := range int64(512) {
			_, _ = s.Symbolize(h.ID, uint64(fi.Size()*i/512))
		}
		if p == self {
			selfBytes = s.Stats().LoadedBytes - before
		}
	}
	heap, anon := heapNow()-heap0, anonReadOnlyBytes(t)-anon0
	held := heap + anon
	st := s.Stats()
	t.Logf("%d files, %d lookups: LoadedBytes %d KiB, held %d KiB (heap %d KiB, inflated sections %d KiB)",
		len(files), st.Lookups, st.LoadedBytes>>10, held>>10, heap>>10, anon>>10)
	if st.LoadedBytes <= 0 {
		t.Fatal("nothing accounted")
	}
	if lo, hi := held*2/3-64<<10, held*3/2+64<<10; st.LoadedBytes < lo || st.LoadedBytes > hi {
		t.Errorf("LoadedBytes = %d KiB, the memory held is %d KiB: want within [2/3, 3/2] of it", st.LoadedBytes>>10, held>>10)
	}
	// This binary's pclntab and symbol table are read in place: what it
	// costs is its lookups' cache entries and a small index.
	ef, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	if pcln := ef.Section(".gopclntab"); pcln == nil || selfBytes > int64(pcln.Size)/8 {
		t.Errorf("this binary costs %d KiB of heap, its .gopclntab is %v: not read in place?", selfBytes>>10, pcln)
	}
	for _, h := range handles {
		h.Release()
	}
	runtime.KeepAlive(s)
}

// mappedLibc returns the path of the libc this process maps, if any (the
// test binary may be static).
func mappedLibc(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, "/"); i >= 0 && strings.Contains(line, "/libc.so") {
			return line[i:]
		}
	}
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// A file whose DWARF index alone would take more than half the budget is
// named from its symbols, without lines: libc's debug file (libc6-dbg)
// takes about 8 MB, its compressed sections inflated.
func TestDWARFIndexBoundedByBudget(t *testing.T) {
	libc := mappedLibc(t)
	if libc == "" {
		t.Skip("no libc")
	}
	qsort := pick(t, nmFunctions(t, libc, true), "qsort")[0]
	off := vaddrToOffset(t, libc, qsort.addr+qsort.size/2)
	lookup := func(budget int64) []Line {
		s := New(zaptest.NewLogger(t), Options{MaxSymbolBytes: budget})
		h, err := s.Open(libc)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		lines, err := s.Symbolize(h.ID, off)
		if err != nil || len(lines) == 0 {
			t.Fatalf("Symbolize(qsort) with a %d MiB budget = %v, %v", budget>>20, lines, err)
		}
		if st := s.Stats(); st.LoadedBytes > budget {
			t.Errorf("%d bytes held with a %d MiB budget", st.LoadedBytes, budget>>20)
		}
		return lines
	}
	full := lookup(64 << 20) // the default
	if full[0].Line == 0 {
		t.Skip("libc has no DWARF here (libc6-dbg not installed)")
	}
	small := lookup(16 << 20)
	if len(small) != 1 || small[0].Line != 0 || !strings.Contains(small[0].Function, "qsort") {
		t.Errorf("with a 16 MiB budget qsort is %+v, want it named from symbols without a line (with 64 MiB: %+v)", small, full)
	}
}

// Lookups from many goroutines while files are evicted (and unmapped)
// under them: a mapping goes only when no lookup reads it, and every
// answer stays right.
func TestConcurrentLookupsWhileEvicting(t *testing.T) {
	bin1, offs1 := cFixture(t)
	bin2, offs2 := cFixture(t, "-g")
	s := New(zaptest.NewLogger(t), Options{MaxFiles: 1, MaxCachedAddrs: 1})
	h1, err := s.Open(bin1)
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Release()
	h2, err := s.Open(bin2)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Release()
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				h, offs := h1, offs1
				if (g+i)%2 == 1 {
					h, offs = h2, offs2
				}
				name := []string{"a", "b", "c"}[i%3]
				lines, err := s.Symbolize(h.ID, offs[name])
				if err != nil || len(lines) == 0 || lines[len(lines)-1].Function != name {
					select {
					case errs <- fmt.Sprintf("Symbolize(%s) = %+v, %v", name, lines, err):
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if st := s.Stats(); st.FilesEvicted == 0 {
		t.Errorf("no eviction happened (%d loads): nothing was exercised", st.FilesLoaded)
	}
}
