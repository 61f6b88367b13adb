package unwind

import (
	"encoding/binary"
	"testing"

	"github.com/sonde-dev/sonde/tracer"
)

// stackOf lays words out from sp on.
func stackOf(sp uint64, words ...uint64) Stack {
	b := make([]byte, 8*len(words))
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	return Stack{SP: sp, Bytes: b}
}

func row(t *testing.T, cfa uint8, cfaOff int32, fp uint8, fpOff int32) tracer.Row {
	t.Helper()
	r, ok := tracer.MakeRow(0, cfa, cfaOff, fp, fpOff)
	if !ok {
		t.Fatalf("MakeRow(%d, %d, %d, %d) refused", cfa, cfaOff, fp, fpOff)
	}
	return r
}

func TestStep(t *testing.T) {
	const sp = 0x7ffc0000
	// A frame of 24 bytes: a local, the caller's RBP saved, the return
	// address; then the caller's frame.
	frame := stackOf(sp, 0xdead, sp+0x40, 0x401234, 0, 0, 0, 0, 0, sp+0x80, 0x405678)
	// The signal frame __restore_rt returns through: the ucontext at SP,
	// its RBP, RSP and RIP at mcontext offsets.
	sig := make([]uint64, (ucMContext+scRIP)/8+1)
	sig[(ucMContext+scRBP)/8], sig[(ucMContext+scRSP)/8], sig[(ucMContext+scRIP)/8] = 0x11, 0x22, 0x33
	for _, tc := range []struct {
		name  string
		regs  Regs
		row   tracer.Row
		have  bool
		stack Stack
		want  Regs
		res   StepResult
	}{
		{"cfa sp, rbp saved", Regs{PC: 0x401000, SP: sp}, row(t, tracer.CFASP, 24, tracer.FPOffset, -16), true, frame,
			Regs{PC: 0x401234, SP: sp + 24, FP: sp + 0x40, Return: true}, StepCFI},
		{"cfa sp, rbp kept", Regs{PC: 0x401000, SP: sp + 8, FP: 7}, row(t, tracer.CFASP, 16, tracer.FPSame, 0), true, frame,
			Regs{PC: 0x401234, SP: sp + 24, FP: 7, Return: true}, StepCFI},
		{"cfa sp, rbp unknown", Regs{PC: 0x401000, SP: sp + 8, FP: 7}, row(t, tracer.CFASP, 16, tracer.FPUnknown, 0), true, frame,
			Regs{PC: 0x401234, SP: sp + 24, Return: true}, StepCFI},
		{"cfa fp", Regs{PC: 0x401000, SP: sp, FP: sp + 8}, row(t, tracer.CFAFP, 16, tracer.FPOffset, -16), true, frame,
			Regs{PC: 0x401234, SP: sp + 24, FP: sp + 0x40, Return: true}, StepCFI},
		{"plt before the push", Regs{PC: 0x401020, SP: sp + 16}, row(t, tracer.CFAPLT, 8, tracer.FPSame, 0), true, frame,
			Regs{PC: 0x401234, SP: sp + 24, Return: true}, StepCFI},
		{"plt after the push", Regs{PC: 0x40102b, SP: sp + 8}, row(t, tracer.CFAPLT, 8, tracer.FPSame, 0), true, frame,
			Regs{PC: 0x401234, SP: sp + 24, Return: true}, StepCFI},
		{"signal frame", Regs{PC: 0x401000, SP: sp}, row(t, tracer.CFASignal, 0, tracer.FPSame, 0), true, stackOf(sp, sig...),
			Regs{PC: 0x33, SP: 0x22, FP: 0x11}, StepCFI},
		{"outermost frame", Regs{PC: 0x401000, SP: sp}, row(t, tracer.CFAEnd, 0, tracer.FPSame, 0), true, frame,
			Regs{PC: 0x401000, SP: sp}, StepComplete},
		{"no usable rule", Regs{PC: 0x401000, SP: sp}, row(t, tracer.CFAUnknown, 0, tracer.FPUnknown, 0), true, frame,
			Regs{PC: 0x401000, SP: sp}, StepUnknownRule},
		{"return address past the copy", Regs{PC: 0x401000, SP: sp}, row(t, tracer.CFASP, 4096, tracer.FPSame, 0), true, frame,
			Regs{PC: 0x401000, SP: sp}, StepUnreadable},
		{"return address that is data", Regs{PC: 0x401000, SP: sp}, row(t, tracer.CFASP, 8, tracer.FPSame, 0), true,
			stackOf(sp, 1<<60), Regs{PC: 0x401000, SP: sp}, StepNoCaller},
		{"frame pointers", Regs{PC: 0x401000, SP: sp, FP: sp + 8}, tracer.Row{}, false, frame,
			Regs{PC: 0x401234, SP: sp + 24, FP: sp + 0x40, Return: true}, StepFramePointer},
		{"frame pointer below sp", Regs{PC: 0x401000, SP: sp + 16, FP: sp + 8}, tracer.Row{}, false, frame,
			Regs{PC: 0x401000, SP: sp + 16, FP: sp + 8}, StepNoCaller},
		{"no frame pointer", Regs{PC: 0x401000, SP: sp}, tracer.Row{}, false, frame,
			Regs{PC: 0x401000, SP: sp}, StepNoCaller},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, res := Step(tc.regs, tc.row, tc.have, tc.stack)
			if res != tc.res || got != tc.want {
				t.Errorf("Step = %+v, %d; want %+v, %d", got, res, tc.want, tc.res)
			}
		})
	}
}

func TestStackWord(t *testing.T) {
	s := stackOf(0x1000, 1, 2)
	s.SP2, s.Bytes2 = 0x8000, stackOf(0, 3).Bytes
	for _, tc := range []struct {
		addr uint64
		want uint64
		ok   bool
	}{
		{0x1000, 1, true}, {0x1008, 2, true}, {0x1009, 0, false}, {0x1010, 0, false},
		{0xff8, 0, false}, {^uint64(0) - 3, 0, false},
		{0x8000, 3, true}, {0x8001, 0, false}, {0x7ff8, 0, false},
	} {
		if got, ok := s.word(tc.addr); got != tc.want || ok != tc.ok {
			t.Errorf("word(%#x) = %d, %v; want %d, %v", tc.addr, got, ok, tc.want, tc.ok)
		}
	}
}
