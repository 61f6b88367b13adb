package tracer

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// benchRecord encodes a sample as deep as the per-sample benchmarks of the
// profiler use: 10 kernel frames, 30 native user frames (each with its file
// and offset, as in a prepared process), and a Python and a JVM frame
// between them.
func benchRecord() []byte {
	kernel := make([]uint64, 10)
	for i := range kernel {
		kernel[i] = 0xffff_ffff_8100_0000 + uint64(i)*0x1234
	}
	user := make([]uint64, 32)
	files := make([]FileRef, 32)
	for i := range user {
		user[i] = 0x5555_5555_0000 + uint64(i)*0x140
		files[i] = FileRef{File: uint32(1 + i%4), Offset: uint64(i) * 0x140}
	}
	user[0] |= pcFlagNoAdjust
	jvm := pcFlagRuntime | uint64(RuntimeJVM)<<uint64(support.SondeRuntimeIdRUNTIME_SHIFT) |
		uint64(support.SondeJvmFrameKindJVM_FRAME_INTERPRETED)<<runtimeKindShift
	user[10] = 0x7f00_1111_2220 | jvm
	user[20] = 0x7f12_3456_7890 | pcFlagRuntime | uint64(RuntimePython)<<uint64(support.SondeRuntimeIdRUNTIME_SHIFT)
	b := encodeSample(4242, 4243, 1, "worker-7", kernel, user, files...)
	binary.LittleEndian.PutUint64(b[offStack+8*(len(kernel)+2*10+1):], 0x7f00_3333_4448)
	binary.LittleEndian.PutUint64(b[offStack+8*(len(kernel)+2*20+1):], 0x7f12_3456_78c6)
	return b
}

// BenchmarkDecodeSample is the tracer's part of one sample once the ring
// buffer handed over its bytes: decoding them into a reused Record.
func BenchmarkDecodeSample(b *testing.B) {
	raw := benchRecord()
	var rec Record
	if err := rec.decode(raw, clock{}); err != nil {
		b.Fatal(err)
	}
	if len(rec.Kernel) != 10 || len(rec.User) != 32 || rec.UserFlags[10]&FrameRuntime == 0 {
		b.Fatalf("decoded %d kernel, %d user frames", len(rec.Kernel), len(rec.User))
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := rec.decode(raw, clock{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadSample is the whole read stage of one sample: taking its
// record from a real BPF ring buffer (TryReadInto: the reader's deadline,
// the copy out of the ring, the consumer position) and decoding it. A tiny
// program run with BPF_PROG_TEST_RUN writes the records, 1024 at a time,
// outside the timed part.
func BenchmarkReadSample(b *testing.B) {
	testutil.RequirePrivileges(b, "a BPF ring buffer")
	raw := benchRecord()
	const batch = 1024
	rb, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.RingBuf, MaxEntries: 1 << 21})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = rb.Close() }()
	src, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(len(raw)), MaxEntries: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = src.Close() }()
	if err := src.Put(uint32(0), raw); err != nil {
		b.Fatal(err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R1, 0),
			asm.StoreMem(asm.RFP, -4, asm.R1, asm.Word),
			asm.LoadMapPtr(asm.R1, src.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "exit"),
			asm.LoadMapPtr(asm.R1, rb.FD()),
			asm.Mov.Reg(asm.R2, asm.R0),
			asm.Mov.Imm(asm.R3, int32(len(raw))),
			asm.Mov.Imm(asm.R4, 0),
			asm.FnRingbufOutput.Call(),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("exit"),
			asm.Return(),
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = prog.Close() }()
	fill := func() {
		if _, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 64), Repeat: batch}); err != nil {
			b.Fatal(err)
		}
	}
	r, err := newRing(rb)
	if err != nil {
		b.Fatal(err)
	}
	t := &Tracer{events: r, clock: newClock()}
	defer func() { _ = r.close() }()
	var rec Record
	fill()
	if err := t.TryReadInto(&rec); err != nil || len(rec.User) != 32 {
		b.Fatalf("read %d user frames: %v", len(rec.User), err)
	}
	b.ReportAllocs()
	for b.Loop() {
		err := t.TryReadInto(&rec)
		if errors.Is(err, ErrEmpty) {
			b.StopTimer()
			fill()
			b.StartTimer()
			err = t.TryReadInto(&rec)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
