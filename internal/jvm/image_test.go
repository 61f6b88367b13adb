package jvm

import (
	"encoding/binary"
	"fmt"
)

// sliceMem is a process image for tests and fuzzers: bytes at base.
type sliceMem struct {
	base uint64
	b    []byte
}

func (m sliceMem) ReadAt(p []byte, addr uint64) error {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return fmt.Errorf("read %d at %#x: outside the image", len(p), addr)
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

// synthTables are the tables of a made-up JVM laid out as JDK 17 lays out
// its structures (fields found through CompiledMethod, scopes data by
// pointer, metadata in the nmethod).
func synthTables() *tables {
	t := &tables{fields: map[string]field{}, sizes: map[string]uint64{}, ints: map[string]int64{}, longs: map[string]uint64{}}
	f := func(name, typ string, at uint64) { t.fields[name] = field{typ: typ, offset: at} }
	f("CodeBlob::_name", "const char*", 0)
	f("CodeBlob::_size", "int", 8)
	f("CodeBlob::_code_begin", "address", 16)
	f("CodeBlob::_frame_size", "int", 24)
	f("CodeBlob::_frame_complete_offset", "int", 28)
	f("CompiledMethod::_method", "Method*", 64)
	f("CompiledMethod::_scopes_data_begin", "address", 72)
	f("nmethod::_compile_id", "int", 80)
	f("nmethod::_comp_level", "int", 84)
	f("nmethod::_entry_bci", "int", 88)
	f("nmethod::_scopes_pcs_offset", "int", 92)
	f("nmethod::_dependencies_offset", "int", 96)
	f("nmethod::_metadata_offset", "int", 100)
	f("HeapBlock::_header", "HeapBlock::Header", 0)
	f("HeapBlock::Header::_length", "size_t", 0)
	f("HeapBlock::Header::_used", "bool", 8)
	f("PcDesc::_pc_offset", "int", 0)
	f("PcDesc::_scope_decode_offset", "int", 4)
	f("Method::_constMethod", "ConstMethod*", 8)
	f("Method::_access_flags", "AccessFlags", 16)
	f("ConstMethod::_constants", "ConstantPool*", 8)
	f("ConstMethod::_constMethod_size", "int", 16)
	f("ConstMethod::_flags", "u2", 20)
	f("ConstMethod::_code_size", "u2", 22)
	f("ConstMethod::_name_index", "u2", 24)
	f("ConstMethod::_signature_index", "u2", 26)
	f("ConstantPool::_pool_holder", "InstanceKlass*", 16)
	f("ConstantPool::_source_file_name_index", "u2", 24)
	f("ConstantPool::_length", "int", 28)
	f("Klass::_name", "Symbol*", 16)
	f("InstanceKlass::_constants", "ConstantPool*", 32)
	f("Symbol::_length", "u2", 0)
	f("Symbol::_body", "", 6)
	for n, s := range map[string]uint64{"CodeBlob": 64, "nmethod": 128, "HeapBlock": 16, "PcDesc": 16,
		"ConstMethod": 48, "ConstantPool": 72, "AccessFlags": 4, "Symbol": 8} {
		t.sizes[n] = s
	}
	t.ints["ConstMethod::_has_linenumber_table"] = 1
	return t
}

// Addresses in the synthetic image.
const (
	imgBase   = 0x10000
	imgBlob   = imgBase + 16 // after its HeapBlock
	imgMethod = imgBase + 0x1000
	imgCallee = imgBase + 0x1800
	imgID     = 7
)

// synthImage builds the memory of a made-up JVM holding one C2 nmethod of
// com.example.JBurn.jGamma(I)J with step(I)J inlined at its first PcDesc.
func synthImage(unsigned5 bool) []byte {
	img := make([]byte, 0x3000)
	at := func(a uint64) []byte { return img[a-imgBase:] }
	put64 := func(a, v uint64) { binary.LittleEndian.PutUint64(at(a), v) }
	put32 := func(a uint64, v uint32) { binary.LittleEndian.PutUint32(at(a), v) }
	put16 := func(a uint64, v uint16) { binary.LittleEndian.PutUint16(at(a), v) }
	sym := func(a uint64, s string) uint64 {
		put16(a, uint16(len(s)))
		copy(at(a+6), s)
		return a
	}
	// The heap block and the nmethod.
	put64(imgBase, 8)
	at(imgBase + 8)[0] = 1
	copy(at(imgBase+0x400), "nmethod\x00")
	put64(imgBlob, imgBase+0x400)
	put32(imgBlob+8, 0x200)
	put64(imgBlob+16, imgBlob+0x80)
	put64(imgBlob+64, imgMethod)
	put64(imgBlob+72, imgBlob+0x100)
	put32(imgBlob+80, imgID)
	put32(imgBlob+84, 4)
	put32(imgBlob+88, 0xFFFFFFFF)
	put32(imgBlob+92, 0x140)
	put32(imgBlob+96, 0x160)
	put32(imgBlob+100, 0xF0)
	put64(imgBlob+0xF0, imgMethod)
	put64(imgBlob+0xF8, imgCallee)
	// Scopes: the caller (metadata 1, bci 2) at 1, the callee (metadata 2,
	// bci 0) after it.
	s := []byte{0}
	s = writeUint(s, 0, unsigned5)
	s = writeUint(s, 1, unsigned5)
	s = writeUint(s, 3, unsigned5)
	callee := len(s)
	s = writeUint(s, 1, unsigned5)
	s = writeUint(s, 2, unsigned5)
	s = writeUint(s, 1, unsigned5)
	copy(at(imgBlob+0x100), s)
	put32(imgBlob+0x140, 0x10)
	put32(imgBlob+0x144, uint32(callee))
	put32(imgBlob+0x150, 0x20)
	put32(imgBlob+0x154, 1)
	// The methods, their ConstMethods, constant pool, class and symbols.
	const cp, klass = imgBase + 0x2000, imgBase + 0x2400
	for _, m := range []struct {
		addr  uint64
		name  uint16
		code  uint16
		lines []linePair
	}{{imgMethod, 1, 8, []linePair{{0, 10}, {2, 12}}}, {imgCallee, 4, 4, []linePair{{0, 20}}}} {
		cm := m.addr + 0x100
		put64(m.addr+8, cm)
		put64(cm+8, cp)
		tab := encodeLines(m.lines, unsigned5)
		put32(cm+16, uint32((48+int(m.code)+len(tab)+7)/8))
		put16(cm+20, 1)
		put16(cm+22, m.code)
		put16(cm+24, m.name)
		put16(cm+26, 2)
		copy(at(cm+48+uint64(m.code)), tab)
	}
	put64(cp+16, klass)
	put16(cp+24, 3)
	put32(cp+28, 5)
	for i, s := range []string{"jGamma", "(I)J", "JBurn.java", "step"} {
		put64(cp+72+8*uint64(i+1), sym(imgBase+0x2800+0x40*uint64(i), s))
	}
	put64(klass+16, sym(imgBase+0x2a00, "com/example/JBurn"))
	put64(klass+32, cp)
	return img
}
