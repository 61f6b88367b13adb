package symbolize

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// cFixture builds cprog.c and returns the binary and the offsets of a, b, c
// and main (each at its second byte).
func cFixture(t *testing.T, flags ...string) (string, map[string]uint64) {
	t.Helper()
	bin := testutil.BuildC(t, "cprog", append([]string{"-O0"}, flags...), testdata("cprog.c"))
	offs := map[string]uint64{}
	for _, s := range pick(t, nmFunctions(t, bin, false), "a", "b", "c", "main") {
		offs[s.name] = vaddrToOffset(t, bin, s.addr+1)
	}
	return bin, offs
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestOpen(t *testing.T) {
	bin, _ := cFixture(t, "-Wl,--build-id")
	s := New(zaptest.NewLogger(t), Options{})

	info, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	wantBuildID, err := elfx.GNUBuildID(ef)
	if err != nil || wantBuildID == "" {
		t.Fatalf("fixture build id %q, %v", wantBuildID, err)
	}
	fh, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	st, _ := fh.Stat()
	wantID, err := elfx.ComputeFileID(fh, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	want := &FileInfo{ID: wantID, Path: bin, Name: bin, Size: st.Size(), GNUBuildID: wantBuildID}
	if diff := cmp.Diff(want, info.FileInfo); diff != "" {
		t.Errorf("FileInfo (-want +got):\n%s", diff)
	}

	again, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	if again.FileInfo != info.FileInfo {
		t.Error("second Open returned a different FileInfo")
	}

	// The same content under another inode is the same file.
	cp := filepath.Join(t.TempDir(), "copy")
	copyFile(t, bin, cp)
	other, err := s.Open(cp)
	if err != nil {
		t.Fatal(err)
	}
	if other.FileInfo != info.FileInfo {
		t.Errorf("a copy has FileInfo %+v, want the original's %+v", other.FileInfo, info.FileInfo)
	}

	// Through the process's root directory.
	viaRoot, err := s.Open("/proc/self/root" + bin)
	if err != nil {
		t.Fatal(err)
	}
	if viaRoot.ID != info.ID {
		t.Errorf("/proc/self/root path gives id %s, want %s", viaRoot.ID, info.ID)
	}

	got := s.Stats()
	if got.LoadedBytes <= 0 {
		t.Error("the known file is not accounted")
	}
	got.LoadedBytes = 0
	wantStats := Stats{FilesOpened: 2, OpenHits: 2, OpenFiles: 1}
	if diff := cmp.Diff(wantStats, got); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	// Four handles hold one file open until the last is released.
	for i, h := range []*Handle{info, again, other, viaRoot} {
		h.Release()
		h.Release() // a second Release does nothing
		if n, want := s.Stats().OpenFiles, min(1, 3-i); n != want {
			t.Errorf("after %d releases %d files are open, want %d", i+1, n, want)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "not-elf")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := New(zaptest.NewLogger(t), Options{})
	for _, p := range []string{notELF, filepath.Join(dir, "missing"), dir, "/proc/self/root/no/such/file"} {
		if _, err := s.Open(p); err == nil {
			t.Errorf("Open(%q) succeeded", p)
		}
	}
	if got := s.Stats().Errors; got != 4 {
		t.Errorf("Stats().Errors = %d, want 4", got)
	}
	if _, err := s.Symbolize(elfx.FileID{1}, 0); !errors.Is(err, ErrUnknownFile) {
		t.Errorf("Symbolize of an unknown id: error %v, want ErrUnknownFile", err)
	}
}

func TestSymbolizeCaching(t *testing.T) {
	bin, offs := cFixture(t)
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.FilesLoaded != 0 {
		t.Fatalf("Open loaded symbols: %+v", st)
	}
	first, err := s.Symbolize(info.ID, offs["b"])
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Symbolize(info.ID, offs["b"])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, second); diff != "" || len(first) != 1 || first[0].Function != "b" {
		t.Errorf("frames %v then %v, want b twice", first, second)
	}
	want := Stats{FilesOpened: 1, FilesLoaded: 1, Lookups: 2, Hits: 1, Misses: 1, OpenFiles: 1, LoadedFiles: 1}
	got := s.Stats()
	got.LoadedBytes = 0
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	if s.Stats().LoadedBytes <= 0 {
		t.Error("LoadedBytes not accounted")
	}
}

func TestEviction(t *testing.T) {
	bin1, offs1 := cFixture(t)
	bin2, offs2 := cFixture(t, "-DUNUSED=1", "-fno-inline", "-g")
	s := New(zaptest.NewLogger(t), Options{MaxFiles: 1, MaxCachedAddrs: 2})
	info1, err := s.Open(bin1)
	if err != nil {
		t.Fatal(err)
	}
	info2, err := s.Open(bin2)
	if err != nil {
		t.Fatal(err)
	}
	if info1.ID == info2.ID {
		t.Fatal("fixtures have the same id")
	}
	const rounds = 3
	for range rounds {
		for _, fx := range []struct {
			info *FileInfo
			offs map[string]uint64
		}{{info1.FileInfo, offs1}, {info2.FileInfo, offs2}} {
			for _, name := range []string{"a", "b", "c"} {
				frames, err := s.Symbolize(fx.info.ID, fx.offs[name])
				if err != nil {
					t.Fatal(err)
				}
				if len(frames) != 1 || frames[0].Function != name {
					t.Fatalf("Symbolize(%s) = %+v", name, frames)
				}
			}
		}
	}
	st := s.Stats()
	// Every switch between the two files reloads one: 2 files x 3 rounds.
	if st.FilesLoaded != 2*rounds || st.FilesEvicted != 2*rounds-1 {
		t.Errorf("loaded %d, evicted %d; want %d and %d", st.FilesLoaded, st.FilesEvicted, 2*rounds, 2*rounds-1)
	}
	if st.Hits != 0 || st.AddrsEvicted != 2*rounds*3-2 {
		t.Errorf("hits %d, addrs evicted %d; want 0 and %d", st.Hits, st.AddrsEvicted, 2*rounds*3-2)
	}
}

func TestSymbolBytesBudget(t *testing.T) {
	bin1, offs1 := cFixture(t)
	bin2, offs2 := cFixture(t, "-g")
	s := New(zaptest.NewLogger(t), Options{MaxSymbolBytes: 1}) // every file is over budget
	for _, fx := range []struct {
		bin string
		off uint64
	}{{bin1, offs1["a"]}, {bin2, offs2["a"]}, {bin1, offs1["b"]}} {
		info, err := s.Open(fx.bin)
		if err != nil {
			t.Fatal(err)
		}
		frames, err := s.Symbolize(info.ID, fx.off)
		if err != nil || len(frames) != 1 {
			t.Fatalf("Symbolize = %v, %v", frames, err)
		}
	}
	st := s.Stats()
	if st.FilesLoaded != 3 || st.FilesEvicted != 2 {
		t.Errorf("loaded %d, evicted %d; want 3 and 2: only the file in use may stay over budget", st.FilesLoaded, st.FilesEvicted)
	}
}

func TestKnownFilesBound(t *testing.T) {
	bin1, offs := cFixture(t)
	bin2, _ := cFixture(t, "-g")
	s := New(zaptest.NewLogger(t), Options{MaxKnownFiles: 1})
	info1, err := s.Open(bin1)
	if err != nil {
		t.Fatal(err)
	}
	// The bound applies to files no Handle holds.
	info1.Release()
	h2, err := s.Open(bin2)
	if err != nil {
		t.Fatal(err)
	}
	h2.Release()
	if _, err := s.Symbolize(info1.ID, offs["a"]); !errors.Is(err, ErrUnknownFile) {
		t.Errorf("Symbolize of a forgotten file: %v, want ErrUnknownFile", err)
	}
	if st := s.Stats(); st.FilesForgotten != 1 {
		t.Errorf("FilesForgotten = %d, want 1", st.FilesForgotten)
	}
	// Opening it again makes it known again.
	if _, err := s.Open(bin1); err != nil {
		t.Fatal(err)
	}
	if frames, err := s.Symbolize(info1.ID, offs["a"]); err != nil || len(frames) != 1 || frames[0].Function != "a" {
		t.Errorf("Symbolize after reopening = %v, %v", frames, err)
	}
}

// corruptSection rewrites the file offset of a section in bin's section
// header table so that reading its data fails.
func corruptSection(t *testing.T, bin, name string) {
	t.Helper()
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	idx := -1
	for i, s := range ef.Sections {
		if s.Name == name {
			idx = i
		}
	}
	ef.Close()
	if idx < 0 {
		t.Fatalf("%s has no %s", bin, name)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	shoff := binary.LittleEndian.Uint64(data[0x28:])
	shentsize := uint64(binary.LittleEndian.Uint16(data[0x3a:]))
	// Elf64_Shdr.sh_offset is at byte 24.
	binary.LittleEndian.PutUint64(data[shoff+uint64(idx)*shentsize+24:], 1<<40)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestCorruptSymbols(t *testing.T) {
	for _, section := range []string{".symtab", ".strtab", ".debug_line"} {
		t.Run(section, func(t *testing.T) {
			bin, offs := cFixture(t, "-g")
			corruptSection(t, bin, section)
			s := New(zaptest.NewLogger(t), Options{})
			info, err := s.Open(bin)
			if err != nil {
				t.Fatalf("Open reads no symbols and should succeed: %v", err)
			}
			for range 2 {
				if frames, err := s.Symbolize(info.ID, offs["a"]); err == nil {
					t.Errorf("Symbolize with a corrupt %s = %v, want an error", section, frames)
				}
			}
			if st := s.Stats(); st.Errors != 2 || st.FilesLoaded != 1 {
				t.Errorf("errors %d, loads %d; want 2 errors from a single failed load", st.Errors, st.FilesLoaded)
			}
		})
	}
}

func TestFileChangedBeforeLoad(t *testing.T) {
	bin, offs := cFixture(t)
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	// Replace the content (same size) before the first Symbolize.
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-1] ^= 0xff
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if frames, err := s.Symbolize(info.ID, offs["a"]); err == nil {
		t.Errorf("Symbolize after the file changed = %v, want an error", frames)
	}
}

func TestConcurrentSymbolize(t *testing.T) {
	bin, offs := cFixture(t, "-g")
	goBin := testutil.BuildGo(t, "goprog", testdata("goprog"))
	goSyms := pick(t, goNMFunctions(t, goBin), "main.a", "main.b", "main.c")

	s := New(zaptest.NewLogger(t), Options{MaxFiles: 1, MaxCachedAddrs: 3})
	type job struct {
		id   elfx.FileID
		off  uint64
		want string
	}
	var jobs []job
	cInfo, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	goInfo, err := s.Open(goBin)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c", "main"} {
		jobs = append(jobs, job{cInfo.ID, offs[n], n})
	}
	for _, sym := range goSyms {
		jobs = append(jobs, job{goInfo.ID, vaddrToOffset(t, goBin, sym.addr+2), sym.name})
	}

	const workers, perWorker = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				j := jobs[(w+i)%len(jobs)]
				frames, err := s.Symbolize(j.id, j.off)
				if err != nil || len(frames) != 1 || frames[0].Function != j.want {
					//nolint:errorlint // err may be nil: it is shown beside the frames, not wrapped
					errs <- fmt.Errorf("Symbolize(%s) = %+v, %v", j.want, frames, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := s.Stats(); st.Lookups != workers*perWorker || st.Hits+st.Misses != st.Lookups {
		t.Errorf("stats %+v: lookups must be counted once each", st)
	}
}

// The (file, offset) cache holds at most 1/addrCacheShare of the budget:
// a stream of addresses seen once evicts the oldest, and the most recent
// stay.
func TestAddrCacheBytesBound(t *testing.T) {
	if _, err := os.Stat(libcPath); err != nil {
		t.Skipf("no %s: %v", libcPath, err)
	}
	const budget = 4 << 20
	s := New(zaptest.NewLogger(t), Options{MaxSymbolBytes: budget, DebugDirs: []string{}})
	h, err := s.Open(libcPath)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	dyn := nmFunctions(t, libcPath, true)
	var offs []uint64
	seen := map[uint64]bool{}
	for _, f := range dyn {
		if off := vaddrToOffset(t, libcPath, f.addr); !seen[off] { // aliases share an address
			seen[off] = true
			offs = append(offs, off)
		}
	}
	for _, off := range offs {
		if _, err := s.Symbolize(h.ID, off); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	held, entries := s.addrBytes, s.addrs.len()
	s.mu.Unlock()
	if held > budget/addrCacheShare {
		t.Errorf("the address cache holds %d bytes, want at most %d", held, budget/addrCacheShare)
	}
	st := s.Stats()
	if st.AddrsEvicted == 0 || entries+int(st.AddrsEvicted) != len(offs) {
		t.Errorf("%d addresses looked up, %d cached, %d evicted: want every one either", len(offs), entries, st.AddrsEvicted)
	}
	// The last one looked up is still cached.
	before := s.Stats().Hits
	if _, err := s.Symbolize(h.ID, offs[len(offs)-1]); err != nil {
		t.Fatal(err)
	}
	if s.Stats().Hits != before+1 {
		t.Error("the most recent address was evicted")
	}
	t.Logf("%d addresses: %d cached in %d bytes, %d evicted", len(offs), entries, held, st.AddrsEvicted)
}
