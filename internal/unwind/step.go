package unwind

import (
	"encoding/binary"

	"github.com/sonde-dev/sonde/tracer"
)

// Stack is a copy of a thread's user stack from address SP on, and of a
// second region from SP2 on where the stack continued elsewhere (a switch
// to another stack): what a stack snapshot (tracer.Snapshot) holds.
type Stack struct {
	SP     uint64
	Bytes  []byte
	SP2    uint64
	Bytes2 []byte
}

// word reads the 8 bytes at addr; ok is false outside the copies.
func (s Stack) word(addr uint64) (uint64, bool) {
	if w, ok := wordIn(s.SP, s.Bytes, addr); ok {
		return w, true
	}
	return wordIn(s.SP2, s.Bytes2, addr)
}

// wordIn reads the 8 bytes at addr in b, a copy of memory from base on.
func wordIn(base uint64, b []byte, addr uint64) (uint64, bool) {
	if addr < base || addr-base > uint64(len(b)) || uint64(len(b))-(addr-base) < 8 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[addr-base:]), true
}

// Regs are what the unwinder tracks of a frame: its PC, SP and RBP, and
// whether the PC is a return address (its row is the one at PC-1) rather
// than where the thread was interrupted.
type Regs struct {
	PC, SP, FP uint64
	Return     bool
}

// Lookup is the address whose row unwinds the frame: the call instruction
// for a return address.
func (r Regs) Lookup() uint64 {
	if r.Return {
		return r.PC - 1
	}
	return r.PC
}

// StepResult says how Step went.
type StepResult uint8

const (
	// StepCFI means the caller was found with the row.
	StepCFI StepResult = iota
	// StepFramePointer means no row covered the PC: the frame-pointer
	// chain gave the caller.
	StepFramePointer
	// StepComplete means the row says the stack ends here (its outermost
	// frame).
	StepComplete
	// StepUnknownRule means the row has no usable rule: the stack stops.
	StepUnknownRule
	// StepUnreadable means the caller is in stack memory the copy does
	// not hold.
	StepUnreadable
	// StepNoCaller means nothing can be a caller (a frame-pointer chain's
	// end, a word that is not a user address).
	StepNoCaller
)

// More reports whether the step found a caller.
func (s StepResult) More() bool { return s == StepCFI || s == StepFramePointer }

// userAddrEnd is where no user address reaches (sonde.h's USER_ADDR_END):
// a return address at or above it is data.
const userAddrEnd = 1 << 56

// Offsets in the signal frame __restore_rt returns through (native.h).
const (
	ucMContext = 40
	scRBP      = 80
	scRSP      = 120
	scRIP      = 128
)

// Step unwinds one frame from r, as the eBPF unwinder's step does
// (support/ebpf/native.h): with row where one covers the frame (haveRow),
// else by the frame-pointer chain, reading the stack from s.
func Step(r Regs, row tracer.Row, haveRow bool, s Stack) (Regs, StepResult) {
	if !haveRow {
		return fpStep(r, s)
	}
	cfaType, cfaOff, fpRule, fpOff := tracer.RowRule(row)
	var cfa uint64
	switch cfaType {
	case tracer.CFASP:
		cfa = r.SP + uint64(cfaOff)
	case tracer.CFAFP:
		cfa = r.FP + uint64(cfaOff)
	case tracer.CFAPLT:
		cfa = r.SP + 8
		if r.PC&15 >= 11 {
			cfa += 8
		}
	case tracer.CFASignal:
		mc := r.SP + ucMContext
		fp, ok1 := s.word(mc + scRBP)
		sp, ok2 := s.word(mc + scRSP)
		pc, ok3 := s.word(mc + scRIP)
		if !ok1 || !ok2 || !ok3 {
			return r, StepUnreadable
		}
		return Regs{PC: pc, SP: sp, FP: fp}, StepCFI
	case tracer.CFAEnd:
		return r, StepComplete
	default:
		return r, StepUnknownRule
	}
	ra, ok := s.word(cfa - 8)
	if !ok {
		return r, StepUnreadable
	}
	if ra >= userAddrEnd {
		return r, StepNoCaller
	}
	fp := r.FP
	switch fpRule {
	case tracer.FPOffset:
		if fp, ok = s.word(cfa + uint64(int64(fpOff))); !ok {
			return r, StepUnreadable
		}
	case tracer.FPUnknown:
		fp = 0
	}
	return Regs{PC: ra, SP: cfa, FP: fp, Return: true}, StepCFI
}

// fpStep walks one frame-pointer link, as native.h's fp_step does.
func fpStep(r Regs, s Stack) (Regs, StepResult) {
	if r.FP == 0 || r.FP < r.SP {
		return r, StepNoCaller
	}
	fp, ok1 := s.word(r.FP)
	ra, ok2 := s.word(r.FP + 8)
	if !ok1 || !ok2 {
		return r, StepUnreadable
	}
	if ra >= userAddrEnd {
		return r, StepNoCaller
	}
	return Regs{PC: ra, SP: r.FP + 16, FP: fp, Return: true}, StepFramePointer
}
