package pclntab

import (
	"debug/elf"
	"os/exec"
	"testing"
)

// SPDeltas walks whole tables; SPDelta decodes one PC from the entry. The
// two must agree at both ends of every range, and the ranges must tile the
// functions.
func TestSPDeltasAgreesWithSPDelta(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH")
	}
	f, err := elf.Open(goTool)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := OpenELF(f)
	if err != nil {
		t.Fatal(err)
	}
	var ranges, funcs, unknown int
	var prevEnd uint64
	err = tab.SPDeltas(func(start, end uint64, delta int32) bool {
		ranges++
		if start >= end {
			t.Fatalf("empty range %#x-%#x", start, end)
		}
		atEntry := false
		if fs, _, ok := tab.FuncRange(start); ok && fs == start {
			funcs++
			atEntry = true
		} else if start != prevEnd {
			t.Fatalf("range %#x-%#x does not continue the previous one ending at %#x", start, end, prevEnd)
		}
		prevEnd = end
		if delta < 0 {
			// Padding after a function's code is not in its table; a
			// function is undecodable when nothing from its entry is.
			if atEntry {
				unknown++
			}
			return true
		}
		for _, pc := range []uint64{start, end - 1} {
			if got, ok := tab.SPDelta(pc); !ok || got != delta {
				t.Fatalf("SPDelta(%#x) = %d, %v; SPDeltas says %d for %#x-%#x", pc, got, ok, delta, start, end)
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if funcs != tab.NumFuncs() {
		t.Errorf("%d functions started a range, the table has %d", funcs, tab.NumFuncs())
	}
	t.Logf("%d ranges in %d functions, %d undecodable", ranges, funcs, unknown)
	if unknown > funcs/100 {
		t.Errorf("%d of %d functions undecodable", unknown, funcs)
	}
}
