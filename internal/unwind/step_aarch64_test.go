package unwind

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/tracer"
)

// TestStepARM64 steps through aarch64's rules: the return address in x30
// (only for the interrupted frame), in a frame record above the saved x29
// (also where the slot is counted from SP, as in GCC's big frames), in its
// own slot, in Go's frame, and in Go's frame found from what
// runtime.asmcgocall saved on the system stack; signed return addresses
// lose their authentication code.
func TestStepARM64(t *testing.T) {
	const sp = 0x7ffc0000
	const pac = 0x002a000000000000 // a pointer authentication code in bits 48..54
	// A 32-byte frame whose record (x29, x30) is at its bottom, then the
	// caller's frame.
	record := stackOf(sp, sp+0x40, pac|0x401234, 0x11, 0x22, 0, 0, 0, 0)
	// A big GCC frame: the record at SP, the CFA 4 KiB above.
	big := stackOf(sp, sp+0x2000, 0x401300)
	// x30 saved alone, 8 bytes below the CFA; x29 untouched.
	alone := stackOf(sp, 0, 0, 0, pac|0x401400)
	// Go's frame of 48 bytes: x30 at SP, the caller's x29 below it.
	goFrame := stackOf(sp-8, sp+0x100, 0x401500, 0, 0, 0, 0, 0)
	// runtime.asmcgocall's call of C: on the system stack the goroutine's
	// g and the depth of its frame (16 bytes) below g.stack.hi; the
	// goroutine's stack holds g (as a stand-in: a g is on the heap) and,
	// 0x40 below hi, the frame: the caller's x29, then x30.
	const sys, gAddr, hi = 0x7ff00000, 0x7ffc1000, 0x7ffc1100
	goroutine := stackOf(gAddr, append([]uint64{0x7ffb0000, hi}, make([]uint64, 30)...)...)
	binary.LittleEndian.PutUint64(goroutine.Bytes[hi-0x40-8-gAddr:], 0x7ffc1200)
	binary.LittleEndian.PutUint64(goroutine.Bytes[hi-0x40-gAddr:], pac|0x401600)
	onC := func(words ...uint64) Stack {
		st := stackOf(sys, words...)
		st.SP2, st.Bytes2 = goroutine.SP, goroutine.Bytes
		return st
	}
	for _, tc := range []struct {
		name  string
		regs  Regs
		row   tracer.Row
		stack Stack
		want  Regs
		res   StepResult
	}{
		{"leaf in x30", Regs{PC: 0x400100, SP: sp, FP: 0x99, LR: pac | 0x400200}, row(t, tracer.CFASPLR, 0, tracer.FPSame, 0), record,
			Regs{PC: 0x400200, SP: sp, FP: 0x99, Return: true}, StepCFI},
		{"x30 of a caller", Regs{PC: 0x400100, SP: sp, FP: 0x99, LR: 0x400200, Return: true}, row(t, tracer.CFASPLR, 0, tracer.FPSame, 0), record,
			Regs{PC: 0x400100, SP: sp, FP: 0x99, LR: 0x400200, Return: true}, StepUnknownRule},
		{"x30 not known", Regs{PC: 0x400100, SP: sp}, row(t, tracer.CFASPLR, 0, tracer.FPSame, 0), record,
			Regs{PC: 0x400100, SP: sp}, StepUnknownRule},
		{"frame record from sp", Regs{PC: 0x400100, SP: sp}, row(t, tracer.CFASPRecord, 32, tracer.FPOffset, -32), record,
			Regs{PC: 0x401234, SP: sp + 32, FP: sp + 0x40, Return: true}, StepCFI},
		{"frame record from x29", Regs{PC: 0x400100, SP: sp - 0x100, FP: sp}, row(t, tracer.CFAFPRecord, 32, tracer.FPOffset, -32), record,
			Regs{PC: 0x401234, SP: sp + 32, FP: sp + 0x40, Return: true}, StepCFI},
		{"frame record 4 KiB below the cfa", Regs{PC: 0x400100, SP: sp}, row(t, tracer.CFASPRecord, 4096, tracer.FPOffset, -4096), big,
			Regs{PC: 0x401300, SP: sp + 4096, FP: sp + 0x2000, Return: true}, StepCFI},
		{"x30 alone", Regs{PC: 0x400100, SP: sp, FP: 0x77}, row(t, tracer.CFASPRA, 32, tracer.FPSame, -8), alone,
			Regs{PC: 0x401400, SP: sp + 32, FP: 0x77, Return: true}, StepCFI},
		{"x30 alone, x29 lost", Regs{PC: 0x400100, SP: sp, FP: 0x77}, row(t, tracer.CFASPRA, 32, tracer.FPUnknown, -8), alone,
			Regs{PC: 0x401400, SP: sp + 32, Return: true}, StepCFI},
		{"go frame", Regs{PC: 0x400100, SP: sp}, row(t, tracer.CFASPGo, 48, tracer.FPSame, 0), goFrame,
			Regs{PC: 0x401500, SP: sp + 48, FP: sp + 0x100, Return: true}, StepCFI},
		{"cgo call: from g and depth", Regs{PC: 0x400100, SP: sys, FP: 0x55}, row(t, tracer.CFAGoCgo, 16, tracer.FPSame, 0), onC(gAddr, 0x40),
			Regs{PC: 0x401600, SP: hi - 0x40 + 16, FP: 0x7ffc1200, Return: true}, StepCFI},
		{"cgo call on the system stack: the frame's sp", Regs{PC: 0x400100, SP: sys, FP: 0x55}, row(t, tracer.CFAGoCgo, 16, tracer.FPSame, 0), onC(0, hi-0x40),
			Regs{PC: 0x401600, SP: hi - 0x40 + 16, FP: 0x7ffc1200, Return: true}, StepCFI},
		{"cgo call: g out of reach", Regs{PC: 0x400100, SP: sys, FP: 0x55}, row(t, tracer.CFAGoCgo, 16, tracer.FPSame, 0), stackOf(sys, gAddr, 0x40),
			Regs{PC: 0x400100, SP: sys, FP: 0x55}, StepUnreadable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, res := Step(tc.regs, tc.row, true, tc.stack)
			if res != tc.res {
				t.Errorf("result %d, want %d", res, tc.res)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("regs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMakeRowARM64Slots checks that a frame record far below the CFA but
// near SP (GCC's big frames) fits a kernel row, counted from SP, and reads
// back as the CFA-relative slot it is.
func TestMakeRowARM64Slots(t *testing.T) {
	for _, tc := range []struct {
		cfa           uint8
		cfaOff, fpOff int32
		fpRule        uint8
		ok            bool
	}{
		{tracer.CFASPRecord, 32, -32, tracer.FPOffset, true},
		{tracer.CFASPRecord, 8208, -8208, tracer.FPOffset, true},
		{tracer.CFASPRA, 8208, -8200, tracer.FPSame, true},
		{tracer.CFASPRecord, 8208, -4096, tracer.FPOffset, false}, // neither near the CFA nor near SP
		{tracer.CFASP, 8208, -8208, tracer.FPOffset, false},       // x86-64's rows count from the CFA only
	} {
		r, ok := tracer.MakeRow(0, tc.cfa, tc.cfaOff, tc.fpRule, tc.fpOff)
		if ok != tc.ok {
			t.Errorf("MakeRow(%d, %d, %d): ok %v, want %v", tc.cfa, tc.cfaOff, tc.fpOff, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		cfa, cfaOff, fpRule, fpOff := tracer.RowRule(r)
		if cfa != tc.cfa || cfaOff != tc.cfaOff || fpRule != tc.fpRule || fpOff != tc.fpOff {
			t.Errorf("RowRule(MakeRow(%d, %d, %d, %d)) = %d, %d, %d, %d", tc.cfa, tc.cfaOff, tc.fpRule, tc.fpOff, cfa, cfaOff, fpRule, fpOff)
		}
	}
}
