package v8

import "golang.org/x/sys/unix"

// userRegs returns the PC, SP and frame pointer (x29) of regs. The V8
// walker runs on x86-64 only; on arm64 its tests build, for `make cross`.
func userRegs(regs *unix.PtraceRegs) (pc, sp, fp uint64) {
	return regs.Pc, regs.Sp, regs.Regs[29]
}
