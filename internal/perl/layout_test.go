package perl

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// offsetsC prints every offset of the layout from the interpreter's
// headers.
const offsetsC = `#include <stdio.h>
#include <stddef.h>
#include "EXTERN.h"
#include "perl.h"
#define P(n, e) printf("%s %lld\n", n, (long long)(e))
int main(void) {
	P("Version", PERL_VERSION);
	P("InterpCurcop", offsetof(PerlInterpreter, Icurcop));
	P("InterpCurstackinfo", offsetof(PerlInterpreter, Icurstackinfo));
	P("SICxstack", offsetof(PERL_SI, si_cxstack));
	P("SIPrev", offsetof(PERL_SI, si_prev));
	P("SICxix", offsetof(PERL_SI, si_cxix));
	P("SIType", offsetof(PERL_SI, si_type));
	P("CxSize", sizeof(PERL_CONTEXT));
	P("CxType", offsetof(PERL_CONTEXT, cx_u.cx_blk.blku_type));
	P("CxU16", offsetof(PERL_CONTEXT, cx_u.cx_blk.blku_u16));
	P("CxOldcop", offsetof(PERL_CONTEXT, cx_u.cx_blk.blku_oldcop));
	P("CxRetop", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.retop));
	P("CxEvalRetop", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_eval.retop));
	P("CxFormatRetop", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_format.retop));
	P("CxSubCV", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_sub.cv));
	P("CxFormatCV", offsetof(PERL_CONTEXT, cx_u.cx_blk.blk_u.blku_format.cv));
	P("CopLine", offsetof(COP, cop_line));
	P("CopFile", offsetof(COP, cop_file));
	P("SvAny", offsetof(SV, sv_any));
	P("SvFlags", offsetof(SV, sv_flags));
	P("XcvStash", offsetof(XPVCV, xcv_stash));
	P("XcvGV", offsetof(XPVCV, xcv_gv_u));
	P("XcvFile", offsetof(XPVCV, xcv_file));
	P("XcvFlags", offsetof(XPVCV, xcv_flags));
	P("XcvFlagsSize", sizeof(((XPVCV *)0)->xcv_flags));
	P("XgvNameHek", offsetof(XPVGV, xiv_u.xivu_namehek));
	P("XgvStash", offsetof(XPVGV, xnv_u.xgv_stash));
	P("SvU", offsetof(SV, sv_u));
	P("XhvMax", offsetof(XPVHV, xhv_max));
#if PERL_VERSION >= 36
	P("XhvAux", offsetof(struct xpvhv_with_aux, xhv_aux));
#else
	P("XhvAux", -1); /* HvAUX: after the bucket array */
#endif
	P("AuxName", offsetof(struct xpvhv_aux, xhv_name_u));
	P("AuxNameCount", offsetof(struct xpvhv_aux, xhv_name_count));
	P("HekLen", offsetof(HEK, hek_len));
	P("HekKey", offsetof(HEK, hek_key));
	P("OpRequire", OP_REQUIRE);
	P("CXTYPEMASK", CXTYPEMASK);
	P("CXt_SUB", CXt_SUB);
	P("CXt_FORMAT", CXt_FORMAT);
	P("CXt_EVAL", CXt_EVAL);
#ifdef CXp_EVALBLOCK
	P("CXp_EVALBLOCK", CXp_EVALBLOCK);
#else
	P("CXp_EVALBLOCK", CXp_TRYBLOCK); /* its name before 5.34 */
#endif
	P("CVf_NAMED", CVf_NAMED);
	P("SVt_PVGV", SVt_PVGV);
	P("SVt_PVHV", SVt_PVHV);
	P("SVt_PVCV", SVt_PVCV);
	P("SVTYPEMASK", SVTYPEMASK);
	P("SVf_OOK", SVf_OOK);
	P("PERLSI_MAIN", PERLSI_MAIN);
	return 0;
}
`

// TestLayoutMatchesHeaders compiles offsetsC against each tested
// interpreter's headers (Debian's libperl5.X ships them), with the flags
// the interpreter gives embedders, and compares every offset and constant
// with the table's layout of that version.
func TestLayoutMatchesHeaders(t *testing.T) {
	eachPerl(t, testLayoutMatchesHeaders)
}

func testLayoutMatchesHeaders(t *testing.T, pl testutil.Interpreter) {
	opts, err := pl.Command("-MExtUtils::Embed", "-e", "ccopts").Output()
	if err != nil {
		t.Fatalf("perl -MExtUtils::Embed -e ccopts: %v", err)
	}
	var flags []string
	inc := ""
	for _, f := range strings.Fields(string(opts)) {
		if strings.HasPrefix(f, "-I") && strings.HasSuffix(f, "/CORE") {
			inc = strings.TrimPrefix(f, "-I")
			if r := pl.Root(); r != nil { // another release's, where it is unpacked
				inc = r.Path(inc)
			}
			f = "-I" + inc
		}
		flags = append(flags, f)
	}
	if _, err := os.Stat(filepath.Join(inc, "perl.h")); err != nil {
		if testutil.InCI() {
			t.Fatalf("perl %s's headers are missing (CI=true: make deps installs libperl5.36; the tests unpack 5.40's): %v", pl.Version, err)
		}
		t.Skipf("perl's headers are missing: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "offsets.c")
	if err := os.WriteFile(src, []byte(offsetsC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "offsets")
	// -O1 drops the headers' static functions, which name libperl's symbols.
	args := append(flags, "-O1", "-w", "-o", bin, src)
	if out, err := exec.Command(testutil.RequireTool(t, "gcc"), args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		got[f[0]] = v
	}
	if got["Version"] != int64(pl.Minor) {
		t.Fatalf("headers of perl 5.%d, want 5.%d", got["Version"], pl.Minor)
	}
	l, err := LayoutFor(int(got["Version"]))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"InterpCurcop": l.InterpCurcop, "InterpCurstackinfo": l.InterpCurstackinfo,
		"SICxstack": l.SICxstack, "SIPrev": l.SIPrev, "SICxix": l.SICxix, "SIType": l.SIType,
		"CxSize": l.CxSize, "CxType": l.CxType, "CxU16": l.CxU16, "CxOldcop": l.CxOldcop,
		"CxRetop": l.CxRetop, "CxEvalRetop": l.CxRetop, "CxFormatRetop": l.CxRetop,
		"CxSubCV": l.CxSubCV, "CxFormatCV": l.CxSubCV,
		"CopLine": l.CopLine, "CopFile": l.CopFile, "SvAny": 0, "SvFlags": l.SvFlags,
		"XcvStash": l.XcvStash, "XcvGV": l.XcvGV, "XcvFile": l.XcvFile, "XcvFlags": l.XcvFlags, "XcvFlagsSize": 4,
		"XgvNameHek": l.XgvNameHek, "XgvStash": l.XgvStash,
		"SvU": l.SvU, "XhvMax": l.XhvMax, "XhvAux": l.XhvAux, "AuxName": l.AuxName, "AuxNameCount": l.AuxNameCount,
		"HekLen": l.HekLen, "HekKey": l.HekKey, "OpRequire": int64(l.OpRequire),
		"CXTYPEMASK": cxTypeMask, "CXt_SUB": cxtSub, "CXt_FORMAT": cxtFormat, "CXt_EVAL": cxtEval,
		"CXp_EVALBLOCK": cxpEvalBlk, "CVf_NAMED": cvfNamed, "SVt_PVGV": svtPVGV, "SVt_PVHV": svtPVHV,
		"SVt_PVCV": svtPVCV, "SVTYPEMASK": svTypeMask, "SVf_OOK": svfOOK, "PERLSI_MAIN": perlsiMain,
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: headers say %d (found %v), the layout %d", k, g, ok, w)
		}
	}
}
