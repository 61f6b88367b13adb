package jvm

import (
	"encoding/binary"
	"fmt"
)

// Bounds of the vmStructs tables: HotSpot exports a few thousand entries.
const (
	maxEntries   = 20000
	maxNameBytes = 256
	maxStride    = 256
)

// tableLayout is where an entry's fields are, as the JVM's
// gHotSpotVM*Offset and *ArrayStride symbols say.
type tableLayout struct {
	stride uint64
	// structs: typeName, fieldName, typeString, isStatic, offset, address
	// types: typeName, superclassName, size
	// constants: name, value
	off []uint64
}

// field is one gHotSpotVMStructs entry.
type field struct {
	typ     string // the field's C++ type, "int", "address", "CodeHeap*"
	static  bool
	offset  uint64 // non-static: offset in the object
	address uint64 // static: the variable's address
}

// tables is what the JVM exports about its structures.
type tables struct {
	fields    map[string]field  // "Class::_field"
	sizes     map[string]uint64 // type name -> sizeof
	ints      map[string]int64
	longs     map[string]uint64
	entryRead int
}

// pageReader reads a process's memory a page at a time, keeping the pages:
// the tables' strings lie together in a few pages of .rodata.
type pageReader struct {
	mem   Memory
	pages map[uint64][]byte
	reads int
}

const pageSize = 4096

func (r *pageReader) page(addr uint64) ([]byte, error) {
	base := addr &^ (pageSize - 1)
	if p, ok := r.pages[base]; ok {
		return p, nil
	}
	if len(r.pages) > 4096 {
		return nil, fmt.Errorf("read %#x: too many pages", addr)
	}
	p := make([]byte, pageSize)
	if err := r.mem.ReadAt(p, base); err != nil {
		return nil, err
	}
	r.reads++
	r.pages[base] = p
	return p, nil
}

func (r *pageReader) read(b []byte, addr uint64) error {
	for len(b) > 0 {
		p, err := r.page(addr)
		if err != nil {
			return err
		}
		n := copy(b, p[addr&(pageSize-1):])
		b, addr = b[n:], addr+uint64(n)
	}
	return nil
}

func (r *pageReader) u64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := r.read(b[:], addr); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// cstring reads a NUL-terminated string of at most maxNameBytes.
func (r *pageReader) cstring(addr uint64) (string, error) {
	var out []byte
	for len(out) < maxNameBytes {
		p, err := r.page(addr)
		if err != nil {
			return "", err
		}
		rest := p[addr&(pageSize-1):]
		for i, c := range rest {
			if c == 0 {
				return string(append(out, rest[:i]...)), nil
			}
			if len(out)+i >= maxNameBytes {
				break
			}
		}
		out = append(out, rest...)
		addr += uint64(len(rest))
	}
	return "", fmt.Errorf("string at %#x: longer than %d bytes", addr, maxNameBytes)
}

// symAddrs are the addresses of the gHotSpot* variables in the process.
type symAddrs map[string]uint64

// readTables reads the four tables. syms holds the process addresses of
// the gHotSpot* symbols.
func readTables(mem Memory, syms symAddrs) (*tables, error) {
	r := &pageReader{mem: mem, pages: map[uint64][]byte{}}
	t := &tables{fields: map[string]field{}, sizes: map[string]uint64{}, ints: map[string]int64{}, longs: map[string]uint64{}}
	get := func(names ...string) (tableLayout, uint64, error) {
		var tl tableLayout
		vals := make([]uint64, len(names))
		for i, n := range names {
			a, ok := syms[n]
			if !ok {
				return tl, 0, fmt.Errorf("no symbol %s: %w", n, ErrUnknownVersion)
			}
			v, err := r.u64(a)
			if err != nil {
				return tl, 0, fmt.Errorf("symbol %s: %w", n, err)
			}
			vals[i] = v
		}
		// vals[0]: the table's address, vals[1]: its stride, then offsets.
		tl.stride = vals[1]
		tl.off = vals[2:]
		if tl.stride == 0 {
			// Set by libjvm's static initializers, which have not run yet.
			return tl, 0, fmt.Errorf("%s: stride 0: %w", names[1], ErrNotReady)
		}
		if tl.stride > maxStride {
			return tl, 0, fmt.Errorf("%s: stride %d: %w", names[1], tl.stride, ErrUnknownVersion)
		}
		for i, o := range tl.off {
			if o+8 > tl.stride {
				return tl, 0, fmt.Errorf("%s: offset %d beyond stride %d: %w", names[2+i], o, tl.stride, ErrUnknownVersion)
			}
		}
		return tl, vals[0], nil
	}
	entries := func(tl tableLayout, base uint64, each func(e []byte) (bool, error)) error {
		e := make([]byte, tl.stride)
		for i := 0; ; i++ {
			if i >= maxEntries {
				return fmt.Errorf("table at %#x: more than %d entries", base, maxEntries)
			}
			if err := r.read(e, base+uint64(i)*tl.stride); err != nil {
				return err
			}
			more, err := each(e)
			if err != nil || !more {
				return err
			}
			t.entryRead++
		}
	}
	word := func(e []byte, off uint64) uint64 { return binary.LittleEndian.Uint64(e[off:]) }
	str := func(e []byte, off uint64) (string, error) {
		a := word(e, off)
		if a == 0 {
			return "", nil
		}
		return r.cstring(a)
	}

	tl, base, err := get("gHotSpotVMStructs", "gHotSpotVMStructEntryArrayStride",
		"gHotSpotVMStructEntryTypeNameOffset", "gHotSpotVMStructEntryFieldNameOffset",
		"gHotSpotVMStructEntryTypeStringOffset", "gHotSpotVMStructEntryIsStaticOffset",
		"gHotSpotVMStructEntryOffsetOffset", "gHotSpotVMStructEntryAddressOffset")
	if err != nil {
		return nil, err
	}
	err = entries(tl, base, func(e []byte) (bool, error) {
		if word(e, tl.off[0]) == 0 {
			return false, nil
		}
		typeName, err := str(e, tl.off[0])
		if err != nil {
			return false, err
		}
		fieldName, err := str(e, tl.off[1])
		if err != nil {
			return false, err
		}
		typ, err := str(e, tl.off[2])
		if err != nil {
			return false, err
		}
		t.fields[typeName+"::"+fieldName] = field{
			typ:     typ,
			static:  binary.LittleEndian.Uint32(e[tl.off[3]:]) != 0,
			offset:  word(e, tl.off[4]),
			address: word(e, tl.off[5]),
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("vm structs: %w", err)
	}

	tl, base, err = get("gHotSpotVMTypes", "gHotSpotVMTypeEntryArrayStride",
		"gHotSpotVMTypeEntryTypeNameOffset", "gHotSpotVMTypeEntrySizeOffset")
	if err != nil {
		return nil, err
	}
	err = entries(tl, base, func(e []byte) (bool, error) {
		if word(e, tl.off[0]) == 0 {
			return false, nil
		}
		name, err := str(e, tl.off[0])
		if err != nil {
			return false, err
		}
		t.sizes[name] = word(e, tl.off[1])
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("vm types: %w", err)
	}

	for _, c := range []struct {
		names []string
		long  bool
	}{
		{[]string{"gHotSpotVMIntConstants", "gHotSpotVMIntConstantEntryArrayStride", "gHotSpotVMIntConstantEntryNameOffset", "gHotSpotVMIntConstantEntryValueOffset"}, false},
		{[]string{"gHotSpotVMLongConstants", "gHotSpotVMLongConstantEntryArrayStride", "gHotSpotVMLongConstantEntryNameOffset", "gHotSpotVMLongConstantEntryValueOffset"}, true},
	} {
		tl, base, err := get(c.names...)
		if err != nil {
			return nil, err
		}
		err = entries(tl, base, func(e []byte) (bool, error) {
			if word(e, tl.off[0]) == 0 {
				return false, nil
			}
			name, err := str(e, tl.off[0])
			if err != nil {
				return false, err
			}
			if c.long {
				t.longs[name] = word(e, tl.off[1])
			} else {
				t.ints[name] = int64(int32(binary.LittleEndian.Uint32(e[tl.off[1]:])))
			}
			return true, nil
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.names[0], err)
		}
	}
	return t, nil
}

// tableSymbols are the gHotSpot* symbols readTables needs.
var tableSymbols = []string{
	"gHotSpotVMStructs", "gHotSpotVMStructEntryArrayStride",
	"gHotSpotVMStructEntryTypeNameOffset", "gHotSpotVMStructEntryFieldNameOffset",
	"gHotSpotVMStructEntryTypeStringOffset", "gHotSpotVMStructEntryIsStaticOffset",
	"gHotSpotVMStructEntryOffsetOffset", "gHotSpotVMStructEntryAddressOffset",
	"gHotSpotVMTypes", "gHotSpotVMTypeEntryArrayStride",
	"gHotSpotVMTypeEntryTypeNameOffset", "gHotSpotVMTypeEntrySizeOffset",
	"gHotSpotVMIntConstants", "gHotSpotVMIntConstantEntryArrayStride",
	"gHotSpotVMIntConstantEntryNameOffset", "gHotSpotVMIntConstantEntryValueOffset",
	"gHotSpotVMLongConstants", "gHotSpotVMLongConstantEntryArrayStride",
	"gHotSpotVMLongConstantEntryNameOffset", "gHotSpotVMLongConstantEntryValueOffset",
}
