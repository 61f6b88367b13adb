package python

import (
	"debug/dwarf"
	"debug/elf"
	"fmt"
	"strings"
	"testing"
)

// dwarfLayouts reads struct layouts from an interpreter's own DWARF (pyenv
// builds keep it), the oracle the layout table is checked against.
type dwarfLayouts struct {
	d     *dwarf.Data
	types map[string][]dwarf.Offset // typedef or struct name -> entries (some incomplete)
}

func openDWARF(t testing.TB, path string) *dwarfLayouts {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	d, err := f.DWARF()
	if err != nil {
		t.Fatalf("dwarf of %s: %v", path, err)
	}
	l := &dwarfLayouts{d: d, types: make(map[string][]dwarf.Offset)}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			t.Fatalf("read dwarf of %s: %v", path, err)
		}
		if e == nil {
			break
		}
		switch e.Tag {
		case dwarf.TagTypedef, dwarf.TagStructType:
			name, _ := e.Val(dwarf.AttrName).(string)
			if name == "" {
				continue
			}
			if e.Tag == dwarf.TagStructType {
				if decl, _ := e.Val(dwarf.AttrDeclaration).(bool); decl {
					continue
				}
				name = "struct " + name
			}
			if len(l.types[name]) < 64 {
				l.types[name] = append(l.types[name], e.Offset)
			}
		}
		if e.Tag != dwarf.TagCompileUnit {
			r.SkipChildren()
		}
	}
	return l
}

// offset returns the byte offset of a dotted member path in a type, or -1
// when the type or a member does not exist.
func (l *dwarfLayouts) offset(typ, path string) int64 {
	ty := l.complete(typ)
	if ty == nil {
		return -1
	}
	total := int64(0)
	for _, part := range strings.Split(path, ".") {
		st := structOf(ty)
		if st == nil {
			return -1
		}
		found := false
		for _, f := range st.Field {
			if f.Name == part {
				total += f.ByteOffset
				ty = f.Type
				found = true
				break
			}
		}
		if !found {
			return -1
		}
	}
	return total
}

func (l *dwarfLayouts) size(typ string) int64 {
	ty := l.complete(typ)
	if ty == nil {
		return -1
	}
	return ty.Size()
}

// complete returns the first complete definition of typ.
func (l *dwarfLayouts) complete(typ string) dwarf.Type {
	for _, off := range l.types[typ] {
		ty, err := l.d.Type(off)
		if err == nil && structOf(ty) != nil {
			return ty
		}
	}
	return nil
}

func structOf(ty dwarf.Type) *dwarf.StructType {
	for {
		switch t := ty.(type) {
		case *dwarf.TypedefType:
			ty = t.Type
		case *dwarf.QualType:
			ty = t.Type
		case *dwarf.StructType:
			if t.Incomplete {
				return nil
			}
			return t
		default:
			return nil
		}
	}
}

func (l *dwarfLayouts) dump() string {
	var b strings.Builder
	q := func(typ string, paths ...string) {
		for _, p := range paths {
			fmt.Fprintf(&b, "%s.%s=%d ", typ, p, l.offset(typ, p))
		}
		b.WriteString("\n")
	}
	q("_PyRuntimeState", "interpreters.head", "gilstate.tstate_current", "gilstate.autoTSSkey")
	q("PyInterpreterState", "next", "tstate_head", "threads.head")
	q("PyThreadState", "next", "interp", "frame", "cframe", "current_frame", "thread_id", "native_thread_id")
	q("_PyCFrame", "current_frame")
	q("PyFrameObject", "f_back", "f_code", "f_lasti")
	q("_PyInterpreterFrame", "previous", "f_code", "f_executable", "prev_instr", "instr_ptr", "owner", "is_entry")
	q("PyCodeObject", "co_filename", "co_name", "co_qualname", "co_firstlineno", "co_lnotab", "co_linetable", "co_code_adaptive", "co_code")
	q("PyTypeObject", "tp_name")
	fmt.Fprintf(&b, "ascii=%d compact=%d bytes.ob_sval=%d\n", l.size("PyASCIIObject"), l.size("PyCompactUnicodeObject"), l.offset("PyBytesObject", "ob_sval"))
	return b.String()
}

func TestDumpDWARFLayouts(t *testing.T) {
	if !*dumpLayouts {
		t.Skip("run with -dump-layouts to print the installed interpreters' layouts")
	}
	for _, in := range installedInterpreters(t) {
		if in.lib == "" {
			continue
		}
		t.Logf("%s\n%s", in.version, openDWARF(t, in.lib).dump())
	}
}
