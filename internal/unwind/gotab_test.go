package unwind

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
	f := openELF(t, bin)
	tab, err := fromFile(f, nil, nil, nil)
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

// The linker's fill between functions gets no row of its own: the last
// rule of the function before covers it (a return address after a call
// that never returns is looked up one byte back, in the function). Every
// byte of code keeps the rule its SP delta gives, checked against the
// pclntab's own decoding of each range's ends.
func TestFromGoPaddingTakesNoRow(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.GoLeaf)
	f := openELF(t, bin)
	pt, err := pclntab.OpenELF(f)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := fromGo(pt, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pads, ranges int
	err = pt.SPDeltas(func(start, end uint64, delta int32) bool {
		switch {
		case delta == pclntab.Padding:
			pads++
			before, _ := tab.Lookup(start - 1)
			for _, pc := range []uint64{start, end - 1} {
				if r, ok := tab.Lookup(pc); !ok || r != before {
					t.Fatalf("padding at %#x: row %+v, want the function's last one %+v", pc, r, before)
				}
			}
		case delta >= 0:
			ranges++
			for _, pc := range []uint64{start, end - 1} {
				d, ok := pt.SPDelta(pc)
				r, _ := tab.Lookup(pc)
				if ok && r.CFA == CFASP && r.CFAOffset != d+8 {
					t.Fatalf("%#x: row %+v, want CFA=SP+%d", pc, r, d+8)
				}
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if pads == 0 || ranges == 0 {
		t.Fatalf("%d padding ranges and %d code ranges", pads, ranges)
	}
	if len(tab.Rows) >= ranges {
		t.Errorf("%d rows for %d code ranges: equal neighbours should merge across the fill", len(tab.Rows), ranges)
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
	f := openELF(t, bin)
	tab, err := fromFile(f, nil, nil, nil)
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
	// SP deltas hold.
	addrs, insns := disassemble(t, bin, "crosscall2")
	if insns[0] != "push %rbp" {
		t.Fatalf("crosscall2 opens with %q", insns[0])
	}
	for i, a := range addrs[1 : len(addrs)-1] {
		if r, _ := tab.Lookup(a); r.CFA != CFASP || (r.CFAOffset > 8) != (r.FP == FPOffset) {
			t.Errorf("crosscall2+%#x (%s): %+v, want SP-based with RBP at CFA-16 inside the frame", a-addrs[0], insns[i+1], r)
		}
	}
	// runtime.call16 checks for stack growth before its prologue: RBP is
	// the caller's until it is pushed, then at CFA-16.
	addrs, insns = disassemble(t, bin, "runtime.call16.abi0")
	push := slices.Index(insns, "push %rbp")
	if push < 1 || push+1 >= len(insns) || insns[push+1] != "mov %rsp,%rbp" {
		t.Fatalf("runtime.call16 has no frame-pointer prologue after its first instruction: %q", insns)
	}
	framed := 0
	for i, a := range addrs {
		r, _ := tab.Lookup(a)
		if r.CFA != CFASP || r.CFAOffset < 8 {
			t.Errorf("runtime.call16+%#x (%s): %+v, want SP-based", a-addrs[0], insns[i], r)
		}
		if r.CFAOffset > 8 {
			framed++
		}
		if saved := r.CFAOffset > 8; saved != (r.FP == FPOffset && r.FPOffset == -16) || i <= push && r.FP != FPSame {
			t.Errorf("runtime.call16+%#x (%s): %+v, want RBP at CFA-16 exactly where the frame is open", a-addrs[0], insns[i], r)
		}
	}
	if framed == 0 {
		t.Error("runtime.call16 never has a frame")
	}
}

// goroot is the GOROOT of the go tool that builds the Go fixtures.
func goroot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(testutil.RequireTool(t, "go"), "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// stackEndSymbols returns the ELF symbols of the functions where Go stacks
// end, from the toolchain's linux/amd64 runtime assembly: those declared
// TOPFRAME, and the switches to the system stack named in switches. An
// ABI0 function's symbol carries the .abi0 suffix; the ABIInternal wrapper
// that keeps the plain name is an ordinary frame.
func stackEndSymbols(t *testing.T, switches ...string) map[string]bool {
	t.Helper()
	reText := regexp.MustCompile(`^TEXT\s+(?:runtime)?·(\w+)(<\w*>)?\(SB\),\s*([A-Z|]+)`)
	want := map[string]bool{}
	for _, file := range []string{"asm_amd64.s", "sys_linux_amd64.s"} {
		src, err := os.ReadFile(filepath.Join(goroot(t), "src", "runtime", file))
		if err != nil {
			t.Skipf("toolchain sources: %v", err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			m := reText.FindStringSubmatch(line)
			if m == nil || m[2] == "<>" || !strings.Contains(m[3], "TOPFRAME") && !slices.Contains(switches, m[1]) {
				continue
			}
			sym := "runtime." + m[1]
			if m[2] != "<ABIInternal>" {
				sym += ".abi0"
			}
			want[sym] = true
		}
	}
	if len(want) < 4+len(switches) {
		t.Fatalf("oracle: stack ends %v", want)
	}
	return want
}

// stackBottomSwitches are the switches to the system stack below which no
// caller can be found: runtime.mcall clears RBP and never returns,
// runtime.morestack leaves its caller's state in g.sched.
var stackBottomSwitches = []string{"mcall", "morestack"}

// A Go stack ends, as a complete stack, in the functions the runtime
// marks as top frames and in runtime.mcall and runtime.morestack; every
// other function, the ABI wrappers of those among them, unwinds by its SP
// deltas. runtime.systemstack and runtime.asmcgocall, whose frames the
// unwinder crosses back to the goroutine's stack when it has read their
// code, end the stack too in a table made without the code.
func TestFromGoStackEnds(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.GoChain)
	f := openELF(t, bin)
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	pt, err := pclntab.OpenELF(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		switches []string
		build    func() (*Table, error)
	}{
		{"with code", stackBottomSwitches, func() (*Table, error) { return fromFile(f, nil, nil, nil) }},
		{"table only", append(slices.Clone(stackBottomSwitches), "systemstack", "asmcgocall"), func() (*Table, error) { return FromGo(pt) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := stackEndSymbols(t, tc.switches...)
			tab, err := tc.build()
			if err != nil {
				t.Fatal(err)
			}
			var ends []elf.Symbol
			bySym := map[string]elf.Symbol{}
			for _, s := range syms {
				if elf.ST_TYPE(s.Info) != elf.STT_FUNC {
					continue
				}
				bySym[s.Name] = s
				if want[s.Name] {
					ends = append(ends, s)
				}
			}
			if len(ends) < 4+len(tc.switches) {
				t.Fatalf("only %d of the stack ends %v are in the binary", len(ends), want)
			}
			for _, s := range ends {
				for pc := s.Value; pc < s.Value+s.Size; pc++ {
					if r, ok := tab.Lookup(pc); !ok || r.CFA != CFAEnd {
						t.Errorf("%s+%#x: row %+v, want the end of the stack", s.Name, pc-s.Value, r)
						break
					}
				}
			}
			// No other function ends a stack: every CFAEnd row starts inside
			// one of the ends (their rows run on over the padding after them).
			for _, r := range tab.Rows {
				if r.CFA != CFAEnd {
					continue
				}
				if !slices.ContainsFunc(ends, func(s elf.Symbol) bool { return s.Value <= r.PC && r.PC < s.Value+s.Size }) {
					t.Errorf("row %+v ends the stack outside the expected functions", r)
				}
			}
			// The frames the unwinder passes on its way to them unwind
			// normally.
			for _, name := range []string{"runtime.mstart0", "runtime.mstart1", "runtime.main", "main.main", "runtime.schedule", "runtime.park_m",
				"runtime.asmcgocall", "runtime.mstart0.abi0", "runtime.morestack_noctxt.abi0"} {
				s, ok := bySym[name]
				if !ok {
					t.Errorf("no symbol %s", name)
					continue
				}
				if r, _ := tab.Lookup(s.Value); r.CFA != CFASP || r.CFAOffset != 8 {
					t.Errorf("%s entry: row %+v, want CFA=SP+8", name, r)
				}
			}
		})
	}
}

// A Go table built with a drop function calling it every dropEvery SP
// ranges is the same table: dropping mapped pages only costs re-reads.
func TestFromGoDropsPagesAsItReads(t *testing.T) {
	bin, err := os.Executable() // the test binary: a Go program big enough
	if err != nil {
		t.Fatal(err)
	}
	f := openELF(t, bin)
	want, err := fromFile(f, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	drops := 0
	got, err := fromFile(f, nil, nil, func() { drops++ })
	if err != nil {
		t.Fatal(err)
	}
	if drops == 0 {
		t.Errorf("drop never called while reading %d rows' worth of SP ranges", len(want.Rows))
	}
	if !slices.Equal(got.Rows, want.Rows) {
		t.Errorf("the table built with drop differs: %d rows, want %d", len(got.Rows), len(want.Rows))
	}
}

// A cgo binary's CFI is parsed without the FDEs inside its Go code (an
// unstripped Go binary's .debug_frame describes every Go function), and
// the table is the one the whole CFI merged with the Go rows gives.
func TestCgoTableSkipsGoCFI(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.GoCgo)
	f := openELF(t, bin)
	got, err := fromFile(f, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer got.release()

	pt, err := pclntab.OpenELF(f)
	if err != nil {
		t.Fatal(err)
	}
	gt, err := fromGo(pt, elfCode(f), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer gt.release()
	all, err := fromSeparateDebug(f, nil, nil, pcRange{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer all.release()
	skipping, err := fromSeparateDebug(f, nil, nil, pcRange{gt.Rows[0].PC, gt.Rows[len(gt.Rows)-1].PC}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer skipping.release()
	if skipping.Stats.Skipped == 0 || skipping.Stats.FDEs+skipping.Stats.Skipped != all.Stats.FDEs || len(skipping.Rows) >= len(all.Rows) {
		t.Errorf("CFI skipping the Go code: %+v, %d rows; the whole CFI: %+v, %d rows; want the Go code's FDEs left out", skipping.Stats, len(skipping.Rows), all.Stats, len(all.Rows))
	}
	want := mergeOutside(gt, all)
	defer want.release()
	if !slices.Equal(got.Rows, want.Rows) {
		t.Errorf("table: %d rows, want the %d the whole CFI gives", len(got.Rows), len(want.Rows))
	}
}

// openELF opens the ELF file at path until the test ends.
func openELF(t *testing.T, path string) *elf.File {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}
