//go:build amd64

package tracer

import (
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// TestUnwindStepARM64TestRun runs the unwinder's step as the aarch64 object
// builds it (arch.h under __TARGET_ARCH_arm64; BPF code runs the same in
// any kernel) on a stack crafted in this process: the return address in
// x30 for the interrupted frame only, in a frame record (also counted from
// SP, as GCC's big frames need), in its own slot, in Go's frame, and signed
// with a pointer authentication code, and in Go's frame found from what
// runtime.asmcgocall saved on the system stack; and, in code without a table, the
// signal trampoline (the vDSO's __kernel_rt_sigreturn), known by its code,
// through the signal frame; and so in a table before its first row or
// under an unknown rule (musl's __restore_rt).
func TestUnwindStepARM64TestRun(t *testing.T) {
	testutil.RequirePrivileges(t, "BPF_PROG_TEST_RUN of the aarch64 unwinder")
	spec, err := loadTestrunArm64()
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		StepTest *ebpf.Program `ebpf:"step_test"`
		Tables   *ebpf.Map     `ebpf:"tables"`
	}
	if err := spec.LoadAndAssign(&tr, nil); err != nil {
		t.Fatalf("load test programs: %v", err)
	}
	t.Cleanup(func() {
		testutil.Close(t, tr.StepTest)
		testutil.Close(t, tr.Tables)
	})
	stack, base, _ := stackPages(t, 4)
	word := func(addr uint64) *uint64 { return &stack[(addr-base)/8] }

	const bias = 0x555500000000
	const table = 3
	rows := []Row{
		mustRow(t, 0x000, CFASPLR, 0, FPSame, 0),              // a leaf, a PLT stub
		mustRow(t, 0x100, CFASPRecord, 32, FPOffset, -32),     // stp x29, x30, [sp, #-32]!
		mustRow(t, 0x200, CFAFPRecord, 32, FPOffset, -32),     // mov x29, sp after it
		mustRow(t, 0x300, CFASPRA, 16, FPSame, -16),           // str x30, [sp, #-16]!
		mustRow(t, 0x400, CFASPGo, 48, FPSame, 0),             // Go: x30 at sp, x29 below
		mustRow(t, 0x500, CFASPRecord, 8208, FPOffset, -8208), // GCC's 8 KiB frame: the record at sp
		mustRow(t, 0x600, CFAGoCgo, 16, FPSame, 0),            // runtime.asmcgocall's call of C
	}
	if rows[5].Rule&rowFPFromBase == 0 {
		t.Fatalf("row %+v: a record 8 KiB below the CFA is stored counted from SP", rows[5])
	}
	if err := loadTable(tr.Tables, table, rows, nil); err != nil {
		t.Fatal(err)
	}
	// A table whose one row says nothing (code a file's CFI leaves out,
	// such as musl's __restore_rt).
	const unknownTable = 4
	unknownRows := []Row{mustRow(t, 0, CFAUnknown, 0, FPUnknown, 0)}
	if err := loadTable(tr.Tables, unknownTable, unknownRows, nil); err != nil {
		t.Fatal(err)
	}
	const pac = 0x002a000000000000 // a pointer authentication code, bits 48..54
	sp := base + 0x100
	fp := base + 0x800
	*word(sp) = base + 0x900       // record at sp: caller's x29
	*word(sp + 8) = pac | 0x401111 // and x30, signed
	*word(fp) = base + 0xa00
	*word(fp + 8) = 0x402222
	*word(sp - 8) = base + 0xb00 // Go: caller's x29 below sp

	// runtime.asmcgocall's call of C: at the system stack's SP the
	// goroutine's g and its frame's depth below g.stack.hi, or 0 and the
	// frame's SP; g.stack {lo, hi} is g's first field.
	sysSP, sysSP0 := base+0x3100, base+0x3180
	g, hi := base+0x3200, base+0x3400
	frameSP := hi - 0x40
	*word(sysSP), *word(sysSP + 8) = g, 0x40
	*word(sysSP0), *word(sysSP0 + 8) = 0, frameSP
	*word(g + 8) = hi
	*word(frameSP - 8), *word(frameSP) = base+0xe00, pac|0x406666

	// Code without a table (the vDSO): the signal trampoline, whose frame
	// is the kernel's signal frame at its sp, and other code, after which
	// frame pointers are followed.
	const sigreturn = 0xd4000001d2801168 // mov x8, #139; svc #0
	tramp := base + 0x2000
	*word(tramp) = sigreturn
	other := base + 0x2100
	*word(other) = 0xd4000001d2801188 // mov x8, #140; svc #0
	sigSP := base + 0x2800
	mc := sigSP + 128 + 176             // siginfo, then the ucontext's sigcontext
	*word(mc + 8 + 29*8) = base + 0xc00 // x29
	*word(mc + 8 + 30*8) = 0x404444     // x30
	*word(mc + 8 + 31*8) = base + 0x3000
	*word(mc + 8 + 32*8) = 0x403333 // pc
	*word(sigSP) = base + 0xd00     // a frame record at x29, for the others
	*word(sigSP + 8) = 0x405555

	const (
		cont    = 0 // STEP_CONTINUE
		done    = 1 // STEP_DONE
		unknown = uint32(support.SondeSampleFlagsSAMPLE_USER_UNKNOWN_RULE)
		fpFlag  = uint32(support.SondeSampleFlagsSAMPLE_FRAME_POINTERS)

		noAdjust     = uint64(support.SondePcFlagsPC_FLAG_NO_ADJUST)
		framePointer = uint64(support.SondePcFlagsPC_FLAG_FRAME_POINTER)
	)
	type want struct {
		result     uint32
		pc, sp, fp uint64
		flags      uint32
	}
	for _, tc := range []struct {
		name       string
		pc, lookup uint64
		sp, fp, lr uint64
		want       want
		// noTable: the code at pc and lookup (absolute) has no table;
		// with unknownBias, it has unknownTable at that bias.
		noTable     bool
		unknownBias uint64
	}{
		{"leaf: x30, signed", 0x10, 0x10, sp, 0x77, pac | 0x400aaa, want{cont, 0x400aaa, sp, 0x77, 0}, false, 0},
		{"x30 of a caller is not known", 0x11, 0x10, sp, 0x77, 0, want{done, 0, 0, 0, unknown}, false, 0},
		{"frame record from sp, signed", 0x110, 0x110, sp, 0x77, 0, want{cont, 0x401111, sp + 32, base + 0x900, 0}, false, 0},
		{"frame record from x29", 0x210, 0x210, sp, fp, 0, want{cont, 0x402222, fp + 32, base + 0xa00, 0}, false, 0},
		{"x30 alone", 0x310, 0x310, sp + 8, 0x77, 0, want{cont, 0x401111, sp + 24, 0x77, 0}, false, 0},
		{"go frame", 0x410, 0x410, sp + 8, 0x77, 0, want{cont, 0x401111, sp + 56, base + 0x900, 0}, false, 0},
		{"record 8 KiB below the cfa", 0x510, 0x510, sp, 0x77, 0, want{cont, 0x401111, sp + 8208, base + 0x900, 0}, false, 0},
		{"cgo call: the frame from g and depth", 0x610, 0x610, sysSP, 0x77, 0, want{cont, 0x406666, frameSP + 16, base + 0xe00, 0}, false, 0},
		{"cgo call on the system stack: the frame's sp", 0x610, 0x610, sysSP0, 0x77, 0, want{cont, 0x406666, frameSP + 16, base + 0xe00, 0}, false, 0},
		{"signal trampoline: the signal frame", tramp, tramp - 1, sigSP, sigSP, 0,
			want{cont, noAdjust | 0x403333, base + 0x3000, base + 0xc00, 0}, true, 0},
		{"the trampoline, interrupted there", tramp, tramp, sigSP, sigSP, 0x406666,
			want{cont, noAdjust | 0x403333, base + 0x3000, base + 0xc00, 0}, true, 0},
		{"other code: frame pointers", other, other - 1, sigSP, sigSP, 0,
			want{cont, framePointer | 0x405555, sigSP + 16, base + 0xd00, fpFlag}, true, 0},
		{"trampoline under an unknown rule", tramp, tramp - 1, sigSP, sigSP, 0,
			want{cont, noAdjust | 0x403333, base + 0x3000, base + 0xc00, 0}, true, tramp - 0x100},
		{"trampoline before the table's first row", tramp, tramp - 1, sigSP, sigSP, 0,
			want{cont, noAdjust | 0x403333, base + 0x3000, base + 0xc00, 0}, true, tramp},
		{"other code under an unknown rule", other, other - 1, sigSP, sigSP, 0,
			want{done, 0, 0, 0, unknown}, true, other - 0x100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testrunArm64TestrunIo{Pc: bias + tc.pc, Lookup: bias + tc.lookup, Sp: tc.sp, Fp: tc.fp, Lr: tc.lr,
				Bias: bias, TableId: table, Rows: uint32(len(rows))}
			if tc.noTable {
				in.Pc, in.Lookup, in.Bias, in.TableId, in.Rows = tc.pc, tc.lookup, 0, 0, 0
			}
			if tc.unknownBias != 0 {
				in.Bias, in.TableId, in.Rows = tc.unknownBias, unknownTable, uint32(len(unknownRows))
			}
			var out testrunArm64TestrunIo
			b := func(io *testrunArm64TestrunIo) []byte {
				return unsafe.Slice((*byte)(unsafe.Pointer(io)), unsafe.Sizeof(*io))
			}
			ret, err := tr.StepTest.Run(&ebpf.RunOptions{Data: b(&in), DataOut: b(&out)})
			if err != nil || ret != 2 {
				t.Fatalf("test run: %d, %v", ret, err)
			}
			got := want{out.Result, out.OutPc, out.OutSp, out.OutFp, out.Flags}
			if got.result == done {
				got.pc, got.sp, got.fp = 0, 0, 0
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
