package perl

import (
	"errors"
	"fmt"
)

// Layout is where one Perl 5 version keeps what the frame walker follows
// and the namer reads. Offsets are in bytes.
type Layout struct {
	Version int // 5.Version

	InterpCurcop       int64 // PerlInterpreter.Icurcop (COP *): the current statement
	InterpCurstackinfo int64 // .Icurstackinfo (PERL_SI *)

	SICxstack int64 // PERL_SI.si_cxstack (PERL_CONTEXT *)
	SIPrev    int64 // .si_prev (PERL_SI *)
	SICxix    int64 // .si_cxix (I32): the innermost context, -1: none
	SIType    int64 // .si_type (I32): PERLSI_*

	CxSize   int64 // sizeof(PERL_CONTEXT)
	CxType   int64 // .blk_type (U8): CXt_* | CXp_*
	CxU16    int64 // .blk_u16: an eval's op type << 7
	CxOldcop int64 // .blk_oldcop (COP *): the caller's statement
	CxRetop  int64 // .blk_sub.retop = .blk_eval.retop (OP *): NULL where C called it (call_sv)
	CxSubCV  int64 // .blk_sub.cv (CV *)

	CopLine int64 // COP.cop_line (U32)
	CopFile int64 // .cop_file (char *, threaded builds)

	SvFlags int64 // SV.sv_flags (U32): the type in its low byte

	XcvStash int64 // XPVCV.xcv_stash (HV *)
	XcvGV    int64 // .xcv_gv_u: GV *, or HEK * where CVf_NAMED
	XcvFile  int64 // .xcv_file (char *)
	XcvFlags int64 // .xcv_flags (U32)

	XgvNameHek int64 // XPVGV.xiv_u.xivu_namehek (HEK *)
	XgvStash   int64 // .xnv_u.xgv_stash (HV *)

	SvU          int64 // SV.sv_u: a hash's bucket array (HvARRAY)
	XhvMax       int64 // XPVHV.xhv_max: the array's last index
	XhvAux       int64 // xpvhv_with_aux.xhv_aux: a hash body's struct xpvhv_aux (where SVf_OOK); -1: after the bucket array (5.34 and before)
	AuxName      int64 // xpvhv_aux.xhv_name_u (HEK *, or HEK ** where the count is not 0)
	AuxNameCount int64 // .xhv_name_count (I32)

	HekLen int64 // HEK.hek_len (I32)
	HekKey int64 // .hek_key

	OpRequire int // OP_REQUIRE: an eval context's op type for require

	// Untested: written from the version's published sources, never run
	// against a real Perl on this project's hosts.
	Untested bool
}

// Values that are the same in every Perl 5 the table knows.
const (
	cxTypeMask  = 0x0f // CXTYPEMASK
	cxtSub      = 9    // CXt_SUB
	cxtFormat   = 10   // CXt_FORMAT
	cxtEval     = 11   // CXt_EVAL
	cxpEvalBlk  = 0x40 // CXp_EVALBLOCK: eval {} (and try {})
	cvfNamed    = 0x8000
	svtPVGV     = 9
	svtPVHV     = 12
	svtPVCV     = 13
	svTypeMask  = 0xff
	svfOOK      = 0x02000000 // SVf_OOK: a hash has its aux struct
	perlsiMain  = 1          // PERLSI_MAIN
	eopTypeShft = 7          // CxOLD_OP_TYPE is blk_u16 >> 7
)

// layouts are the versions this package knows, each checked against
// Debian's headers (libperl5.X's CORE, offsetof) by TestLayoutMatchesHeaders
// and run by the live tests: 5.32 is Debian 11's, 5.36 Debian 12's, 5.40
// Debian 13's, 5.42 Debian 14's. 5.40 and 5.42 keep every offset of 5.36
// and number their ops anew. 5.32's interpreter holds 16 more bytes before
// curcop, and a hash's aux struct follows its bucket array.
var layouts = map[int]Layout{
	32: perl532,
	36: perl536,
	40: with(perl536, 40, 345),
	42: with(perl536, 42, 349),
}

var perl536 = Layout{Version: 36,
	InterpCurcop: 208, InterpCurstackinfo: 224,
	SICxstack: 8, SIPrev: 16, SICxix: 32, SIType: 44,
	CxSize: 104, CxType: 0, CxU16: 2, CxOldcop: 16, CxRetop: 48, CxSubCV: 72,
	CopLine: 36, CopFile: 48,
	SvFlags:  12,
	XcvStash: 32, XcvGV: 56, XcvFile: 64, XcvFlags: 92,
	XgvNameHek: 32, XgvStash: 40,
	SvU: 16, XhvMax: 24, XhvAux: 32, AuxName: 0, AuxNameCount: 28,
	HekLen: 4, HekKey: 8,
	OpRequire: 342}

var perl532 = func() Layout {
	l := perl536
	l.Version, l.InterpCurcop, l.InterpCurstackinfo, l.XhvAux = 32, 224, 240, -1
	return l
}()

// with is l for Perl 5.version, whose OP_REQUIRE is opRequire.
func with(l Layout, version, opRequire int) Layout {
	l.Version, l.OpRequire = version, opRequire
	return l
}

// ErrUnknownVersion is matched by the error for a Perl whose version has
// no layout: its processes keep native stacks.
var ErrUnknownVersion = errors.New("unsupported perl version")

// LayoutFunc returns the layout of Perl 5.version, or an error matching
// ErrUnknownVersion.
type LayoutFunc func(version int) (Layout, error)

// LayoutFor returns the table's layout of Perl 5.version.
func LayoutFor(version int) (Layout, error) {
	l, ok := layouts[version]
	if !ok {
		return Layout{}, fmt.Errorf("perl 5.%d: %w", version, ErrUnknownVersion)
	}
	return l, nil
}
