package symbolize

import (
	"cmp"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// loadLineTable indexes bin's DWARF, in the heap; aranges false ignores
// .debug_aranges, so every unit's entry gives its ranges.
func loadLineTable(t *testing.T, bin string, aranges bool) *lineTable {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	inflate := int64(1 << 30)
	lt, err := loadLines(f, nil, 1<<30, 1<<30, &inflate, nil)
	if err != nil || lt == nil {
		t.Fatalf("loadLines(%s) = %v, %v", bin, lt, err)
	}
	t.Cleanup(lt.unmap)
	if !aranges {
		fromEntries, err := indexUnits(lt.sec, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		fromEntries.maps = lt.maps
		lt = fromEntries
	}
	return lt
}

// .debug_aranges, where a file has it, gives the same unit ranges as the
// units' own entries: GCC's C and C++, LTO, and libc's debug file.
func TestArangesMatchUnitEntries(t *testing.T) {
	fixtures := map[string]func(t *testing.T) string{
		"c-O2": func(t *testing.T) string {
			return testutil.BuildC(t, "inline", []string{"-O2", "-g"}, testdata("inline.c"))
		},
		"c-O2-lto": func(t *testing.T) string {
			return testutil.BuildC(t, "inline", []string{"-O2", "-g", "-flto"}, testdata("inline.c"))
		},
		"cxx-O2": func(t *testing.T) string {
			return testutil.BuildCXX(t, "cxxprog", []string{"-O2", "-g"}, testdata("cxxprog.cc"))
		},
		"libc-debug": func(t *testing.T) string {
			p := libcDebugFile()
			if p == "" {
				t.Skip("libc6-dbg is not installed")
			}
			return p
		},
	}
	for name, build := range fixtures {
		t.Run(name, func(t *testing.T) {
			bin := build(t)
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Section(".debug_aranges") == nil {
				t.Fatal("fixture has no .debug_aranges")
			}
			byAranges, byEntries := loadLineTable(t, bin, true), loadLineTable(t, bin, false)
			sorted := func(us []unitRange) []unitRange {
				return slices.SortedFunc(slices.Values(us), func(a, b unitRange) int {
					return cmp.Or(cmp.Compare(a.lo, b.lo), cmp.Compare(a.hi, b.hi), cmp.Compare(a.unit, b.unit))
				})
			}
			if diff := gocmp.Diff(sorted(byEntries.units), sorted(byAranges.units), gocmp.AllowUnexported(unitRange{})); diff != "" {
				t.Errorf("unit ranges (-entries +aranges):\n%s", diff)
			}
			t.Logf("%d units, %d ranges", len(byAranges.heads), len(byAranges.units))
		})
	}
}

// libcDebugFile returns the path of libc's separate debug file, "" when it
// is not installed.
func libcDebugFile() string {
	f, err := elf.Open(libcPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := f.Section(".note.gnu.build-id")
	if s == nil {
		return ""
	}
	b, err := s.Data()
	if err != nil || len(b) < 16+2 {
		return ""
	}
	id := b[16:]
	p := filepath.Join("/usr/lib/debug/.build-id", hexString(id[:1]), hexString(id[1:])+".debug")
	df, err := elf.Open(p)
	if err != nil {
		return ""
	}
	df.Close()
	return p
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// With LTO, GCC names inlined functions through DW_FORM_ref_addr into
// another unit (the early debug info). Those references are followed into
// that unit; when it cannot be read (here: no other unit may be opened),
// that level has no name, and its position is unchanged.
func TestDWARFRefAddrAcrossUnits(t *testing.T) {
	bin := testutil.BuildC(t, "inline", []string{"-O2", "-g", "-flto"}, testdata("inline.c"))
	lt := loadLineTable(t, bin, true)
	refAddr := false
	for _, h := range lt.heads {
		hdr, err := readUnitHeader(lt.sec["info"], h.off, binary.LittleEndian)
		if err != nil {
			t.Fatal(err)
		}
		for _, forms := range abbrevRefs(lt.sec["abbrev"], hdr.abbrevOff) {
			refAddr = refAddr || forms.origin == refInSection || forms.spec == refInSection
		}
	}
	if !refAddr {
		t.Fatal("fixture has no DW_FORM_ref_addr origin: nothing exercised")
	}
	walk := pick(t, nmFunctions(t, bin, false), "walk")[0]
	var pcs []uint64
	for pc := walk.addr; pc < walk.addr+walk.size; pc++ {
		pcs = append(pcs, pc)
	}
	full := map[uint64][]dwarfFrame{}
	inlined := 0
	for _, pc := range pcs {
		chain := lt.lookup(pc)
		full[pc] = chain
		if len(chain) > 1 {
			inlined++
		}
		for i, fr := range chain {
			if fr.name == "" {
				t.Fatalf("%#x: level %d of %+v has no name", pc, i, chain)
			}
		}
	}
	if inlined == 0 {
		t.Fatal("no inlined level in walk")
	}

	cut := loadLineTable(t, bin, true)
	cut.refUnits = 0
	unnamed := 0
	for _, pc := range pcs {
		chain := cut.lookup(pc)
		if len(chain) != len(full[pc]) {
			t.Fatalf("%#x: %d levels, want %d as %+v", pc, len(chain), len(full[pc]), full[pc])
		}
		for i, fr := range chain {
			want := full[pc][i]
			if fr.file != want.file || fr.line != want.line || fr.name != "" && fr.name != want.name {
				t.Errorf("%#x level %d: %+v, want %+v or it unnamed", pc, i, fr, want)
			}
			if fr.name == "" {
				unnamed++
			}
		}
	}
	if unnamed == 0 {
		t.Error("every level was named without reading another unit: references were not across units")
	}
	t.Logf("%d PCs, %d with inlined levels; %d levels unnamed without other units", len(pcs), inlined, unnamed)
}

// Compressed DWARF is inflated into read-only anonymous mappings that go
// when the file's symbols are evicted.
func TestInflatedSectionsUnmappedOnEviction(t *testing.T) {
	bin := testutil.BuildC(t, "inline", []string{"-O2", "-g", "-gz=zlib"}, testdata("inline.c"))
	other, otherOffs := cFixture(t)
	walk := pick(t, nmFunctions(t, bin, false), "walk")[0]
	s := New(zaptest.NewLogger(t), Options{MaxFiles: 1})
	h, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	anon0 := anonReadOnlyBytes(t)
	lines, err := s.Symbolize(h.ID, vaddrToOffset(t, bin, walk.addr+1))
	if err != nil || len(lines) == 0 || lines[0].Line == 0 {
		t.Fatalf("Symbolize(walk) = %+v, %v", lines, err)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	info := f.Section(".debug_info")
	f.Close()
	if info.Flags&elf.SHF_COMPRESSED == 0 {
		t.Fatal("fixture's .debug_info is not compressed")
	}
	if got := anonReadOnlyBytes(t) - anon0; got < int64(info.Size) {
		t.Errorf("%d bytes of read-only anonymous mappings for a %d-byte .debug_info", got, info.Size)
	}
	oh, err := s.Open(other)
	if err != nil {
		t.Fatal(err)
	}
	defer oh.Release()
	if _, err := s.Symbolize(oh.ID, otherOffs["a"]); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.FilesEvicted == 0 {
		t.Fatal("nothing evicted")
	}
	// What stays is the other file's symbol index: a dozen functions, one
	// page of anonymous memory.
	if got := anonReadOnlyBytes(t) - anon0; got > int64(os.Getpagesize()) {
		t.Errorf("%d bytes of read-only anonymous mappings left after eviction", got)
	}
}
