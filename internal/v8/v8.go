package v8

import (
	"errors"

	"github.com/sonde-dev/sonde/internal/symbolize"
)

// ErrNotV8 is matched when a process maps no file exporting V8's
// post-mortem metadata (the v8dbg_* symbols).
var ErrNotV8 = errors.New("not v8")

// ErrUnknownVersion is matched when a V8's metadata lacks a constant naming
// needs and no table here supplies it: its layout is not supported.
var ErrUnknownVersion = errors.New("v8 layout not supported")

// ErrStale is matched when a frame's function or code no longer holds
// what the sample saw (moved by the garbage collector, freed, reused,
// deoptimized): naming it would lie.
var ErrStale = errors.New("v8 frame stale")

// ErrUnreadable is matched when a frame's memory cannot be read or is
// inconsistent.
var ErrUnreadable = errors.New("v8 frame unreadable")

// Memory reads another process's memory. ReadAt fills all of p or fails.
type Memory interface {
	ReadAt(p []byte, addr uint64) error
}

// VM is a V8 found in a process.
type VM struct {
	V8      string // "11.3.244.8"
	V8Major int    // 11
	V8Minor int    // 3
	Node    string // "v20.20.2" where the binary says so, else ""
	// NodeMajor is Node's major (20), from Node or from the V8 version.
	NodeMajor int
	Untested  bool   // a V8 the tests here do not run
	Kernel    Kernel // what the eBPF walker needs

	// File is the binary (or library) exporting the metadata, as the
	// agent opened it.
	File string
	l    *layout
	// builtins are the embedded builtins by address, for naming frames
	// of builtin code.
	builtins *builtinTable
	// bytecodeSizes are Ignition's bytecode sizes (3 rows: operand
	// scales 1, 2, 4), to step through bytecodes; nil if the binary has
	// no symbol for them.
	bytecodeSizes []byte
	// builtinOffs are the offsets in the builtins of each
	// Kernel.Builtins range's start.
	builtinOffs []uint64
}

// Kernel is the eBPF walker's view of one V8 process: everything it needs
// to walk JavaScript frames on x86-64 and report them. Addresses are the
// process's; offsets are in bytes.
//
// # Which code is V8's
//
// A PC is V8 code when it lies in one of Builtins (the embedded builtins,
// in the binary's text or its second mapping) or in executable memory
// that no file backs (V8's code space: anonymous r-x or rwx mappings; Node
// runs no other JIT). Everything else is native code for the native
// unwinder.
//
// # The frame walk
//
// V8 keeps a frame pointer in all its code (builtins, interpreter,
// Sparkplug, Maglev, TurboFan), so the walker follows rbp. It starts with
// the (pc, fp) of the first frame in V8 code: at the leaf, the sampled rip
// and rbp; after the native unwinder, the return address and frame
// pointer where it reached V8 code. For each frame, while fp is not 0,
// 8-aligned, and above the previous fp (at most MaxFrames frames):
//
//  0. At the leaf only, with pc in the code space (not Builtins): read the
//     16 bytes of code at pc-8 (a third read). Maglev and TurboFan code
//     starts by building its frame: push rbp (55), mov rbp, rsp (48 89
//     e5), push rsi (the context), push rdi (the function). A pc at the
//     push rbp (those four bytes at pc) or just after it (at pc-1) has
//     not made fp its own yet: the frame at fp is the caller's, and the
//     return address into it is the u64 at sp (at sp+8 after the push).
//     Emit FrameCompiled with addr = 0 (the function is the code's own),
//     word = pc; then read that return address (a fourth read) and go on
//     at step 1 with it as the pc of a caller, fp unchanged. A pc just
//     after the mov (the bytes at pc-4), or after the push rsi (at pc-5,
//     56 at pc-1), has fp set but the function slot not yet written: emit
//     the same frame, and go on at step 5 with the u64s at fp and fp+8
//     (read as one, the fourth read).
//  1. Read one block of FrameReadSize bytes at fp+FrameReadStart (one
//     read): slot(o) is the u64 at fp+o. slot(0) is the caller's fp,
//     slot(8) the return address into the caller.
//  2. marker := slot(FPMarker). If marker&SmiTagMask == 0 the frame is a
//     typed frame (entry, exit, stub, internal, construct, ...): emit
//     FrameStub with addr = pc, word = marker >> MarkerShift (the frame
//     type, named in user space from the v8dbg_frametype_* constants). If
//     that type is EntryFrame or ConstructEntryFrame (EntryTypes), native
//     C++ called into JavaScript here: emit the frame, then hand back to
//     the native unwinder with pc = slot(8), sp = fp+16, rbp = slot(0)
//     (JSEntry saved the caller's rbp at fp). Otherwise go on at step 5.
//  3. Otherwise (marker is a tagged context) the frame is a JavaScript
//     frame: fn := slot(FPFunction); fn&HeapObjectTagMask must equal
//     HeapObjectTag, else stop (count: not a JS frame). sfi := the u64 at
//     fn - HeapObjectTag + JSFunctionShared (the second read), the
//     function's SharedFunctionInfo, tagged. Its low bits must be
//     HeapObjectTag too, else stop.
//  4. Classify by pc:
//     - pc in one of Builtins, slot(FPBytecodeOffset) a Smi
//     (its low SmiShift bits 0) and slot(FPBytecodeArray) tagged: an
//     interpreted (Ignition) frame. Emit FrameInterpreted with addr =
//     sfi, word = uint64(uint32(slot(FPBytecodeOffset) >> SmiShift)) << 32
//     | uint64(uint32(slot(FPBytecodeArray))): the raw offset slot (the
//     bytecode offset plus the bytecode array's header, less the tag) and
//     the low half of the BytecodeArray pointer the frame holds.
//     - pc in one of Builtins otherwise, at the leaf (the first frame),
//     with the u64 at sp (a third read) in V8's code space: a builtin that
//     builds no frame (an arithmetic or property stub Sparkplug, Maglev
//     or TurboFan code calls), called by the frame's compiled code, whose
//     return address is on top of the stack. Emit FrameStub with addr =
//     pc, word = 0 (no frame type: the builtin is named by its pc), then
//     FrameCompiled with addr = sfi, word = that return address (a return
//     address).
//     - pc in one of Builtins otherwise: a builtin with JavaScript
//     linkage (Array.prototype.map, ...), or a frameless builtin whose
//     caller is not found. Emit FrameBuiltin with addr = sfi, word = pc.
//     - pc elsewhere (V8's code space): Sparkplug, Maglev or TurboFan code
//     (OSR code included). Emit FrameCompiled with addr = sfi, word = pc.
//     User space finds the code holding pc and checks that it belongs to
//     sfi; the tier comes from the code.
//  5. pc = slot(8), fp = slot(0); the frame is a caller now (user space is
//     told its pc is a return address). A caller pc that is not V8 code
//     (see above) ends the V8 walk: hand back to the native unwinder with
//     that pc, sp = the old fp+16 and rbp = slot(0) (count it; V8 enters
//     and leaves C++ through entry and exit frames, so this is a walk that
//     went wrong).
//
// That is two reads per JavaScript frame and one per typed frame (three
// at the leaf of a frameless builtin); reasons to stop early (a failed
// read, a slot that is not what it must be, MaxFrames, a pc that is not
// V8 code) are counted each. At the leaf, a pc in a builtin that builds
// no frame (most bytecode handlers, some stubs) leaves rbp at its
// caller's frame: the walk reports that frame with the leaf pc, which is
// right for interpreted frames (the handler runs the frame's bytecode);
// for a compiled caller the return address at sp gives its pc (above),
// unless the builtin pushed something first (then FrameBuiltin: function
// known, line unknown).
//
// Every frame the walker reports as JavaScript names a function that ran
// at the sample: the SharedFunctionInfo is read at the sample from the
// frame's own JSFunction. User space checks what it reads later against
// the sample (the object's map, the bytecode array's low half, the code's
// owner) and reports ErrStale rather than a wrong name.
type Kernel struct {
	// Builtins are where the embedded builtins (the Builtins_* functions
	// of the binary's text) run: the binary's own mapping and, where V8
	// maps the same file pages again next to its code space for short
	// builtin calls (seen on Node 20 to 26, depending on where the code
	// range lands), that mapping too (at most MaxBuiltinRanges). Find sees
	// the second mapping once it exists (V8 makes it when it sets up its
	// first isolate): the caller looks again when a process's file
	// mappings change.
	Builtins []Range
	// FrameReadStart and FrameReadSize are the block read per frame:
	// [fp+FrameReadStart, fp+FrameReadStart+FrameReadSize), covering every
	// slot below and the caller's fp and return address (fp+0, fp+8).
	FrameReadStart int16
	FrameReadSize  uint16
	// Frame slots, from fp (v8dbg_off_fp_*): the context or frame type
	// marker, the JSFunction, the BytecodeArray and the bytecode offset
	// (a Smi) of interpreted frames.
	FPMarker, FPFunction, FPBytecodeArray, FPBytecodeOffset int16
	// JSFunctionShared is the offset of JSFunction's SharedFunctionInfo
	// field (v8dbg_class_JSFunction__shared__SharedFunctionInfo).
	JSFunctionShared uint16
	// HeapObjectTag and HeapObjectTagMask: a tagged pointer p has
	// p&HeapObjectTagMask == HeapObjectTag; the object starts at
	// p-HeapObjectTag (v8dbg_HeapObjectTag, v8dbg_HeapObjectTagMask).
	HeapObjectTag, HeapObjectTagMask uint8
	// SmiTagMask: a word w is a Smi (or a frame type marker) when
	// w&SmiTagMask == 0 (v8dbg_SmiTagMask).
	SmiTagMask uint8
	// SmiShift is how far a Smi's value is shifted: 32 where pointers are
	// not compressed (v8dbg_SmiShiftSize + 1); its low SmiShift bits are 0.
	SmiShift uint8
	// MarkerShift: a typed frame's marker is its type << MarkerShift.
	MarkerShift uint8
	// EntryTypes are the frame types (after MarkerShift) of the entry
	// frames, where C++ called into JavaScript (v8dbg_frametype_EntryFrame,
	// v8dbg_frametype_ConstructEntryFrame).
	EntryTypes [2]uint8
}

// Range is [Start, End) of process addresses.
type Range struct{ Start, End uint64 }

// MaxBuiltinRanges bounds Kernel.Builtins.
const MaxBuiltinRanges = 4

// InBuiltins says whether pc is in the embedded builtins.
func (k *Kernel) InBuiltins(pc uint64) bool {
	for _, r := range k.Builtins {
		if pc >= r.Start && pc < r.End {
			return true
		}
	}
	return false
}

// MaxFrames bounds the JavaScript frames the reference walker (and the
// eBPF walker it specifies) follows in one stack.
const MaxFrames = 128

// FrameKind is how the walker reported a V8 frame.
type FrameKind uint8

const (
	// FrameInterpreted is an Ignition frame (pc in the embedded builtins,
	// with a Smi bytecode offset slot): addr is the tagged
	// SharedFunctionInfo read from the frame's JSFunction; word is
	// uint64(offsetSlot)<<32 | uint64(uint32(bytecodeArray)), offsetSlot
	// the value of the frame's bytecode offset Smi (the offset from the
	// tagged BytecodeArray pointer: header size - tag + bytecode offset),
	// bytecodeArray the frame's BytecodeArray slot.
	FrameInterpreted FrameKind = 1
	// FrameCompiled is a frame of code in V8's code space (Sparkplug,
	// Maglev, TurboFan, OSR code): addr is the tagged SharedFunctionInfo
	// read from the frame's JSFunction, word the frame's pc. addr 0 is a
	// leaf in the prologue of its code, before the frame holds the
	// function: the function is the code's own.
	FrameCompiled FrameKind = 2
	// FrameBuiltin is a frame with a JSFunction whose pc is in the
	// embedded builtins but that is not interpreted (a builtin with
	// JavaScript linkage): addr is the tagged SharedFunctionInfo, word the
	// pc.
	FrameBuiltin FrameKind = 3
	// FrameStub is a typed frame (entry, exit, stub, construct, ...):
	// addr is the frame's pc, word its frame type (the marker >>
	// MarkerShift); word 0 is a builtin at the leaf without a frame of its
	// own.
	FrameStub FrameKind = 4
)

// Tiers: how a frame ran (the location attribute sonde.frame.tier).
const (
	TierInterpreted = "interpreted" // Ignition
	TierBaseline    = "baseline"    // Sparkplug
	TierMaglev      = "maglev"
	TierTurbofan    = "turbofan"
	TierBuiltin     = "builtin" // embedded builtin code with JavaScript linkage
	TierStub        = "stub"    // a typed frame: entry, exit, stub, ...
)

// Frame is a named V8 frame.
type Frame struct {
	// Lines are innermost first: the functions inlined at the pc, then
	// the function whose frame it is.
	Lines []symbolize.Line
	Tier  string
}
