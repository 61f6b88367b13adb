package v8

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/sonde-dev/sonde/internal/lru"
	"github.com/sonde-dev/sonde/internal/symbolize"
)

// A synthetic V8 heap, laid out as V8 11 (Node 20) lays out its objects,
// for naming tests without a process and for fuzzing.

// synthMetadata is the metadata of a V8 11 as its v8dbg_* symbols say.
func synthMetadata() metadata {
	return metadata{
		"HeapObjectTag": 1, "HeapObjectTagMask": 3, "SmiShiftSize": 31, "SmiValueShift": 1, "SmiTagMask": 1,
		"FirstNonstringType": 128, "StringRepresentationMask": 7, "StringEncodingMask": 8, "OneByteStringTag": 8,
		"SeqStringTag": 0, "ConsStringTag": 1, "SlicedStringTag": 3, "ThinStringTag": 5, "ExternalStringTag": 2,
		"class_ExternalString__resource__Object":                     16,
		"class_Map__instance_type__uint16_t":                         12,
		"class_String__length__int32_t":                              12,
		"class_SeqOneByteString__chars__char":                        16,
		"class_SeqTwoByteString__chars__char":                        16,
		"class_ConsString__first__String":                            16,
		"class_ConsString__second__String":                           24,
		"class_ThinString__actual__String":                           16,
		"class_SlicedString__parent__String":                         16,
		"class_SlicedString__offset__SMI":                            24,
		"class_FixedArrayBase__length__SMI":                          8,
		"class_FixedArray__data__uintptr_t":                          16,
		"class_JSFunction__shared__SharedFunctionInfo":               24,
		"class_SharedFunctionInfo__name_or_scope_info__Object":       16,
		"class_SharedFunctionInfo__script_or_debug_info__HeapObject": 32,
		"class_SharedFunctionInfo__function_data__Object":            8,
		"class_Script__name__Object":                                 16,
		"class_Script__source__Object":                               8,
		"class_Script__line_ends__Object":                            56,
		"class_BytecodeArray__data__uintptr_t":                       54,
		"class_InstructionStream__instruction_start__uintptr_t":      16,
		"CodeKindFieldMask":                                          15, "CodeKindFieldShift": 0, "CodeKindBaseline": 11,
		"DeoptimizationDataInliningPositionsIndex": 7, "DeoptimizationDataLiteralArrayIndex": 2,
		"DeoptimizationDataSharedFunctionInfoIndex": 6,
		"scopeinfo_idx_first_vars":                  3, "scopeinfo_idx_ncontextlocals": 2,
		"type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE": synthSFI, "type_Script__SCRIPT_TYPE": synthScript,
		"type_BytecodeArray__BYTECODE_ARRAY_TYPE": synthBytecode, "type_Code__CODE_TYPE": synthCode,
		"type_InstructionStream__INSTRUCTION_STREAM_TYPE": synthIStream, "type_ScopeInfo__SCOPE_INFO_TYPE": 261,
		"type_FixedArray__FIXED_ARRAY_TYPE": synthFixed, "type_ByteArray__BYTE_ARRAY_TYPE": synthBytes,
		"type_InterpreterData__INTERPRETER_DATA_TYPE": 159, "type_Map__MAP_TYPE": synthMap,
		"frametype_EntryFrame": 1, "frametype_ConstructEntryFrame": 2, "frametype_StubFrame": 15,
		"off_fp_context_or_frame_type": -8, "off_fp_function": -16, "off_fp_bytecode_array": -32,
		"off_fp_bytecode_offset": -40,
	}
}

const (
	synthSFI, synthScript, synthBytecode, synthCode = 262, 167, 191, 245
	synthIStream, synthFixed, synthBytes, synthMap  = 252, 175, 190, 255
	synthString                                     = 8 // a one-byte sequential string

	imgBase = 0x10000000
	imgSize = 0x4000
)

// synthImg is a heap image under construction.
type synthImg struct {
	b    []byte
	next uint64
	maps map[int64]uint64
}

func (s *synthImg) put(a, v uint64) { binary.LittleEndian.PutUint64(s.b[a-imgBase:], v) }

// alloc returns the (untagged) address of n fresh bytes, 8-aligned.
func (s *synthImg) alloc(n uint64) uint64 {
	a := s.next
	s.next += (n + 7) &^ 7
	return a
}

// object allocates an object of type t and n bytes, with its map.
func (s *synthImg) object(t int64, n uint64) uint64 {
	m, ok := s.maps[t]
	if !ok {
		m = s.alloc(16) + 1
		s.maps[t] = m
		s.put(m-1, s.maps[synthMap])
		binary.LittleEndian.PutUint16(s.b[m-1+12-imgBase:], uint16(t))
	}
	a := s.alloc(n)
	s.put(a, m)
	return a + 1
}

func smiV(v int64) uint64 { return uint64(v) << 32 }

func (s *synthImg) str(v string) uint64 {
	o := s.object(synthString, 16+uint64(len(v)))
	binary.LittleEndian.PutUint32(s.b[o-1+12-imgBase:], uint32(len(v)))
	copy(s.b[o-1+16-imgBase:], v)
	return o
}

func (s *synthImg) bytes(t int64, v []byte) uint64 {
	o := s.object(t, 16+uint64(len(v)))
	s.put(o-1+8, smiV(int64(len(v))))
	copy(s.b[o-1+16-imgBase:], v)
	return o
}

func (s *synthImg) fixed(vs ...uint64) uint64 {
	o := s.object(synthFixed, 16+8*uint64(len(vs)))
	s.put(o-1+8, smiV(int64(len(vs))))
	for i, v := range vs {
		s.put(o-1+16+8*uint64(i), v)
	}
	return o
}

// The synthetic program: f calls g on line 2; g, inlined into f's
// TurboFan code, loops on line 5.
const synthSource = "function f() {\n  return g();\n}\nfunction g() {\n  for (;;) {}\n}\n"

// synth holds the addresses tests name frames by.
type synth struct {
	img               []byte
	sfiF, sfiG        uint64
	bytecodeF         uint64
	istream, instrs   uint64
	offCall, offInner uint32 // machine code offsets: the call in f, g's loop
	bcCall            int    // f's bytecode offset of the call
}

func buildSynth() synth {
	s := &synthImg{b: make([]byte, imgSize), next: imgBase + 64, maps: map[int64]uint64{}}
	// The meta map: a map whose map is itself.
	mm := s.alloc(16) + 1
	s.put(mm-1, mm)
	binary.LittleEndian.PutUint16(s.b[mm-1+12-imgBase:], synthMap)
	s.maps[synthMap] = mm
	undefined := s.object(synthFixed+100, 16)

	script := s.object(synthScript, 64)
	s.put(script-1+8, s.str(synthSource))
	s.put(script-1+16, s.str("/app/synth.js"))
	s.put(script-1+56, undefined)

	callOff := int32(len("function f() {\n  return "))
	loopOff := int32(len("function f() {\n  return g();\n}\nfunction g() {\n  "))
	const bcCall = 3
	spt := s.bytes(synthBytes, encodePositions([]posEntry{
		{codeOffset: 0, pos: rawPosition(callOff-7, -1), statement: true},
		{codeOffset: bcCall, pos: rawPosition(callOff, -1)},
	}, false))
	bc := s.object(synthBytecode, 64)
	s.put(bc-1+8, smiV(10))
	s.put(bc-1+32, spt)

	sfiF := s.object(synthSFI, 64)
	s.put(sfiF-1+8, bc)
	s.put(sfiF-1+16, s.str("f"))
	s.put(sfiF-1+32, script)
	sfiG := s.object(synthSFI, 64)
	s.put(sfiG-1+8, smiV(0))
	s.put(sfiG-1+16, s.str("g"))
	s.put(sfiG-1+32, script)

	inl := make([]byte, 16)
	binary.LittleEndian.PutUint64(inl, uint64(rawPosition(callOff, -1)))
	deopt := s.fixed(0, 0, s.fixed(sfiG), 0, 0, 0, sfiF, s.bytes(synthBytes, inl))
	const offInner, offCall = 0x10, 0x40
	cpos := s.bytes(synthBytes, encodePositions([]posEntry{
		{codeOffset: 0, pos: rawPosition(0, -1)},
		{codeOffset: offInner, pos: rawPosition(loopOff, 0)},
		{codeOffset: offCall, pos: rawPosition(callOff, -1)},
	}, false))
	code := s.object(synthCode, 64)
	s.next = (s.next + 63) &^ 63
	istream := s.object(synthIStream, 16+0x100)
	s.put(code-1+16, deopt)
	s.put(code-1+24, cpos)
	s.put(code-1+32, istream)
	s.put(code-1+40, istream-1+16)
	binary.LittleEndian.PutUint32(s.b[code-1+48-imgBase:], 13) // turbofan
	binary.LittleEndian.PutUint32(s.b[code-1+56-imgBase:], 0x100)
	s.put(istream-1+8, code)
	return synth{img: s.b, sfiF: sfiF, sfiG: sfiG, bytecodeF: bc, istream: istream, instrs: istream - 1 + 16,
		offCall: offCall, offInner: offInner, bcCall: bcCall}
}

// sliceMem reads a byte slice at base.
type sliceMem struct {
	base uint64
	b    []byte
}

func (m sliceMem) ReadAt(p []byte, a uint64) error {
	if a < m.base || a-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(a-m.base) {
		return fmt.Errorf("read %#x+%d outside the image", a, len(p))
	}
	copy(p, m.b[a-m.base:])
	return nil
}

func synthNamer(t testing.TB, img []byte) *Namer {
	l, err := newLayout(synthMetadata(), 11)
	if err != nil {
		t.Fatal(err)
	}
	n := NewNamer("/nonexistent", 1<<20)
	n.addMem(1, &VM{V8Major: 11, l: l}, sliceMem{base: imgBase, b: img}, nil)
	return n
}

func TestNamerSynthetic(t *testing.T) {
	sy := buildSynth()
	n := synthNamer(t, sy.img)
	f := symbolize.Line{Function: "f", File: "/app/synth.js", Line: 2}
	g := symbolize.Line{Function: "g", File: "/app/synth.js", Line: 5}
	// Interpreted: f at the call's bytecode offset.
	raw := uint32(54 - 1 + sy.bcCall)
	fr, err := n.Frame(1, FrameInterpreted, sy.sfiF, uint64(raw)<<32|uint64(uint32(sy.bytecodeF)), true)
	if err != nil || fr.Tier != TierInterpreted || fmt.Sprint(fr.Lines) != fmt.Sprint([]symbolize.Line{f}) {
		t.Errorf("interpreted: %+v %v", fr, err)
	}
	// Another bytecode array than the function's: stale.
	if _, err := n.Frame(1, FrameInterpreted, sy.sfiF, uint64(raw)<<32|uint64(uint32(sy.bytecodeF+8)), true); !errors.Is(err, ErrStale) {
		t.Errorf("other bytecode: %v, want ErrStale", err)
	}
	for _, c := range []struct {
		name  string
		pc    uint64
		ret   bool
		sfi   uint64
		want  []symbolize.Line
		stale bool
	}{
		{"inlined g at the leaf", sy.instrs + uint64(sy.offInner) + 4, false, sy.sfiF, []symbolize.Line{g, f}, false},
		{"f returning from its call", sy.instrs + uint64(sy.offCall) + 5, true, sy.sfiF, []symbolize.Line{f}, false},
		{"the code of another function", sy.instrs + 4, false, sy.sfiG, nil, true},
		{"in the prologue: the code's own function", sy.instrs + 1, false, 0, []symbolize.Line{{Function: "f", File: "/app/synth.js", Line: 1}}, false},
		{"past the instructions", sy.instrs + 0x100, false, sy.sfiF, nil, true},
	} {
		fr, err := n.Frame(1, FrameCompiled, c.sfi, c.pc, c.ret)
		if c.stale {
			if !errors.Is(err, ErrStale) {
				t.Errorf("%s: %+v %v, want ErrStale", c.name, fr, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if fr.Tier != TierTurbofan || fmt.Sprint(fr.Lines) != fmt.Sprint(c.want) {
			t.Errorf("%s: %s %+v, want turbofan %+v", c.name, fr.Tier, fr.Lines, c.want)
		}
	}
	// The code replaced by other bytes at the same address: stale, not
	// named from the cache.
	img2 := append([]byte(nil), sy.img...)
	binary.LittleEndian.PutUint64(img2[sy.istream-1+8-imgBase:], 0)
	n.procs[1].h.mem = sliceMem{base: imgBase, b: img2}
	if _, err := n.Frame(1, FrameCompiled, sy.sfiF, sy.instrs+uint64(sy.offInner), false); !errors.Is(err, ErrStale) && !errors.Is(err, ErrUnreadable) {
		t.Errorf("code overwritten: %v, want ErrStale or ErrUnreadable", err)
	}
	st := n.Stats()
	if st.Named != 4 || st.Stale < 3 || st.Bytes <= 0 || st.Entries == 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestNamerBound(t *testing.T) {
	sy := buildSynth()
	n := synthNamer(t, sy.img)
	n.cache = lru.New[entryKey, *entry](600)
	for range 3 {
		if _, err := n.Frame(1, FrameCompiled, sy.sfiF, sy.instrs+uint64(sy.offInner), false); err != nil {
			t.Fatal(err)
		}
	}
	st := n.Stats()
	if st.Bytes > 600 || st.Evictions == 0 {
		t.Errorf("stats %+v: want at most 600 bytes and evictions", st)
	}
}

// synthKernel is the walker's view of the synthetic V8 11, its builtins
// at 0x400000-0x500000.
func synthKernel(t testing.TB) Kernel {
	l, err := newLayout(synthMetadata(), 11)
	if err != nil {
		t.Fatal(err)
	}
	k, err := l.kernel(synthMetadata())
	if err != nil {
		t.Fatal(err)
	}
	k.Builtins = []Range{{Start: 0x400000, End: 0x500000}}
	return k
}

func TestWalkSynthetic(t *testing.T) {
	k := synthKernel(t)
	sy := buildSynth()
	// A stack: a TurboFan frame of f, an interpreted caller (f again), an
	// entry frame.
	stack := make([]byte, 0x200)
	const sb = 0x7ff0000
	put := func(a, v uint64) { binary.LittleEndian.PutUint64(stack[a-sb:], v) }
	// JSFunction for f in the heap image: reuse spare bytes at its end.
	fn := uint64(imgBase + imgSize - 64 + 1)
	binary.LittleEndian.PutUint64(sy.img[fn-1+24-imgBase:], sy.sfiF)
	mem := multiMem{sliceMem{sb, stack}, sliceMem{imgBase, sy.img}}
	fp0, fp1, fp2 := uint64(sb+0x40), uint64(sb+0x100), uint64(sb+0x180)
	put(fp0-8, 0x1234561) // a context
	put(fp0-16, fn)
	put(fp0, fp1)
	put(fp0+8, 0x400100) // returns into the interpreter
	put(fp1-8, 0x1234561)
	put(fp1-16, fn)
	put(fp1-32, sy.bytecodeF)
	put(fp1-40, smiV(56))
	put(fp1, fp2)
	put(fp1+8, 0x400200)
	put(fp2-8, 1<<1) // an entry frame's marker
	put(fp2, 0x7000)
	put(fp2+8, 0x401000)
	frames, stop, next := k.Walk(mem, nil, sy.instrs+4, fp0-32, fp0)
	want := []WalkedFrame{
		{Kind: FrameCompiled, Addr: sy.sfiF, Word: sy.instrs + 4},
		{Kind: FrameInterpreted, Addr: sy.sfiF, Word: 56<<32 | uint64(uint32(sy.bytecodeF)), ReturnAddr: true},
		{Kind: FrameStub, Addr: 0x400200, Word: 1, ReturnAddr: true},
	}
	if stop != StopEntry || fmt.Sprint(frames) != fmt.Sprint(want) || next != [3]uint64{0x401000, fp2 + 16, 0x7000} {
		t.Errorf("walk: %v %+v %#x, want entry %+v", stop, frames, next, want)
	}
	// The leaf in a builtin that built no frame, called from f's compiled
	// code: its return address on top of the stack gives f's pc.
	sp := uint64(sb + 0x10)
	put(sp, sy.instrs+0x20)
	jit := func(pc uint64) bool { return pc >= sy.instrs && pc < sy.instrs+0x100 }
	frames, _, _ = k.Walk(mem, jit, 0x400300, sp, fp0)
	if len(frames) < 2 || frames[0] != (WalkedFrame{Kind: FrameStub, Addr: 0x400300}) ||
		frames[1] != (WalkedFrame{Kind: FrameCompiled, Addr: sy.sfiF, Word: sy.instrs + 0x20, ReturnAddr: true}) {
		t.Errorf("frameless leaf: %+v", frames)
	}
	// Not a return address into compiled code: the builtin's frame as
	// FrameBuiltin.
	put(sp, 0x1234)
	frames, _, _ = k.Walk(mem, jit, 0x400300, sp, fp0)
	if len(frames) < 1 || frames[0] != (WalkedFrame{Kind: FrameBuiltin, Addr: sy.sfiF, Word: 0x400300}) {
		t.Errorf("builtin leaf: %+v", frames)
	}
}

// TestWalkPrologue: a leaf in compiled code that has not built its frame
// yet (push rbp; mov rbp, rsp; push rsi; push rdi) leaves as the code's
// own function (addr 0) above the caller's frames, at each step of the
// prologue; once the function is pushed, the frame is an ordinary one.
func TestWalkPrologue(t *testing.T) {
	k := synthKernel(t)
	sy := buildSynth()
	fn := uint64(imgBase + imgSize - 64 + 1)
	binary.LittleEndian.PutUint64(sy.img[fn-1+24-imgBase:], sy.sfiF)

	// The code: filler, then the prologue at entry.
	const cb = 0x6000000
	code := append(bytes.Repeat([]byte{0x90}, 8), 0x55, 0x48, 0x89, 0xe5, 0x56, 0x57, 0x50, 0x48, 0x83, 0xec, 0x08)
	code = append(code, bytes.Repeat([]byte{0x90}, 16)...)
	entry := uint64(cb + 8)
	jit := func(pc uint64) bool { return pc >= cb && pc < cb+uint64(len(code)) }

	// The caller: an interpreted frame of f at fp1, returning to an
	// entry frame at fp2.
	const sb = 0x7ff0000
	stack := make([]byte, 0x200)
	put := func(a, v uint64) { binary.LittleEndian.PutUint64(stack[a-sb:], v) }
	fp1, fp2 := uint64(sb+0x100), uint64(sb+0x180)
	put(fp1-8, 0x1234561)
	put(fp1-16, fn)
	put(fp1-32, sy.bytecodeF)
	put(fp1-40, smiV(56))
	put(fp1, fp2)
	put(fp1+8, 0x400200)
	put(fp2-8, 1<<1)
	put(fp2, 0x7000)
	put(fp2+8, 0x401000)
	const ra = 0x400100 // into the interpreter's call
	caller := []WalkedFrame{
		{Kind: FrameInterpreted, Addr: sy.sfiF, Word: 56<<32 | uint64(uint32(sy.bytecodeF)), ReturnAddr: true},
		{Kind: FrameStub, Addr: 0x400200, Word: 1, ReturnAddr: true},
	}
	mem := multiMem{sliceMem{sb, stack}, sliceMem{imgBase, sy.img}, sliceMem{cb, code}}

	top := uint64(sb + 0x80) // sp at the call
	for _, tc := range []struct {
		name   string
		pc     uint64
		sp, fp uint64
		setup  func()
	}{
		{"at push rbp", entry, top, fp1, func() { put(top, ra) }},
		{"after push rbp", entry + 1, top - 8, fp1, func() { put(top, ra); put(top-8, fp1) }},
		{"after mov rbp, rsp", entry + 4, top - 8, top - 8, func() { put(top, ra); put(top-8, fp1) }},
		{"after push rsi", entry + 5, top - 16, top - 8, func() { put(top, ra); put(top-8, fp1); put(top-16, 0x1234561) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(stack[top-16-sb : top+8-sb])
			tc.setup()
			frames, stop, _ := k.Walk(mem, jit, tc.pc, tc.sp, tc.fp)
			want := append([]WalkedFrame{{Kind: FrameCompiled, Word: tc.pc}}, caller...)
			if stop != StopEntry || fmt.Sprint(frames) != fmt.Sprint(want) {
				t.Errorf("walk: %v %+v, want entry %+v", stop, frames, want)
			}
		})
	}
	// The function pushed: an ordinary frame, its function read.
	clear(stack[top-32-sb : top+8-sb])
	put(top, ra)
	put(top-8, fp1)
	put(top-16, 0x1234561)
	put(top-24, fn)
	frames, _, _ := k.Walk(mem, jit, entry+6, top-24, top-8)
	if len(frames) == 0 || frames[0] != (WalkedFrame{Kind: FrameCompiled, Addr: sy.sfiF, Word: entry + 6}) {
		t.Errorf("after push rdi: %+v", frames)
	}
	// The same bytes elsewhere than at the pc say nothing.
	frames, _, _ = k.Walk(mem, jit, entry+12, top-24, top-8)
	if len(frames) == 0 || frames[0].Addr != sy.sfiF {
		t.Errorf("past the prologue: %+v", frames)
	}
}

// multiMem reads from the first of its memories that holds the range.
type multiMem []sliceMem

func (m multiMem) ReadAt(p []byte, a uint64) error {
	for _, s := range m {
		if s.ReadAt(p, a) == nil {
			return nil
		}
	}
	return fmt.Errorf("read %#x+%d: unmapped", a, len(p))
}

// countingMem counts the reads made of a Memory.
type countingMem struct {
	Memory
	reads *int
}

func (m countingMem) ReadAt(p []byte, a uint64) error {
	*m.reads++
	return m.Memory.ReadAt(p, a)
}

// A frame of a sample taken before the namer last found its objects
// unchanged is named without reading them again; one taken after that
// check reads them, and sees what changed since.
func TestNamerReusesChecksMadeAfterTheSample(t *testing.T) {
	sy := buildSynth()
	n := synthNamer(t, sy.img)
	reads := 0
	n.procs[1].h.mem = countingMem{Memory: sliceMem{base: imgBase, b: sy.img}, reads: &reads}
	pc := sy.instrs + uint64(sy.offInner) + 4
	name := func(captured time.Time) (Frame, error) {
		return n.FrameCaptured(captured, 1, FrameCompiled, sy.sfiF, pc, false)
	}
	early := time.Now()
	if _, err := name(early); err != nil {
		t.Fatal(err)
	}
	// A second sample taken before that naming read the objects: its
	// frame comes from the cache without a read.
	reads = 0
	if fr, err := name(early); err != nil || len(fr.Lines) != 2 || reads != 0 {
		t.Errorf("sample taken before the check: %+v %v after %d reads, want 2 lines and no read", fr, err, reads)
	}
	if st := n.Stats(); st.Reused == 0 {
		t.Errorf("stats %+v: want objects reused", st)
	}
	// The code replaced since: a sample taken now is checked against
	// memory, and the change is seen.
	img2 := append([]byte(nil), sy.img...)
	binary.LittleEndian.PutUint64(img2[sy.istream-1+8-imgBase:], 0)
	n.procs[1].h.mem = countingMem{Memory: sliceMem{base: imgBase, b: img2}, reads: &reads}
	reads = 0
	if _, err := name(time.Now()); !errors.Is(err, ErrStale) && !errors.Is(err, ErrUnreadable) || reads == 0 {
		t.Errorf("sample taken after the change: %v after %d reads, want ErrStale or ErrUnreadable after reading", err, reads)
	}
	// Without a capture time everything is read.
	n.procs[1].h.mem = countingMem{Memory: sliceMem{base: imgBase, b: sy.img}, reads: &reads}
	if _, err := name(time.Time{}); err != nil {
		t.Fatal(err)
	}
	reads = 0
	if _, err := name(time.Time{}); err != nil || reads == 0 {
		t.Errorf("no capture time: %v after %d reads, want reads", err, reads)
	}
}

// TestExternalStrings: a string whose characters are behind a C++
// resource is read through the pointer it caches after the resource
// (one-byte and two-byte, whole and sliced); one that caches none is
// unreadable, not guessed.
func TestExternalStrings(t *testing.T) {
	s := &synthImg{b: make([]byte, imgSize), next: imgBase + 16, maps: map[int64]uint64{}}
	s.maps[synthMap] = s.alloc(16) + 1
	s.put(s.maps[synthMap]-1, s.maps[synthMap])
	binary.LittleEndian.PutUint16(s.b[s.maps[synthMap]-1+12-imgBase:], synthMap)
	const (
		extOneByte   = 0x2a // external, one-byte, not internalized
		extTwoByte   = 0x22 // external, two-byte
		extUncached  = 0x3a // external, one-byte, uncached
		slicedString = 0x23 // sliced, two-byte
	)
	ext := func(t int64, n int, chars uint64) uint64 {
		o := s.object(t, 32)
		binary.LittleEndian.PutUint32(s.b[o-1+12-imgBase:], uint32(n))
		s.put(o-1+16, 0xdead0000) // the resource: never read
		s.put(o-1+24, chars)
		return o
	}
	one := s.alloc(16)
	copy(s.b[one-imgBase:], "let a = 1;\nf()\n")
	two := s.alloc(8)
	for i, c := range utf16.Encode([]rune("é\nz")) {
		binary.LittleEndian.PutUint16(s.b[two+2*uint64(i)-imgBase:], c)
	}
	oneByte := ext(extOneByte, 15, one)
	twoByte := ext(extTwoByte, 3, two)
	uncached := ext(extUncached, 15, one)
	sliced := s.object(slicedString, 32)
	binary.LittleEndian.PutUint32(s.b[sliced-1+12-imgBase:], 4)
	s.put(sliced-1+16, oneByte)
	s.put(sliced-1+24, smiV(4))

	n := synthNamer(t, s.b)
	h := n.procs[1].h
	for _, tc := range []struct {
		name string
		o    uint64
		want string
	}{
		{"one-byte", oneByte, "let a = 1;\nf()\n"},
		{"two-byte", twoByte, "é\nz"},
		{"sliced", sliced, "a = "},
	} {
		got, err := h.str(tc.o, maxSourceLen)
		if err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if got, err := h.str(uncached, maxSourceLen); !errors.Is(err, ErrUnreadable) {
		t.Errorf("uncached: %q, %v; want ErrUnreadable", got, err)
	}
}

// A pc in a code object the namer holds is found in its index of code
// objects, without scanning memory for the code's header again: naming a
// second pc of f's code reads less than naming it first in a fresh namer
// does. Code no longer where the index says is scanned for again.
func TestNamerFindsCodeByItsRange(t *testing.T) {
	sy := buildSynth()
	first := sy.instrs + uint64(sy.offCall) + 5
	second := sy.instrs + uint64(sy.offInner) + 4
	readsFor := func(n *Namer, pc uint64) int {
		reads := 0
		n.procs[1].h.mem = countingMem{Memory: sliceMem{base: imgBase, b: sy.img}, reads: &reads}
		if _, err := n.Frame(1, FrameCompiled, sy.sfiF, pc, false); err != nil {
			t.Fatal(err)
		}
		return reads
	}
	fresh := readsFor(synthNamer(t, sy.img), second)
	n := synthNamer(t, sy.img)
	readsFor(n, first)
	if got := readsFor(n, second); got >= fresh {
		t.Errorf("second pc of a known code object: %d reads, a fresh namer %d; want fewer", got, fresh)
	}
	if len(n.procs[1].codeStarts) != 1 || n.procs[1].codeStarts[0] != sy.istream-1 {
		t.Errorf("code index %#x, want [%#x]", n.procs[1].codeStarts, sy.istream-1)
	}
	// The index points at a start that holds no code now: the pc is
	// scanned for and named all the same, and the index corrected.
	n.procs[1].codeStarts[0] = sy.istream - 1 - 64
	n.cache.Put(entryKey{pid: 1, kind: codeEntry, addr: sy.istream - 1 - 64}, &entry{code: &codeInfo{start: sy.instrs, size: 0x100, hdr: []byte("stale")}}, minCodeCost)
	if _, err := n.Frame(1, FrameCompiled, sy.sfiF, second, false); err != nil {
		t.Errorf("after the code moved: %v", err)
	}
	if !slices.Contains(n.procs[1].codeStarts, sy.istream-1) || slices.Contains(n.procs[1].codeStarts, sy.istream-1-64) {
		t.Errorf("code index %#x after the rescan, want %#x in it and not %#x", n.procs[1].codeStarts, sy.istream-1, sy.istream-1-64)
	}
}

// goneMem is the memory of a process that has exited: every read ends at
// once (io.EOF).
type goneMem struct{}

func (goneMem) ReadAt(p []byte, a uint64) error {
	return fmt.Errorf("read %d bytes at %#x: %w", len(p), a, io.EOF)
}

// TestNamerAfterExit: once the process's memory is gone, frames are named
// from what the cache holds where the frame's own words agree with it (the
// function's bytecode, the code's function), whenever it was read; a
// frame they contradict is stale, and one never read stays unnamed.
func TestNamerAfterExit(t *testing.T) {
	sy := buildSynth()
	n := synthNamer(t, sy.img)
	pc := sy.instrs + uint64(sy.offInner) + 4
	word := uint64(uint32(54-1+sy.bcCall))<<32 | uint64(uint32(sy.bytecodeF))
	before := time.Now()
	compiled, err := n.FrameCaptured(before, 1, FrameCompiled, sy.sfiF, pc, false)
	if err != nil {
		t.Fatal(err)
	}
	interp, err := n.FrameCaptured(before, 1, FrameInterpreted, sy.sfiF, word, true)
	if err != nil {
		t.Fatal(err)
	}
	n.procs[1].h.mem = goneMem{}
	later := time.Now().Add(time.Second) // after every check: nothing reusable while alive
	if fr, err := n.FrameCaptured(later, 1, FrameCompiled, sy.sfiF, pc, false); err != nil || fmt.Sprint(fr) != fmt.Sprint(compiled) {
		t.Errorf("compiled frame after exit: %+v %v, want %+v", fr, err, compiled)
	}
	if fr, err := n.FrameCaptured(later, 1, FrameInterpreted, sy.sfiF, word, true); err != nil || fmt.Sprint(fr) != fmt.Sprint(interp) {
		t.Errorf("interpreted frame after exit: %+v %v, want %+v", fr, err, interp)
	}
	if _, err := n.FrameCaptured(later, 1, FrameCompiled, sy.sfiG, pc, false); !errors.Is(err, ErrStale) {
		t.Errorf("code of another function after exit: %v, want ErrStale", err)
	}
	if _, err := n.FrameCaptured(later, 1, FrameInterpreted, sy.sfiF, word+8, true); !errors.Is(err, ErrStale) {
		t.Errorf("another bytecode array after exit: %v, want ErrStale", err)
	}
	if _, err := n.FrameCaptured(later, 1, FrameInterpreted, sy.sfiF+0x40, word, true); err == nil {
		t.Error("a function never read was named after exit")
	}
	if st := n.Stats(); st.Gone != 2 {
		t.Errorf("stats %+v: want 2 frames named after exit", st)
	}
}
