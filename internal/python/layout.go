package python

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout is where one CPython minor version keeps what the frame walker
// follows and the namer reads. Offsets are in bytes; -1 marks a field the
// version does not have.
type Layout struct {
	Minor int // 3.Minor

	// Where the interpreters list starts: _PyRuntime.interpreters.head
	// (3.7+); 3.6 has the interp_head variable instead.
	RuntimeInterpretersHead int64
	InterpNext              int64 // PyInterpreterState.next
	InterpThreadsHead       int64 // tstate_head (..3.10) or threads.head (3.11+)

	ThreadNext     int64  // PyThreadState.next
	ThreadID       int64  // PyThreadState.thread_id: pthread_self(), the thread pointer
	ThreadFrame    int64  // frame (..3.10), cframe (3.11, 3.12), current_frame (3.13+)
	CFrameCurrent  int64  // _PyCFrame.current_frame (3.11, 3.12), else -1
	FrameBack      int64  // f_back (..3.10) or previous (3.11+)
	FrameCode      int64  // f_code or f_executable
	FrameInstr     int64  // f_lasti (int, ..3.10), prev_instr or instr_ptr (a pointer, 3.11+)
	FrameOwner     int64  // owner (3.11+), a byte
	FrameIsEntry   int64  // is_entry (3.11 only), a byte
	OwnerShimFrom  int64  // owner values >= this are the C stack's shim frames (3.12+), else -1
	ExecutableMask uint64 // f_executable is a tagged reference (3.14): mask the tag bits

	CodeFilename  int64
	CodeName      int64
	CodeQualname  int64 // 3.11+
	CodeFirstLine int64 // an int
	CodeLineTable int64 // co_lnotab (..3.9) or co_linetable (3.10+)
	CodeAdaptive  int64 // co_code_adaptive: the bytecode inside the code object (3.11+)

	ASCIISize   int64 // sizeof(PyASCIIObject): where compact ASCII data starts
	CompactSize int64 // sizeof(PyCompactUnicodeObject)
	BytesData   int64 // PyBytesObject.ob_sval
	TypeName    int64 // PyTypeObject.tp_name

	// Untested: written from the version's published sources, never run
	// against a real interpreter on this project's hosts.
	Untested bool
}

// Line-table formats by version.
const (
	tableLnotab   = iota // 3.6–3.9: co_lnotab, byte offsets
	table310             // 3.10: co_linetable, byte offsets
	tableLocation        // 3.11+: the location table, code units
)

func (l *Layout) lineTableKind() int {
	switch {
	case l.Minor <= 9:
		return tableLnotab
	case l.Minor == 10:
		return table310
	}
	return tableLocation
}

// InstrIsPointer says whether a frame's instruction is an address into the
// code object's bytecode (3.11+) rather than an index (f_lasti).
func (l *Layout) InstrIsPointer() bool { return l.Minor >= 11 }

// layouts are the versions this package knows. 3.6–3.13 were derived
// from the interpreters' DWARF and are checked against it by
// TestLayoutsMatchDWARF; 3.13 is also checked against its _Py_DebugOffsets.
var layouts = map[int]Layout{
	6: {Minor: 6, RuntimeInterpretersHead: -1, InterpNext: 0, InterpThreadsHead: 8,
		ThreadNext: 8, ThreadID: 152, ThreadFrame: 24, CFrameCurrent: -1,
		FrameBack: 24, FrameCode: 32, FrameInstr: 120, FrameOwner: -1, FrameIsEntry: -1, OwnerShimFrom: -1,
		CodeFilename: 96, CodeName: 104, CodeQualname: -1, CodeFirstLine: 36, CodeLineTable: 112, CodeAdaptive: -1,
		ASCIISize: 48, CompactSize: 72, BytesData: 32, TypeName: 24},
	7: {Minor: 7, RuntimeInterpretersHead: 24, InterpNext: 0, InterpThreadsHead: 8,
		ThreadNext: 8, ThreadID: 176, ThreadFrame: 24, CFrameCurrent: -1,
		FrameBack: 24, FrameCode: 32, FrameInstr: 104, FrameOwner: -1, FrameIsEntry: -1, OwnerShimFrom: -1,
		CodeFilename: 96, CodeName: 104, CodeQualname: -1, CodeFirstLine: 36, CodeLineTable: 112, CodeAdaptive: -1,
		ASCIISize: 48, CompactSize: 72, BytesData: 32, TypeName: 24},
	8: {Minor: 8, RuntimeInterpretersHead: 32, InterpNext: 0, InterpThreadsHead: 8,
		ThreadNext: 8, ThreadID: 176, ThreadFrame: 24, CFrameCurrent: -1,
		FrameBack: 24, FrameCode: 32, FrameInstr: 104, FrameOwner: -1, FrameIsEntry: -1, OwnerShimFrom: -1,
		CodeFilename: 104, CodeName: 112, CodeQualname: -1, CodeFirstLine: 40, CodeLineTable: 120, CodeAdaptive: -1,
		ASCIISize: 48, CompactSize: 72, BytesData: 32, TypeName: 24},
	9: {Minor: 9, RuntimeInterpretersHead: 32, InterpNext: 0, InterpThreadsHead: 8,
		ThreadNext: 8, ThreadID: 176, ThreadFrame: 24, CFrameCurrent: -1,
		FrameBack: 24, FrameCode: 32, FrameInstr: 104, FrameOwner: -1, FrameIsEntry: -1, OwnerShimFrom: -1,
		CodeFilename: 104, CodeName: 112, CodeQualname: -1, CodeFirstLine: 40, CodeLineTable: 120, CodeAdaptive: -1,
		ASCIISize: 48, CompactSize: 72, BytesData: 32, TypeName: 24},
	10: {Minor: 10, RuntimeInterpretersHead: 32, InterpNext: 0, InterpThreadsHead: 8,
		ThreadNext: 8, ThreadID: 176, ThreadFrame: 24, CFrameCurrent: -1,
		FrameBack: 24, FrameCode: 32, FrameInstr: 96, FrameOwner: -1, FrameIsEntry: -1, OwnerShimFrom: -1,
		CodeFilename: 104, CodeName: 112, CodeQualname: -1, CodeFirstLine: 40, CodeLineTable: 120, CodeAdaptive: -1,
		ASCIISize: 48, CompactSize: 72, BytesData: 32, TypeName: 24},
	11: {Minor: 11, RuntimeInterpretersHead: 40, InterpNext: 0, InterpThreadsHead: 16,
		ThreadNext: 8, ThreadID: 152, ThreadFrame: 56, CFrameCurrent: 8,
		FrameBack: 48, FrameCode: 32, FrameInstr: 56, FrameOwner: 69, FrameIsEntry: 68, OwnerShimFrom: -1,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 72, CodeLineTable: 136, CodeAdaptive: 184,
		ASCIISize: 48, CompactSize: 72, BytesData: 32, TypeName: 24},
	12: {Minor: 12, RuntimeInterpretersHead: 40, InterpNext: 0, InterpThreadsHead: 72,
		ThreadNext: 8, ThreadID: 136, ThreadFrame: 56, CFrameCurrent: 0,
		FrameBack: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 70, FrameIsEntry: -1, OwnerShimFrom: 3,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 68, CodeLineTable: 136, CodeAdaptive: 192,
		ASCIISize: 40, CompactSize: 56, BytesData: 32, TypeName: 24},
	13: {Minor: 13, RuntimeInterpretersHead: 632, InterpNext: 7264, InterpThreadsHead: 7344,
		ThreadNext: 8, ThreadID: 152, ThreadFrame: 72, CFrameCurrent: -1,
		FrameBack: 8, FrameCode: 0, FrameInstr: 56, FrameOwner: 70, FrameIsEntry: -1, OwnerShimFrom: 3,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 68, CodeLineTable: 136, CodeAdaptive: 200,
		ASCIISize: 40, CompactSize: 56, BytesData: 32, TypeName: 24},
	// 3.14 comes from its Include/internal/pycore_debug_offsets.h and
	// pycore_interpframe_structs.h: owner 3 is FRAME_OWNED_BY_INTERPRETER
	// and 4 FRAME_OWNED_BY_CSTACK, both shims; f_executable is a
	// _PyStackRef whose low bits are tags. Its process-specific offsets
	// come from the process's own _Py_DebugOffsets (see debugOffsets); the
	// entry holds only what those do not say.
	14: {Minor: 14, RuntimeInterpretersHead: -1, InterpNext: -1, InterpThreadsHead: -1,
		ThreadNext: -1, ThreadID: -1, ThreadFrame: -1, CFrameCurrent: -1,
		FrameBack: -1, FrameCode: -1, FrameInstr: -1, FrameOwner: -1, FrameIsEntry: -1, OwnerShimFrom: 3,
		ExecutableMask: 3,
		CodeFilename:   -1, CodeName: -1, CodeQualname: -1, CodeFirstLine: -1, CodeLineTable: -1, CodeAdaptive: -1,
		ASCIISize: -1, CompactSize: -1, BytesData: -1, TypeName: -1, Untested: true},
}

// ErrUnknownVersion is matched by the error for an interpreter whose
// version has no layout: its processes keep native stacks.
var ErrUnknownVersion = errors.New("unsupported python version")

// LayoutFor returns the table's layout of 3.minor.
func LayoutFor(minor int) (Layout, error) {
	l, ok := layouts[minor]
	if !ok {
		return Layout{}, fmt.Errorf("python 3.%d: %w", minor, ErrUnknownVersion)
	}
	return l, nil
}

// debugCookie starts _Py_DebugOffsets, the first member of _PyRuntime
// from 3.13 on.
const debugCookie = "xdebugpy"

// debugOffsetsSize is how much of _PyRuntime parseDebugOffsets reads.
const debugOffsetsSize = 8 * 96

// Indexes of the 8-byte words parseDebugOffsets uses, per version of the
// _Py_DebugOffsets layout (word 0 is the cookie, 1 the version).
type debugWords struct {
	interpretersHead, interpNext, threadsHead                      int
	threadNext, currentFrame, threadID                             int
	previous, executable, instrPtr, owner                          int
	filename, name, qualname, linetable, firstlineno, codeAdaptive int
	tpName, asciiSize, bytesSval                                   int
}

// 3.13: cookie, version, free_threaded, runtime_state{size, finalizing,
// interpreters_head}, interpreter_state{size, id, next, threads_head, +9},
// thread_state{size, prev, next, interp, current_frame, thread_id, +3},
// interpreter_frame{size, previous, executable, instr_ptr, localsplus,
// owner}, code_object{size, filename, name, qualname, linetable,
// firstlineno, +3, co_code_adaptive}, pyobject{2}, type_object{size,
// tp_name, +2}, tuple{3}, list{3}, dict{3}, float{2}, long{3},
// bytes{size, ob_size, ob_sval}, unicode{size, state, length,
// asciiobject_size}.
var debugWords313 = debugWords{
	interpretersHead: 5, interpNext: 8, threadsHead: 9,
	threadNext: 21, currentFrame: 23, threadID: 24,
	previous: 29, executable: 30, instrPtr: 31, owner: 33,
	filename: 35, name: 36, qualname: 37, linetable: 38, firstlineno: 39, codeAdaptive: 43,
	tpName: 47, asciiSize: 70, bytesSval: 66,
}

// 3.14 adds interpreter_state.threads_main, code_object_generation and
// tlbc_generation, interpreter_frame.stackpointer and tlbc_index,
// code_object.co_tlbc and a set_object before dict_object.
var debugWords314 = debugWords{
	interpretersHead: 5, interpNext: 8, threadsHead: 9,
	threadNext: 24, currentFrame: 26, threadID: 27,
	previous: 32, executable: 33, instrPtr: 34, owner: 36,
	filename: 40, name: 41, qualname: 42, linetable: 43, firstlineno: 44, codeAdaptive: 48,
	tpName: 53, asciiSize: 80, bytesSval: 76,
}

// errDebugOffsets is wrapped by parseDebugOffsets's errors.
var errDebugOffsets = errors.New("bad _Py_DebugOffsets")

// parseDebugOffsets reads the layout from the start of a 3.13+
// _PyRuntime (b, at least debugOffsetsSize bytes). Values not in
// _Py_DebugOffsets come from base, the table's entry for the version.
func parseDebugOffsets(b []byte, base Layout) (Layout, error) {
	if len(b) < debugOffsetsSize {
		return Layout{}, fmt.Errorf("%w: %d bytes", errDebugOffsets, len(b))
	}
	if string(b[:8]) != debugCookie {
		return Layout{}, fmt.Errorf("%w: no cookie", errDebugOffsets)
	}
	hex := binary.LittleEndian.Uint64(b[8:])
	major, minor := hex>>24&0xff, int(hex>>16&0xff)
	if major != 3 || minor != base.Minor {
		return Layout{}, fmt.Errorf("%w: version %#x in a 3.%d interpreter", errDebugOffsets, hex, base.Minor)
	}
	if ft := binary.LittleEndian.Uint64(b[16:]); ft != 0 {
		return Layout{}, fmt.Errorf("%w: free-threaded build: %w", errDebugOffsets, ErrUnknownVersion)
	}
	var w debugWords
	switch minor {
	case 13:
		w = debugWords313
	case 14:
		w = debugWords314
	default:
		return Layout{}, fmt.Errorf("%w: layout of 3.%d: %w", errDebugOffsets, minor, ErrUnknownVersion)
	}
	word := func(i int) int64 {
		v := binary.LittleEndian.Uint64(b[8*i:])
		if v > 1<<20 {
			return -2 // flagged below
		}
		return int64(v)
	}
	l := base
	for _, f := range []struct {
		dst *int64
		i   int
	}{
		{&l.RuntimeInterpretersHead, w.interpretersHead}, {&l.InterpNext, w.interpNext},
		{&l.InterpThreadsHead, w.threadsHead}, {&l.ThreadNext, w.threadNext},
		{&l.ThreadFrame, w.currentFrame}, {&l.ThreadID, w.threadID},
		{&l.FrameBack, w.previous}, {&l.FrameCode, w.executable}, {&l.FrameInstr, w.instrPtr},
		{&l.FrameOwner, w.owner}, {&l.CodeFilename, w.filename}, {&l.CodeName, w.name},
		{&l.CodeQualname, w.qualname}, {&l.CodeLineTable, w.linetable},
		{&l.CodeFirstLine, w.firstlineno}, {&l.CodeAdaptive, w.codeAdaptive},
		{&l.TypeName, w.tpName}, {&l.ASCIISize, w.asciiSize}, {&l.BytesData, w.bytesSval},
	} {
		v := word(f.i)
		if v < 0 {
			return Layout{}, fmt.Errorf("%w: word %d out of range", errDebugOffsets, f.i)
		}
		*f.dst = v
	}
	// PyCompactUnicodeObject adds utf8_length and utf8 to PyASCIIObject.
	l.CompactSize = l.ASCIISize + 16
	l.CFrameCurrent = -1
	l.FrameIsEntry = -1
	return l, nil
}
