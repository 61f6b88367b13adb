package php

import "golang.org/x/sys/unix"

// vmRegs returns no VM registers: the walker is x86-64's only, and the
// live tests do not run on arm64.
func vmRegs(*unix.PtraceRegs) VMRegs {
	return VMRegs{}
}
