package symbolize

import (
	"debug/elf"
	"os"
	"slices"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// The vDSO of this process, read from its memory, names every function
// readelf finds in the same image, at its entry and inside it; an offset
// past the functions is not named.
func TestVDSO(t *testing.T) {
	v, err := ReadVDSO("/proc")
	if err != nil {
		t.Fatal(err)
	}
	path, funcs := testutil.VDSO(t)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if v.Size() != uint64(st.Size()) {
		t.Fatalf("Size() = %d, want the mapping's %d", v.Size(), st.Size())
	}
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	offsetOf := func(vaddr uint64) (uint64, bool) {
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr-p.Vaddr < p.Filesz {
				return vaddr - p.Vaddr + p.Off, true
			}
		}
		return 0, false
	}
	aliases := map[uint64][]string{}
	var last uint64
	for _, f := range funcs {
		aliases[f.Value] = append(aliases[f.Value], f.Name)
		last = max(last, f.Value+f.Size)
	}
	for _, f := range funcs {
		for _, vaddr := range []uint64{f.Value, f.Value + f.Size - 1} {
			off, ok := offsetOf(vaddr)
			if !ok {
				t.Fatalf("%s at %#x: outside the vdso's segments", f.Name, vaddr)
			}
			got, ok := v.Lookup(off)
			if !ok || !slices.Contains(aliases[f.Value], got) {
				t.Errorf("Lookup(%#x) = %q, %v; want one of %q (readelf)", off, got, ok, aliases[f.Value])
			}
		}
	}
	if off, ok := offsetOf(last); ok {
		if got, ok := v.Lookup(off); ok {
			t.Errorf("Lookup(%#x), past every function = %q, want nothing", off, got)
		}
	}
}

// An image that is not an ELF file is an error, not a namer of nothing.
func TestParseVDSOGarbage(t *testing.T) {
	if _, err := ParseVDSO([]byte("not an ELF image")); err == nil {
		t.Error("ParseVDSO of garbage: no error")
	}
}
