package jvm

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// off is a field's offset and width in bytes (1, 2, 4 or 8).
type off struct {
	at    uint64
	width uint8
}

// layout is what naming needs of the JVM's structures, from its tables.
type layout struct {
	t *tables

	// CodeBlob
	blobName, blobSize, blobKind, blobCodeBegin, blobMutableData, blobMutableSize, blobRelocSize off
	hasKind, codeBeginIsOffset, hasMutable                                                       bool
	kindNmethod                                                                                  int64

	// nmethod
	nmMethod, nmCompileID, nmCompLevel, nmEntryBCI off
	nmImmutable, nmImmutableSize                   off // _immutable_data (JDK 24+)
	nmScopesPcs, nmScopesData, nmDeps, nmMetadata  off // offsets; nmScopesData may be a pointer
	hasImmutable, scopesDataIsPtr, hasMetadataOff  bool

	heapBlockSize uint64
	heapBlockUsed uint64 // offset of HeapBlock::_header._used

	// PcDesc
	pcDescSize            uint64
	pcDescPC, pcDescScope off

	// Method, ConstMethod, ConstantPool, Klass, Symbol
	methodConst, methodAccess                                 off
	constSize, constConstants, constName, constSig, constCode off
	constFlags                                                off
	constHasLines                                             uint64
	constMethodSize                                           uint64
	cpHolder, cpSourceFile, cpLength                          off
	ikConstants                                               off
	cpSize                                                    uint64
	ikSourceFile                                              off // JDK 8: InstanceKlass::_source_file_name_index
	sourceInKlass                                             bool
	klassName                                                 off
	symLength, symBody                                        off

	// unsigned5 says the JVM's CompressedReadStream excludes the zero
	// byte (UNSIGNED5 of JDK 20 and later).
	unsigned5 bool
}

// typeWidth is the size in bytes of a field of C++ type typ.
func (t *tables) typeWidth(typ string) uint8 {
	typ = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(typ), "volatile "))
	if strings.HasSuffix(typ, "*") {
		return 8
	}
	switch typ {
	case "address", "size_t", "uintptr_t", "intptr_t", "long", "uint64_t", "int64_t", "jlong", "julong":
		return 8
	case "int", "jint", "juint", "int32_t", "uint32_t", "unsigned", "unsigned int", "u4":
		return 4
	case "u2", "jushort", "jshort", "uint16_t", "int16_t", "unsigned short", "short":
		return 2
	case "u1", "bool", "jboolean", "jbyte", "int8_t", "uint8_t", "char", "signed char", "unsigned char":
		return 1
	}
	if s, ok := t.sizes[typ]; ok && (s == 1 || s == 2 || s == 4 || s == 8) {
		return uint8(s)
	}
	return 0
}

// need returns the offset of the first of names the tables export.
func (t *tables) need(missing *[]string, names ...string) off {
	o, ok := t.opt(names...)
	if !ok {
		*missing = append(*missing, names[0])
	}
	return o
}

// opt is need for a field some versions lack.
func (t *tables) opt(names ...string) (off, bool) {
	for _, n := range names {
		f, ok := t.fields[n]
		if !ok || f.static {
			continue
		}
		return off{at: f.offset, width: t.typeWidth(f.typ)}, true
	}
	return off{}, false
}

// static returns the address of a static field.
func (t *tables) static(missing *[]string, name string) uint64 {
	f, ok := t.fields[name]
	if !ok || !f.static || f.address == 0 {
		*missing = append(*missing, name)
		return 0
	}
	return f.address
}

func (t *tables) size(missing *[]string, name string) uint64 {
	s, ok := t.sizes[name]
	if !ok || s == 0 {
		*missing = append(*missing, "sizeof "+name)
	}
	return s
}

var majorRe = regexp.MustCompile(`^(?:1\.(\d+)|(\d+))`)

// testedMajors are the JDK majors this project's tests run.
var testedMajors = map[int]bool{17: true, 25: true}

// newVM builds the layout and the kernel's view of a JVM from its tables.
func newVM(t *tables, mem Memory) (*VM, error) {
	var miss []string
	r := &pageReader{mem: mem, pages: map[uint64][]byte{}}

	// Version.
	vm := &VM{}
	if a := t.static(&miss, "Abstract_VM_Version::_s_vm_release"); a != 0 {
		p, err := r.u64(a)
		if err != nil {
			return nil, fmt.Errorf("vm release: %w", err)
		}
		if vm.Release, err = r.cstring(p); err != nil {
			return nil, fmt.Errorf("vm release: %w", err)
		}
	}
	// The Java major: JDK_Version::_current._major where exported (JDK 8
	// to 17 at least: JDK 8's HotSpot calls itself 25.x), else the VM's
	// own major, which is the Java one from JDK 9.
	cur, okCur := t.fields["JDK_Version::_current"]
	maj, okMaj := t.fields["JDK_Version::_major"]
	if okCur && okMaj && cur.static && !maj.static {
		var b [1]byte
		if err := r.read(b[:], cur.address+maj.offset); err != nil {
			return nil, fmt.Errorf("jdk major version: %w", err)
		}
		vm.Major = int(b[0])
	} else if f, ok := t.fields["Abstract_VM_Version::_vm_major_version"]; ok && f.static {
		var b [4]byte
		if err := r.read(b[:], f.address); err != nil {
			return nil, fmt.Errorf("vm major version: %w", err)
		}
		vm.Major = int(int32(binary.LittleEndian.Uint32(b[:])))
	}
	if m := majorRe.FindStringSubmatch(vm.Release); m != nil && (vm.Major <= 0 || vm.Major > 1000) {
		s := m[1]
		if s == "" {
			s = m[2]
		}
		vm.Major, _ = strconv.Atoi(s)
	}
	if len(miss) > 0 {
		return nil, fmt.Errorf("jvm: missing %s: %w", strings.Join(miss, ", "), ErrUnknownVersion)
	}
	if vm.Major < 8 {
		return nil, fmt.Errorf("jvm release %q: major %d: %w", vm.Release, vm.Major, ErrUnknownVersion)
	}
	vm.Untested = !testedMajors[vm.Major]
	l, frameSize, frameComplete, err := newLayout(t, vm.Major)
	if err != nil {
		return nil, fmt.Errorf("jvm %s: %w", vm.Release, err)
	}
	vm.l = l
	k, err := readKernel(t, r, vm.Major)
	if err != nil {
		return nil, err
	}
	k.HeapBlockSize = uint16(l.heapBlockSize)
	k.HeapBlockUsed = uint16(l.heapBlockUsed)
	k.BlobFrameSize = uint16(frameSize.at)
	k.BlobFrameComplete = uint16(frameComplete.at)
	k.BlobFrameCompleteWidth = frameComplete.width
	k.BlobCodeBegin = uint16(l.blobCodeBegin.at)
	k.CodeBeginIsOffset = l.codeBeginIsOffset
	k.NmethodCompileID = uint16(l.nmCompileID.at)
	k.NmethodMethod = uint16(l.nmMethod.at)
	vm.Kernel = k
	return vm, nil
}

// interpreterFrame is where the x86-64 template interpreter keeps a
// frame's Method*, bcp and sender sp, in words from rbp. vmStructs exports
// only the sender sp's; the others come from frame_x86.hpp of each JDK.
type interpreterFrame struct{ method, bcp, senderSP int16 }

// interpreterFrames is keyed by the first major with a layout: JDK 8 has
// no mirror slot, JDK 9 (JDK-8154580) added it below the Method*.
var interpreterFrames = []struct {
	major int
	f     interpreterFrame
}{
	{8, interpreterFrame{method: -3, bcp: -7, senderSP: -1}},
	{9, interpreterFrame{method: -3, bcp: -8, senderSP: -1}},
}

func interpreterFrameOf(major int) (interpreterFrame, bool) {
	var f interpreterFrame
	ok := false
	for _, e := range interpreterFrames {
		if major >= e.major {
			f, ok = e.f, true
		}
	}
	return f, ok
}

// readKernel reads the code cache's bounds and heaps and the interpreter.
func readKernel(t *tables, r *pageReader, major int) (Kernel, error) {
	var miss []string
	var k Kernel
	f, ok := interpreterFrameOf(major)
	if !ok {
		return k, fmt.Errorf("interpreter frame of jdk %d: %w", major, ErrUnknownVersion)
	}
	if s, ok := t.ints["frame::interpreter_frame_sender_sp_offset"]; ok && s != int64(f.senderSP) {
		return k, fmt.Errorf("interpreter sender sp slot %d, want %d: %w", s, f.senderSP, ErrUnknownVersion)
	}
	if s, ok := t.ints["frame::interpreter_frame_last_sp_offset"]; ok && s != int64(f.senderSP-1) {
		return k, fmt.Errorf("interpreter last sp slot %d, want %d: %w", s, f.senderSP-1, ErrUnknownVersion)
	}
	k.InterpMethod, k.InterpBCP, k.InterpSenderSP = f.method*8, f.bcp*8, f.senderSP*8

	memory := t.need(&miss, "CodeHeap::_memory")
	segmap := t.need(&miss, "CodeHeap::_segmap")
	shift := t.need(&miss, "CodeHeap::_log2_segment_size")
	lowB := t.need(&miss, "VirtualSpace::_low_boundary")
	highB := t.need(&miss, "VirtualSpace::_high_boundary")
	low := t.need(&miss, "VirtualSpace::_low")
	var heaps []uint64
	u64 := func(a uint64) uint64 {
		v, err := r.u64(a)
		if err != nil {
			miss = append(miss, fmt.Sprintf("memory at %#x", a))
		}
		return v
	}
	if _, ok := t.fields["CodeCache::_heaps"]; ok {
		arr := u64(t.static(&miss, "CodeCache::_heaps"))
		lenOff := t.need(&miss, "GrowableArrayBase::_len", "GenericGrowableArray::_len")
		dataOff := t.need(&miss, "GrowableArray<int>::_data")
		k.CodeLow = u64(t.static(&miss, "CodeCache::_low_bound"))
		k.CodeHigh = u64(t.static(&miss, "CodeCache::_high_bound"))
		if len(miss) > 0 {
			return k, fmt.Errorf("code cache: missing %s: %w", strings.Join(miss, ", "), ErrUnknownVersion)
		}
		var b [4]byte
		if err := r.read(b[:], arr+lenOff.at); err != nil {
			return k, fmt.Errorf("code heaps: %w", err)
		}
		n := int32(binary.LittleEndian.Uint32(b[:]))
		if n == 0 {
			return k, fmt.Errorf("code heaps: none yet: %w", ErrNotReady)
		}
		if n < 0 || n > MaxHeaps {
			return k, fmt.Errorf("code heaps: %d heaps", n)
		}
		data := u64(arr + dataOff.at)
		for i := range n {
			heaps = append(heaps, u64(data+uint64(i)*8))
		}
	} else {
		heaps = append(heaps, u64(t.static(&miss, "CodeCache::_heap")))
	}
	if len(miss) > 0 {
		return k, fmt.Errorf("code cache: missing %s: %w", strings.Join(miss, ", "), ErrUnknownVersion)
	}
	for _, h := range heaps {
		var ch CodeHeap
		ch.Low = u64(h + memory.at + lowB.at)
		ch.High = u64(h + memory.at + highB.at)
		ch.Segmap = u64(h + segmap.at + low.at)
		var b [4]byte
		if err := r.read(b[:], h+shift.at); err != nil {
			return k, fmt.Errorf("code heap: %w", err)
		}
		s := binary.LittleEndian.Uint32(b[:])
		if s < 4 || s > 16 || ch.Low >= ch.High || ch.Segmap == 0 {
			return k, fmt.Errorf("code heap %#x: [%#x, %#x) segment shift %d: inconsistent", h, ch.Low, ch.High, s)
		}
		ch.SegShift = uint8(s)
		k.Heaps = append(k.Heaps, ch)
	}
	if k.CodeLow == 0 {
		k.CodeLow, k.CodeHigh = k.Heaps[0].Low, k.Heaps[0].High
	}
	for _, h := range k.Heaps {
		if h.Low < k.CodeLow || h.High > k.CodeHigh {
			return k, fmt.Errorf("code heap [%#x, %#x) outside the code cache [%#x, %#x)", h.Low, h.High, k.CodeLow, k.CodeHigh)
		}
	}

	q := u64(t.static(&miss, "AbstractInterpreter::_code"))
	buf := t.need(&miss, "StubQueue::_stub_buffer")
	limit := t.need(&miss, "StubQueue::_buffer_limit")
	if len(miss) > 0 {
		return k, fmt.Errorf("interpreter: missing %s: %w", strings.Join(miss, ", "), ErrUnknownVersion)
	}
	if q == 0 {
		return k, fmt.Errorf("interpreter: not generated yet: %w", ErrNotReady)
	}
	k.InterpStart = u64(q + buf.at)
	var b [4]byte
	if err := r.read(b[:], q+limit.at); err != nil {
		return k, fmt.Errorf("interpreter: %w", err)
	}
	k.InterpEnd = k.InterpStart + uint64(binary.LittleEndian.Uint32(b[:]))
	if len(miss) > 0 || k.InterpStart == 0 || k.InterpEnd <= k.InterpStart {
		return k, fmt.Errorf("interpreter [%#x, %#x): unreadable", k.InterpStart, k.InterpEnd)
	}
	return k, nil
}

// newLayout reads what naming needs from the tables of a JVM of major:
// the CodeBlob frame size and frame complete fields go to the kernel.
func newLayout(t *tables, major int) (l *layout, frameSize, frameComplete off, err error) {
	var miss []string
	l = &layout{t: t, unsigned5: major >= 20}

	// Code blobs.
	l.blobName = t.need(&miss, "CodeBlob::_name")
	l.blobSize = t.need(&miss, "CodeBlob::_size")
	l.blobKind, l.hasKind = t.opt("CodeBlob::_kind")
	if l.hasKind {
		k, ok := t.ints["CodeBlobKind::Nmethod"]
		if !ok {
			miss = append(miss, "CodeBlobKind::Nmethod")
		}
		l.kindNmethod = k
	}
	if o, ok := t.opt("CodeBlob::_code_begin"); ok {
		l.blobCodeBegin = o
	} else {
		l.blobCodeBegin = t.need(&miss, "CodeBlob::_code_offset")
		l.codeBeginIsOffset = true
	}
	l.blobMutableData, l.hasMutable = t.opt("CodeBlob::_mutable_data")
	if l.hasMutable {
		l.blobMutableSize = t.need(&miss, "CodeBlob::_mutable_data_size")
		l.blobRelocSize = t.need(&miss, "CodeBlob::_relocation_size")
	}
	frameSize = t.need(&miss, "CodeBlob::_frame_size")
	frameComplete = t.need(&miss, "CodeBlob::_frame_complete_offset")

	l.nmMethod = t.need(&miss, "nmethod::_method", "CompiledMethod::_method")
	l.nmCompileID = t.need(&miss, "nmethod::_compile_id")
	l.nmCompLevel = t.need(&miss, "nmethod::_comp_level")
	l.nmEntryBCI = t.need(&miss, "nmethod::_entry_bci")
	l.nmScopesPcs = t.need(&miss, "nmethod::_scopes_pcs_offset")
	l.nmImmutable, l.hasImmutable = t.opt("nmethod::_immutable_data")
	if l.hasImmutable {
		l.nmImmutableSize = t.need(&miss, "nmethod::_immutable_data_size")
		l.nmScopesData = t.need(&miss, "nmethod::_scopes_data_offset")
	} else {
		l.nmDeps = t.need(&miss, "nmethod::_dependencies_offset")
		if o, ok := t.opt("nmethod::_scopes_data_begin", "CompiledMethod::_scopes_data_begin"); ok {
			l.nmScopesData, l.scopesDataIsPtr = o, true
		} else {
			l.nmScopesData = t.need(&miss, "nmethod::_scopes_data_offset")
		}
	}
	if !l.hasMutable {
		l.nmMetadata = t.need(&miss, "nmethod::_metadata_offset")
		l.hasMetadataOff = true
	}

	l.heapBlockSize = t.size(&miss, "HeapBlock")
	hdr := t.need(&miss, "HeapBlock::_header")
	used := t.need(&miss, "HeapBlock::Header::_used")
	l.heapBlockUsed = hdr.at + used.at

	l.pcDescSize = t.size(&miss, "PcDesc")
	l.pcDescPC = t.need(&miss, "PcDesc::_pc_offset")
	l.pcDescScope = t.need(&miss, "PcDesc::_scope_decode_offset")

	l.methodConst = t.need(&miss, "Method::_constMethod")
	l.methodAccess = t.need(&miss, "Method::_access_flags")
	l.constMethodSize = t.size(&miss, "ConstMethod")
	l.constConstants = t.need(&miss, "ConstMethod::_constants")
	l.constName = t.need(&miss, "ConstMethod::_name_index")
	l.constSig = t.need(&miss, "ConstMethod::_signature_index")
	l.constCode = t.need(&miss, "ConstMethod::_code_size")
	l.constSize = t.need(&miss, "ConstMethod::_constMethod_size")
	l.constFlags = t.need(&miss, "ConstMethod::_flags._flags", "ConstMethod::_flags")
	hasLines, ok := t.ints["ConstMethodFlags::_misc_has_linenumber_table"]
	if !ok {
		hasLines, ok = t.ints["ConstMethod::_has_linenumber_table"]
	}
	if !ok {
		miss = append(miss, "ConstMethod::_has_linenumber_table")
	}
	l.constHasLines = uint64(hasLines)
	l.cpSize = t.size(&miss, "ConstantPool")
	l.cpHolder = t.need(&miss, "ConstantPool::_pool_holder")
	l.cpLength, _ = t.opt("ConstantPool::_length")
	l.ikConstants = t.need(&miss, "InstanceKlass::_constants")
	if o, ok := t.opt("ConstantPool::_source_file_name_index"); ok {
		l.cpSourceFile = o
	} else {
		l.ikSourceFile = t.need(&miss, "InstanceKlass::_source_file_name_index")
		l.sourceInKlass = true
	}
	l.klassName = t.need(&miss, "Klass::_name")
	l.symLength = t.need(&miss, "Symbol::_length")
	l.symBody = t.need(&miss, "Symbol::_body")

	// Check the widths naming relies on.
	for _, c := range []struct {
		name string
		o    off
		w    []uint8
	}{
		{"CodeBlob::_name", l.blobName, []uint8{8}},
		{"CodeBlob::_size", l.blobSize, []uint8{4}},
		{"CodeBlob code begin", l.blobCodeBegin, []uint8{4, 8}},
		{"CodeBlob::_frame_size", frameSize, []uint8{4}},
		{"CodeBlob::_frame_complete_offset", frameComplete, []uint8{2, 4}},
		{"nmethod::_method", l.nmMethod, []uint8{8}},
		{"nmethod::_compile_id", l.nmCompileID, []uint8{4}},
		{"nmethod::_comp_level", l.nmCompLevel, []uint8{1, 4}},
		{"nmethod::_scopes_pcs_offset", l.nmScopesPcs, []uint8{4}},
		{"PcDesc::_pc_offset", l.pcDescPC, []uint8{4}},
		{"PcDesc::_scope_decode_offset", l.pcDescScope, []uint8{4}},
		{"Method::_constMethod", l.methodConst, []uint8{8}},
		{"Method::_access_flags", l.methodAccess, []uint8{2, 4}},
		{"ConstMethod::_constants", l.constConstants, []uint8{8}},
		{"ConstMethod::_name_index", l.constName, []uint8{2}},
		{"ConstMethod::_code_size", l.constCode, []uint8{2}},
		{"ConstMethod::_flags", l.constFlags, []uint8{2, 4}},
		{"ConstantPool::_pool_holder", l.cpHolder, []uint8{8}},
		{"Klass::_name", l.klassName, []uint8{8}},
		{"Symbol::_length", l.symLength, []uint8{2}},
	} {
		ok := false
		for _, w := range c.w {
			ok = ok || c.o.width == w
		}
		if !ok {
			miss = append(miss, fmt.Sprintf("%s of %d bytes", c.name, c.o.width))
		}
	}
	if len(miss) > 0 {
		return nil, off{}, off{}, fmt.Errorf("missing %s: %w", strings.Join(miss, ", "), ErrUnknownVersion)
	}

	return l, frameSize, frameComplete, nil
}
