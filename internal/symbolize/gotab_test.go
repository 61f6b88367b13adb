package symbolize

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestSymbolizeGo compares Go frames with `go tool addr2line`, which names
// a PC by its physical function at the innermost source position: the
// symbolizer's inline chain collapses to that.
func TestSymbolizeGo(t *testing.T) {
	tests := []struct {
		name   string
		flags  []string
		goarch string // "": this machine's; naming must not depend on it
	}{
		{"exe", nil, ""},
		{"pie", []string{"-buildmode=pie"}, ""},
		{"stripped", []string{"-ldflags=-s -w"}, ""},
		{"arm64-exe", nil, "arm64"},
		{"arm64-pie", []string{"-buildmode=pie"}, "arm64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			build := func(name string, flags ...string) string {
				if tt.goarch != "" {
					return testutil.BuildGoFor(t, name, testdata("goprog"), tt.goarch, flags...)
				}
				return testutil.BuildGo(t, name, testdata("goprog"), flags...)
			}
			bin := build("goprog", tt.flags...)
			nmBin := bin
			if tt.name == "stripped" {
				// go tool nm needs the ELF symbols -s removes; the unstripped
				// build has the same code at the same addresses.
				nmBin = build("goprog-ref")
			}
			all := goNMFunctions(t, nmBin)
			syms := pick(t, all, "main.a", "main.b", "main.c", "main.main")
			for i := 0; i < len(all); i += 37 { // and a spread of runtime and library code
				syms = append(syms, all[i])
			}

			s := New(zaptest.NewLogger(t), Options{})
			info, err := s.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			if !info.IsGo {
				t.Error("IsGo = false for a Go binary")
			}
			if want := strings.TrimSpace(run(t, nil, goTool(t), "tool", "buildid", bin)); info.GoBuildID != want {
				t.Errorf("GoBuildID = %q, go tool buildid says %q", info.GoBuildID, want)
			}
			var addrs []uint64
			var owners []funcSym
			for _, sym := range syms {
				for _, a := range probes(sym) {
					addrs, owners = append(addrs, a), append(owners, sym)
				}
			}
			want := goAddr2line(t, bin, addrs)
			inlined := 0
			for i, addr := range addrs {
				got, err := s.Symbolize(info.ID, vaddrToOffset(t, bin, addr))
				if err != nil {
					t.Fatalf("Symbolize(%#x): %v", addr, err)
				}
				var w, g []Line
				if want[i].Function != "??" && want[i].Function != "?" {
					w = []Line{{Function: want[i].Function, File: want[i].File, Line: want[i].Line}}
				}
				if len(got) > 0 {
					g = []Line{{Function: got[len(got)-1].Function, File: got[0].File, Line: got[0].Line}}
				}
				if len(got) > 1 {
					inlined++
				}
				if diff := cmp.Diff(w, g); diff != "" {
					t.Errorf("%s+%#x (address %#x) (-want +got):\n%s", owners[i].name, addr-owners[i].addr, addr, diff)
				}
			}
			if inlined == 0 {
				t.Error("no probe inside an inlined call: inline frames are not expanded")
			}
		})
	}
}

// TestSymbolizeGoInline runs the pclntab fixture, which prints the frames
// runtime.CallersFrames gives for PCs it captured itself, some inside
// inlined calls, and symbolizes the same PCs through the file offset.
func TestSymbolizeGoInline(t *testing.T) {
	bin := testutil.BuildGo(t, "inlprog", "../pclntab/testdata/inlprog")
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	type stack struct {
		pc     uint64
		frames []Line
	}
	var stacks []stack
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "pc "); ok {
			pc, err := strconv.ParseUint(rest, 16, 64)
			if err != nil {
				t.Fatalf("fixture line %q: %v", line, err)
			}
			stacks = append(stacks, stack{pc: pc})
		} else if rest, ok := strings.CutPrefix(line, "frame "); ok {
			f := strings.Split(rest, "\t")
			n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
			if len(f) != 3 || err != nil || len(stacks) == 0 {
				t.Fatalf("fixture line %q", line)
			}
			stacks[len(stacks)-1].frames = append(stacks[len(stacks)-1].frames, Line{Function: f[0], File: f[1], Line: n, Go: true})
		}
	}
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	inlined := 0
	for _, st := range stacks {
		got, err := s.Symbolize(info.ID, vaddrToOffset(t, bin, st.pc))
		if err != nil {
			t.Fatalf("Symbolize(%#x): %v", st.pc, err)
		}
		if diff := cmp.Diff(st.frames, got); diff != "" {
			t.Errorf("%#x (-want +got):\n%s", st.pc, diff)
		}
		if len(st.frames) > 1 {
			inlined++
		}
	}
	if inlined < 4 {
		t.Fatalf("fixture gave %d frames with inlined calls, want >= 4", inlined)
	}
}

// A Go binary's symbol table is read only when a lookup misses the
// pclntab (a cgo binary's C code), not when the file is loaded: a big Go
// binary's names are megabytes, and Go code never needs them.
func TestGoSymbolTableOnFirstNeed(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.GoCgo)
	img, err := os.ReadFile(bin) // the file's bytes, as its mapping holds them
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	fs, err := loadSymsWith(ef, img, nil, nil, loadLimits{maxDWARF: 1 << 30, maxDWARFHeap: 1 << 30, inflate: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]uint64{}
	for _, s := range syms {
		at[s.Name] = s.Value
	}
	before := fs.memSize()
	if fs.nativeIfLoaded() != nil {
		t.Fatal("the symbol table was read at load")
	}
	if fr := fs.frames(vaddrToOffset(t, bin, at["main.goInner"]+1)); len(fr) == 0 || fr[0].Function != "main.goInner" {
		t.Errorf("main.goInner named %v", fr)
	}
	if fs.nativeIfLoaded() != nil || fs.memSize() != before {
		t.Error("a Go function's lookup read the symbol table")
	}
	if fr := fs.frames(vaddrToOffset(t, bin, at["c_leaf"]+1)); len(fr) == 0 || fr[0].Function != "c_leaf" {
		t.Errorf("c_leaf named %v", fr)
	}
	native := fs.nativeIfLoaded()
	if native == nil || fs.memSize() <= before {
		t.Fatalf("after a C function's lookup: table read %v, %d bytes (%d before); want it read and counted", native != nil, fs.memSize(), before)
	}
	// It holds the C functions only: the pclntab names the Go code.
	lo, hi := fs.goTab.pcln.Range()
	funcs := 0
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
			funcs++
		}
	}
	for _, s := range native.syms {
		if s.addr >= lo && s.addr < hi || s.addr < lo && s.addr+uint64(s.size) > lo {
			t.Errorf("symbol %q [%#x, +%d) reaches into the Go code [%#x, %#x)", native.name(s.name), s.addr, s.size, lo, hi)
		}
	}
	if len(native.syms) == 0 || len(native.syms) > funcs/4 {
		t.Errorf("symbol table keeps %d of the file's %d functions; want the C ones only", len(native.syms), funcs)
	}
}

// A Go binary built with cgo holds C code too. The pclntab names only the
// Go code, so the frames it names say Go and the C functions' do not.
func TestCgoFramesGoOrNative(t *testing.T) {
	bin := testutil.BuildWorkload(t, testutil.GoCgo)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.Symbols()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !info.IsGo {
		t.Fatalf("%s: IsGo false", bin)
	}
	want := map[string]bool{ // ELF symbol -> Go code
		"main.goInner": true, "runtime.cgocall": true, "crosscall2": true, "runtime.asmcgocall.abi0": true,
		"c_leaf": false, "c_middle": false, "goCallback": false,
	}
	for _, sym := range syms {
		isGo, ok := want[sym.Name]
		if !ok || elf.ST_TYPE(sym.Info) != elf.STT_FUNC {
			continue
		}
		delete(want, sym.Name)
		frames, err := s.Symbolize(info.ID, vaddrToOffset(t, bin, sym.Value+1))
		if err != nil || len(frames) == 0 {
			t.Errorf("%s: %v, %v", sym.Name, frames, err)
			continue
		}
		if frames[0].Go != isGo || strings.TrimSuffix(sym.Name, ".abi0") != frames[0].Function {
			t.Errorf("%s: named %q with Go %v, want Go %v", sym.Name, frames[0].Function, frames[0].Go, isGo)
		}
	}
	if len(want) > 0 {
		t.Errorf("symbols not in %s: %v", bin, want)
	}
}
