package unwind

import (
	"debug/elf"
	"errors"
	"fmt"

	"github.com/sonde-dev/sonde/internal/pclntab"
)

// maxGoRows bounds the rows derived from one pclntab.
const maxGoRows = 1 << 22

// FromGo derives rows from a Go binary's stack-pointer delta tables: at a PC
// where the stack pointer is delta bytes below its value at entry, the CFA is
// SP + delta + 8. Once the prologue has pushed the frame pointer (delta >= 8)
// the caller's RBP is at CFA-16; before that, and in frameless leaves, RBP is
// still the caller's. A frameless leaf thus unwinds to its caller from SP,
// which a frame-pointer walk cannot do.
//
// FromGo sees only the table; fromFile also reads the code of the runtime's
// assembly functions, whose frames the deltas do not fully describe.
func FromGo(t *pclntab.Table) (*Table, error) { return fromGo(t, nil) }

// asmFrame is what the code of one assembly function says about its frame
// beyond its SP deltas.
type asmFrame struct {
	entry, end uint64
	// fp: it opens with the frame-pointer prologue (push %rbp; mov
	// %rsp,%rbp), so from entry+fpPrologue on RBP points at its frame.
	// Without it the function never saves RBP: RBP stays the caller's.
	fp bool
	// switches: it moves SP to another stack (the runtime's cgo calls and
	// callbacks, systemstack, vDSO calls on the system stack). Its SP
	// deltas stop saying where its frame is once it does, but RBP still
	// points at the frame it opened: the CFA is RBP+16 throughout its body.
	// (runtime.mcall clears RBP before it enters the scheduler, which
	// never returns to it: the walk ends there.)
	switches bool
}

// fpPrologue is the length of push %rbp (55) and mov %rsp,%rbp (48 89 e5).
const fpPrologue = 4

// row returns the rule at pc, delta bytes into the frame, of the function
// a describes (nil: compiled Go code).
func (a *asmFrame) row(pc uint64, delta int32) Row {
	r := Row{PC: pc}
	switch {
	case delta < 0:
		// CFAUnknown
	case a != nil && a.switches && a.fp && delta >= 8 && pc >= a.entry+fpPrologue:
		r.CFA, r.CFAOffset, r.FP, r.FPOffset = CFAFP, 16, FPOffset, -16
	default:
		r.CFA, r.CFAOffset = CFASP, delta+8
		if delta >= 8 && (a == nil || a.fp) {
			r.FP, r.FPOffset = FPOffset, -16
		}
	}
	return r
}

// fromGo is FromGo with the frames of the assembly functions in asm (sorted
// by address, not overlapping).
func fromGo(t *pclntab.Table, asm []asmFrame) (*Table, error) {
	var rows []Row
	var end uint64
	var st Stats
	add := func(r Row) {
		if r.CFA == CFAUnknown {
			st.Unknown++
		}
		if n := len(rows); n > 0 && rows[n-1].sameRule(r) {
			return // equal neighbours merge
		}
		rows = append(rows, r)
	}
	err := t.SPDeltas(func(start, stop uint64, delta int32) bool {
		for len(asm) > 0 && asm[0].end <= start {
			asm = asm[1:]
		}
		var a *asmFrame
		if len(asm) > 0 && asm[0].entry <= start {
			a = &asm[0]
		}
		// A range holding the end of the prologue splits there.
		if a != nil && a.switches && a.fp && start < a.entry+fpPrologue && stop > a.entry+fpPrologue {
			add(a.row(start, delta))
			start = a.entry + fpPrologue
		}
		add(a.row(start, delta))
		end = stop
		return len(rows) < maxGoRows
	})
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, ErrNoCFI
	}
	if len(rows) >= maxGoRows {
		return nil, fmt.Errorf("go tables: more than %d rows", maxGoRows)
	}
	rows = append(rows, Row{PC: end})
	st.Rows = len(rows)
	return &Table{Rows: rows, Stats: st}, nil
}

// asmFrames reads the first bytes of every assembly function of t in f's
// code (x86-64 only) and returns what they say about its frame, in address
// order.
func asmFrames(f *elf.File, t *pclntab.Table) ([]asmFrame, error) {
	if f.Machine != elf.EM_X86_64 {
		return nil, nil
	}
	var out []asmFrame
	var rerr error
	err := t.Funcs(func(fn pclntab.Func) bool {
		if fn.Flag&pclntab.FuncFlagAsm == 0 {
			return true
		}
		a := asmFrame{entry: fn.Entry, end: fn.End, switches: fn.Flag&pclntab.FuncFlagSPWrite != 0}
		code := make([]byte, fpPrologue)
		if fn.End-fn.Entry >= fpPrologue {
			if err := readCode(f, fn.Entry, code); err != nil {
				rerr = fmt.Errorf("go tables: code of %s: %w", fn.Name, err)
				return false
			}
			a.fp = code[0] == 0x55 && code[1] == 0x48 && code[2] == 0x89 && code[3] == 0xe5
		}
		out = append(out, a)
		return true
	})
	if err != nil {
		return nil, err
	}
	return out, rerr
}

// readCode reads len(b) bytes at virtual address addr of f's loaded code.
func readCode(f *elf.File, addr uint64, b []byte) error {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || addr < p.Vaddr || addr-p.Vaddr+uint64(len(b)) > p.Filesz {
			continue
		}
		_, err := p.ReadAt(b, int64(addr-p.Vaddr))
		return err
	}
	return fmt.Errorf("address %#x is outside the file's code", addr)
}

// fromFile builds the table of an ELF file: from the pclntab for Go code
// and from CFI for the rest (C code in cgo binaries, every other file).
func fromFile(f *elf.File) (*Table, error) {
	cfi, cfiErr := FromELF(f)
	if pclntab.Section(f) == nil {
		return cfi, cfiErr
	}
	pt, err := pclntab.OpenELF(f)
	if err != nil {
		return cfi, cfiErr
	}
	asm, err := asmFrames(f, pt)
	if err != nil {
		return cfi, cfiErr
	}
	gt, err := fromGo(pt, asm)
	if err != nil {
		return cfi, cfiErr
	}
	if cfiErr != nil {
		if !errors.Is(cfiErr, ErrNoCFI) {
			return nil, cfiErr
		}
		return gt, nil
	}
	return mergeOutside(gt, cfi), nil
}

// mergeOutside returns inner's rows, with outer's rows before and after
// inner's range; at the end of inner's range outer's rule there resumes.
func mergeOutside(inner, outer *Table) *Table {
	lo, hi := inner.Rows[0].PC, inner.Rows[len(inner.Rows)-1].PC
	var rows []Row
	for _, r := range outer.Rows {
		if r.PC < lo {
			rows = append(rows, r)
		}
	}
	rows = append(rows, inner.Rows[:len(inner.Rows)-1]...)
	resume := Row{PC: hi}
	if r, ok := outer.Lookup(hi); ok {
		resume = r
		resume.PC = hi
	}
	rows = append(rows, resume)
	for _, r := range outer.Rows {
		if r.PC > hi {
			rows = append(rows, r)
		}
	}
	out := rows[:0]
	for _, r := range rows {
		if n := len(out); n > 0 && out[n-1].sameRule(r) {
			continue
		}
		out = append(out, r)
	}
	return &Table{Rows: out, Stats: Stats{Rows: len(out)}}
}
