package unwind

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// Hand-assembled CFI: every test section lives at secAddr, and every FDE
// covers [fdeBegin, fdeBegin+fdeSize).
const (
	secAddr  = 0x10000
	fdeBegin = 0x1000
	fdeSize  = 0x100
)

func uleb(v uint64) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			out = append(out, c|0x80)
			continue
		}
		return append(out, c)
	}
}

func sleb(v int64) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 && c&0x40 == 0 || v == -1 && c&0x40 != 0 {
			return append(out, c)
		}
		out = append(out, c|0x80)
	}
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func u16(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// encodePtr encodes v in encoding enc for a field at fieldAddr.
func encodePtr(enc uint8, v, fieldAddr uint64, bases ptrCtx) []byte {
	switch enc & 0x70 {
	case pePCRel:
		v -= fieldAddr
	case peTextRel:
		v -= bases.textBase
	case peDataRel:
		v -= bases.dataBase
	}
	switch enc & 0x0f {
	case peAbsptr, peUdata8, peSdata8:
		return u64(v)
	case peULEB128:
		return uleb(v)
	case peSLEB128:
		return sleb(int64(v))
	case peUdata2, peSdata2:
		return u16(uint16(v))
	default:
		return u32(uint32(v))
	}
}

// defaultInitial is what GCC's x86-64 CIE says: CFA = rsp+8, ra at cfa-8.
var defaultInitial = []byte{0x0c, 7, 8, 0x80 | 16, 1}

// cieBody is a CIE after its id: version 1, code alignment 1, data alignment
// -8, return address column 16.
func cieBody(aug string, augData, initial []byte) []byte {
	b := cat([]byte{1}, []byte(aug), []byte{0}, uleb(1), sleb(-8), []byte{16})
	if len(aug) > 0 && aug[0] == 'z' {
		b = cat(b, uleb(uint64(len(augData))), augData)
	}
	return cat(b, initial)
}

// ehFrame lays out a CIE at offset 0 and then one FDE per element of fdes;
// fde gets the offset of its pc_begin field and returns the FDE body
// (without length and CIE pointer).
func ehFrame(cie []byte, fdes ...func(fieldOff int) []byte) []byte {
	sec := cat(u32(uint32(4+len(cie))), u32(0), cie)
	for _, f := range fdes {
		off := len(sec)
		body := f(off + 8)
		sec = cat(sec, u32(uint32(4+len(body))), u32(uint32(off+4)), body)
	}
	return cat(sec, u32(0))
}

// fde returns an FDE body with pc_begin/pc_range in enc and instructions
// prog; withAug adds the 'z' augmentation length.
func fde(enc uint8, bases ptrCtx, withAug bool, prog []byte) func(int) []byte {
	return func(fieldOff int) []byte {
		begin := encodePtr(enc, fdeBegin, secAddr+uint64(fieldOff), bases)
		b := cat(begin, encodePtr(enc&0x0f, fdeSize, 0, ptrCtx{}))
		if withAug {
			b = cat(b, uleb(0))
		}
		return cat(b, prog)
	}
}

func parseEH(t *testing.T, data []byte, ctx ptrCtx) *Table {
	t.Helper()
	ctx.secAddr = secAddr
	tab, err := fromSections(&section{data: data, addr: secAddr, ctx: ctx}, nil, pcRange{}, nil)
	if err != nil {
		t.Fatalf("fromSections: %v", err)
	}
	return tab
}

func sp(pc uint64, off int32) Row { return Row{PC: pc, CFA: CFASP, CFAOffset: off} }
func spFP(pc uint64, off int32, fpOff int16) Row {
	return Row{PC: pc, CFA: CFASP, CFAOffset: off, FP: FPOffset, FPOffset: fpOff}
}
func endRow() Row { return Row{PC: fdeBegin + fdeSize} }

func TestOps(t *testing.T) {
	const b = fdeBegin
	cases := []struct {
		name string
		prog []byte
		want []Row // the closing CFAUnknown row is added; nil: the FDE is dropped
	}{
		{"nop", []byte{0, 0, 0}, []Row{sp(b, 8)}},
		{"advance_loc def_cfa_offset", []byte{0x41, 0x0e, 16, 0x44, 0x0e, 8}, []Row{sp(b, 8), sp(b+1, 16), sp(b+5, 8)}},
		{"advance_loc1", []byte{0x02, 0x80, 0x0e, 16}, []Row{sp(b, 8), sp(b+0x80, 16)}},
		{"advance_loc2", []byte{0x03, 0x10, 0x00, 0x0e, 16}, []Row{sp(b, 8), sp(b+0x10, 16)}},
		{"advance_loc4", []byte{0x04, 0x20, 0, 0, 0, 0x0e, 16}, []Row{sp(b, 8), sp(b+0x20, 16)}},
		{"advance past end drops rows", []byte{0x04, 0, 0x10, 0, 0, 0x0e, 16}, []Row{sp(b, 8)}},
		{"set_loc", cat([]byte{0x01}, u32(b+7), []byte{0x0e, 24}), []Row{sp(b, 8), sp(b+7, 24)}},
		{"offset rbp", []byte{0x0e, 16, 0x86, 2}, []Row{spFP(b, 16, -16)}},
		{"offset_extended", []byte{0x0e, 16, 0x05, 6, 2}, []Row{spFP(b, 16, -16)}},
		{"offset_extended_sf", cat([]byte{0x0e, 16, 0x11, 6}, sleb(2)), []Row{spFP(b, 16, -16)}},
		{"GNU_negative_offset_extended", []byte{0x2f, 6, 1}, []Row{spFP(b, 8, 8)}},
		{"restore", []byte{0x86, 2, 0x41, 0xc6}, []Row{spFP(b, 8, -16), sp(b+1, 8)}},
		{"restore_extended", []byte{0x86, 2, 0x41, 0x06, 6}, []Row{spFP(b, 8, -16), sp(b+1, 8)}},
		{"undefined rbp", []byte{0x07, 6}, []Row{{PC: b, CFA: CFASP, CFAOffset: 8, FP: FPUnknown}}},
		{"undefined ra is the outermost frame", []byte{0x07, 16}, []Row{{PC: b, CFA: CFAEnd}}},
		{"same_value", []byte{0x86, 2, 0x41, 0x08, 6}, []Row{spFP(b, 8, -16), sp(b+1, 8)}},
		{"register", []byte{0x09, 6, 3}, []Row{{PC: b, CFA: CFASP, CFAOffset: 8, FP: FPUnknown}}},
		{"register ra elsewhere", []byte{0x09, 16, 3}, []Row{{PC: b}}},
		{"val_offset rbp", []byte{0x14, 6, 2}, []Row{{PC: b, CFA: CFASP, CFAOffset: 8, FP: FPUnknown}}},
		{"val_offset_sf rbp", cat([]byte{0x15, 6}, sleb(2)), []Row{{PC: b, CFA: CFASP, CFAOffset: 8, FP: FPUnknown}}},
		{"remember restore_state", []byte{0x0a, 0x41, 0x0e, 32, 0x86, 4, 0x41, 0x0b},
			[]Row{sp(b, 8), spFP(b+1, 32, -32), sp(b+2, 8)}},
		{"restore_state underflow", []byte{0x0b}, nil},
		{"def_cfa rbp", []byte{0x0c, 6, 16, 0x86, 2}, []Row{{PC: b, CFA: CFAFP, CFAOffset: 16, FP: FPOffset, FPOffset: -16}}},
		{"def_cfa_register", []byte{0x0e, 16, 0x41, 0x0d, 6}, []Row{sp(b, 16), {PC: b + 1, CFA: CFAFP, CFAOffset: 16}}},
		{"def_cfa other register", []byte{0x0c, 10, 0}, []Row{{PC: b}}},
		{"def_cfa_sf", cat([]byte{0x12, 7}, sleb(-3)), []Row{sp(b, 24)}},
		{"def_cfa_offset_sf", cat([]byte{0x13}, sleb(-4)), []Row{sp(b, 32)}},
		{"def_cfa_expression plt", cat([]byte{0x0f, byte(len(pltExpr))}, pltExpr), []Row{{PC: b, CFA: CFAPLT, CFAOffset: 8}}},
		{"def_cfa_expression other", []byte{0x0f, 3, 0x76, 0x78, 0x06}, []Row{{PC: b}}},
		{"def_cfa_offset after expression", []byte{0x0f, 1, 0x96, 0x41, 0x0e, 16}, []Row{{PC: b}, sp(b+1, 16)}},
		{"expression rbp", []byte{0x10, 6, 2, 0x76, 0x00}, []Row{{PC: b, CFA: CFASP, CFAOffset: 8, FP: FPUnknown}}},
		{"val_expression rbp", []byte{0x16, 6, 2, 0x76, 0x00}, []Row{{PC: b, CFA: CFASP, CFAOffset: 8, FP: FPUnknown}}},
		{"expression other register", []byte{0x10, 3, 2, 0x76, 0x00}, []Row{sp(b, 8)}},
		{"GNU_args_size", []byte{0x2e, 16, 0x41, 0x0e, 16}, []Row{sp(b, 8), sp(b+1, 16)}},
		{"unknown op", []byte{0x2d}, nil},
		{"truncated operand", []byte{0x0c, 7}, nil},
		{"expression longer than fde", []byte{0x0f, 100, 0}, nil},
		{"location moves back", cat([]byte{0x41, 0x01}, u32(b)), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := ehFrame(cieBody("zR", []byte{peUdata4}, defaultInitial), fde(peUdata4, ptrCtx{}, true, tc.prog))
			tab := parseEH(t, data, ptrCtx{})
			want := tc.want
			if n := len(want); n > 0 && !want[n-1].sameRule(endRow()) {
				want = append(want, endRow()) // an unknown last row merges with the closing one
			}
			if diff := cmp.Diff(want, tab.Rows, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			wantBad := 0
			if tc.want == nil {
				wantBad = 1
			}
			if tab.Stats.BadFDEs != wantBad {
				t.Errorf("BadFDEs = %d, want %d", tab.Stats.BadFDEs, wantBad)
			}
		})
	}
}

func TestRememberStateDepth(t *testing.T) {
	prog := make([]byte, maxStateDepth+1)
	for i := range prog {
		prog[i] = 0x0a
	}
	data := ehFrame(cieBody("zR", []byte{peUdata4}, defaultInitial), fde(peUdata4, ptrCtx{}, true, prog))
	tab := parseEH(t, data, ptrCtx{})
	if tab.Stats.BadFDEs != 1 || len(tab.Rows) != 0 {
		t.Errorf("remember_state %d deep: stats %+v rows %v, want the FDE dropped", len(prog), tab.Stats, tab.Rows)
	}
}

func TestPointerEncodings(t *testing.T) {
	bases := ptrCtx{textBase: 0x800, dataBase: 0x20000}
	// The indirect case stores fdeBegin in a fake GOT slot at 0x30000.
	bases.deref = func(addr uint64) (uint64, error) {
		if addr == 0x30000 {
			return fdeBegin, nil
		}
		return 0, errors.New("unmapped")
	}
	cases := []struct {
		name string
		enc  uint8
	}{
		{"absptr", peAbsptr},
		{"udata2", peUdata2},
		{"udata4", peUdata4},
		{"udata8", peUdata8},
		{"sdata2", peSdata2},
		{"sdata4", peSdata4},
		{"sdata8", peSdata8},
		{"uleb128", peULEB128},
		{"sleb128", peSLEB128},
		{"pcrel sdata4", pePCRel | peSdata4},
		{"pcrel sdata8", pePCRel | peSdata8},
		{"textrel udata4", peTextRel | peUdata4},
		{"datarel sdata4", peDataRel | peSdata4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := ehFrame(cieBody("zR", []byte{tc.enc}, defaultInitial), fde(tc.enc, bases, true, []byte{0x42, 0x0e, 16}))
			tab := parseEH(t, data, bases)
			want := []Row{sp(fdeBegin, 8), sp(fdeBegin+2, 16), endRow()}
			if diff := cmp.Diff(want, tab.Rows); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("indirect pcrel sdata4", func(t *testing.T) {
		enc := uint8(peIndirect | pePCRel | peSdata4)
		f := func(fieldOff int) []byte {
			return cat(u32(uint32(0x30000-(secAddr+uint64(fieldOff)))), u32(fdeSize), uleb(0))
		}
		data := ehFrame(cieBody("zR", []byte{enc}, defaultInitial), f)
		tab := parseEH(t, data, bases)
		if diff := cmp.Diff([]Row{sp(fdeBegin, 8), endRow()}, tab.Rows); diff != "" {
			t.Errorf("rows (-want +got):\n%s", diff)
		}
	})
	t.Run("unknown format", func(t *testing.T) {
		data := ehFrame(cieBody("zR", []byte{0x07}, defaultInitial), fde(peUdata4, bases, true, nil))
		tab := parseEH(t, data, bases)
		if tab.Stats.BadFDEs != 1 || len(tab.Rows) != 0 {
			t.Errorf("stats %+v rows %v, want the FDE dropped", tab.Stats, tab.Rows)
		}
	})
}

func TestAugmentations(t *testing.T) {
	cases := []struct {
		name    string
		aug     string
		augData []byte
		withAug bool
		enc     uint8
		want    []Row
	}{
		{"none", "", nil, false, peAbsptr, []Row{sp(fdeBegin, 8), endRow()}},
		{"zR", "zR", []byte{peUdata4}, true, peUdata4, []Row{sp(fdeBegin, 8), endRow()}},
		// Personality pointer indirect|pcrel|sdata4 is skipped, never read.
		{"zPLR", "zPLR", cat([]byte{0x9b}, u32(0x1234), []byte{0x1b, 0x1b}), true, 0x1b, []Row{sp(fdeBegin, 8), endRow()}},
		{"zRS signal", "zRS", []byte{0x1b}, true, 0x1b, []Row{{PC: fdeBegin, CFA: CFASignal, FP: FPUnknown}, endRow()}},
		{"unknown after z is skipped", "zRX", []byte{0x1b, 0xaa}, true, 0x1b, []Row{sp(fdeBegin, 8), endRow()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := ehFrame(cieBody(tc.aug, tc.augData, defaultInitial), fde(tc.enc, ptrCtx{}, tc.withAug, nil))
			tab := parseEH(t, data, ptrCtx{})
			if diff := cmp.Diff(tc.want, tab.Rows); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("unknown without z", func(t *testing.T) {
		data := ehFrame(cieBody("Q", nil, defaultInitial), fde(peAbsptr, ptrCtx{}, false, nil))
		tab := parseEH(t, data, ptrCtx{})
		if tab.Stats.BadCIEs != 1 || tab.Stats.BadFDEs != 1 || len(tab.Rows) != 0 {
			t.Errorf("stats %+v rows %v, want CIE and FDE rejected", tab.Stats, tab.Rows)
		}
	})
}

// debugFrame lays out a .debug_frame with a version-4 CIE and FDEs at
// absolute addresses.
func debugFrame(ranges [][2]uint64, prog []byte) []byte {
	cie := cat([]byte{4}, []byte{0}, []byte{8, 0}, uleb(1), sleb(-8), uleb(16), defaultInitial)
	sec := cat(u32(uint32(4+len(cie))), u32(0xffffffff), cie)
	for _, r := range ranges {
		body := cat(u64(r[0]), u64(r[1]-r[0]), prog)
		sec = cat(sec, u32(uint32(4+len(body))), u32(0), body)
	}
	return sec
}

func TestDebugFrameMerge(t *testing.T) {
	eh := ehFrame(cieBody("zR", []byte{peUdata4}, defaultInitial), fde(peUdata4, ptrCtx{}, true, []byte{0x0e, 16}))
	// One FDE overlaps the .eh_frame one and must lose; one fills a gap; one
	// comes after a gap.
	dbg := debugFrame([][2]uint64{{0x1080, 0x1200}, {0x1100, 0x1180}, {0x1300, 0x1310}}, []byte{0x0e, 32})
	tab, err := fromSections(&section{data: eh, addr: secAddr, ctx: ptrCtx{secAddr: secAddr}}, &section{data: dbg, debug: true}, pcRange{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Row{sp(0x1000, 16), sp(0x1100, 32), {PC: 0x1180}, sp(0x1300, 32), {PC: 0x1310}}
	if diff := cmp.Diff(want, tab.Rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	if tab.Stats.Overlapping != 1 || tab.Stats.FDEs != 4 || tab.Stats.CIEs != 2 || tab.Stats.Unknown != 2 {
		t.Errorf("stats %+v, want 1 overlapping, 4 FDEs, 2 CIEs, 2 unknown rows", tab.Stats)
	}
	for _, tc := range []struct {
		pc   uint64
		want Row
		ok   bool
	}{
		{0xfff, Row{}, false},
		{0x1000, sp(0x1000, 16), true},
		{0x10ff, sp(0x1000, 16), true},
		{0x1250, Row{PC: 0x1180}, true},
		{0x1305, sp(0x1300, 32), true},
		{0xffffffff, Row{PC: 0x1310}, true},
	} {
		got, ok := tab.Lookup(tc.pc)
		if ok != tc.ok || got != tc.want {
			t.Errorf("Lookup(%#x) = %+v, %v; want %+v, %v", tc.pc, got, ok, tc.want, tc.ok)
		}
	}
}
