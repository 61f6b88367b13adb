package unwind

import (
	"debug/elf"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

func symbolAddr(t *testing.T, f *elf.File, name string) elf.Symbol {
	t.Helper()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no symbol %s", name)
	return elf.Symbol{}
}

// The frameless leaf unwinds from SP (CFA = SP+8, RBP untouched); a function
// with a frame saves the caller's RBP at CFA-16 after its prologue.
func TestFromGoFramelessLeaf(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.GoLeaf)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := fromFile(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf := symbolAddr(t, f, "main.leaf")
	for pc := leaf.Value; pc < leaf.Value+leaf.Size; pc++ {
		r, ok := tab.Lookup(pc)
		if !ok || r.CFA != CFASP || r.CFAOffset != 8 || r.FP != FPSame {
			t.Fatalf("main.leaf+%#x: row %+v, want CFA=SP+8 with RBP unchanged (frameless)", pc-leaf.Value, r)
		}
	}
	beta := symbolAddr(t, f, "main.beta")
	if r, _ := tab.Lookup(beta.Value); r.CFA != CFASP || r.CFAOffset != 8 || r.FP != FPSame {
		t.Errorf("main.beta entry: row %+v, want CFA=SP+8, RBP unchanged", r)
	}
	framed := 0
	for pc := beta.Value; pc < beta.Value+beta.Size; pc++ {
		r, _ := tab.Lookup(pc)
		if r.CFA == CFASP && r.CFAOffset >= 16 {
			framed++
			if r.FP != FPOffset || r.FPOffset != -16 {
				t.Fatalf("main.beta+%#x: row %+v, want the caller's RBP at CFA-16 inside the frame", pc-beta.Value, r)
			}
		}
	}
	if framed == 0 {
		t.Error("main.beta never has a frame")
	}
	if r, ok := tab.Lookup(leaf.Value + leaf.Size + 1<<30); !ok || r.CFA != CFAUnknown {
		t.Errorf("far past the text: %+v, want unknown", r)
	}
}
