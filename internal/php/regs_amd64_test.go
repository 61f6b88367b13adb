package php

import "golang.org/x/sys/unix"

// vmRegs returns the registers the hybrid VM keeps its frame and opline in
// (r14, r15).
func vmRegs(regs *unix.PtraceRegs) VMRegs {
	return VMRegs{Ex: regs.R14, Opline: regs.R15}
}
