package unwind

import (
	"debug/elf"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/pclntab"
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
	tab, err := fromFile(f)
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

// disassemble returns the instructions of the function sym of bin as
// objdump decodes them: address and text ("push   %rbp").
func disassemble(t *testing.T, bin, sym string) (addrs []uint64, insns []string) {
	t.Helper()
	objdump := testutil.RequireTool(t, "objdump")
	out, err := exec.Command(objdump, "-d", "--no-show-raw-insn", "--disassemble="+sym, bin).Output()
	if err != nil {
		t.Fatalf("objdump %s: %v", sym, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		addr, insn, ok := strings.Cut(strings.TrimSpace(line), ":\t")
		if !ok {
			continue
		}
		a, err := strconv.ParseUint(addr, 16, 64)
		if err != nil {
			continue
		}
		addrs, insns = append(addrs, a), append(insns, strings.Join(strings.Fields(insn), " "))
	}
	if len(addrs) == 0 {
		t.Fatalf("objdump found no code for %s", sym)
	}
	return addrs, insns
}

// The runtime's assembly that moves SP to another stack (asmcgocall to the
// system stack for a cgo call, cgocallback back to the goroutine's for a
// callback) keeps RBP on the frame it opened: from the end of its prologue
// its CFA is RBP+16, not what its SP deltas say. Assembly without the
// frame-pointer prologue never saves RBP. objdump decodes the code.
func TestFromGoStackSwitches(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.GoCgo)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := fromFile(f)
	if err != nil {
		t.Fatal(err)
	}
	pt, err := pclntab.OpenELF(f)
	if err != nil {
		t.Fatal(err)
	}
	fpRule := Row{CFA: CFAFP, CFAOffset: 16, FP: FPOffset, FPOffset: -16}
	for _, tc := range []struct {
		sym  string
		call string // the call whose return address is on the other stack
	}{
		{"runtime.asmcgocall.abi0", "<runtime.asmcgocall_landingpad"}, // tail-calls the C function
		{"runtime.cgocallback.abi0", "call *%rax"},                    // runtime.cgocallbackg
		{"runtime.systemstack.abi0", "call *%rdi"},
	} {
		addrs, insns := disassemble(t, bin, tc.sym)
		if len(insns) < 2 || insns[0] != "push %rbp" || insns[1] != "mov %rsp,%rbp" {
			t.Fatalf("%s opens with %q: not the frame-pointer prologue this test expects", tc.sym, insns[:2])
		}
		if r, _ := tab.Lookup(addrs[1]); r.CFA != CFASP || r.CFAOffset != 16 {
			t.Errorf("%s at the mov of its prologue: %+v, want CFA=SP+16 (RBP not set yet)", tc.sym, r)
		}
		calls := 0
		for i := 2; i < len(insns); i++ {
			r, _ := tab.Lookup(addrs[i])
			r.PC = 0
			// Where the function's frame is open (after its push %rbp),
			// RBP locates it.
			if delta, ok := pt.SPDelta(addrs[i]); ok && delta >= 8 && r != fpRule {
				t.Errorf("%s+%#x (%s): %+v, want CFA=RBP+16 with RBP at CFA-16", tc.sym, addrs[i]-addrs[0], insns[i], r)
			}
			if strings.Contains(insns[i-1], tc.call) {
				calls++
				if r != fpRule {
					t.Errorf("%s+%#x, after %s: %+v, want CFA=RBP+16 with RBP at CFA-16", tc.sym, addrs[i]-addrs[0], insns[i-1], r)
				}
			}
		}
		if calls == 0 {
			t.Errorf("%s: no %q found", tc.sym, tc.call)
		}
	}

	// crosscall2 has a frame pointer and constant SP adjustments only: its
	// SP deltas hold. runtime.sigtramp never saves RBP.
	addrs, insns := disassemble(t, bin, "crosscall2")
	if insns[0] != "push %rbp" {
		t.Fatalf("crosscall2 opens with %q", insns[0])
	}
	for i, a := range addrs[1 : len(addrs)-1] {
		if r, _ := tab.Lookup(a); r.CFA != CFASP || (r.CFAOffset > 8) != (r.FP == FPOffset) {
			t.Errorf("crosscall2+%#x (%s): %+v, want SP-based with RBP at CFA-16 inside the frame", a-addrs[0], insns[i+1], r)
		}
	}
	addrs, insns = disassemble(t, bin, "runtime.sigtramp.abi0")
	if insns[0] == "push %rbp" {
		t.Fatalf("runtime.sigtramp opens with %q", insns[0])
	}
	framed := 0
	for _, a := range addrs {
		r, _ := tab.Lookup(a)
		if r.FP != FPSame {
			t.Errorf("runtime.sigtramp+%#x: %+v, want RBP unchanged", a-addrs[0], r)
		}
		if r.CFA == CFASP && r.CFAOffset > 8 {
			framed++
		}
	}
	if framed == 0 {
		t.Error("runtime.sigtramp never has a frame")
	}
}
