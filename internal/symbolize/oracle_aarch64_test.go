package symbolize

import (
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestInlineChainsOracleARM64 is TestInlineChainsOracle on aarch64
// binaries, cross-compiled (Debian's gcc-aarch64-linux-gnu) and checked
// against aarch64-linux-gnu-addr2line: ELF symbols, DWARF lines and inline
// chains do not depend on the architecture, and must stay so.
func TestInlineChainsOracleARM64(t *testing.T) {
	const addr2line = "aarch64-linux-gnu-addr2line"
	ours := func(s funcSym) bool { return s.name == "walk" || s.name == "twice" || s.name == "main" }
	for _, fx := range []struct {
		name     string
		compiler string
		source   string
		flags    []string
		keep     func(funcSym) bool
	}{
		{"c-O2", testutil.CrossCC, "inline.c", []string{"-O2", "-g"}, ours},
		{"c-O2-pac", testutil.CrossCC, "inline.c", []string{"-O2", "-g", "-mbranch-protection=standard"}, ours},
		{"c-O2-dwarf4", testutil.CrossCC, "inline.c", []string{"-O2", "-gdwarf-4"}, ours},
		{"cxx-O2", testutil.CrossCXX, "inline.cc", []string{"-O2", "-g"}, func(s funcSym) bool { return strings.HasPrefix(s.name, "_ZN3geo") || s.name == "main" }},
	} {
		t.Run(fx.name, func(t *testing.T) {
			bin := testutil.BuildCWith(t, fx.compiler, "inline-arm64", fx.flags, testdata(fx.source))
			var syms []funcSym
			for _, s := range nmFunctions(t, bin, false) {
				if fx.keep(s) {
					syms = append(syms, s)
				}
			}
			// aarch64 instructions are 4 bytes: every one of them.
			addrs := strideAddrs(syms, 4)
			if len(addrs) < 20 {
				t.Fatalf("oracle: only %d addresses in %v", len(addrs), syms)
			}
			s := New(zaptest.NewLogger(t), Options{})
			agree, _, diffs := agreementTool(t, addr2line, s, bin, bin, addrs, false)
			inlined := 0
			for _, c := range addr2lineChainsWith(t, addr2line, bin, addrs) {
				if len(c) > 1 {
					inlined++
				}
			}
			t.Logf("%s: %d/%d addresses agree with %s (%d with inline levels)", fx.name, agree, len(addrs), addr2line, inlined)
			if inlined == 0 {
				t.Error("fixture does not exercise inlining: addr2line shows no inline level")
			}
			if agree != len(addrs) {
				t.Errorf("%d of %d addresses disagree with %s:\n%s", len(addrs)-agree, len(addrs), addr2line, strings.Join(diffs, "\n"))
			}
		})
	}
}
