package v8

import "golang.org/x/sys/unix"

// userRegs returns the PC, SP and frame pointer of regs.
func userRegs(regs *unix.PtraceRegs) (pc, sp, fp uint64) {
	return regs.Rip, regs.Rsp, regs.Rbp
}
