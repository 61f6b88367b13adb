package jvm

import (
	"encoding/binary"
	"fmt"
)

// Reads of one frame's structures from a JVM's memory. Every size read
// from the process is checked against a bound before it sizes a read.

const (
	maxHeader     = 1024    // bytes of a struct header read at once
	maxLineTable  = 1 << 16 // bytes of a compressed line number table
	jvmAccNative  = 0x0100  // JVM_ACC_NATIVE, as the class file format says
	maxBlobSize   = 1 << 30
	maxNameLength = 1 << 12 // bytes of a blob's name
)

// sizeOf is sizeof(name), at least least.
func (l *layout) sizeOf(name string, least uint64) uint64 {
	return max(l.t.sizes[name], least)
}

// blobHeader is what a CodeBlob says of itself.
type blobHeader struct {
	raw       []byte // the blob's first bytes (its nmethod header for an nmethod)
	size      uint32
	name      uint64
	codeBegin uint32 // from the blob's start
	nmethod   bool
	compileID int32
}

// readBlobHeader reads the CodeBlob at blob: it must sit in a used heap
// block.
func readBlobHeader(mem Memory, l *layout, blob uint64) (blobHeader, error) {
	var h blobHeader
	n := l.sizeOf("CodeBlob", 64)
	if n > maxHeader || l.heapBlockSize > 64 {
		return h, fmt.Errorf("code blob of %d bytes: %w", n, ErrUnreadable)
	}
	b := make([]byte, l.heapBlockSize+n)
	if err := mem.ReadAt(b, blob-l.heapBlockSize); err != nil {
		return h, fmt.Errorf("code blob: %w: %w", err, ErrStale)
	}
	if l.heapBlockUsed >= l.heapBlockSize || b[l.heapBlockUsed] == 0 {
		return h, fmt.Errorf("code blob at %#x: heap block free: %w", blob, ErrStale)
	}
	b = b[l.heapBlockSize:]
	size, _ := l.blobSize.get(b)
	name, _ := l.blobName.get(b)
	cb, _ := l.blobCodeBegin.get(b)
	if !l.codeBeginIsOffset {
		cb -= blob
	}
	if size == 0 || size > maxBlobSize || cb >= size || name == 0 {
		return h, fmt.Errorf("code blob at %#x: size %#x code at %#x: %w", blob, size, cb, ErrStale)
	}
	h.size, h.name, h.codeBegin = uint32(size), name, uint32(cb)
	if l.hasKind {
		k, _ := l.blobKind.get(b)
		h.nmethod = int64(k) == l.kindNmethod
	} else {
		s, err := readCString(mem, name, maxNameLength)
		if err != nil {
			return h, fmt.Errorf("code blob name: %w", err)
		}
		h.nmethod = s == "nmethod" || s == "native nmethod"
	}
	if !h.nmethod {
		return h, nil
	}
	nn := l.sizeOf("nmethod", 64)
	if nn > maxHeader || uint64(h.size) < nn {
		return h, fmt.Errorf("nmethod at %#x: %d bytes: %w", blob, h.size, ErrStale)
	}
	h.raw = make([]byte, nn)
	if err := mem.ReadAt(h.raw, blob); err != nil {
		return h, fmt.Errorf("nmethod: %w", err)
	}
	id, _ := l.nmCompileID.get(h.raw)
	h.compileID = int32(id)
	return h, nil
}

// readNmethod reads the method, tier and debug info of the nmethod at
// blob.
func readNmethod(mem Memory, l *layout, blob uint64, h blobHeader) (*nmethodInfo, error) {
	b := h.raw
	nm := &nmethodInfo{codeBegin: h.codeBegin, size: h.size}
	nm.method, _ = l.nmMethod.get(b)
	if nm.method == 0 {
		return nil, fmt.Errorf("nmethod at %#x: no method: %w", blob, ErrStale)
	}
	mh := make([]byte, l.methodAccess.at+uint64(l.methodAccess.width))
	if err := mem.ReadAt(mh, nm.method); err != nil {
		return nil, fmt.Errorf("nmethod's method: %w", err)
	}
	access, _ := l.methodAccess.get(mh)
	level, _ := l.nmCompLevel.get(b)
	switch {
	case access&jvmAccNative != 0:
		nm.tier = TierNative
		return nm, nil
	case level >= 1 && level <= 3:
		nm.tier = TierC1
	case level == 4:
		nm.tier = TierC2
	default:
		return nil, fmt.Errorf("nmethod at %#x: compilation level %d: %w", blob, level, ErrUnreadable)
	}

	field := func(o off) uint64 { v, _ := o.get(b); return v }
	var pcsBegin, pcsEnd, dataBegin, dataEnd, metaBegin, metaEnd uint64
	if l.hasImmutable {
		imm := field(l.nmImmutable)
		pcsBegin = imm + field(l.nmScopesPcs)
		pcsEnd = imm + field(l.nmScopesData)
		dataBegin = pcsEnd
		dataEnd = imm + field(l.nmImmutableSize)
	} else {
		pcsBegin = blob + field(l.nmScopesPcs)
		pcsEnd = blob + field(l.nmDeps)
		if l.scopesDataIsPtr {
			dataBegin = field(l.nmScopesData)
		} else {
			dataBegin = blob + field(l.nmScopesData)
		}
		dataEnd = pcsBegin
	}
	if l.hasMutable {
		mut := field(l.blobMutableData)
		metaBegin = mut + field(l.blobRelocSize)
		metaEnd = mut + field(l.blobMutableSize)
	} else {
		metaBegin = blob + field(l.nmMetadata)
		if l.hasImmutable {
			metaEnd = blob + uint64(h.size)
		} else {
			metaEnd = dataBegin
		}
	}
	if pcsEnd < pcsBegin || pcsEnd-pcsBegin > maxPcDescs*l.pcDescSize ||
		dataEnd < dataBegin || dataEnd-dataBegin > maxScopesData ||
		metaEnd < metaBegin || (metaEnd-metaBegin)/8 > maxMetadata {
		return nil, fmt.Errorf("nmethod at %#x: pcs [%#x, %#x) scopes [%#x, %#x) metadata [%#x, %#x): %w",
			blob, pcsBegin, pcsEnd, dataBegin, dataEnd, metaBegin, metaEnd, ErrUnreadable)
	}
	raw := make([]byte, pcsEnd-pcsBegin)
	if err := mem.ReadAt(raw, pcsBegin); err != nil {
		return nil, fmt.Errorf("nmethod pcs: %w", err)
	}
	pcs, err := decodePcDescs(raw, l.pcDescSize, l.pcDescPC.at, l.pcDescScope.at)
	if err != nil {
		return nil, fmt.Errorf("nmethod pcs: %w", err)
	}
	nm.pcs = pcs
	nm.scopes = make([]byte, dataEnd-dataBegin)
	if err := mem.ReadAt(nm.scopes, dataBegin); err != nil {
		return nil, fmt.Errorf("nmethod scopes: %w", err)
	}
	mb := make([]byte, (metaEnd-metaBegin)&^7)
	if err := mem.ReadAt(mb, metaBegin); err != nil {
		return nil, fmt.Errorf("nmethod metadata: %w", err)
	}
	nm.metadata = make([]uint64, len(mb)/8)
	for i := range nm.metadata {
		nm.metadata[i] = binary.LittleEndian.Uint64(mb[8*i:])
	}
	return nm, nil
}

// readMethod reads the names, source file and line table of the Method at
// addr.
func readMethod(mem Memory, l *layout, addr uint64) (*method, error) {
	if addr == 0 || addr%8 != 0 {
		return nil, fmt.Errorf("method %#x: %w", addr, ErrStale)
	}
	mh := make([]byte, max(l.methodConst.at+8, l.methodAccess.at+uint64(l.methodAccess.width)))
	if err := mem.ReadAt(mh, addr); err != nil {
		return nil, fmt.Errorf("method: %w", err)
	}
	m := &method{}
	m.constMethod, _ = l.methodConst.get(mh)
	access, _ := l.methodAccess.get(mh)
	m.native = access&jvmAccNative != 0
	if l.constMethodSize > maxHeader || m.constMethod == 0 {
		return nil, fmt.Errorf("method %#x: const method %#x: %w", addr, m.constMethod, ErrStale)
	}
	cm := make([]byte, l.constMethodSize)
	if err := mem.ReadAt(cm, m.constMethod); err != nil {
		return nil, fmt.Errorf("const method: %w", err)
	}
	cp, _ := l.constConstants.get(cm)
	nameIdx, _ := l.constName.get(cm)
	sigIdx, _ := l.constSig.get(cm)
	m.codeSize, _ = l.constCode.get(cm)
	flags, _ := l.constFlags.get(cm)
	words, _ := l.constSize.get(cm)
	m.codeStart = m.constMethod + l.constMethodSize
	cmEnd := m.constMethod + words*8
	if cp == 0 || m.codeStart+m.codeSize > cmEnd || words > 1<<20 {
		return nil, fmt.Errorf("method %#x: const method inconsistent: %w", addr, ErrStale)
	}

	if l.cpSize > maxHeader {
		return nil, fmt.Errorf("constant pool of %d bytes: %w", l.cpSize, ErrUnreadable)
	}
	cph := make([]byte, l.cpSize)
	if err := mem.ReadAt(cph, cp); err != nil {
		return nil, fmt.Errorf("constant pool: %w", err)
	}
	holder, _ := l.cpHolder.get(cph)
	cpLen := l.poolLength(cph)
	symbolAt := func(i uint64) (string, error) { return poolSymbol(mem, l, cp, cpLen, i) }
	name, err := symbolAt(nameIdx)
	if err != nil {
		return nil, fmt.Errorf("method name: %w", err)
	}
	sig, err := symbolAt(sigIdx)
	if err != nil {
		return nil, fmt.Errorf("method signature: %w", err)
	}
	if holder == 0 {
		return nil, fmt.Errorf("method %s: no class: %w", name, ErrStale)
	}
	kn, err := readU64(mem, holder+l.klassName.at)
	if err != nil {
		return nil, fmt.Errorf("class name: %w", err)
	}
	internal, err := readSymbol(mem, l, kn)
	if err != nil {
		return nil, fmt.Errorf("class name: %w", err)
	}
	class, pkg := externalClassName(internal)
	m.function = class + "." + name
	m.sys = m.function + sig

	// The source file is the class's: a method handle intrinsic has a
	// constant pool of its own, of three entries, that does not hold it.
	src, err := readSourceFile(mem, l, holder)
	if err != nil {
		return nil, fmt.Errorf("source file of %s: %w", m.function, err)
	}
	if src != "" && pkg != "" {
		src = pkg + "/" + src
	}
	m.file = src

	if flags&l.constHasLines != 0 && !m.native {
		start := m.codeStart + m.codeSize
		n := min(cmEnd-start, maxLineTable)
		b := make([]byte, n)
		if err := mem.ReadAt(b, start); err != nil {
			return nil, fmt.Errorf("line table: %w", err)
		}
		if m.lines, err = decodeLines(b, l.unsigned5); err != nil {
			return nil, fmt.Errorf("line table of %s: %w", m.function, err)
		}
	}
	return m, nil
}

// readSymbol reads a Symbol's text.
func readSymbol(mem Memory, l *layout, addr uint64) (string, error) {
	if addr == 0 {
		return "", fmt.Errorf("symbol: null: %w", ErrUnreadable)
	}
	// One read covers the header and a short body, within the page.
	head := l.symBody.at
	n := min(head+64, pageSize-addr%pageSize)
	if n < head {
		n = head
	}
	b := make([]byte, n)
	if err := mem.ReadAt(b, addr); err != nil {
		return "", fmt.Errorf("symbol: %w", err)
	}
	length, _ := l.symLength.get(b)
	if length > maxSymbol {
		return "", fmt.Errorf("symbol of %d bytes: %w", length, ErrUnreadable)
	}
	if head+length <= uint64(len(b)) {
		return symbolString(b[head : head+length]), nil
	}
	body := make([]byte, length)
	if err := mem.ReadAt(body, addr+head); err != nil {
		return "", fmt.Errorf("symbol: %w", err)
	}
	return symbolString(body), nil
}

// poolLength is the entry count of the constant pool whose header is b.
func (l *layout) poolLength(b []byte) uint64 {
	if l.cpLength.width == 0 {
		return 1 << 16
	}
	n, _ := l.cpLength.get(b)
	return n
}

// poolSymbol reads the Symbol at index i of the constant pool at cp.
func poolSymbol(mem Memory, l *layout, cp, length, i uint64) (string, error) {
	if i == 0 || i >= length {
		return "", fmt.Errorf("constant pool index %d of %d: %w", i, length, ErrUnreadable)
	}
	p, err := readU64(mem, cp+l.cpSize+8*i)
	if err != nil {
		return "", fmt.Errorf("constant pool entry %d: %w", i, err)
	}
	return readSymbol(mem, l, p)
}

// readSourceFile reads the SourceFile attribute of the class at klass
// ("" without one).
func readSourceFile(mem Memory, l *layout, klass uint64) (string, error) {
	cp, err := readU64(mem, klass+l.ikConstants.at)
	if err != nil || cp == 0 {
		return "", fmt.Errorf("class constant pool %#x: %w", cp, err)
	}
	var idx uint64
	if l.sourceInKlass {
		b := make([]byte, 2)
		if err := mem.ReadAt(b, klass+l.ikSourceFile.at); err != nil {
			return "", err
		}
		idx = uint64(binary.LittleEndian.Uint16(b))
	}
	cph := make([]byte, l.cpSize)
	if err := mem.ReadAt(cph, cp); err != nil {
		return "", fmt.Errorf("class constant pool: %w", err)
	}
	if !l.sourceInKlass {
		idx, _ = l.cpSourceFile.get(cph)
	}
	if idx == 0 {
		return "", nil
	}
	return poolSymbol(mem, l, cp, l.poolLength(cph), idx)
}
