package unwind

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// Kinds of register rules; ruleUnset is the initial state (same value on
// x86-64 for the registers we track).
const (
	ruleUnset uint8 = iota
	ruleUndefined
	ruleSame
	ruleOffset
	ruleValOffset
	ruleRegister
	ruleExpr
	ruleValExpr
)

type regRule struct {
	kind uint8
	off  int64
}

// cfaKinds.
const (
	cfaUnset uint8 = iota
	cfaReg
	cfaExpr
)

// frameState is the part of a CFI row the unwinder uses: the CFA rule, and
// the rules for RBP and the return address column.
type frameState struct {
	cfaKind uint8
	cfaReg  uint64
	cfaOff  int64
	cfaExpr []byte
	fp      regRule
	ra      regRule
}

// program is one FDE's CFI to interpret.
type program struct {
	cie        *cie
	initial    []byte // the CIE's initial instructions
	body       []byte // the section up to the FDE's end
	secOff     int    // offset of the FDE's instructions in body
	begin, end uint64
	ctx        *ptrCtx
}

// machine interprets CFI programs. Its remember_state stack is reused
// between runs; a machine is not safe for concurrent use.
type machine struct {
	stack []frameState
}

var errCFI = errors.New("cfi")

// pltExpr is the DWARF expression binutils and lld emit for a .plt section:
// DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
// DW_OP_lit11; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus.
var pltExpr = []byte{0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22}

// run interprets the CIE's initial instructions then the FDE's, appending
// one Row per location to rows.
func (m *machine) run(rows []Row, p program) ([]Row, error) {
	var initial, st frameState
	m.stack = m.stack[:0]
	loc := p.begin
	// The CIE's instructions define the initial state; DW_CFA_restore
	// returns to it.
	ib := buf{data: p.initial}
	if err := m.exec(&ib, &st, &initial, &loc, nil, p, true); err != nil {
		return rows, fmt.Errorf("cie program: %w", err)
	}
	initial = st
	m.stack = m.stack[:0]
	start := len(rows)
	emit := func(newLoc uint64) error {
		if newLoc < loc {
			return fmt.Errorf("%w: location moves back from %#x to %#x", errCFI, loc, newLoc)
		}
		if newLoc == loc || loc >= p.end {
			loc = newLoc
			return nil
		}
		if len(rows)-start >= maxRowsPerFDE {
			return fmt.Errorf("%w: more than %d rows", errCFI, maxRowsPerFDE)
		}
		rows = append(rows, st.row(loc, p.cie))
		loc = newLoc
		return nil
	}
	fb := buf{data: p.body, off: p.secOff}
	if err := m.exec(&fb, &st, &initial, &loc, emit, p, false); err != nil {
		return rows, err
	}
	if loc < p.end {
		if len(rows)-start >= maxRowsPerFDE {
			return rows, fmt.Errorf("%w: more than %d rows", errCFI, maxRowsPerFDE)
		}
		rows = append(rows, st.row(loc, p.cie))
	}
	return rows, nil
}

// exec runs the instructions in b. emit is called before the location
// advances; it is nil for the CIE program, where advancing is an error.
func (m *machine) exec(b *buf, st, initial *frameState, loc *uint64, emit func(uint64) error, p program, inCIE bool) error {
	c := p.cie
	advance := func(delta uint64) error {
		if emit == nil {
			return fmt.Errorf("%w: advance in cie", errCFI)
		}
		if delta > math.MaxUint64/c.codeAlign {
			return fmt.Errorf("%w: advance overflows", errCFI)
		}
		n := *loc + delta*c.codeAlign
		if n < *loc {
			return fmt.Errorf("%w: advance overflows", errCFI)
		}
		return emit(n)
	}
	fpReg := uint64(regRBP)
	if c.arm64 {
		fpReg = regX29
	}
	set := func(reg uint64, r regRule) {
		switch reg {
		case fpReg:
			st.fp = r
		case c.raReg:
			st.ra = r
		}
	}
	restore := func(reg uint64) {
		if inCIE {
			set(reg, regRule{})
			return
		}
		switch reg {
		case fpReg:
			st.fp = initial.fp
		case c.raReg:
			st.ra = initial.ra
		}
	}
	factored := func(v int64) int64 { return v * c.dataAlign }
	for b.err == nil && b.left() > 0 {
		op := b.u8()
		switch op >> 6 {
		case 1: // DW_CFA_advance_loc
			if err := advance(uint64(op & 0x3f)); err != nil {
				return err
			}
			continue
		case 2: // DW_CFA_offset
			set(uint64(op&0x3f), regRule{ruleOffset, factored(int64(b.uleb()))})
			continue
		case 3: // DW_CFA_restore
			restore(uint64(op & 0x3f))
			continue
		}
		switch op {
		case 0x00: // DW_CFA_nop
		case 0x01: // DW_CFA_set_loc
			if emit == nil {
				return fmt.Errorf("%w: set_loc in cie", errCFI)
			}
			n := b.pointer(c.fdeEnc, p.ctx, true)
			if b.err != nil {
				break
			}
			if err := emit(n); err != nil {
				return err
			}
		case 0x02: // DW_CFA_advance_loc1
			if d := b.u8(); b.err == nil {
				if err := advance(uint64(d)); err != nil {
					return err
				}
			}
		case 0x03: // DW_CFA_advance_loc2
			if d := b.u16(); b.err == nil {
				if err := advance(uint64(d)); err != nil {
					return err
				}
			}
		case 0x04: // DW_CFA_advance_loc4
			if d := b.u32(); b.err == nil {
				if err := advance(uint64(d)); err != nil {
					return err
				}
			}
		case 0x1d: // DW_CFA_MIPS_advance_loc8
			if d := b.u64(); b.err == nil {
				if err := advance(d); err != nil {
					return err
				}
			}
		case 0x05: // DW_CFA_offset_extended
			reg := b.uleb()
			set(reg, regRule{ruleOffset, factored(int64(b.uleb()))})
		case 0x06: // DW_CFA_restore_extended
			restore(b.uleb())
		case 0x07: // DW_CFA_undefined
			set(b.uleb(), regRule{kind: ruleUndefined})
		case 0x08: // DW_CFA_same_value
			set(b.uleb(), regRule{kind: ruleSame})
		case 0x09: // DW_CFA_register
			reg := b.uleb()
			other := b.uleb()
			if reg == other {
				set(reg, regRule{kind: ruleSame})
			} else {
				set(reg, regRule{ruleRegister, int64(other)})
			}
		case 0x0a: // DW_CFA_remember_state
			if len(m.stack) >= maxStateDepth {
				return fmt.Errorf("%w: remember_state deeper than %d", errCFI, maxStateDepth)
			}
			m.stack = append(m.stack, *st)
		case 0x0b: // DW_CFA_restore_state
			if len(m.stack) == 0 {
				return fmt.Errorf("%w: restore_state with empty stack", errCFI)
			}
			// The CFA rule is not part of the saved register state in DWARF,
			// but GCC, LLVM and every unwinder (libgcc, libunwind, binutils)
			// restore it too.
			*st = m.stack[len(m.stack)-1]
			m.stack = m.stack[:len(m.stack)-1]
		case 0x0c: // DW_CFA_def_cfa
			st.cfaReg = b.uleb()
			st.cfaOff = int64(b.uleb())
			st.cfaKind, st.cfaExpr = cfaReg, nil
		case 0x0d: // DW_CFA_def_cfa_register
			st.cfaReg = b.uleb()
			st.cfaKind, st.cfaExpr = cfaReg, nil
		case 0x0e: // DW_CFA_def_cfa_offset
			st.cfaOff = int64(b.uleb())
			st.cfaKind, st.cfaExpr = cfaReg, nil
		case 0x0f: // DW_CFA_def_cfa_expression
			st.cfaExpr = b.bytes(b.uleb())
			st.cfaKind = cfaExpr
		case 0x10: // DW_CFA_expression
			reg := b.uleb()
			b.bytes(b.uleb())
			set(reg, regRule{kind: ruleExpr})
		case 0x11: // DW_CFA_offset_extended_sf
			reg := b.uleb()
			set(reg, regRule{ruleOffset, factored(b.sleb())})
		case 0x12: // DW_CFA_def_cfa_sf
			st.cfaReg = b.uleb()
			st.cfaOff = factored(b.sleb())
			st.cfaKind, st.cfaExpr = cfaReg, nil
		case 0x13: // DW_CFA_def_cfa_offset_sf
			st.cfaOff = factored(b.sleb())
			st.cfaKind, st.cfaExpr = cfaReg, nil
		case 0x14: // DW_CFA_val_offset
			reg := b.uleb()
			set(reg, regRule{ruleValOffset, factored(int64(b.uleb()))})
		case 0x15: // DW_CFA_val_offset_sf
			reg := b.uleb()
			set(reg, regRule{ruleValOffset, factored(b.sleb())})
		case 0x16: // DW_CFA_val_expression
			reg := b.uleb()
			b.bytes(b.uleb())
			set(reg, regRule{kind: ruleValExpr})
		case 0x2d: // DW_CFA_AARCH64_negate_ra_state (DW_CFA_GNU_window_save elsewhere)
			if !c.arm64 {
				return fmt.Errorf("%w: unknown op %#x", errCFI, op)
			}
			// The return address is signed (PAC) from here, or no more:
			// the eBPF unwinder strips every return address alike.
		case 0x2e: // DW_CFA_GNU_args_size
			b.uleb()
		case 0x2f: // DW_CFA_GNU_negative_offset_extended
			reg := b.uleb()
			set(reg, regRule{ruleOffset, -factored(int64(b.uleb()))})
		default:
			return fmt.Errorf("%w: unknown op %#x", errCFI, op)
		}
	}
	if b.err != nil {
		return fmt.Errorf("%w: %w", errCFI, b.err)
	}
	return nil
}

// row converts the state at pc into a table row.
func (s *frameState) row(pc uint64, c *cie) Row {
	r := Row{PC: pc}
	if c.signal {
		r.CFA = CFASignal
		r.FP = FPUnknown
		return r
	}
	if c.arm64 {
		return s.rowARM64(r)
	}
	switch {
	case s.ra.kind == ruleUndefined:
		r.CFA = CFAEnd
		return r
	case s.ra.kind != ruleOffset || s.ra.off != -8:
		return r
	}
	switch s.cfaKind {
	case cfaReg:
		if s.cfaOff < math.MinInt32 || s.cfaOff > math.MaxInt32 {
			return r
		}
		switch s.cfaReg {
		case regRSP:
			r.CFA = CFASP
		case regRBP:
			r.CFA = CFAFP
		default:
			return r
		}
		r.CFAOffset = int32(s.cfaOff)
	case cfaExpr:
		if !bytes.Equal(s.cfaExpr, pltExpr) {
			return r
		}
		r.CFA, r.CFAOffset = CFAPLT, 8
	default:
		return r
	}
	switch s.fp.kind {
	case ruleUnset, ruleSame:
		r.FP = FPSame
	case ruleOffset:
		if s.fp.off < math.MinInt16 || s.fp.off > math.MaxInt16 {
			r.FP = FPUnknown
			break
		}
		r.FP, r.FPOffset = FPOffset, int16(s.fp.off)
	default:
		r.FP = FPUnknown
	}
	return r
}

// rowARM64 is row for an aarch64 file: the return address is in x30 until a
// prologue stores it, mostly next to x29 as the frame record; the CFA is
// sp or x29 plus an offset.
func (s *frameState) rowARM64(r Row) Row {
	if s.ra.kind == ruleUndefined {
		r.CFA = CFAEnd
		return r
	}
	if s.cfaKind != cfaReg || s.cfaOff < 0 || s.cfaOff > math.MaxInt32 {
		return r
	}
	r.CFAOffset = int32(s.cfaOff)
	fpSaved := s.fp.kind == ruleOffset && s.fp.off >= math.MinInt16 && s.fp.off <= math.MaxInt16
	switch {
	case s.cfaReg == regARMSP && (s.ra.kind == ruleUnset || s.ra.kind == ruleSame):
		r.CFA = CFASPLR
	case s.ra.kind != ruleOffset:
		return Row{PC: r.PC}
	case fpSaved && s.ra.off == s.fp.off+8 && (s.cfaReg == regARMSP || s.cfaReg == regX29):
		r.CFA, r.FP, r.FPOffset = CFASPRecord, FPOffset, int16(s.fp.off)
		if s.cfaReg == regX29 {
			r.CFA = CFAFPRecord
		}
		return r
	case s.cfaReg == regARMSP && s.ra.off >= math.MinInt16 && s.ra.off <= math.MaxInt16:
		// x30 saved apart from x29 (code without frame pointers): the
		// row holds the return address's slot in FPOffset.
		r.CFA, r.FPOffset = CFASPRA, int16(s.ra.off)
	default:
		return Row{PC: r.PC}
	}
	switch {
	case s.fp.kind == ruleUnset || s.fp.kind == ruleSame:
		r.FP = FPSame
	case r.CFA == CFASPLR && fpSaved:
		r.FP, r.FPOffset = FPOffset, int16(s.fp.off)
	default:
		r.FP = FPUnknown
	}
	return r
}
