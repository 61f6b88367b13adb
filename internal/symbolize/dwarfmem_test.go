package symbolize

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// anonReadOnlyBytes is the size of this process's read-only anonymous
// mappings and spilled ones (elfx.MapSpill): where inflated DWARF
// sections are kept, outside the heap.
func anonReadOnlyBytes(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		anon := len(f) == 5 && f[1] == "r--p" && f[4] == "0"
		// A spilled mapping (elfx.MapSpill): a shared read-only mapping of
		// an unlinked spill file.
		spilled := len(f) == 7 && f[1] == "r--s" && strings.Contains(f[5], "sonde-spill-") && f[6] == "(deleted)"
		if !anon && !spilled {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		z, err2 := strconv.ParseUint(hi, 16, 64)
		if ok && err1 == nil && err2 == nil {
			n += int64(z - a)
		}
	}
	return n
}

// openLibc opens libc in a Symbolizer of a 128 MiB budget, and returns
// the file offsets of 400 of its functions, spread over its text.
func openLibc(t *testing.T) (*Symbolizer, *Handle, []uint64) {
	t.Helper()
	if _, err := os.Stat(libcPath); err != nil {
		t.Skipf("no %s: %v", libcPath, err)
	}
	s := New(zaptest.NewLogger(t), Options{MaxSymbolBytes: 128 << 20})
	h, err := s.Open(libcPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Release)
	dyn := nmFunctions(t, libcPath, true)
	var offs []uint64
	for i := 0; i < len(dyn) && len(offs) < 400; i += max(len(dyn)/400, 1) {
		offs = append(offs, vaddrToOffset(t, libcPath, dyn[i].addr+dyn[i].size/2))
	}
	return s, h, offs
}

// nameWithLines names offs in h's file and returns how many got a line.
func nameWithLines(t *testing.T, s *Symbolizer, h *Handle, offs []uint64) int {
	t.Helper()
	n := 0
	for _, off := range offs {
		lines, err := s.Symbolize(h.ID, off)
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) > 0 && lines[0].Line > 0 {
			n++
		}
	}
	return n
}

// What libc's separate debug file (libc6-dbg) costs: the heap and the
// anonymous mappings held after loading it and naming a few hundred PCs
// in libc, against what the Symbolizer accounts for, and the load time.
func TestLibcDebugFileMemory(t *testing.T) {
	s, h, offs := openLibc(t)
	debugPath := h.GNUBuildID
	if len(debugPath) > 2 {
		debugPath = elfx.DefaultDebugDir + "/.build-id/" + debugPath[:2] + "/" + debugPath[2:] + ".debug"
	}
	if _, err := os.Stat(debugPath); err != nil {
		t.Skipf("libc6-dbg is not installed (%v)", err)
	}
	heap0, anon0 := heapNow(), anonReadOnlyBytes(t)
	start := time.Now()
	if _, err := s.Symbolize(h.ID, offs[0]); err != nil {
		t.Fatal(err)
	}
	load := time.Since(start)
	heapLoaded, anonLoaded := heapNow()-heap0, anonReadOnlyBytes(t)-anon0
	loadedBytes := s.Stats().LoadedBytes
	start = time.Now()
	withLine := nameWithLines(t, s, h, offs)
	lookups := time.Since(start)
	heap, anon := heapNow()-heap0, anonReadOnlyBytes(t)-anon0
	st := s.Stats()
	mb := func(n int64) float64 { return float64(n) / (1 << 20) }
	t.Logf("load %v: heap %.1f MB, read-only anonymous %.1f MB, LoadedBytes %.1f MB", load, mb(heapLoaded), mb(anonLoaded), mb(loadedBytes))
	t.Logf("%d lookups (%d with a line) in %v: heap %.1f MB, read-only anonymous %.1f MB, LoadedBytes %.1f MB",
		len(offs), withLine, lookups, mb(heap), mb(anon), mb(st.LoadedBytes))
	if withLine < len(offs)*9/10 {
		t.Errorf("only %d of %d lookups have a line: the debug file was not used", withLine, len(offs))
	}
}

// Naming addresses in many of libc's compile units reads megabytes of its
// debug file and of the inflated sections; the pages each unit read go
// once it is parsed, so the file pages the agent holds stay few without
// waiting for DropPages.
func TestLibcLookupsHoldFewPages(t *testing.T) {
	s, h, offs := openLibc(t)
	before := testutil.StatusKiB(t, "RssFile")
	withLine := nameWithLines(t, s, h, offs)
	if withLine < len(offs)*9/10 {
		t.Skipf("only %d of %d lookups have a line: no libc debug file (libc6-dbg) here", withLine, len(offs))
	}
	if grew := testutil.StatusKiB(t, "RssFile") - before; grew > 2048 {
		t.Errorf("%d lookups in libc's units left %d KiB of file pages in the process, want at most 2048", len(offs), grew)
	}
}

// Naming Go code reads a few places of a big pclntab for each address,
// and each read maps the 64 KiB around it: the pages go every few lookups,
// so naming many addresses holds few of them.
func TestGoLookupsHoldFewPages(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	f.Close()
	if text == nil {
		t.Fatal("the test binary has no .text")
	}
	s := New(zaptest.NewLogger(t), Options{MaxSymbolBytes: 128 << 20})
	h, err := s.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if _, err := s.Symbolize(h.ID, text.Offset); err != nil { // loads the pclntab
		t.Fatal(err)
	}
	before := testutil.StatusKiB(t, "RssFile")
	const lookups = 200
	named := 0
	for i := range uint64(lookups) {
		lines, err := s.Symbolize(h.ID, text.Offset+i*(text.Size/lookups))
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) > 0 && lines[0].Function != "" {
			named++
		}
	}
	if named < lookups*9/10 {
		t.Fatalf("only %d of %d addresses in the test binary's text were named", named, lookups)
	}
	if grew := testutil.StatusKiB(t, "RssFile") - before; grew > 1024 {
		t.Errorf("%d lookups in the test binary's pclntab left %d KiB of file pages in the process, want at most 1024", lookups, grew)
	}
}

// smapsRSS is the RSS of this process's mappings whose smaps header line
// (address range, permissions, offset, device, inode, path) match takes,
// in bytes, and how many there are.
func smapsRSS(t *testing.T, match func(header []string) bool) (rss int64, n int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			if in = match(f); in {
				n++
			}
			continue
		}
		if in && len(f) >= 2 && f[0] == "Rss:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			rss += kb << 10
		}
	}
	return rss, n
}

// spilled matches the mappings of spill files (elfx.MapSpill).
func spilled(h []string) bool {
	return len(h) >= 6 && h[1] == "r--s" && strings.Contains(h[5], "sonde-spill-")
}

// Indexing a big DWARF, libc6-dbg's, lets go of what it read as it goes:
// each compressed section's file pages once it is inflated, and the pages
// of .debug_info, inflated or in place, as the walk over its unit headers
// passes them. Otherwise the load holds the whole file and most of what it
// inflated in the RSS at once (10 MB for libc's).
func TestLoadLinesLetsGoOfWhatItRead(t *testing.T) {
	compressed := libcDebugFile()
	if compressed == "" {
		t.Skip("libc6-dbg is not installed")
	}
	plain := filepath.Join(t.TempDir(), "libc.debug")
	run(t, nil, testutil.RequireTool(t, "objcopy"), "--decompress-debug-sections", compressed, plain)
	for _, tc := range []struct {
		name, path string
		compressed bool
	}{{"compressed", compressed, true}, {"in place", plain, false}} {
		t.Run(tc.name, func(t *testing.T) {
			img, ef := mapELF(t, tc.path)
			info := ef.Section(".debug_info")
			if info == nil || (info.Flags&elf.SHF_COMPRESSED != 0) != tc.compressed || info.Size < 4<<20 {
				t.Fatalf("%s: want a .debug_info of at least 4 MiB, compressed %v; have %+v", tc.path, tc.compressed, info)
			}
			base := uintptr(unsafe.Pointer(&img.Bytes()[0]))
			isImg := func(h []string) bool { return strings.HasPrefix(h[0], fmt.Sprintf("%x-", base)) }
			handed := map[[2]uint64]bool{}
			dropRead := func(b []byte) {
				handed[[2]uint64{uint64(uintptr(unsafe.Pointer(&b[0])) - base), uint64(len(b))}] = true
				img.DropRange(b)
			}
			spill0, n0 := smapsRSS(t, spilled)
			inflate := int64(1 << 30)
			lt, err := loadLines(ef, img.Bytes(), 1<<30, 1<<30, &inflate, dropRead)
			if err != nil || lt == nil {
				t.Fatalf("loadLines(%s) = %v, %v", tc.path, lt, err)
			}
			defer lt.unmap()
			spill, n := smapsRSS(t, spilled)
			imgRSS, _ := smapsRSS(t, isImg)
			if tc.compressed && n == n0 {
				t.Skip("no section was spilled to a file: the temporary directory keeps spills in memory")
			}
			for _, name := range append(slices.Clone(dwarfSections), "aranges") {
				s := ef.Section(".debug_" + name)
				if tc.compressed && s != nil && s.Flags&elf.SHF_COMPRESSED != 0 && !handed[[2]uint64{s.Offset, s.FileSize}] {
					t.Errorf("%s: its %d compressed bytes were not handed back once inflated", s.Name, s.FileSize)
				}
			}
			// The walk leaves at most the last MiB it passed, and the 64
			// KiB the kernel maps around each read; in place, the other
			// sections' pages the indexing read (aranges, abbreviations).
			held := spill - spill0 + imgRSS
			if held > 2<<20 {
				t.Errorf("the file and its inflated sections hold %.1f MiB of RSS after indexing (.debug_info is %.1f MiB), want at most 2",
					float64(held)/(1<<20), float64(info.Size)/(1<<20))
			}
			t.Logf("%d ranges handed back; %.1f MiB of RSS after indexing, .debug_info %.1f MiB",
				len(handed), float64(held)/(1<<20), float64(info.Size)/(1<<20))
		})
	}
}

// mapELF maps the ELF file at path read-only, as the Symbolizer does, and
// parses its headers from the mapping; the mapping goes when t ends.
func mapELF(t *testing.T, path string) (*elfx.Image, *elf.File) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	img, err := elfx.MapImage(f, st.Size())
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(img.Unmap)
	ef, err := elf.NewFile(bytes.NewReader(img.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return img, ef
}
