package symbolize

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// checkAgainstOracle symbolizes every probe address of syms in bin and
// compares the frame with what the oracle says for the same address in
// oracleBin (the unstripped build, for stripped binaries).
func checkAgainstOracle(t *testing.T, bin string, syms []funcSym, oracle func([]uint64) []sourcePos, adjust func(sym funcSym, want *Line, got []Line)) {
	t.Helper()
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []uint64
	var owners []funcSym
	for _, sym := range syms {
		for _, a := range probes(sym) {
			addrs = append(addrs, a)
			owners = append(owners, sym)
		}
	}
	want := oracle(addrs)
	for i, addr := range addrs {
		got, err := s.Symbolize(info.ID, vaddrToOffset(t, bin, addr))
		if err != nil {
			t.Fatalf("Symbolize(%#x): %v", addr, err)
		}
		if len(got) > 1 {
			// The oracles here name the outermost function with the innermost
			// position; TestInlineChainsOracle compares whole inline chains.
			got = []Line{{Function: got[len(got)-1].Function, SystemName: got[len(got)-1].SystemName, File: got[0].File, Line: got[0].Line, Rust: got[len(got)-1].Rust}}
		}
		got = fullNames(t, got)
		var w []Line
		if want[i].Function != "??" && want[i].Function != "?" {
			fr := Line{Function: want[i].Function, File: want[i].File, Line: want[i].Line}
			if adjust != nil {
				adjust(owners[i], &fr, got)
			}
			w = []Line{fr}
		}
		if diff := cmp.Diff(w, got); diff != "" {
			t.Errorf("%s+%#x (address %#x) (-want +got):\n%s", owners[i].name, addr-owners[i].addr, addr, diff)
		}
	}
}

// pick returns the symbols of syms with the given names, failing if one is
// missing.
func pick(t *testing.T, syms []funcSym, names ...string) []funcSym {
	t.Helper()
	var out []funcSym
	for _, n := range names {
		i := slices.IndexFunc(syms, func(s funcSym) bool { return s.name == n })
		if i < 0 {
			t.Fatalf("the oracle lists no symbol %q", n)
		}
		out = append(out, syms[i])
	}
	return out
}

func TestSymbolizeC(t *testing.T) {
	src := testdata("cprog.c")
	tests := []struct {
		name  string
		flags []string
		funcs []string
	}{
		{"O0-g-pie", []string{"-O0", "-g", "-fPIE", "-pie"}, []string{"a", "b", "c", "main"}},
		{"O2-g-nopie", []string{"-O2", "-g", "-fno-PIE", "-no-pie"}, []string{"a", "b", "c"}},
		{"O0-g-dwarf4", []string{"-O0", "-gdwarf-4"}, []string{"a", "b", "c", "main"}},
		{"O0-no-debug", []string{"-O0"}, []string{"a", "b", "c", "main"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := testutil.BuildC(t, "cprog", tt.flags, src)
			syms := pick(t, nmFunctions(t, bin, false), tt.funcs...)
			checkAgainstOracle(t, bin, syms, func(a []uint64) []sourcePos { return addr2line(t, bin, a) }, nil)
		})
	}
}

func TestSymbolizeStripped(t *testing.T) {
	strip := testutil.RequireTool(t, "strip")
	src := testdata("cprog.c")

	t.Run("rdynamic names from dynsym", func(t *testing.T) {
		bin := testutil.BuildC(t, "cprog", []string{"-O0", "-g", "-rdynamic"}, src)
		stripped := filepath.Join(t.TempDir(), "cprog-stripped")
		run(t, nil, strip, "-o", stripped, bin)
		syms := pick(t, nmFunctions(t, stripped, true), "a", "b", "c", "main")
		// Names come from the unstripped build; file and line went with the debug info.
		checkAgainstOracle(t, stripped, syms, func(a []uint64) []sourcePos { return addr2line(t, bin, a) },
			func(_ funcSym, f *Line, _ []Line) { f.File, f.Line = "", 0 })
	})

	t.Run("no exported names", func(t *testing.T) {
		bin := testutil.BuildC(t, "cprog", []string{"-O0"}, src)
		stripped := filepath.Join(t.TempDir(), "cprog-stripped")
		run(t, nil, strip, "-o", stripped, bin)
		if dyn := nmFunctions(t, stripped, true); len(dyn) != 0 {
			t.Fatalf("oracle: the stripped binary still exports %v", dyn)
		}
		s := New(zaptest.NewLogger(t), Options{})
		info, err := s.Open(stripped)
		if err != nil {
			t.Fatal(err)
		}
		for _, sym := range pick(t, nmFunctions(t, bin, false), "a", "b", "c", "main") {
			got, err := s.Symbolize(info.ID, vaddrToOffset(t, stripped, sym.addr+1))
			if err != nil || got != nil {
				t.Errorf("Symbolize(%s+1) = %v, %v; want nil, nil for a file without symbols", sym.name, got, err)
			}
		}
		if st := s.Stats(); st.Unnamed != 4 || st.FilesLoaded != 1 {
			t.Errorf("stats = %+v, want 4 unnamed lookups and 1 load", st)
		}
	})
}

func TestSymbolizeCxx(t *testing.T) {
	testutil.RequireTool(t, "g++")
	bin := filepath.Join(t.TempDir(), "cxxprog")
	run(t, nil, "g++", "-O0", "-g", "-o", bin, testdata("cxxprog.cc"))

	var syms []funcSym
	for _, s := range nmFunctions(t, bin, false) {
		if strings.HasPrefix(s.name, "_ZN3geo") || strings.HasPrefix(s.name, "_ZNK3geo") {
			syms = append(syms, s)
		}
	}
	// twice<int>, twice<long>, twice<double>, Shape::area, Shape::Shape, scale(long), scale(double)
	if len(syms) < 7 {
		t.Fatalf("oracle: nm lists only %d geo:: functions: %v", len(syms), syms)
	}
	// Constructors have aliases (C1 complete, C2 base) at one address; any
	// raw name nm lists there is right.
	aliases := map[uint64][]string{}
	for _, s := range syms {
		aliases[s.addr] = append(aliases[s.addr], s.name)
	}
	checkAgainstOracle(t, bin, syms, func(a []uint64) []sourcePos { return addr2line(t, bin, a) },
		func(s funcSym, f *Line, got []Line) {
			if f.Function == s.name {
				t.Errorf("oracle did not demangle %s", s.name)
			}
			f.SystemName = s.name
			if len(got) == 1 && slices.Contains(aliases[s.addr], got[0].SystemName) {
				f.SystemName = got[0].SystemName
			}
		})
}

func TestSymbolizeLibc(t *testing.T) {
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	dyn := nmFunctions(t, libc, true)
	if len(dyn) == 0 {
		t.Skipf("%s: no dynamic symbols", libc)
	}
	// Names from .dynsym alone: TestLibcDebugFile covers libc6-dbg.
	s := New(zaptest.NewLogger(t), Options{DebugDirs: []string{}})
	info, err := s.Open(libc)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("qsort", func(t *testing.T) {
		q := pick(t, dyn, "qsort")[0]
		for _, a := range probes(q) {
			got, err := s.Symbolize(info.ID, vaddrToOffset(t, libc, a))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]Line{{Function: "qsort"}}, got); diff != "" {
				t.Errorf("qsort+%#x (-want +got):\n%s", a-q.addr, diff)
			}
		}
	})

	t.Run("spread", func(t *testing.T) {
		// Any name nm lists over an address is right: libc has many aliases.
		namesAt := func(a uint64) []string {
			var names []string
			for _, s := range dyn {
				if a >= s.addr && a < s.addr+max(s.size, 1) {
					names = append(names, s.name)
				}
			}
			return names
		}
		checked := 0
		for i := 0; i < len(dyn); i += 7 {
			for _, a := range probes(dyn[i]) {
				got, err := s.Symbolize(info.ID, vaddrToOffset(t, libc, a))
				if err != nil {
					t.Fatal(err)
				}
				want := namesAt(a)
				if len(got) != 1 || !slices.Contains(want, got[0].Function) {
					t.Errorf("%#x: got %+v, want one of %v", a, got, want)
				}
				checked++
			}
		}
		t.Logf("checked %d addresses in %d functions", checked, len(dyn)/7)
	})
}

func TestSymbolizeRust(t *testing.T) {
	rustc := testutil.RequireTool(t, "rustc")
	tests := []struct {
		name  string
		flags []string
		keep  func(string) bool
	}{
		// rustc mangles the crate's own functions with the legacy scheme by default.
		{"legacy", nil, func(n string) bool { return strings.HasPrefix(n, "_ZN8rustprog") }},
		// v0 also names the generic std code instantiated in this crate.
		{"v0", []string{"-C", "symbol-mangling-version=v0"}, func(n string) bool {
			return strings.HasPrefix(n, "_R") && strings.Contains(n, "8rustprog")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "rustprog")
			args := append([]string{"-C", "opt-level=0", "-g", "-o", bin}, tt.flags...)
			run(t, nil, rustc, append(args, testdata("rustprog.rs"))...)
			var syms []funcSym
			for _, s := range nmFunctions(t, bin, false) {
				if tt.keep(s.name) {
					syms = append(syms, s)
				}
			}
			if len(syms) < 4 {
				t.Fatalf("oracle: nm lists only %d crate functions: %v", len(syms), syms)
			}
			checkAgainstOracle(t, bin, syms, func(a []uint64) []sourcePos { return addr2line(t, bin, a) },
				func(s funcSym, f *Line, _ []Line) { f.SystemName, f.Rust = s.name, true })
		})
	}
}
