package v8

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sonde-dev/sonde/internal/symbolize"
)

// Naming compiled frames: the code object holding a pc is found by
// scanning back from the pc for the header of a code object (a word
// equal to the code space's code map: InstructionStream, or Code in V8
// 10, whose instructions follow their header), then checked: its Code
// must say its instructions start there and hold the pc.

const (
	scanChunk     = 4096
	maxScan       = 2 << 20   // bytes scanned back from a pc
	maxKnownScan  = 256 << 10 // the same for a known code map only: a code space page
	maxNotMaps    = 4096      // words remembered per process as not the code map
	maxCodeMaps   = 16        // code maps per process: one per isolate at most
	codeHdrBytes  = 64        // bytes of an InstructionStream compared at each use
	maxInlined    = 1 << 12   // inlined functions of one code object
	maxInlineHops = 64        // inlining depth followed
	minCodeCost   = 256       // what a cached code object costs at least
)

// codeAt returns the start of the code object holding pc (its map word's
// address), found by scanning back, above floor (0: none). With knownOnly
// it stops only at a word equal to a code map already known and checks no
// other word: no read beyond the scanned bytes. V8 has one such map per
// isolate (one per process where isolates share their read-only heap, as
// in Node), so once it is known a header is almost always found that way;
// the caller checks what it found and scans in full, above it, where that
// fails.
func (p *namerProc) codeAt(pc uint64, knownOnly bool, floor uint64) (uint64, error) {
	h := p.h
	limit := uint64(maxScan)
	if knownOnly {
		limit = maxKnownScan
	}
	l := h.l
	buf := make([]byte, scanChunk)
	end := pc &^ 7
	for scanned := uint64(0); scanned < limit; scanned += scanChunk {
		lo := (end - scanChunk) &^ (scanChunk - 1)
		if end%scanChunk != 0 {
			lo = end &^ (scanChunk - 1)
		}
		if lo >= end {
			lo = end - scanChunk
		}
		n := end - lo
		if err := h.mem.ReadAt(buf[:n], lo); err != nil {
			return 0, fmt.Errorf("code before pc %#x: %w: %w", pc, err, ErrStale)
		}
		for i := int(n) - 8; i >= 0; i -= 8 {
			w := binary.LittleEndian.Uint64(buf[i:])
			a := lo + uint64(i)
			if a <= floor {
				return 0, fmt.Errorf("no code object between %#x and pc %#x: %w", floor, pc, ErrStale)
			}
			if a+l.istreamInstructions > pc || !h.isTagged(w) {
				continue
			}
			if p.codeMaps[w] {
				return a, nil
			}
			if knownOnly || p.notMaps[w] {
				continue
			}
			if len(p.codeMaps) < maxCodeMaps && p.isCodeMap(w) {
				p.codeMaps[w] = true
				return a, nil
			}
			if len(p.notMaps) >= maxNotMaps {
				// Start again rather than stop remembering: the
				// words of the code scanned lately are the likely
				// ones.
				clear(p.notMaps)
			}
			p.notMaps[w] = true
		}
		end = lo
	}
	return 0, fmt.Errorf("no code object within %d bytes before pc %#x: %w", limit, pc, ErrStale)
}

// codeHolding returns the start of the cached code object whose
// instructions hold pc, if the namer holds it. n.mu is held.
func (n *Namer) codeHolding(pid int, p *namerProc, pc uint64) (uint64, bool) {
	i, found := slices.BinarySearch(p.codeStarts, pc)
	if !found {
		i--
	}
	if i < 0 {
		return 0, false
	}
	at := p.codeStarts[i]
	e := n.get(entryKey{pid: pid, kind: codeEntry, addr: at})
	if e == nil {
		p.codeStarts = slices.Delete(p.codeStarts, i, i+1)
		return 0, false
	}
	if pc < e.code.start || pc >= e.code.start+e.code.size {
		return 0, false
	}
	return at, true
}

// noteCode adds the start of a code object just cached to p's index,
// dropping first the starts whose entries are gone when the index holds
// more than the cache could (each code entry costs at least
// minCodeCost). n.mu is held.
func (n *Namer) noteCode(p *namerProc, at uint64) {
	i, found := slices.BinarySearch(p.codeStarts, at)
	if found {
		return
	}
	if int64(len(p.codeStarts)) >= n.maxBytes/minCodeCost {
		p.codeStarts = slices.DeleteFunc(p.codeStarts, func(a uint64) bool {
			_, ok := n.cache.Peek(entryKey{pid: p.pid, kind: codeEntry, addr: a})
			return !ok
		})
		i, _ = slices.BinarySearch(p.codeStarts, at)
	}
	p.codeStarts = slices.Insert(p.codeStarts, i, at)
}

// forgetCode drops at from p's index of code objects.
func (p *namerProc) forgetCode(at uint64) {
	if i, found := slices.BinarySearch(p.codeStarts, at); found {
		p.codeStarts = slices.Delete(p.codeStarts, i, i+1)
	}
}

// isCodeMap says whether w is the map of code objects in the code space:
// a Map whose instance type is the code object's.
func (p *namerProc) isCodeMap(w uint64) bool {
	h := p.h
	t, err := h.typeOf(w)
	if err != nil || t != h.l.typeMap() {
		return false
	}
	var b [2]byte
	if err := h.mem.ReadAt(b[:], w-h.l.tag+h.l.instanceType); err != nil {
		return false
	}
	return int64(binary.LittleEndian.Uint16(b[:])) == h.l.typeIStream
}

// code returns what naming needs of the code object starting at at,
// cached while its first bytes are unchanged; it must hold pc.
func (n *Namer) code(pid int, p *namerProc, at, pc uint64) (*codeInfo, error) {
	h := p.h
	l := h.l
	k := entryKey{pid: pid, kind: codeEntry, addr: at}
	var ci *codeInfo
	if e := n.checkedSince(k); e != nil {
		ci = e.code
	} else {
		now := time.Now()
		hdr := make([]byte, codeHdrBytes)
		if err := h.mem.ReadAt(hdr, at); err != nil {
			return nil, fmt.Errorf("code: %w: %w", err, ErrStale)
		}
		if e := n.get(k); e != nil && string(e.code.hdr) == string(hdr) {
			// The Code's own fields may change (deoptimized code is
			// marked, not moved); the instructions it points to must
			// still be these.
			start, err := h.field(e.code.code, l.codeInstructionStart)
			if err == nil && (l.codeInline || start == e.code.start) {
				ci = e.code
				e.checked = now
			}
		}
		if ci == nil {
			var err error
			if ci, err = n.readCode(p, at, hdr); err != nil {
				return nil, err
			}
			cost := int64(minCodeCost + len(ci.offsets) + len(ci.bytecodes) + 16*len(ci.positions) + 16*len(ci.inlining) + 8*len(ci.inlined))
			n.put(&entry{key: k, cost: cost, code: ci, checked: now})
		}
	}
	if pc < ci.start || pc >= ci.start+ci.size {
		return nil, fmt.Errorf("pc %#x outside the code's instructions [%#x, %#x): %w", pc, ci.start, ci.start+ci.size, ErrStale)
	}
	return ci, nil
}

// readCode reads the code object at at (hdr its first bytes).
func (n *Namer) readCode(p *namerProc, at uint64, hdr []byte) (*codeInfo, error) {
	h := p.h
	l := h.l
	ci := &codeInfo{hdr: hdr}
	if !p.codeMaps[binary.LittleEndian.Uint64(hdr)] {
		return nil, fmt.Errorf("code at %#x: not a code object: %w", at, ErrStale)
	}
	if l.codeInline {
		ci.code = at + l.tag
		ci.start = at + l.codeInstructionStart
	} else {
		ci.code = binary.LittleEndian.Uint64(hdr[l.istreamCode:])
		ci.start = at + l.istreamInstructions
		if err := h.expect(ci.code, l.typeCode, "code"); err != nil {
			return nil, err
		}
		start, err := h.field(ci.code, l.codeInstructionStart)
		if err != nil {
			return nil, err
		}
		if start != ci.start {
			return nil, fmt.Errorf("code at %#x: its Code says instructions at %#x: %w", at, start, ErrStale)
		}
	}
	size, err := h.u32(ci.code - l.tag + l.codeInstructionSize)
	if err != nil {
		return nil, err
	}
	flags, err := h.u32(ci.code - l.tag + l.codeFlags)
	if err != nil {
		return nil, err
	}
	if size == 0 || size > 1<<28 {
		return nil, fmt.Errorf("code at %#x: %d bytes: %w", at, size, ErrStale)
	}
	ci.size = uint64(size)
	kind := int64((uint64(flags) >> l.codeKindShift) & l.codeKindMask)
	switch kind {
	case l.kindBaseline:
		ci.tier = TierBaseline
	case l.kindMaglev:
		ci.tier = TierMaglev
	case l.kindTurbofan:
		ci.tier = TierTurbofan
	default:
		return nil, fmt.Errorf("code at %#x: kind %d is no JavaScript function's: %w", at, kind, ErrStale)
	}
	dd, err := h.field(ci.code, l.codeDeoptData)
	if err != nil {
		return nil, err
	}
	if ci.tier == TierBaseline {
		// Its interpreter data: the function's bytecode.
		bc, err := n.bytecodeOf(h, dd)
		if err != nil {
			return nil, fmt.Errorf("baseline code at %#x: %w", at, err)
		}
		ci.bytecode = bc
		// Its bytecode offset table and the bytecodes, to map a pc to
		// the bytecode it runs.
		if len(p.vm.bytecodeSizes) > 0 {
			if pt, err := h.field(ci.code, l.codeBytecodeOffsets); err == nil && h.isTagged(pt) {
				if tb, err := h.byteArray(pt, maxByteArray); err == nil {
					if bcs, err := h.bytecodes(bc); err == nil {
						ci.offsets, ci.bytecodes = tb, bcs
					}
				}
			}
		}
		return ci, nil
	}
	d, err := h.fixedArray(dd, 1<<16)
	if err != nil {
		return nil, fmt.Errorf("deoptimization data: %w", err)
	}
	idx := func(i int64) (uint64, error) {
		if i < 0 || i >= int64(len(d)) {
			return 0, fmt.Errorf("deoptimization data of %d entries: no entry %d: %w", len(d), i, ErrUnreadable)
		}
		return d[i], nil
	}
	if ci.sfi, err = idx(l.deoptSFI); err != nil {
		return nil, err
	}
	if ci.sfi, err = n.unwrapSFI(h, ci.sfi); err != nil {
		return nil, err
	}
	if pt, err := h.field(ci.code, l.codePositions); err == nil && h.isTagged(pt) {
		if b, err := h.byteArray(pt, maxByteArray); err == nil && len(b) > 0 {
			if es, err := decodePositions(b, l.flaggedPositions); err == nil {
				ci.positions, ci.posOK = es, true
			}
		}
	}
	ipv, err := idx(l.deoptInliningPositions)
	if err != nil {
		return nil, err
	}
	if ib, err := h.byteArray(ipv, maxByteArray); err == nil {
		for i := 0; i+16 <= len(ib) && len(ci.inlining) < maxInlined; i += 16 {
			ci.inlining = append(ci.inlining, inlinePos{
				pos: int64(binary.LittleEndian.Uint64(ib[i:])),
				fn:  int32(binary.LittleEndian.Uint32(ib[i+8:])),
			})
		}
	}
	if len(ci.inlining) > 0 {
		lav, err := idx(l.deoptLiteralArray)
		if err != nil {
			return nil, err
		}
		lits, err := h.fixedArray(lav, 1<<16)
		if err != nil {
			return nil, fmt.Errorf("literal array: %w", err)
		}
		ci.inlined = lits
	}
	return ci, nil
}

// inlinedSFIOf returns the SharedFunctionInfo of ci's inlined function i,
// unwrapped once for as long as ci is cached: the code's literals are read
// with it and checked with it.
func (n *Namer) inlinedSFIOf(h heap, ci *codeInfo, i int32) (uint64, error) {
	if ci.inlinedSFI == nil {
		ci.inlinedSFI = make([]uint64, len(ci.inlined))
	}
	if s := ci.inlinedSFI[i]; s != 0 {
		return s, nil
	}
	s, err := n.unwrapSFI(h, ci.inlined[i])
	if err == nil {
		ci.inlinedSFI[i] = s
	}
	return s, err
}

// unwrapSFI returns the SharedFunctionInfo v is or wraps (a weak
// reference's, or a SharedFunctionInfoWrapper's in V8 13+).
func (n *Namer) unwrapSFI(h heap, v uint64) (uint64, error) {
	l := h.l
	v &^= 2 // a weak reference
	t, err := h.typeOf(v)
	if err != nil {
		return 0, err
	}
	if t == l.typeSFI {
		return v, nil
	}
	if l.sfiWrapperSFI != 0 {
		w, err := h.field(v, l.sfiWrapperSFI)
		if err == nil {
			if t2, err := h.typeOf(w); err == nil && t2 == l.typeSFI {
				return w, nil
			}
		}
	}
	return 0, fmt.Errorf("function %#x: instance type %d: %w", v, t, ErrStale)
}

// codeFor returns the code object holding pc: the one the index says held
// it, else the one a scan back for a known code map finds, else the one a
// full scan finds above that. A process gone (io.EOF) ends the search.
// n.mu is held.
func (n *Namer) codeFor(pid int, p *namerProc, pc uint64) (*codeInfo, error) {
	if at, known := n.codeHolding(pid, p, pc); known {
		ci, err := n.code(pid, p, at, pc)
		if err == nil {
			return ci, nil
		}
		if errors.Is(err, io.EOF) {
			return nil, err // the process is gone: what the index holds stays
		}
		// What held the pc before does not now: look again.
		p.forgetCode(at)
	}
	var floor uint64
	var found error // why the code the known map led to does not hold pc
	if len(p.codeMaps) > 0 {
		if at, err := p.codeAt(pc, true, 0); err == nil {
			ci, err := n.code(pid, p, at, pc)
			if err == nil {
				n.noteCode(p, at)
				return ci, nil
			}
			if errors.Is(err, io.EOF) {
				return nil, err
			}
			// Only a header of another map, above the one found, can
			// hold pc: the full scan stops there, not to check it again.
			floor, found = at, err
		} else if errors.Is(err, io.EOF) {
			return nil, err
		}
	}
	at, err := p.codeAt(pc, false, floor)
	if err != nil {
		if found != nil {
			return nil, found
		}
		return nil, err
	}
	ci, err := n.code(pid, p, at, pc)
	if err != nil {
		return nil, err
	}
	n.noteCode(p, at)
	return ci, nil
}

// compiled names a frame of code in the code space: the code holding pc
// must belong to the function sfi the sample read. sfi 0 is a leaf in
// its code's prologue (FrameCompiled): the function is the code's own.
func (n *Namer) compiled(pid int, p *namerProc, sfi, pc uint64, returnAddr bool) (Frame, error) {
	h := p.h
	lookup := pc
	if returnAddr {
		lookup-- // a call at the code's very end returns past it
	}
	ci, err := n.codeFor(pid, p, lookup)
	if err != nil {
		return Frame{}, err
	}
	if sfi == 0 {
		if ci.tier == TierBaseline {
			return Frame{}, fmt.Errorf("baseline code at %#x in a prologue: no function: %w", ci.start, ErrStale)
		}
		sfi = ci.sfi
	}
	fn, err := n.function(pid, p, sfi)
	if err != nil {
		return Frame{}, err
	}
	top := symbolize.Line{Function: fn.displayName()}
	var sc *scriptInfo
	if fn.script != 0 {
		if sc, err = n.script(pid, p, fn.script); err != nil {
			return Frame{}, err
		}
		top.File = sc.name
	}
	if ci.tier == TierBaseline {
		if fn.bytecode == 0 || ci.bytecode != fn.bytecode {
			return Frame{}, fmt.Errorf("baseline code of bytecode %#x, the function's is %#x: %w", ci.bytecode, fn.bytecode, ErrStale)
		}
		// The pc's bytecode, from the code's bytecode offset table (V8
		// looks the pc itself up, return address or not).
		if ci.offsets != nil && fn.bcPosOK && sc != nil {
			if bo, err := baselineBytecodeOffset(ci.offsets, ci.bytecodes, p.vm.bytecodeSizes, pc-ci.start); err == nil {
				if raw, ok := positionAt(fn.bcPos, int32(bo)); ok {
					if sp := splitPosition(raw); !sp.external {
						top.Line = sc.line(sp.scriptOffset)
					}
				}
			}
		}
		return Frame{Tier: ci.tier, Lines: []symbolize.Line{top}}, nil
	}
	if ci.sfi != sfi {
		return Frame{}, fmt.Errorf("code of function %#x, the frame's is %#x: %w", ci.sfi, sfi, ErrStale)
	}
	off := int32(lookup - ci.start)
	raw, ok := positionAt(ci.positions, off)
	if !ci.posOK || !ok {
		return Frame{Tier: ci.tier, Lines: []symbolize.Line{top}}, nil
	}
	var lines []symbolize.Line
	for range maxInlineHops {
		sp := splitPosition(raw)
		if sp.inliningID < 0 {
			if sc != nil && sp.scriptOffset >= 0 && !sp.external {
				top.Line = sc.line(sp.scriptOffset)
			}
			return Frame{Tier: ci.tier, Lines: append(lines, top)}, nil
		}
		if int(sp.inliningID) >= len(ci.inlining) {
			return Frame{}, fmt.Errorf("inlining id %d of %d: %w", sp.inliningID, len(ci.inlining), ErrUnreadable)
		}
		ip := ci.inlining[sp.inliningID]
		if ip.fn < 0 || int(ip.fn) >= len(ci.inlined) {
			// Maglev leaves some inlined functions without a literal
			// (V8 13: their id stays -1); a pc in one is not named.
			return Frame{}, fmt.Errorf("inlined function %d of %d literals: %w", ip.fn, len(ci.inlined), ErrUnreadable)
		}
		isfi, err := n.inlinedSFIOf(h, ci, ip.fn)
		if err != nil {
			return Frame{}, fmt.Errorf("inlined function: %w", err)
		}
		ifn, err := n.function(pid, p, isfi)
		if err != nil {
			return Frame{}, fmt.Errorf("inlined function: %w", err)
		}
		il := symbolize.Line{Function: ifn.displayName()}
		if ifn.script != 0 {
			isc, err := n.script(pid, p, ifn.script)
			if err != nil {
				return Frame{}, err
			}
			il.File = isc.name
			if sp.scriptOffset >= 0 && !sp.external {
				il.Line = isc.line(sp.scriptOffset)
			}
		}
		lines = append(lines, il)
		raw = ip.pos
	}
	return Frame{}, fmt.Errorf("inlining deeper than %d: %w", maxInlineHops, ErrUnreadable)
}
