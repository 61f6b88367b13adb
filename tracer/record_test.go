package tracer

import (
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"structs"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"
	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/support"
)

// The decoder's offsets come from the bpf2go types; those must lay out every
// record and map value exactly as the C structs do in the object's BTF.
func TestRecordLayoutMatchesBTF(t *testing.T) {
	spec, err := support.LoadSonde()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c   string
		goT reflect.Type
	}{
		{"sample_record", reflect.TypeFor[support.SondeSampleRecord]()},
		{"task_record", reflect.TypeFor[support.SondeTaskRecord]()},
		{"offcpu_end_record", reflect.TypeFor[support.SondeOffcpuEndRecord]()},
		{"unwind_row", reflect.TypeFor[support.SondeUnwindRow]()},
		{"mapping_key", reflect.TypeFor[support.SondeMappingKey]()},
		{"mapping_info", reflect.TypeFor[support.SondeMappingInfo]()},
		{"file_key", reflect.TypeFor[support.SondeFileKey]()},
		{"file_table", reflect.TypeFor[support.SondeFileTable]()},
		{"pid_stats", reflect.TypeFor[support.SondePidStats]()},
		{"stack_snapshot", reflect.TypeFor[support.SondeStackSnapshot]()},
	} {
		t.Run(tc.c, func(t *testing.T) {
			var st *btf.Struct
			if err := spec.Types.TypeByName(tc.c, &st); err != nil {
				t.Fatal(err)
			}
			if size, err := btf.Sizeof(st); err != nil || uintptr(size) != tc.goT.Size() {
				t.Errorf("size: C %d (%v), Go %d", size, err, tc.goT.Size())
			}
			var fields []reflect.StructField
			for i := range tc.goT.NumField() {
				if f := tc.goT.Field(i); f.Name != "_" && f.Type != reflect.TypeFor[structs.HostLayout]() {
					fields = append(fields, f)
				}
			}
			if len(fields) != len(st.Members) {
				t.Fatalf("%d Go fields, %d C members", len(fields), len(st.Members))
			}
			for i, m := range st.Members {
				size, err := btf.Sizeof(m.Type)
				if err != nil {
					t.Fatal(err)
				}
				f := fields[i]
				if f.Offset != uintptr(m.Offset.Bytes()) || f.Type.Size() != uintptr(size) {
					t.Errorf("%s (Go %s): C offset %d size %d, Go offset %d size %d",
						m.Name, f.Name, m.Offset.Bytes(), size, f.Offset, f.Type.Size())
				}
			}
		})
	}
	// 127 kernel frames, then maxUserFrames user frames of two words each.
	if maxWords != maxKernelFrames+2*maxUserFrames {
		t.Errorf("stack holds %d words, want %d kernel + 2×%d user", maxWords, maxKernelFrames, maxUserFrames)
	}
	if offType != 0 || offComm+commLen > offKernelLen {
		t.Errorf("sample header: type at %d, comm %d..%d, kernel_len at %d", offType, offComm, offComm+commLen, offKernelLen)
	}
}

// encodeSample encodes a sample as the eBPF side does; user frames get the
// file words of files (nil: none known).
func encodeSample(pid, tid, cpu uint32, comm string, kernel, user []uint64, files ...FileRef) []byte {
	le := binary.LittleEndian
	b := make([]byte, offStack+8*(len(kernel)+2*len(user)))
	le.PutUint32(b[offType:], uint32(RecordSample))
	le.PutUint32(b[offPID:], pid)
	le.PutUint32(b[offTID:], tid)
	le.PutUint32(b[offCPU:], cpu)
	le.PutUint64(b[offKtime:], 1_000_000_000)
	copy(b[offComm:offComm+16], comm)
	le.PutUint16(b[offKernelLen:], uint16(len(kernel)))
	le.PutUint16(b[offUserLen:], uint16(len(user)))
	le.PutUint32(b[offFlags:], FlagFramePointers)
	for i, pc := range kernel {
		le.PutUint64(b[offStack+8*i:], pc)
	}
	for i, pc := range user {
		at := offStack + 8*(len(kernel)+2*i)
		le.PutUint64(b[at:], pc)
		if i < len(files) {
			le.PutUint64(b[at+8:], uint64(files[i].File)<<32|files[i].Offset)
		}
	}
	return b
}

func TestDecodeSample(t *testing.T) {
	b := encodeSample(42, 43, 1, "worker", []uint64{0xffffffff81000010},
		[]uint64{0x401000, 0x401100 | pcFlagFramePointer, 0x401200 | pcFlagNoAdjust},
		FileRef{File: 7, Offset: 0x1000}, FileRef{}, FileRef{File: 9, Offset: 0xffffffff})
	var rec Record
	if err := rec.decode(b, clock{offset: 5}); err != nil {
		t.Fatal(err)
	}
	got := struct {
		Type          RecordType
		PID, TID, CPU uint32
		Comm          string
		Nanos         int64
		Kernel, User  []uint64
		Flags         []FrameFlags
		Files         []FileRef
	}{rec.Type, rec.PID, rec.TID, rec.CPU, rec.Comm, rec.Time.UnixNano(), rec.Kernel, rec.User, rec.UserFlags, rec.UserFiles}
	want := got
	want.Type, want.PID, want.TID, want.CPU, want.Comm, want.Nanos = RecordSample, 42, 43, 1, "worker", 1_000_000_005
	want.Kernel = []uint64{0xffffffff81000010}
	want.User = []uint64{0x401000, 0x401100, 0x401200}
	want.Flags = []FrameFlags{0, FrameFromFramePointer, FrameInterrupted}
	want.Files = []FileRef{{File: 7, Offset: 0x1000}, {}, {File: 9, Offset: 0xffffffff}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decoded sample (-want +got):\n%s", diff)
	}
}

// encodeEnd encodes an off-CPU end record as the eBPF side does.
func encodeEnd(pid, tid, flags uint32, start, duration uint64) []byte {
	le := binary.LittleEndian
	b := make([]byte, endSize)
	le.PutUint32(b[offType:], uint32(RecordOffCPUEnd))
	le.PutUint32(b[endOffPID:], pid)
	le.PutUint32(b[endOffTID:], tid)
	le.PutUint32(b[endOffFlags:], flags)
	le.PutUint64(b[endOffStart:], start)
	le.PutUint64(b[endOffDuration:], duration)
	return b
}

func TestDecodeOffCPU(t *testing.T) {
	var rec Record
	// A start is a sample of another type: same layout.
	start := encodeSample(42, 43, 1, "waiter", []uint64{0xffffffff81000010}, []uint64{0x401000 | pcFlagNoAdjust, 0x401100})
	binary.LittleEndian.PutUint32(start[offType:], uint32(RecordOffCPUStart))
	if err := rec.decode(start, clock{offset: 5}); err != nil {
		t.Fatal(err)
	}
	if rec.Type != RecordOffCPUStart || rec.PID != 42 || rec.TID != 43 || rec.KTime != 1_000_000_000 ||
		rec.Time.UnixNano() != 1_000_000_005 || len(rec.Kernel) != 1 || len(rec.User) != 2 || rec.OffCPU != 0 {
		t.Errorf("decoded start %+v", rec)
	}
	// The same Record then takes an end: nothing of the start stays.
	if err := rec.decode(encodeEnd(42, 43, OffCPUShort, 1_000_000_000, 250_000_000), clock{offset: 5}); err != nil {
		t.Fatal(err)
	}
	got := struct {
		Type         RecordType
		PID, TID     uint32
		Flags        uint32
		KTime        uint64
		Nanos        int64
		OffCPU       time.Duration
		Comm         string
		Kernel, User []uint64
	}{rec.Type, rec.PID, rec.TID, rec.Flags, rec.KTime, rec.Time.UnixNano(), rec.OffCPU, rec.Comm, rec.Kernel, rec.User}
	want := got
	want.Type, want.PID, want.TID, want.Flags = RecordOffCPUEnd, 42, 43, OffCPUShort
	want.KTime, want.Nanos, want.OffCPU, want.Comm, want.Kernel, want.User = 1_000_000_000, 1_000_000_005, 250*time.Millisecond, "", nil, nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decoded end (-want +got):\n%s", diff)
	}
}

func TestDecodeMalformed(t *testing.T) {
	full := encodeSample(1, 1, 0, "x", []uint64{1, 2}, []uint64{3})
	lying := append([]byte{}, full...)
	binary.LittleEndian.PutUint16(lying[offUserLen:], 200) // claims more frames than sent
	tooMany := encodeSample(1, 1, 0, "x", nil, nil)
	binary.LittleEndian.PutUint16(tooMany[offKernelLen:], uint16(maxWords))
	binary.LittleEndian.PutUint16(tooMany[offUserLen:], 1)
	unknown := append([]byte{}, full...)
	binary.LittleEndian.PutUint32(unknown[offType:], 99)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"short header", full[:offStack-1]},
		{"truncated frames", full[:len(full)-1]},
		{"frame count beyond record", lying},
		{"frame count beyond maximum", tooMany},
		{"unknown type", unknown},
		{"short task record", full[:taskSize-1]},
		{"short off-CPU end", encodeEnd(1, 1, 0, 1, 1)[:endSize-1]},
		{"off-CPU duration beyond int64", encodeEnd(1, 1, 0, 1, 1<<63)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			if tc.name == "short task record" {
				b = append([]byte{}, b...)
				binary.LittleEndian.PutUint32(b, uint32(RecordExit))
			}
			var rec Record
			if err := rec.decode(b, clock{}); !errors.Is(err, ErrMalformed) {
				t.Errorf("decode = %v, want ErrMalformed", err)
			}
		})
	}
}

// withSnapshot appends to a sample b (of user frames user) a snapshot at
// user frame frame, as the eBPF side does; second, if given, is a second
// region's address and bytes.
func withSnapshot(b []byte, user []uint64, frame int, interrupted bool, sp, fp uint64, stack []byte, second ...any) []byte {
	le := binary.LittleEndian
	le.PutUint32(b[offFlags:], le.Uint32(b[offFlags:])|FlagSnapshot)
	h := make([]byte, snapSize)
	pc := user[frame] &^ pcFlagsMask
	if interrupted {
		pc |= pcFlagNoAdjust
	}
	le.PutUint64(h[snapOffPC:], pc)
	le.PutUint64(h[snapOffSP:], sp)
	le.PutUint64(h[snapOffFP:], fp)
	le.PutUint16(h[snapOffFrame:], uint16(frame))
	le.PutUint32(h[snapOffBytes:], uint32(len(stack)))
	var stack2 []byte
	if len(second) == 2 {
		le.PutUint64(h[snapOffSP2:], second[0].(uint64))
		stack2 = second[1].([]byte)
		le.PutUint32(h[snapOffBytes2:], uint32(len(stack2)))
	}
	return append(append(append(b, h...), stack...), stack2...)
}

func TestDecodeSnapshot(t *testing.T) {
	user := []uint64{0x401000 | pcFlagNoAdjust, 0x7f0000001234 | pcFlagFramePointer}
	stack := []byte("0123456789abcdef")
	b := withSnapshot(encodeSample(42, 43, 1, "new", nil, user), user, 1, false, 0x7ffc0000, 0x7ffc0040, stack)
	var rec Record
	if err := rec.decode(b, clock{}); err != nil {
		t.Fatal(err)
	}
	if rec.Snapshot == nil {
		t.Fatal("no snapshot decoded")
	}
	got := *rec.Snapshot
	want := Snapshot{Frame: 1, SP: 0x7ffc0000, FP: 0x7ffc0040, Stack: stack, Stack2: []byte{}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("snapshot (-want +got):\n%s", diff)
	}
	// With a second region.
	b = withSnapshot(encodeSample(42, 43, 1, "new", nil, user), user, 0, true, 0x7ffc0000, 0, stack, uint64(0xc000010000), []byte("goroutine stack!"))
	if err := rec.decode(b, clock{}); err != nil {
		t.Fatal(err)
	}
	want = Snapshot{Frame: 0, Interrupted: true, SP: 0x7ffc0000, Stack: stack, SP2: 0xc000010000, Stack2: []byte("goroutine stack!")}
	if diff := cmp.Diff(want, *rec.Snapshot); diff != "" {
		t.Errorf("snapshot with a second region (-want +got):\n%s", diff)
	}
	// The same Record then takes a sample without one: none is left.
	if err := rec.decode(encodeSample(42, 43, 1, "new", nil, user), clock{}); err != nil {
		t.Fatal(err)
	}
	if rec.Snapshot != nil {
		t.Errorf("snapshot %+v left from the previous record", rec.Snapshot)
	}
}

func TestDecodeSnapshotMalformed(t *testing.T) {
	user := []uint64{0x401000, 0x401100}
	base := func() []byte { return encodeSample(1, 1, 0, "x", nil, user) }
	good := withSnapshot(base(), user, 0, true, 0x1000, 0, make([]byte, 64))
	wrongPC := withSnapshot(base(), user, 0, true, 0x1000, 0, make([]byte, 64))
	binary.LittleEndian.PutUint64(wrongPC[offStack+8*4+snapOffPC:], 0x999)
	pastFrames := withSnapshot(base(), user, 1, true, 0x1000, 0, nil)
	binary.LittleEndian.PutUint16(pastFrames[offStack+8*4+snapOffFrame:], 2)
	tooBig := withSnapshot(base(), user, 0, true, 0x1000, 0, nil)
	binary.LittleEndian.PutUint32(tooBig[offStack+8*4+snapOffBytes:], uint32(MaxSnapshotBytes+1))
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"header cut", good[:offStack+8*4+snapSize-1]},
		{"bytes cut", good[:len(good)-1]},
		{"frame's PC differs", wrongPC},
		{"frame past the user frames", pastFrames},
		{"more bytes than a snapshot holds", tooBig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec Record
			if err := rec.decode(tc.b, clock{}); !errors.Is(err, ErrMalformed) {
				t.Errorf("decode = %v, want ErrMalformed", err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeSample(1, 2, 3, "comm", []uint64{1}, []uint64{2, 3}))
	f.Add(withSnapshot(encodeSample(1, 2, 3, "comm", []uint64{1}, []uint64{2, 3}), []uint64{2, 3}, 1, false, 8, 16, []byte{1, 2, 3}))
	f.Add([]byte{2, 0, 0, 0})
	f.Add(encodeEnd(1, 2, 0, 3, 4))
	f.Fuzz(func(t *testing.T, b []byte) {
		var rec Record
		if err := rec.decode(b, clock{}); err != nil {
			return
		}
		if len(rec.Kernel)+2*len(rec.User) > maxWords || len(rec.UserFiles) != len(rec.User) {
			t.Fatalf("%d kernel and %d user frames (%d files) decoded, more than %d words",
				len(rec.Kernel), len(rec.User), len(rec.UserFiles), maxWords)
		}
		if s := rec.Snapshot; s != nil && (s.Frame >= len(rec.User) || len(s.Stack) > MaxSnapshotBytes) {
			t.Fatalf("snapshot at frame %d of %d, %d bytes", s.Frame, len(rec.User), len(s.Stack))
		}
	})
}

func TestDecodeSampleAllocatesNothingWhenWarm(t *testing.T) {
	b := encodeSample(42, 43, 1, "worker", []uint64{1, 2}, []uint64{3, 4, 5})
	var rec Record
	if err := rec.decode(b, clock{}); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = rec.decode(b, clock{}) }); n != 0 {
		t.Errorf("decode allocates %v times per warm record, want 0", n)
	}
}

// A record reused from the pool grows to a deeper stack than it held, and
// keeps every frame of both; it grows no further than the deepest.
func TestDecodeGrowsRecordToDeeperStacks(t *testing.T) {
	frames := func(n int, base uint64) []uint64 {
		s := make([]uint64, n)
		for i := range s {
			s[i] = base + uint64(i)
		}
		return s
	}
	deepUser := min(maxUserFrames, (maxWords-8)/2)
	var rec Record
	for _, tc := range []struct{ kernel, user []uint64 }{
		{frames(2, 100), frames(3, 200)},
		{frames(8, 0xffff0000), frames(deepUser, 0x400000)},
		{frames(1, 300), frames(1, 400)},
	} {
		if err := rec.decode(encodeSample(1, 2, 0, "c", tc.kernel, tc.user), clock{}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(rec.Kernel, tc.kernel) || !slices.Equal(rec.User, tc.user) || len(rec.UserFiles) != len(tc.user) {
			t.Fatalf("decoded %d+%d frames, want %d+%d equal", len(rec.Kernel), len(rec.User), len(tc.kernel), len(tc.user))
		}
		if cap(rec.stack) > maxWords || cap(rec.flags) > maxUserFrames {
			t.Fatalf("record grew to %d words and %d user frames, beyond %d and %d", cap(rec.stack), cap(rec.flags), maxWords, maxUserFrames)
		}
	}
}

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{in: "0", want: []int{0}},
		{in: "0-3", want: []int{0, 1, 2, 3}},
		{in: "0-1,4,6-7", want: []int{0, 1, 4, 6, 7}},
		{in: "", wantErr: true},
		{in: "a-b", wantErr: true},
		{in: "3-1", wantErr: true},
		{in: "0-99999999", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseCPUList(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseCPUList(%q) error = %v, wantErr %v", tc.in, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parseCPUList(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestDecodeUserFrameFlags(t *testing.T) {
	user := []uint64{0x401000 | pcFlagNoAdjust, 0x401100, 0x401200 | pcFlagFramePointer, 0x7f0000001000 | pcFlagNoAdjust}
	var rec Record
	if err := rec.decode(encodeSample(1, 1, 0, "x", nil, user), clock{}); err != nil {
		t.Fatal(err)
	}
	want := []uint64{0x401000, 0x401100, 0x401200, 0x7f0000001000}
	wantFlags := []FrameFlags{FrameInterrupted, 0, FrameFromFramePointer, FrameInterrupted}
	if diff := cmp.Diff(want, rec.User); diff != "" {
		t.Errorf("user PCs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantFlags, rec.UserFlags); diff != "" {
		t.Errorf("user frame flags (-want +got):\n%s", diff)
	}
}

// A Python frame keeps its code object address and its whole 64-bit
// instruction word (a pointer from 3.11 on), and no file.
func TestDecodePythonFrame(t *testing.T) {
	const code, instr = 0x7f12_3456_7890, 0x7f12_3456_78c6
	user := []uint64{0x401000 | pcFlagNoAdjust, code | pcFlagRuntime, 0x401100}
	b := encodeSample(1, 1, 0, "x", nil, user, FileRef{File: 3, Offset: 0x1000}, FileRef{}, FileRef{File: 3, Offset: 0x1100})
	binary.LittleEndian.PutUint64(b[offStack+8*3:], instr)
	var rec Record
	if err := rec.decode(b, clock{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]uint64{0x401000, code, 0x401100}, rec.User); diff != "" {
		t.Errorf("user PCs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]FrameFlags{FrameInterrupted, FrameRuntime, 0}, rec.UserFlags); diff != "" {
		t.Errorf("user frame flags (-want +got):\n%s", diff)
	}
	want := []FileRef{{File: 3, Offset: 0x1000}, {Offset: instr}, {File: 3, Offset: 0x1100}}
	if diff := cmp.Diff(want, rec.UserFiles); diff != "" {
		t.Errorf("user files (-want +got):\n%s", diff)
	}
}

// A Java frame keeps its address (the runtime and kind bits off), its
// second word whole, and says which runtime and kind reported it; an
// interrupted one stays interrupted.
func TestDecodeJVMFrame(t *testing.T) {
	const blob, word = 0x7f12_3456_7000, 0x0000_002a_0000_01c4
	const method, bcp = 0x7f00_1111_2220, 0x7f00_3333_4448
	jvm := func(kind uint64) uint64 {
		return pcFlagRuntime | uint64(RuntimeJVM)<<uint64(support.SondeRuntimeIdRUNTIME_SHIFT) | kind<<runtimeKindShift
	}
	compiled := uint64(support.SondeJvmFrameKindJVM_FRAME_COMPILED)
	interp := uint64(support.SondeJvmFrameKindJVM_FRAME_INTERPRETED)
	user := []uint64{blob | jvm(compiled) | pcFlagNoAdjust, method | jvm(interp), 0x401100}
	b := encodeSample(1, 1, 0, "x", nil, user, FileRef{}, FileRef{}, FileRef{File: 3, Offset: 0x1100})
	binary.LittleEndian.PutUint64(b[offStack+8*1:], word)
	binary.LittleEndian.PutUint64(b[offStack+8*3:], bcp)
	var rec Record
	if err := rec.decode(b, clock{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]uint64{blob, method, 0x401100}, rec.User); diff != "" {
		t.Errorf("user PCs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]FrameFlags{FrameRuntime | FrameInterrupted, FrameRuntime, 0}, rec.UserFlags); diff != "" {
		t.Errorf("user frame flags (-want +got):\n%s", diff)
	}
	for i, want := range []struct{ runtime, kind uint8 }{{RuntimeJVM, uint8(compiled)}, {RuntimeJVM, uint8(interp)}} {
		if rt, kind := RuntimeFrame(rec.UserFiles[i]); rt != want.runtime || kind != want.kind {
			t.Errorf("frame %d: runtime %d kind %d, want %d %d", i, rt, kind, want.runtime, want.kind)
		}
	}
	if rec.UserFiles[0].Offset != word || rec.UserFiles[1].Offset != bcp {
		t.Errorf("second words %#x %#x, want %#x %#x", rec.UserFiles[0].Offset, rec.UserFiles[1].Offset, uint64(word), uint64(bcp))
	}
}
