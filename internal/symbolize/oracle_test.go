package symbolize

import (
	"debug/elf"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// addr2lineChains runs binutils addr2line -a -f -i -C on addrs and returns,
// per address, every inline level innermost first. An address addr2line
// cannot name gives nil.
func addr2lineChains(t testing.TB, bin string, addrs []uint64) [][]sourcePos {
	t.Helper()
	return addr2lineChainsWith(t, "addr2line", bin, addrs)
}

// addr2lineChainsWith is addr2lineChains with the addr2line named (a
// cross toolchain's, for another architecture's binaries).
func addr2lineChainsWith(t testing.TB, addr2line, bin string, addrs []uint64) [][]sourcePos {
	t.Helper()
	tool := testutil.RequireTool(t, addr2line)
	var out [][]sourcePos
	for len(addrs) > 0 { // keep command lines short
		batch := addrs[:min(len(addrs), 2000)]
		addrs = addrs[len(batch):]
		args := []string{"-a", "-f", "-i", "-C", "-e", bin}
		for _, a := range batch {
			args = append(args, fmt.Sprintf("%#x", a))
		}
		groups := addr2lineGroups(t, run(t, nil, tool, args...), len(batch))
		for _, g := range groups {
			levels := parseAddr2line(t, g, strings.Count(g, "\n")/2)
			if len(levels) == 1 && (levels[0].Function == "??" || levels[0].Function == "?") {
				levels = nil
			}
			for i := range levels {
				if levels[i].Function == "??" {
					levels[i].Function = ""
				}
			}
			out = append(out, levels)
		}
	}
	return out
}

// chainOf keeps what addr2line -C prints: the full demangled name (of
// the raw name, as fullNames checks), the file and the line.
func chainOf(t testing.TB, frames []Line) []sourcePos {
	var out []sourcePos
	for _, f := range fullNames(t, frames) {
		out = append(out, sourcePos{Function: f.Function, File: f.File, Line: f.Line})
	}
	return out
}

// agreement symbolizes every address of bin through s and compares each
// whole inline chain with addr2line's. It returns the number of addresses
// that agree exactly, the number that agree once both sides' paths are
// cleaned (debug/dwarf cleans "dir/../file"; addr2line prints it as
// recorded), and a description of the first few that differ even then.
func agreement(t testing.TB, s *Symbolizer, bin, oracleBin string, addrs []uint64) (agree, cleanAgree int, diffs []string) {
	return agreementWith(t, s, bin, oracleBin, addrs, false)
}

// agreementWith is agreement; with artificial, a level addr2line places in
// "<artificial>" (binutils 2.40 shows GCC's LTO units so where their line
// table names the source file) is compared without its file.
func agreementWith(t testing.TB, s *Symbolizer, bin, oracleBin string, addrs []uint64, artificial bool) (agree, cleanAgree int, diffs []string) {
	t.Helper()
	return agreementTool(t, "addr2line", s, bin, oracleBin, addrs, artificial)
}

// agreementTool is agreementWith with the addr2line named.
func agreementTool(t testing.TB, addr2line string, s *Symbolizer, bin, oracleBin string, addrs []uint64, artificial bool) (agree, cleanAgree int, diffs []string) {
	t.Helper()
	info, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	want := addr2lineChainsWith(t, addr2line, oracleBin, addrs)
	for i, a := range addrs {
		got, err := s.Symbolize(info.ID, vaddrToOffset(t, bin, a))
		if err != nil {
			t.Fatalf("Symbolize(%#x): %v", a, err)
		}
		chain := chainOf(t, got)
		if artificial && len(chain) == len(want[i]) {
			for k := range want[i] {
				if strings.HasSuffix(want[i][k].File, "/<artificial>") {
					want[i][k].File = chain[k].File
				}
			}
		}
		if diff := cmp.Diff(want[i], chain); diff == "" {
			agree++
			cleanAgree++
		} else if cmp.Equal(cleanPaths(want[i]), cleanPaths(chain)) {
			cleanAgree++
		} else if len(diffs) < 10 {
			diffs = append(diffs, fmt.Sprintf("%#x (-addr2line +ours):\n%s", a, diff))
		}
	}
	return agree, cleanAgree, diffs
}

func cleanPaths(chain []sourcePos) []sourcePos {
	out := slices.Clone(chain)
	for i := range out {
		if out[i].File != "" {
			out[i].File = path.Clean(out[i].File)
		}
	}
	return out
}

// strideAddrs returns addresses every stride bytes through each function.
func strideAddrs(syms []funcSym, stride uint64) []uint64 {
	var out []uint64
	for _, s := range syms {
		for a := s.addr; a < s.addr+max(s.size, 1); a += stride {
			out = append(out, a)
		}
	}
	return out
}

func TestInlineChainsOracle(t *testing.T) {
	type fixture struct {
		name  string
		build func(t *testing.T) string
		keep  func(funcSym) bool
	}
	ours := func(s funcSym) bool { return s.name == "walk" || s.name == "twice" || s.name == "main" }
	buildC := func(flags ...string) func(t *testing.T) string {
		return func(t *testing.T) string { return testutil.BuildC(t, "inline", flags, testdata("inline.c")) }
	}
	fixtures := []fixture{
		{"c-O2", buildC("-O2", "-g"), ours},
		{"c-O2-dwarf4", buildC("-O2", "-gdwarf-4"), ours},
		{"c-O3-nopie", buildC("-O3", "-g", "-fno-PIE", "-no-pie"), ours},
		{"c-O2-gz-zlib", buildC("-O2", "-g", "-gz=zlib"), ours},
		// LTO names inlined functions through DW_FORM_ref_addr into the
		// early debug info's unit.
		{"c-O2-lto", buildC("-O2", "-g", "-flto"), ours},
		// Without .debug_aranges each unit's entry gives its ranges.
		{"c-O2-no-aranges", func(t *testing.T) string {
			bin := buildC("-O2", "-g")(t)
			out := bin + ".no-aranges"
			run(t, nil, testutil.RequireTool(t, "objcopy"), "--remove-section=.debug_aranges", bin, out)
			return out
		}, ours},
		// binutils 2.40 no longer reads legacy .zdebug sections: the
		// uncompressed build is the oracle (oracleBin below).
		{"c-O2-objcopy-zlib-gnu", func(t *testing.T) string {
			return compressDebug(t, buildC("-O2", "-g")(t), "zlib-gnu")
		}, ours},
		// This gcc has no -gz=zstd; binutils compresses the same sections.
		{"c-O2-objcopy-zstd", func(t *testing.T) string {
			return compressDebug(t, buildC("-O2", "-g")(t), "zstd")
		}, ours},
		{"cxx-O2", func(t *testing.T) string {
			bin := filepath.Join(t.TempDir(), "inline-cxx")
			run(t, nil, testutil.RequireTool(t, "g++"), "-O2", "-g", "-o", bin, testdata("inline.cc"))
			return bin
		}, func(s funcSym) bool { return strings.HasPrefix(s.name, "_ZN3geo") || s.name == "main" }},
		{"rust-O2", func(t *testing.T) string {
			bin := filepath.Join(t.TempDir(), "rustprog")
			run(t, nil, testutil.RequireTool(t, "rustc"), "-C", "opt-level=2", "-C", "debuginfo=2", "-o", bin, testdata("rustprog.rs"))
			return bin
		}, func(s funcSym) bool { return strings.Contains(s.name, "8rustprog") }},
	}
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			bin := fx.build(t)
			var syms []funcSym
			for _, s := range nmFunctions(t, bin, false) {
				if fx.keep(s) {
					syms = append(syms, s)
				}
			}
			addrs := strideAddrs(syms, 3)
			if len(addrs) < 20 {
				t.Fatalf("oracle: only %d addresses in %v", len(addrs), syms)
			}
			s := New(zaptest.NewLogger(t), Options{})
			oracleBin := strings.TrimSuffix(bin, ".zlib-gnu")
			// addr2line places LTO units' lines in "<artificial>".
			lto := strings.HasSuffix(fx.name, "-lto")
			agree, _, diffs := agreementWith(t, s, bin, oracleBin, addrs, lto)
			inlined := 0
			for _, c := range addr2lineChains(t, oracleBin, addrs) {
				if len(c) > 1 {
					inlined++
				}
			}
			t.Logf("%s: %d/%d addresses agree with addr2line (%d with inline levels)", fx.name, agree, len(addrs), inlined)
			if inlined == 0 {
				t.Error("fixture does not exercise inlining: addr2line shows no inline level")
			}
			if agree != len(addrs) {
				t.Errorf("%d of %d addresses disagree with addr2line:\n%s", len(addrs)-agree, len(addrs), strings.Join(diffs, "\n"))
			}
		})
	}
}

// compressDebug compresses bin's debug sections with objcopy
// (--compress-debug-sections=how) and checks that they are.
func compressDebug(t *testing.T, bin, how string) string {
	t.Helper()
	out := bin + "." + how
	run(t, nil, testutil.RequireTool(t, "objcopy"), "--compress-debug-sections="+how, bin, out)
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if how == "zlib-gnu" {
		if f.Section(".zdebug_info") == nil {
			t.Fatalf("oracle: objcopy wrote no .zdebug_info")
		}
		return out
	}
	s := f.Section(".debug_info")
	if s == nil || s.Flags&elf.SHF_COMPRESSED == 0 {
		t.Fatalf("oracle: objcopy left .debug_info uncompressed")
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := elf.CompressionType(f.ByteOrder.Uint32(raw[s.Offset:])); how == "zstd" && got != elf.COMPRESS_ZSTD {
		t.Fatalf("oracle: .debug_info is compressed with %v, want zstd", got)
	}
	return out
}

const libcPath = "/lib/x86_64-linux-gnu/libc.so.6"

// TestLibcDebugFile checks libc against addr2line, which finds the same
// debug file (libc6-dbg) by build id.
func TestLibcDebugFile(t *testing.T) {
	if _, err := os.Stat(libcPath); err != nil {
		t.Skipf("no %s: %v", libcPath, err)
	}
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(libcPath)
	if err != nil {
		t.Fatal(err)
	}
	debugPath := filepath.Join(elfx.DefaultDebugDir, ".build-id", info.GNUBuildID[:2], info.GNUBuildID[2:]+".debug")
	if _, err := os.Stat(debugPath); err != nil {
		t.Skipf("libc6-dbg is not installed (%v)", err)
	}
	dyn := nmFunctions(t, libcPath, true)
	var syms []funcSym
	for i := 0; i < len(dyn); i += 5 {
		syms = append(syms, dyn[i])
	}
	var addrs []uint64
	for _, sym := range syms {
		addrs = append(addrs, probes(sym)...)
	}
	agree, cleanAgree, diffs := agreement(t, s, libcPath, libcPath, addrs)
	pct := func(n int) float64 { return 100 * float64(n) / float64(len(addrs)) }
	t.Logf("libc: %d/%d addresses (%.1f%%) agree with addr2line exactly, %d (%.1f%%) with cleaned paths",
		agree, len(addrs), pct(agree), cleanAgree, pct(cleanAgree))

	// Every probe must at least have a file and line now.
	withLine := 0
	for _, a := range addrs {
		got, _ := s.Symbolize(info.ID, vaddrToOffset(t, libcPath, a))
		if len(got) > 0 && got[0].File != "" && got[0].Line > 0 {
			withLine++
		}
	}
	t.Logf("libc: %d/%d addresses have a file and line", withLine, len(addrs))
	if withLine < len(addrs)*9/10 {
		t.Errorf("only %d of %d libc addresses have a file and line; the debug file was not used", withLine, len(addrs))
	}
	if cleanAgree < len(addrs)*8/10 { // measured 83.8%: see the report
		t.Errorf("only %d of %d libc addresses agree with addr2line:\n%s", cleanAgree, len(addrs), strings.Join(diffs, "\n"))
	}
}

const ldsoPath = "/lib64/ld-linux-x86-64.so.2"

// ld.so's entry code is hand-written assembly whose labels are untyped
// (STT_NOTYPE) in its debug file: _start, which calls _dl_start, and
// _dl_start_user, which calls _dl_init (the libraries' constructors) and
// jumps to the program. A stack through either is named from libc6-dbg's
// debug file like any other frame, as perf names it; so is a local
// function of ld.so that only the debug file has (_dl_start). The oracle
// is the debug file's own symbol table, read with debug/elf.
func TestLdSoEntryNamed(t *testing.T) {
	if _, err := os.Stat(ldsoPath); err != nil {
		t.Skipf("no %s: %v", ldsoPath, err)
	}
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(ldsoPath)
	if err != nil {
		t.Fatal(err)
	}
	debugPath := filepath.Join(elfx.DefaultDebugDir, ".build-id", info.GNUBuildID[:2], info.GNUBuildID[2:]+".debug")
	df, err := elf.Open(debugPath)
	if err != nil {
		t.Skipf("libc6-dbg is not installed (%v)", err)
	}
	syms, err := df.Symbols()
	df.Close()
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]elf.Symbol{}
	for _, sym := range syms {
		at[sym.Name] = sym
	}
	for _, name := range []string{"_start", "_dl_start_user", "_dl_start"} {
		if _, ok := at[name]; !ok {
			t.Fatalf("oracle: %s has no symbol %s", debugPath, name)
		}
	}
	if typ := elf.ST_TYPE(at["_start"].Info); typ != elf.STT_NOTYPE {
		t.Logf("_start is %v here, not STT_NOTYPE: the untyped case is not exercised", typ)
	}
	for _, tc := range []struct {
		what string
		pc   uint64
		want string
	}{
		// The return address of _start's call to _dl_start, minus one:
		// the last byte before _dl_start_user.
		{"caller _start", at["_dl_start_user"].Value - 1, "_start"},
		{"entry _start", at["_start"].Value, "_start"},
		// The return address of _dl_start_user's call to _dl_init, minus
		// one, is a few bytes in.
		{"caller _dl_start_user", at["_dl_start_user"].Value + 1, "_dl_start_user"},
		{"local function _dl_start", at["_dl_start"].Value + at["_dl_start"].Size/2, "_dl_start"},
	} {
		got, err := s.Symbolize(info.ID, vaddrToOffset(t, ldsoPath, tc.pc))
		if err != nil {
			t.Errorf("%s (%#x): %v", tc.what, tc.pc, err)
			continue
		}
		if len(got) == 0 || got[len(got)-1].Function != tc.want {
			t.Errorf("%s (%#x): %+v, want %s", tc.what, tc.pc, got, tc.want)
		}
	}
}
