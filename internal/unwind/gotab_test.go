package unwind

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
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
// TOPFRAME, and the switches to the system stack. An ABI0 function's
// symbol carries the .abi0 suffix; the ABIInternal wrapper that keeps the
// plain name is an ordinary frame.
func stackEndSymbols(t *testing.T) map[string]bool {
	t.Helper()
	reText := regexp.MustCompile(`^TEXT\s+(?:runtime)?·(\w+)(<\w*>)?\(SB\),\s*([A-Z|]+)`)
	switches := map[string]bool{"mcall": true, "morestack": true, "systemstack": true, "asmcgocall": true}
	want := map[string]bool{}
	for _, file := range []string{"asm_amd64.s", "sys_linux_amd64.s"} {
		src, err := os.ReadFile(filepath.Join(goroot(t), "src", "runtime", file))
		if err != nil {
			t.Skipf("toolchain sources: %v", err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			m := reText.FindStringSubmatch(line)
			if m == nil || m[2] == "<>" || !strings.Contains(m[3], "TOPFRAME") && !switches[m[1]] {
				continue
			}
			sym := "runtime." + m[1]
			if m[2] != "<ABIInternal>" {
				sym += ".abi0"
			}
			want[sym] = true
		}
	}
	if len(want) < 6 {
		t.Fatalf("oracle: stack ends %v", want)
	}
	return want
}

// A Go stack ends, as a complete stack, in the functions the runtime
// marks as top frames and in the switches to the system stack; every other
// function, the ABI wrappers of those among them, unwinds by its SP deltas.
func TestFromGoStackEnds(t *testing.T) {
	want := stackEndSymbols(t)
	bin := testutil.BuildWorkload(t, testutil.GoChain)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := fromFile(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.Symbols()
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
	if len(ends) < 6 {
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
	// No other function ends a stack: every CFAEnd row starts inside one of
	// the ends (their rows run on over the padding after them).
	for _, r := range tab.Rows {
		if r.CFA != CFAEnd {
			continue
		}
		if !slices.ContainsFunc(ends, func(s elf.Symbol) bool { return s.Value <= r.PC && r.PC < s.Value+s.Size }) {
			t.Errorf("row %+v ends the stack outside the expected functions", r)
		}
	}
	// The frames the unwinder passes on its way to them unwind normally.
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
}
