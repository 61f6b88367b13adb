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
// Where a stack ends for the unwinder the rows are CFAEnd: in the
// functions the runtime flags as top frames (runtime.goexit at the bottom of
// every goroutine, runtime.mstart at the bottom of a thread's system stack,
// runtime.rt0_go, runtime.sigtramp), and in the runtime's switches to the
// system stack (runtime.mcall, runtime.morestack, runtime.systemstack,
// runtime.asmcgocall). Below such a switch lies no return address: the
// caller's state is in the goroutine's g.sched, out of the unwinder's
// reach, and the pcsp table does not describe the new stack pointer.
func FromGo(t *pclntab.Table) (*Table, error) {
	ends, err := stackEnds(t)
	if err != nil {
		return nil, err
	}
	var rows []Row
	var end uint64
	var st Stats
	err = t.SPDeltas(func(start, stop uint64, delta int32) bool {
		for len(ends) > 0 && ends[0].end <= start {
			ends = ends[1:]
		}
		r := Row{PC: start}
		if len(ends) > 0 && ends[0].start <= start {
			r.CFA = CFAEnd
		} else if delta >= 0 {
			r.CFA, r.CFAOffset = CFASP, delta+8
			if delta >= 8 {
				r.FP, r.FPOffset = FPOffset, -16
			}
		} else {
			st.Unknown++
		}
		if n := len(rows); n > 0 && rows[n-1].sameRule(r) {
			// Equal neighbours merge.
		} else {
			rows = append(rows, r)
		}
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

// systemStackSwitches are the runtime functions that move to the system
// (g0) stack and call a function there; as callers on that stack they are
// its outermost frame. They are named, not matched by FuncID: the linker
// gives them their FuncID by these very names, but the numbering changes
// between Go releases. Each must also carry FlagSPWrite, the linker's
// finding that it writes SP.
var systemStackSwitches = map[string]bool{
	"runtime.mcall":       true,
	"runtime.morestack":   true,
	"runtime.systemstack": true,
	"runtime.asmcgocall":  true,
}

// pcRange is the address range [start, end).
type pcRange struct{ start, end uint64 }

// stackEnds returns, in address order, the ranges of the functions at
// which the unwinder ends a Go stack: those flagged FlagTopFrame, and the
// switches to the system stack.
func stackEnds(t *pclntab.Table) ([]pcRange, error) {
	var ends []pcRange
	err := t.Funcs(func(f pclntab.Func) bool {
		if f.Flag&pclntab.FlagTopFrame != 0 ||
			f.Flag&pclntab.FlagSPWrite != 0 && systemStackSwitches[t.FuncName(f)] {
			ends = append(ends, pcRange{f.Entry, f.End})
		}
		return true
	})
	return ends, err
}

// fromFile builds the table of an ELF file: from the pclntab for Go code
// and from CFI for the rest (C code in cgo binaries, every other file). debug
// is f's separate debug file or nil; its .debug_frame adds to f's CFI as
// FromSeparateDebug does.
func fromFile(f, debug *elf.File) (*Table, error) {
	cfi, cfiErr := FromSeparateDebug(f, debug)
	if pclntab.Section(f) == nil {
		return cfi, cfiErr
	}
	pt, err := pclntab.OpenELF(f)
	if err != nil {
		return cfi, cfiErr
	}
	gt, err := FromGo(pt)
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
