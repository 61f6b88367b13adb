package pclntab

import (
	"debug/elf"
	"fmt"
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
	var ranges, funcs, unknown, padding int
	var prevEnd uint64
	fill := make([]byte, 1<<16)
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
		if delta == Padding {
			// The fill between functions, which the amd64 linker writes
			// as int3: no instruction of the function is there.
			padding++
			if atEntry || end-start > uint64(len(fill)) {
				t.Fatalf("padding %#x-%#x at a function's entry, or longer than any alignment", start, end)
			}
			if err := readText(f, start, fill[:end-start]); err != nil {
				t.Fatal(err)
			}
			for i, b := range fill[:end-start] {
				if b != 0xcc {
					t.Fatalf("padding %#x-%#x holds %#x at %#x, not int3 fill", start, end, b, start+uint64(i))
				}
			}
			return true
		}
		if delta < 0 {
			// A function is undecodable when nothing from its entry is.
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
	t.Logf("%d ranges in %d functions, %d undecodable, %d padded", ranges, funcs, unknown, padding)
	if padding < funcs/2 {
		t.Errorf("only %d of %d functions end with padding; most are aligned to 32 bytes", padding, funcs)
	}
	if unknown > funcs/100 {
		t.Errorf("%d of %d functions undecodable", unknown, funcs)
	}
}

// Funcs lists every function once, in address order, with the ranges
// FuncRange finds and the flags the runtime's assembly declares: the
// functions that switch stacks write SP, the outermost frames are top
// frames, and compiled Go code has neither flag.
func TestFuncsFlags(t *testing.T) {
	tab := openELF(t, goToolBinary(t))
	byName := map[string]Func{}
	var n int
	var prevEnd uint64
	err := tab.Funcs(func(f Func) bool {
		n++
		name := tab.FuncName(f)
		if f.Entry < prevEnd || f.End <= f.Entry {
			t.Fatalf("function %s at %#x-%#x after one ending at %#x", name, f.Entry, f.End, prevEnd)
		}
		prevEnd = f.End
		if start, end, ok := tab.FuncRange(f.Entry); !ok || start != f.Entry || end != f.End {
			t.Fatalf("Funcs: %s at %#x-%#x; FuncRange: %#x-%#x, %v", name, f.Entry, f.End, start, end, ok)
		}
		if _, dup := byName[name]; !dup {
			byName[name] = f
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != tab.NumFuncs() {
		t.Errorf("Funcs yielded %d functions, the table has %d", n, tab.NumFuncs())
	}
	for _, tc := range []struct {
		name string
		want FuncFlag
	}{
		// runtime/asm_amd64.s: each moves SP to another stack.
		{"runtime.systemstack", FlagSPWrite | FlagAsm},
		{"runtime.mcall", FlagSPWrite | FlagAsm},
		{"runtime.asmcgocall", FlagSPWrite | FlagAsm},
		// TOPFRAME in its TEXT line.
		{"runtime.goexit", FlagTopFrame | FlagAsm},
		{"runtime.main", 0},
		{"main.main", 0},
	} {
		f, ok := byName[tc.name]
		if !ok {
			t.Errorf("%s: not in the table", tc.name)
			continue
		}
		if f.Flag != tc.want {
			t.Errorf("%s: flags %03b, want %03b", tc.name, f.Flag, tc.want)
		}
	}
}

// readText reads len(b) bytes at virtual address addr of f's loaded code.
func readText(f *elf.File, addr uint64, b []byte) error {
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && addr >= p.Vaddr && addr-p.Vaddr+uint64(len(b)) <= p.Filesz {
			_, err := p.ReadAt(b, int64(addr-p.Vaddr))
			return err
		}
	}
	return fmt.Errorf("address %#x is outside the code", addr)
}
