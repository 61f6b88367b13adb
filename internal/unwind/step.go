package unwind

import (
	"encoding/binary"
	"runtime"

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

// Regs are what the unwinder tracks of a frame: its PC, SP and RBP (x29),
// the link register x30 where it holds the frame's return address (aarch64;
// 0: not known), and whether the PC is a return address (its row is the one
// at PC-1) rather than where the thread was interrupted.
type Regs struct {
	PC, SP, FP, LR uint64
	Return         bool
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

// Offsets in the signal frame __restore_rt returns through (arch.h).
const (
	ucMContext = 40
	scRBP      = 80
	scRSP      = 120
	scRIP      = 128
)

// Offsets in aarch64's signal frame, at the SP __kernel_rt_sigreturn runs
// with (arch.h): siginfo, then the ucontext, its sigcontext 176 bytes in.
const (
	armMContext = 128 + 176
	armSigFP    = 8 + 29*8
	armSigLR    = 8 + 30*8
	armSigSP    = 8 + 31*8
	armSigPC    = 8 + 32*8
)

// armUserMask keeps the 48 bits of an aarch64 user address, dropping a
// return address's pointer authentication code (arch.h's arch_strip_ra).
const armUserMask = 1<<48 - 1

// signalARM64 says whether a CFASignal row is aarch64's signal frame: the
// rows of this host's processes are.
const signalARM64 = runtime.GOARCH == "arm64"

// Step unwinds one frame from r, as the eBPF unwinder's step does
// (support/ebpf/native.h): with row where one covers the frame (haveRow),
// else by the frame-pointer chain, reading the stack from s.
func Step(r Regs, row tracer.Row, haveRow bool, s Stack) (Regs, StepResult) {
	if !haveRow {
		return fpStep(r, s)
	}
	cfaType, cfaOff, fpRule, fpOff := tracer.RowRule(row)
	var cfa uint64
	raAt := func() uint64 { return cfa - 8 }
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
	case tracer.CFASPLR:
		cfa = r.SP + uint64(cfaOff)
	case tracer.CFASPRecord, tracer.CFASPRA, tracer.CFASPGo:
		cfa = r.SP + uint64(cfaOff)
	case tracer.CFAFPRecord:
		cfa = r.FP + uint64(cfaOff)
	case tracer.CFAGoCgo:
		// The goroutine's frame, from what runtime.asmcgocall saved at
		// SP: its g (whose first field is g.stack {lo, hi}) and the
		// frame's depth below hi, or 0 and the frame's SP.
		g, ok1 := s.word(r.SP)
		frameSP, ok2 := s.word(r.SP + 8)
		if !ok1 || !ok2 {
			return r, StepUnreadable
		}
		if g != 0 {
			hi, ok := s.word(g + 8)
			if !ok {
				return r, StepUnreadable
			}
			frameSP = hi - frameSP
		}
		r.SP = frameSP // from here on, the frame is CFASPGo's
		cfaType = tracer.CFASPGo
		cfa = r.SP + uint64(cfaOff)
	case tracer.CFASignal:
		if signalARM64 {
			return signalStepARM64(r, s)
		}
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
	switch cfaType {
	case tracer.CFASPRecord, tracer.CFAFPRecord:
		raAt = func() uint64 { return cfa + uint64(int64(fpOff)) + 8 }
	case tracer.CFASPRA:
		raAt = func() uint64 { return cfa + uint64(int64(fpOff)) }
	case tracer.CFASPGo:
		raAt = func() uint64 { return r.SP }
	}
	var ra uint64
	var ok bool
	if cfaType == tracer.CFASPLR {
		// The return address is still in x30, known only for the frame
		// the sample interrupted.
		if r.LR == 0 || r.Return {
			return r, StepUnknownRule
		}
		ra = r.LR
	} else if ra, ok = s.word(raAt()); !ok {
		return r, StepUnreadable
	}
	if cfaType >= tracer.CFASPLR {
		ra &= armUserMask
	}
	if ra >= userAddrEnd {
		return r, StepNoCaller
	}
	fp := r.FP
	switch {
	case cfaType == tracer.CFASPGo:
		if fp, ok = s.word(r.SP - 8); !ok {
			return r, StepUnreadable
		}
	case cfaType == tracer.CFASPRA:
		if fpRule == tracer.FPUnknown {
			fp = 0
		}
	case fpRule == tracer.FPOffset:
		if fp, ok = s.word(cfa + uint64(int64(fpOff))); !ok {
			return r, StepUnreadable
		}
	case fpRule == tracer.FPUnknown:
		fp = 0
	}
	return Regs{PC: ra, SP: cfa, FP: fp, Return: true}, StepCFI
}

// signalStepARM64 takes the interrupted frame's registers from aarch64's
// signal frame at r.SP.
func signalStepARM64(r Regs, s Stack) (Regs, StepResult) {
	mc := r.SP + armMContext
	fp, ok1 := s.word(mc + armSigFP)
	sp, ok2 := s.word(mc + armSigSP)
	pc, ok3 := s.word(mc + armSigPC)
	if !ok1 || !ok2 || !ok3 {
		return r, StepUnreadable
	}
	lr, _ := s.word(mc + armSigLR)
	return Regs{PC: pc, SP: sp, FP: fp, LR: lr}, StepCFI
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
	if signalARM64 {
		ra &= armUserMask
	}
	if ra >= userAddrEnd {
		return r, StepNoCaller
	}
	return Regs{PC: ra, SP: r.FP + 16, FP: fp, Return: true}, StepFramePointer
}
