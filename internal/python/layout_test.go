package python

import (
	"debug/elf"
	"errors"
	"testing"
)

// TestLayoutsMatchDWARF checks every table entry against the struct
// layouts in the interpreter's own DWARF.
func TestLayoutsMatchDWARF(t *testing.T) {
	for _, in := range installedInterpreters(t) {
		if in.lib == "" {
			continue
		}
		t.Run(in.version, func(t *testing.T) {
			d := openDWARF(t, in.lib)
			l, err := LayoutFor(in.minor)
			if err != nil {
				t.Fatal(err)
			}
			threads, frame, back, code, instr := "tstate_head", "frame", "f_back", "f_code", "f_lasti"
			frameType, lineTable := "PyFrameObject", "co_lnotab"
			if in.minor >= 10 {
				lineTable = "co_linetable"
			}
			if in.minor >= 11 {
				threads, frame, back, code, instr = "threads.head", "cframe", "previous", "f_code", "prev_instr"
				frameType = "_PyInterpreterFrame"
			}
			if in.minor >= 13 {
				frame, code, instr = "current_frame", "f_executable", "instr_ptr"
			}
			checks := []struct {
				name      string
				got, want int64
			}{
				{"interpreters.head", l.RuntimeInterpretersHead, d.offset("_PyRuntimeState", "interpreters.head")},
				{"interp.next", l.InterpNext, d.offset("PyInterpreterState", "next")},
				{"interp." + threads, l.InterpThreadsHead, d.offset("PyInterpreterState", threads)},
				{"tstate.next", l.ThreadNext, d.offset("PyThreadState", "next")},
				{"tstate.thread_id", l.ThreadID, d.offset("PyThreadState", "thread_id")},
				{"tstate." + frame, l.ThreadFrame, d.offset("PyThreadState", frame)},
				{"cframe.current_frame", l.CFrameCurrent, d.offset("_PyCFrame", "current_frame")},
				{"frame." + back, l.FrameBack, d.offset(frameType, back)},
				{"frame." + code, l.FrameCode, d.offset(frameType, code)},
				{"frame." + instr, l.FrameInstr, d.offset(frameType, instr)},
				{"frame.owner", l.FrameOwner, d.offset("_PyInterpreterFrame", "owner")},
				{"frame.is_entry", l.FrameIsEntry, d.offset("_PyInterpreterFrame", "is_entry")},
				{"code.co_filename", l.CodeFilename, d.offset("PyCodeObject", "co_filename")},
				{"code.co_name", l.CodeName, d.offset("PyCodeObject", "co_name")},
				{"code.co_qualname", l.CodeQualname, d.offset("PyCodeObject", "co_qualname")},
				{"code.co_firstlineno", l.CodeFirstLine, d.offset("PyCodeObject", "co_firstlineno")},
				{"code." + lineTable, l.CodeLineTable, d.offset("PyCodeObject", lineTable)},
				{"code.co_code_adaptive", l.CodeAdaptive, d.offset("PyCodeObject", "co_code_adaptive")},
				{"sizeof(PyASCIIObject)", l.ASCIISize, d.size("PyASCIIObject")},
				{"sizeof(PyCompactUnicodeObject)", l.CompactSize, d.size("PyCompactUnicodeObject")},
				{"bytes.ob_sval", l.BytesData, d.offset("PyBytesObject", "ob_sval")},
				{"type.tp_name", l.TypeName, d.offset("PyTypeObject", "tp_name")},
			}
			if in.minor == 6 {
				checks[0].want = -1 // no _PyRuntime: interp_head
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s: table %d, DWARF %d", c.name, c.got, c.want)
				}
			}
		})
	}
}

// runtimeBytes returns the initial bytes of _PyRuntime from the file.
func runtimeBytes(t *testing.T, path string) []byte {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rt, ok := symbols(f, "_PyRuntime")["_PyRuntime"]
	if !ok {
		t.Fatalf("%s: no _PyRuntime", path)
	}
	for _, ph := range f.Progs {
		if ph.Type == elf.PT_LOAD && rt.Value >= ph.Vaddr && rt.Value+debugOffsetsSize <= ph.Vaddr+ph.Filesz {
			b := make([]byte, debugOffsetsSize)
			if _, err := ph.ReadAt(b, int64(rt.Value-ph.Vaddr)); err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("%s: _PyRuntime not in a loaded segment", path)
	return nil
}

// TestDebugOffsetsMatchTable reads 3.13's own _Py_DebugOffsets (from the
// file's initialized _PyRuntime) and requires the table's entry.
func TestDebugOffsetsMatchTable(t *testing.T) {
	for _, in := range installedInterpreters(t) {
		if in.minor < 13 || in.lib == "" {
			continue
		}
		t.Run(in.version, func(t *testing.T) {
			want, _ := LayoutFor(in.minor)
			empty := Layout{Minor: in.minor, OwnerShimFrom: want.OwnerShimFrom, ExecutableMask: want.ExecutableMask}
			got, err := parseDebugOffsets(runtimeBytes(t, in.lib), empty)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("from _Py_DebugOffsets:\n%+v\ntable:\n%+v", got, want)
			}
		})
	}
}

func TestParseDebugOffsetsRejects(t *testing.T) {
	good := func() []byte {
		b := make([]byte, debugOffsetsSize)
		copy(b, debugCookie)
		b[8+2] = 13 // 0x030d0000
		b[8+3] = 3
		return b
	}
	base, _ := LayoutFor(13)
	tests := []struct {
		name  string
		edit  func([]byte) []byte
		isErr error
	}{
		{"short", func(b []byte) []byte { return b[:100] }, errDebugOffsets},
		{"no cookie", func(b []byte) []byte { b[0] = 'y'; return b }, errDebugOffsets},
		{"other version", func(b []byte) []byte { b[8+2] = 12; return b }, errDebugOffsets},
		{"free-threaded", func(b []byte) []byte { b[16] = 1; return b }, ErrUnknownVersion},
		{"offset out of range", func(b []byte) []byte { b[8*23+3] = 1; return b }, errDebugOffsets},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseDebugOffsets(tc.edit(good()), base); !errors.Is(err, tc.isErr) {
				t.Fatalf("err %v, want %v", err, tc.isErr)
			}
		})
	}
	if _, err := parseDebugOffsets(good(), base); err != nil {
		t.Fatalf("zero offsets with a cookie: %v", err)
	}
}

func TestLayoutForUnknown(t *testing.T) {
	for _, minor := range []int{5, 15} {
		if _, err := LayoutFor(minor); !errors.Is(err, ErrUnknownVersion) {
			t.Errorf("3.%d: %v, want ErrUnknownVersion", minor, err)
		}
	}
	l, err := LayoutFor(14)
	if err != nil || !l.Untested {
		t.Errorf("3.14: %+v, %v: want an entry marked untested", l, err)
	}
}
