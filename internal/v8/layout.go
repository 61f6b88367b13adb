package v8

import (
	"fmt"
	"strings"
)

// metadata is V8's post-mortem metadata: the values of a binary's v8dbg_*
// symbols, by name without the prefix.
type metadata map[string]int64

// get returns the first of names the metadata has.
func (m metadata) get(names ...string) (int64, bool) {
	for _, n := range names {
		if v, ok := m[n]; ok {
			return v, true
		}
	}
	return 0, false
}

// field returns the offset of class's field, whatever its type suffix
// (v8dbg_class_<class>__<field>__<type>).
func (m metadata) field(class, field string) (int64, bool) {
	p := "class_" + class + "__" + field + "__"
	for n, v := range m {
		if strings.HasPrefix(n, p) {
			return v, true
		}
	}
	return 0, false
}

// instanceType returns the instance type named name
// (v8dbg_type_<Class>__<NAME>).
func (m metadata) instanceType(name string) (int64, bool) {
	s := "__" + name
	for n, v := range m {
		if strings.HasPrefix(n, "type_") && strings.HasSuffix(n, s) {
			return v, true
		}
	}
	return 0, false
}

// layout is what walking and naming need of one V8's objects. Offsets are
// from an object's start (its tagged pointer less the tag).
type layout struct {
	tag, tagMask   uint64
	smiShift       uint
	instanceType   uint64 // Map::instance_type (u16)
	firstNonString uint64 // instance types below are strings

	// Strings.
	strLength                           uint64 // int32
	seqOneByte, seqTwoByte              uint64 // first char
	consFirst, consSecond, thinActual   uint64
	slicedParent, slicedOffset          uint64
	strReprMask, strEncMask, oneByte    uint64
	seqTag, consTag, slicedTag, thinTag uint64
	// externalTag is the representation of a string whose characters
	// are behind a C++ resource; externalResource the offset of its
	// resource pointer (0: unknown), the cached pointer to the
	// characters following it.
	externalTag, externalResource uint64

	fixedArrayLength, fixedArrayData uint64
	byteArrayData                    uint64 // ByteArray and TrustedByteArray

	// JSFunction, SharedFunctionInfo, Script, ScopeInfo.
	jsFunctionShared                           uint64
	sfiName, sfiScript, sfiFunctionData        uint64
	scriptName, scriptSource, scriptLineEnds   uint64
	scopeInfoFirstVars, scopeInfoContextLocals uint64 // indexes (tagged slots after the map)
	uncompiledInferredName                     uint64

	// BytecodeArray and InterpreterData.
	bytecodeData, bytecodeLength, bytecodePositions uint64
	interpreterDataBytecode                         uint64

	// Code: V8 10 keeps instructions in the Code object (codeInline, at
	// codeInstructionStart); later ones in an InstructionStream whose
	// Code is at istreamCode, instructions at istreamInstructions.
	codeInline                                           bool
	codeInstructionStart, codeInstructionSize, codeFlags uint64
	codeDeoptData, codePositions, codeBytecodeOffsets    uint64
	codeKindMask, codeKindShift                          uint64
	istreamCode, istreamInstructions                     uint64
	kindBaseline, kindMaglev, kindTurbofan               int64

	// Deoptimization data indexes (a FixedArray).
	deoptSFI, deoptInliningPositions, deoptLiteralArray int64
	deoptSFIWrapped                                     bool // the SFI behind a SharedFunctionInfoWrapper (V8 13+)
	sfiWrapperSFI                                       uint64

	// Instance types.
	typeSFI, typeScript, typeBytecode, typeCode, typeIStream int64
	typeScopeInfo, typeFixedArray, typeInterpreterData       int64
	typeByteArray, typeTrustedByteArray, typeTrustedFixed    int64
	typeDebugInfo, typeMapV                                  int64

	frameTypes map[int64]string // frame type by number
	// flaggedPositions: source position tables encode code offsets as
	// V8 14 does (see decodePositions).
	flaggedPositions bool
}

// perVersion is what the metadata of one V8 major.minor lacks, from that
// V8's sources, and checked at Find against what the metadata does say.
type perVersion struct {
	// DeoptimizationData indexes, where the metadata lacks them (V8 10).
	deoptSFI, deoptInliningPositions, deoptLiteralArray int64

	sfiFunctionData      int64 // SharedFunctionInfo's function data (trusted, where split)
	bytecodePositions    int64 // BytecodeArray::source_position_table
	codeDeoptData        int64 // Code's deoptimization data (or interpreter data)
	codePositions        int64 // Code's source position (or bytecode offset) table
	codeInstructionStart int64 // V8 10: instructions in the Code at this offset; else Code's instruction_start
	codeInstructionSize  int64
	codeFlags            int64
	istreamCode          int64 // InstructionStream's Code (V8 11+)
	interpreterDataBC    int64 // InterpreterData::bytecode_array
}

// versions are the V8s of the Node majors tested here (18: 10.2, 20:
// 11.3, 22: 12.4, 24: 13.6, 26: 14.6), by V8 major.
var versions = map[int]perVersion{
	10: {deoptSFI: 6, deoptInliningPositions: 7, deoptLiteralArray: 2, sfiFunctionData: 8, bytecodePositions: 32, codeDeoptData: 16, codePositions: 24,
		codeInstructionStart: 128, codeInstructionSize: 40, codeFlags: 48, interpreterDataBC: 8},
	11: {sfiFunctionData: 8, bytecodePositions: 32, codeDeoptData: 16, codePositions: 24,
		codeInstructionStart: 40, codeInstructionSize: 56, codeFlags: 48, istreamCode: 8, interpreterDataBC: 8},
	12: {sfiFunctionData: 8, bytecodePositions: 24, codeDeoptData: 8, codePositions: 16,
		istreamCode: 8, interpreterDataBC: 8},
	13: {sfiFunctionData: 8, bytecodePositions: 24, codeDeoptData: 8, codePositions: 16,
		istreamCode: 8, interpreterDataBC: 8},
	14: {sfiFunctionData: 8, bytecodePositions: 24, codeDeoptData: 8, codePositions: 16,
		istreamCode: 8, interpreterDataBC: 8},
}

// testedV8 are the V8 majors the live tests run.
var testedV8 = map[int]bool{10: true, 11: true, 12: true, 13: true, 14: true}

// newLayout reads a layout from md for V8 major.
func newLayout(md metadata, major int) (*layout, error) {
	pv, ok := versions[major]
	if !ok {
		return nil, fmt.Errorf("v8 %d: no table: %w", major, ErrUnknownVersion)
	}
	var missing []string
	need := func(names ...string) uint64 {
		v, ok := md.get(names...)
		if !ok {
			missing = append(missing, names[0])
		}
		return uint64(v)
	}
	field := func(class, f string) uint64 {
		v, ok := md.field(class, f)
		if !ok {
			missing = append(missing, class+"::"+f)
		}
		return uint64(v)
	}
	typ := func(name string) int64 {
		v, ok := md.instanceType(name)
		if !ok {
			missing = append(missing, name)
			return -1
		}
		return v
	}
	optType := func(name string) int64 {
		if v, ok := md.instanceType(name); ok {
			return v
		}
		return -1
	}
	l := &layout{
		tag:                    need("HeapObjectTag"),
		tagMask:                need("HeapObjectTagMask"),
		smiShift:               uint(need("SmiShiftSize") + need("SmiValueShift")),
		instanceType:           field("Map", "instance_type"),
		firstNonString:         need("FirstNonstringType"),
		strLength:              field("String", "length"),
		seqOneByte:             field("SeqOneByteString", "chars"),
		seqTwoByte:             field("SeqTwoByteString", "chars"),
		consFirst:              field("ConsString", "first"),
		consSecond:             field("ConsString", "second"),
		thinActual:             field("ThinString", "actual"),
		slicedParent:           field("SlicedString", "parent"),
		slicedOffset:           field("SlicedString", "offset"),
		strReprMask:            need("StringRepresentationMask"),
		strEncMask:             need("StringEncodingMask"),
		oneByte:                need("OneByteStringTag"),
		seqTag:                 need("SeqStringTag"),
		consTag:                need("ConsStringTag"),
		slicedTag:              need("SlicedStringTag"),
		thinTag:                need("ThinStringTag"),
		externalTag:            need("ExternalStringTag"),
		fixedArrayLength:       field("FixedArrayBase", "length"),
		fixedArrayData:         field("FixedArray", "data"),
		jsFunctionShared:       field("JSFunction", "shared"),
		sfiName:                field("SharedFunctionInfo", "name_or_scope_info"),
		scriptName:             field("Script", "name"),
		scriptSource:           field("Script", "source"),
		scriptLineEnds:         field("Script", "line_ends"),
		bytecodeData:           field("BytecodeArray", "data"),
		codeKindMask:           need("CodeKindFieldMask"),
		codeKindShift:          need("CodeKindFieldShift"),
		kindBaseline:           int64(need("CodeKindBaseline")),
		scopeInfoFirstVars:     need("scopeinfo_idx_first_vars"),
		scopeInfoContextLocals: need("scopeinfo_idx_ncontextlocals"),
		typeSFI:                typ("SHARED_FUNCTION_INFO_TYPE"),
		typeScript:             typ("SCRIPT_TYPE"),
		typeBytecode:           typ("BYTECODE_ARRAY_TYPE"),
		typeCode:               typ("CODE_TYPE"),
		typeScopeInfo:          typ("SCOPE_INFO_TYPE"),
		typeFixedArray:         typ("FIXED_ARRAY_TYPE"),
		typeByteArray:          typ("BYTE_ARRAY_TYPE"),
		typeInterpreterData:    typ("INTERPRETER_DATA_TYPE"),
		typeIStream:            optType("INSTRUCTION_STREAM_TYPE"),
		typeTrustedByteArray:   optType("TRUSTED_BYTE_ARRAY_TYPE"),
		typeTrustedFixed:       optType("TRUSTED_FIXED_ARRAY_TYPE"),
		typeDebugInfo:          optType("DEBUG_INFO_TYPE"),
		typeMapV:               typ("MAP_TYPE"),
		frameTypes:             map[int64]string{},
	}
	// V8 10 and 11 had no DeoptimizationData index names in every build:
	// 10.2's are V8 11's.
	deopt := func(name string, def int64) int64 {
		if v, ok := md.get(name); ok {
			return v
		}
		if def == 0 {
			missing = append(missing, name)
		}
		return def
	}
	l.deoptInliningPositions = deopt("DeoptimizationDataInliningPositionsIndex", pv.deoptInliningPositions)
	l.deoptLiteralArray = deopt("DeoptimizationDataLiteralArrayIndex", pv.deoptLiteralArray)
	if pv.deoptSFI != 0 {
		l.deoptSFI = pv.deoptSFI
	} else if v, ok := md.get("DeoptimizationDataSharedFunctionInfoIndex"); ok {
		l.deoptSFI = v
	} else if v, ok := md.get("DeoptimizationDataWrappedSharedFunctionInfoIndex"); ok {
		l.deoptSFI, l.deoptSFIWrapped, l.sfiWrapperSFI = v, true, 8
	} else {
		missing = append(missing, "DeoptimizationDataSharedFunctionInfoIndex")
	}
	if v, ok := md.field("SharedFunctionInfo", "script_or_debug_info"); ok {
		l.sfiScript = uint64(v)
	} else if v, ok := md.field("SharedFunctionInfo", "script"); ok {
		l.sfiScript = uint64(v)
	} else {
		missing = append(missing, "SharedFunctionInfo::script")
	}
	if v, ok := md.field("SharedFunctionInfo", "function_data"); ok {
		l.sfiFunctionData = uint64(v)
	} else {
		l.sfiFunctionData = uint64(pv.sfiFunctionData)
	}
	l.bytecodeLength = l.fixedArrayLength
	l.bytecodePositions = uint64(pv.bytecodePositions)
	l.byteArrayData = l.fixedArrayData // map, length (a Smi), then the bytes
	l.interpreterDataBytecode = uint64(pv.interpreterDataBC)
	l.kindMaglev, l.kindTurbofan = l.kindBaseline+1, l.kindBaseline+2
	l.flaggedPositions = major >= 14
	l.uncompiledInferredName, _ = fieldOr(md, "UncompiledData", "inferred_name", 8)

	if v, ok := md.field("InstructionStream", "instruction_start"); ok {
		l.istreamInstructions = uint64(v)
		l.istreamCode = uint64(pv.istreamCode)
		l.codeInstructionStart = fieldOrDef(md, "Code", "instruction_start", pv.codeInstructionStart)
	} else {
		l.codeInline = true
		l.codeInstructionStart = fieldOrDef(md, "Code", "instruction_start", pv.codeInstructionStart)
		l.typeIStream = l.typeCode
	}
	l.codeInstructionSize = fieldOrDef(md, "Code", "instruction_size", pv.codeInstructionSize)
	l.codeFlags = fieldOrDef(md, "Code", "flags", pv.codeFlags)
	l.codeDeoptData = fieldOrDef(md, "Code", "deoptimization_data", pv.codeDeoptData)
	l.codePositions = fieldOrDef(md, "Code", "source_position_table", pv.codePositions)
	l.codeBytecodeOffsets = l.codePositions
	if l.codeInstructionSize == 0 || l.codeFlags == 0 || l.codeInstructionStart == 0 {
		missing = append(missing, "Code::instruction_start/size/flags")
	}
	for n, v := range md {
		if name, ok := strings.CutPrefix(n, "frametype_"); ok {
			l.frameTypes[v] = name
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("v8 %d: metadata lacks %s: %w", major, strings.Join(missing, ", "), ErrUnknownVersion)
	}
	// What the table says must agree with what the metadata says where
	// both say something.
	if v, ok := md.field("BytecodeArray", "source_position_table"); ok && uint64(v) != l.bytecodePositions {
		return nil, fmt.Errorf("v8 %d: BytecodeArray::source_position_table at %d, the table says %d: %w",
			major, v, l.bytecodePositions, ErrUnknownVersion)
	}
	if l.tagMask == 0 || l.tag == 0 || l.tag&^l.tagMask != 0 || l.smiShift >= 64 {
		return nil, fmt.Errorf("v8 %d: tagging %d/%d, smi shift %d: %w", major, l.tag, l.tagMask, l.smiShift, ErrUnknownVersion)
	}
	l.externalResource, _ = fieldOr(md, "ExternalString", "resource", 0)
	return l, nil
}

// uncachedExternal is the instance type bit of an external string that
// does not cache the pointer to its characters (V8's
// kUncachedExternalStringMask, the same in V8 10 to 14).
const uncachedExternal = 1 << 4

func fieldOr(md metadata, class, f string, def uint64) (uint64, bool) {
	if v, ok := md.field(class, f); ok {
		return uint64(v), true
	}
	return def, false
}

func fieldOrDef(md metadata, class, f string, def int64) uint64 {
	v, _ := fieldOr(md, class, f, uint64(def))
	return v
}

// kernel fills in the walker's view from the layout and metadata.
func (l *layout) kernel(md metadata) (Kernel, error) {
	k := Kernel{
		HeapObjectTag:     uint8(l.tag),
		HeapObjectTagMask: uint8(l.tagMask),
		SmiShift:          uint8(l.smiShift),
		MarkerShift:       1,
		JSFunctionShared:  uint16(l.jsFunctionShared),
	}
	if v, ok := md.get("SmiTagMask"); ok {
		k.SmiTagMask = uint8(v)
	}
	fp := func(name string) (int16, error) {
		v, ok := md.get("off_fp_" + name)
		if !ok || v < -256 || v > 256 || v%8 != 0 {
			return 0, fmt.Errorf("frame slot %s %d (%v): %w", name, v, ok, ErrUnknownVersion)
		}
		return int16(v), nil
	}
	var err error
	if k.FPMarker, err = fp("context_or_frame_type"); err != nil {
		return k, err
	}
	if k.FPFunction, err = fp("function"); err != nil {
		return k, err
	}
	if k.FPBytecodeArray, err = fp("bytecode_array"); err != nil {
		return k, err
	}
	if k.FPBytecodeOffset, err = fp("bytecode_offset"); err != nil {
		return k, err
	}
	lo := min(k.FPMarker, k.FPFunction, k.FPBytecodeArray, k.FPBytecodeOffset, 0)
	k.FrameReadStart = lo
	k.FrameReadSize = uint16(16 - int(lo))
	entry, ok1 := md.get("frametype_EntryFrame")
	cons, ok2 := md.get("frametype_ConstructEntryFrame")
	if !ok1 || !ok2 || k.SmiTagMask == 0 {
		return k, fmt.Errorf("entry frame types: %w", ErrUnknownVersion)
	}
	k.EntryTypes = [2]uint8{uint8(entry), uint8(cons)}
	return k, nil
}

func (l *layout) typeMap() int64 { return l.typeMapV }
