package symbolize

import (
	"debug/elf"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// candidate describes one symbol for buildTable.
type candidate struct {
	name            string
	addr, size, end uint64 // end: the end of the symbol's section
	bind            elf.SymBind
	label           bool // untyped (STT_NOTYPE) in an executable section
}

func buildTable(cands []candidate) *nativeTable {
	var names strings.Builder
	var cs []symCandidate
	for _, c := range cands {
		rank := aliasRank(c.bind, c.size, []byte(c.name))
		if c.label {
			rank += 4 << 20 // as readSymbols ranks them
		}
		cs = append(cs, symCandidate{
			addr: c.addr, size: c.size, sectEnd: c.end,
			name: uint32(names.Len()), nameLen: uint32(len(c.name)),
			rank: rank, label: c.label,
		})
		names.WriteString(c.name)
		names.WriteByte(0)
	}
	t := &nativeTable{names: names.String(), namesHeap: true}
	if err := t.setSyms(cs); err != nil {
		panic(err)
	}
	return t
}

func TestNativeLookup(t *testing.T) {
	table := buildTable([]candidate{
		{name: "sized", addr: 0x1000, size: 0x10, bind: elf.STB_GLOBAL},
		{name: "unsized", addr: 0x1100, bind: elf.STB_GLOBAL},
		{name: "next", addr: 0x1180, size: 0x20, bind: elf.STB_GLOBAL},
		{name: "__alias_local", addr: 0x1200, size: 0x40, bind: elf.STB_LOCAL},
		{name: "alias_weak", addr: 0x1200, size: 0x40, bind: elf.STB_WEAK},
		{name: "__alias_global", addr: 0x1200, size: 0x40, bind: elf.STB_GLOBAL},
		{name: "alias_global", addr: 0x1200, size: 0x40, bind: elf.STB_GLOBAL},
		{name: "outer", addr: 0x1300, size: 0x100, bind: elf.STB_GLOBAL},
		{name: "inner", addr: 0x1340, size: 0x10, bind: elf.STB_LOCAL},
		{name: "last_unsized", addr: 0x2000, end: 0x2100, bind: elf.STB_GLOBAL},
	})
	tests := []struct {
		addr uint64
		want string // "" for not found
	}{
		{0xfff, ""},
		{0x1000, "sized"},
		{0x100f, "sized"},
		{0x1010, ""}, // past the sized end, before the next symbol
		{0x1100, "unsized"},
		{0x117f, "unsized"}, // unsized: up to the next symbol
		{0x1180, "next"},
		{0x11a0, ""},
		{0x1200, "alias_global"}, // global, then fewest leading underscores
		{0x123f, "alias_global"},
		{0x1345, "inner"},
		{0x1350, "outer"}, // past the nested symbol, still in the outer one
		{0x13ff, "outer"},
		{0x1400, ""},
		{0x20ff, "last_unsized"}, // the last unsized symbol ends with its section
		{0x2100, ""},
	}
	for _, tt := range tests {
		got, ok := table.lookup(tt.addr)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("lookup(%#x) = %q, %v; want %q", tt.addr, got, ok, tt.want)
		}
	}
}

func TestDemangled(t *testing.T) {
	// Mangled inputs are checked against addr2line in TestSymbolizeCxx and
	// TestSymbolizeRust; here only what must pass through untouched.
	for _, name := range []string{"main", "qsort", "_start", "__libc_start_main", "_Zfoo", "_R", "_ZN"} {
		if got := demangled(name); got != name {
			t.Errorf("demangled(%q) = %q, want it unchanged", name, got)
		}
	}
	// A name that expands past the length bound stays raw instead of
	// growing without limit: each S_ back-reference doubles the output.
	bomb := "_Z1fI" + strings.Repeat("S_", 64) + "E" + "vv"
	if got := demangled(bomb); len(got) > 1<<demangleMaxLength {
		t.Errorf("demangled bomb is %d bytes", len(got))
	}
}

func TestCString(t *testing.T) {
	tab := []byte("\x00main\x00" + strings.Repeat("x", maxSymbolName+10))
	tests := []struct {
		off  uint32
		want string
	}{
		{0, ""},
		{1, "main"},
		{3, "in"},
		{6, strings.Repeat("x", maxSymbolName)},
		{uint32(len(tab)), ""},
		{^uint32(0), ""},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, string(cString(tab, tt.off))); diff != "" {
			t.Errorf("cString(%d) (-want +got):\n%s", tt.off, diff)
		}
	}
}

func TestNativeSymSize(t *testing.T) {
	if got := unsafe.Sizeof(nativeSym{}); got != nativeSymSize {
		t.Errorf("nativeSym takes %d bytes, nativeSymSize says %d", got, nativeSymSize)
	}
}

func TestRustSymbol(t *testing.T) {
	tests := []struct {
		raw  string
		want bool
	}{
		{"_RNvCs1234_7mycrate3foo", true},                       // v0
		{"_ZN4core3fmt5write17h0123456789abcdefE", true},        // legacy
		{"_ZN8rustprog4main17h9f3b2a1c0d4e5f60E.llvm.42", true}, // legacy, LLVM suffix
		{"_ZN4core3fmt5write17h0123456789abcdeE", false},        // 15 hex digits
		{"_ZN4core3fmt5write17h0123456789abcdxfE", false},       // not hex
		{"_ZNSt6vectorIiSaIiEE9push_backERKi", false},           // C++
		{"_ZN3geo5ShapeC2Ed", false},
		{"main", false},
		{"_R", false},
	}
	for _, tt := range tests {
		if got := rustSymbol(tt.raw); got != tt.want {
			t.Errorf("rustSymbol(%q) = %v, want %v", tt.raw, got, tt.want)
		}
	}
}

func TestNativeFrameNames(t *testing.T) {
	tests := []struct {
		raw  string
		want Line
	}{
		{"_ZN5clang4Sema12ActOnComment6ModuleERNS_4SemaEbb", Line{Function: "clang::Sema::ActOnComment::Module", SystemName: "_ZN5clang4Sema12ActOnComment6ModuleERNS_4SemaEbb"}},
		{"_ZNSt6vectorIiSaIiEE9push_backERKi", Line{Function: "std::vector::push_back", SystemName: "_ZNSt6vectorIiSaIiEE9push_backERKi"}},
		{"_ZN4core3fmt5write17h0123456789abcdefE", Line{Function: "core::fmt::write", SystemName: "_ZN4core3fmt5write17h0123456789abcdefE", Rust: true}},
		{"qsort", Line{Function: "qsort"}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, nativeFrame(tt.raw, "", 0)); diff != "" {
			t.Errorf("nativeFrame(%q) (-want +got):\n%s", tt.raw, diff)
		}
	}
}

// TestReadSymbolsIndexesOutsideTheHeap reads the .dynsym of GCC's C++
// compiler in place, about 30k functions, and checks that the heap took a
// small part of what their index and candidates take: both live outside
// it, and the index is counted all the same.
func TestReadSymbolsIndexesOutsideTheHeap(t *testing.T) {
	out, err := exec.Command(testutil.RequireTool(t, "g++"), "-print-prog-name=cc1plus").Output()
	if err != nil {
		t.Fatal(err)
	}
	path := strings.TrimSpace(string(out))
	img, ef := mapELF(t, path)
	sec := ef.SectionByType(elf.SHT_DYNSYM)
	if sec == nil {
		t.Fatalf("%s has no .dynsym", path)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	table, err := readSymbols(ef, img.Bytes(), sec, true)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	defer table.unmap()
	n := len(table.syms)
	if n < 10_000 {
		t.Fatalf("%d functions in %s's .dynsym; want a big table", n, path)
	}
	held := int64(n) * nativeSymSize
	if got := table.memSize(); got < held {
		t.Errorf("memSize() = %d, below the %d bytes its index holds", got, held)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(held)/4 {
		t.Errorf("reading %d functions allocated %d heap bytes; the index (%d bytes) and its candidates belong outside the heap", n, got, held)
	}
	// Every function the oracle lists is named.
	syms, err := ef.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, sym := range syms {
		if elf.ST_TYPE(sym.Info) != elf.STT_FUNC || sym.Value == 0 || sym.Section == elf.SHN_UNDEF || sym.Size == 0 {
			continue
		}
		if _, ok := table.lookup(sym.Value); !ok {
			t.Errorf("no function at %#x (%s)", sym.Value, sym.Name)
		}
		checked++
	}
	if checked < n/2 {
		t.Errorf("checked %d functions of %d", checked, n)
	}
}

// Untyped labels in code name what no function covers (ld.so's _start and
// _dl_start_user); inside a sized function, or at its address, the
// function wins.
func TestNativeLabels(t *testing.T) {
	table := buildTable([]candidate{
		{name: "_start", addr: 0x1000, bind: elf.STB_LOCAL, label: true},
		{name: "_dl_start_user", addr: 0x1008, bind: elf.STB_LOCAL, label: true},
		{name: "func", addr: 0x1100, size: 0x40, bind: elf.STB_GLOBAL},
		{name: "inner_label", addr: 0x1120, bind: elf.STB_LOCAL, label: true},
		{name: "same_address_label", addr: 0x1200, bind: elf.STB_GLOBAL, label: true},
		{name: "other", addr: 0x1200, size: 0x10, bind: elf.STB_LOCAL},
		{name: "after", addr: 0x1300, end: 0x1310, bind: elf.STB_LOCAL, label: true},
	})
	for _, tt := range []struct {
		addr uint64
		want string
	}{
		{0x1000, "_start"},
		{0x1007, "_start"}, // a label ends at the next symbol
		{0x1009, "_dl_start_user"},
		{0x10ff, "_dl_start_user"},
		{0x1130, "func"}, // the label inside func is not kept
		{0x1205, "other"},
		{0x130f, "after"},
		{0x1310, ""},
	} {
		got, ok := table.lookup(tt.addr)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("lookup(%#x) = %q, %v; want %q", tt.addr, got, ok, tt.want)
		}
	}
}
