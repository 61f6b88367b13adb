package jvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/sonde-dev/sonde/internal/lru"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/symbolize"
)

// NamerStats count what naming did.
type NamerStats struct {
	Named      uint64 // frames named
	Stale      uint64 // frames whose code or method changed since the sample
	Unreadable uint64 // frames whose memory could not be read or made no sense
	// MethodOnly counts compiled frames whose code was freed or reused
	// since the sample, named by the method the sample read (TierCompiled).
	MethodOnly uint64
	Evictions  uint64 // cache entries dropped to stay within the bound
	// Loads counts the cache's misses: the entries (a method, a compiled
	// method or stub, the blob of a PC) read from a process's memory.
	Loads   uint64
	Bytes   int64 // bytes the cache holds now
	Entries int   // entries it holds now
}

// Namer names the JVM frames of the processes added to it. Its cache of
// methods and compiled code is bounded by maxBytes; the least recently
// used entries go first (counted in Stats). It is safe for concurrent
// use; it owns the memory files Add opens and Forget closes them.
type Namer struct {
	mu     sync.Mutex
	procfs string
	procs  map[int]*namerProc
	cache  *lru.Cache[entryKey, *entry]
	stats  NamerStats
}

type namerProc struct {
	vm  *VM
	mem Memory
	// close releases mem; nil for memory the caller owns.
	close func() error
}

// entryKey names a cached method (compileID 0, kind methodEntry) or
// nmethod (addr, compileID).
type entryKey struct {
	pid       int
	kind      uint8
	addr      uint64
	compileID int32
}

const (
	methodEntry uint8 = iota
	nmethodEntry
	// stubEntry is keyed by what the sample read at the blob's compile id
	// offset too: while the stub lives those bytes stay, and a block
	// reused for an nmethod holds its compile id there instead.
	stubEntry
	// blobEntry is the blob a PC was found in (blob), keyed by the PC and
	// the compile id bits the sample read: the segment map is walked once
	// per such PC, not at every sample.
	blobEntry
)

type entry struct {
	key  entryKey
	cost int64
	m    *method
	nm   *nmethodInfo
	stub *stubInfo
	blob uint64 // blobEntry's
}

// stubInfo is a code blob that is no Java method.
type stubInfo struct {
	name string
	size uint32
}

// method is what naming needs of one Method.
type method struct {
	constMethod   uint64
	codeStart     uint64 // the first bytecode
	codeSize      uint64
	function, sys string
	file          string
	lines         []linePair
	native        bool
}

// onlyLine is the line of all of m's bytecodes when its line table has
// one line only (small methods, which C2 compiles without a safepoint
// inside), else 0: unknown.
func (m *method) onlyLine() int64 {
	if m.native || len(m.lines) == 0 {
		return 0
	}
	for _, p := range m.lines[1:] {
		if p.line != m.lines[0].line {
			return 0
		}
	}
	return int64(m.lines[0].line)
}

// nmethodInfo is what naming needs of one nmethod.
type nmethodInfo struct {
	method    uint64
	tier      string
	codeBegin uint32 // from the blob's start
	size      uint32 // the blob's size
	pcs       []pcDesc
	scopes    []byte
	metadata  []uint64
}

// NewNamer returns a Namer reading processes under procfs ("/proc") with
// a cache of at most maxBytes.
func NewNamer(procfs string, maxBytes int64) *Namer {
	return &Namer{procfs: procfs, procs: map[int]*namerProc{},
		cache: lru.New[entryKey, *entry](maxBytes)}
}

// Add opens pid's memory (kept open until Forget) to name its frames.
func (n *Namer) Add(pid int, vm *VM) error {
	mem, err := python.OpenMem(n.procfs, pid)
	if err != nil {
		return fmt.Errorf("jvm %d: %w", pid, err)
	}
	n.addMem(pid, vm, mem, mem.Close)
	return nil
}

// addMem is Add with memory already open; closer (if not nil) releases it.
func (n *Namer) addMem(pid int, vm *VM, mem Memory, closer func() error) {
	n.mu.Lock()
	old := n.procs[pid]
	n.procs[pid] = &namerProc{vm: vm, mem: mem, close: closer}
	n.mu.Unlock()
	if old != nil && old.close != nil {
		_ = old.close()
	}
	n.dropPID(pid)
}

// Close forgets every process, closing the memory files Add opened: the
// profiler's end. The Namer may be used again.
func (n *Namer) Close() {
	n.mu.Lock()
	pids := slices.Collect(maps.Keys(n.procs))
	n.mu.Unlock()
	for _, pid := range pids {
		n.Forget(pid)
	}
}

// Forget closes pid's memory and drops what the cache holds of it.
func (n *Namer) Forget(pid int) {
	n.mu.Lock()
	p := n.procs[pid]
	delete(n.procs, pid)
	n.mu.Unlock()
	if p != nil && p.close != nil {
		_ = p.close()
	}
	n.dropPID(pid)
}

func (n *Namer) dropPID(pid int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cache.RemoveIf(func(k entryKey) bool { return k.pid == pid })
}

// Stats returns the counters and the cache's size.
func (n *Namer) Stats() NamerStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	s.Bytes = n.cache.Cost()
	s.Entries = n.cache.Len()
	s.Evictions = n.cache.Evictions()
	return s
}

// get returns a cached entry, marking it used. n.mu is held.
func (n *Namer) get(k entryKey) *entry {
	e, _ := n.cache.Get(k)
	return e
}

// put caches e, evicting the least recently used entries to stay within
// the bound. An entry larger than the bound is not kept. n.mu is held.
func (n *Namer) put(e *entry) {
	n.cache.Put(e.key, e, e.cost)
}

// Frame names one frame. returnAddr says the frame's pc is a return
// address (a caller frame), not the interrupted pc of the leaf. The error
// of a frame that cannot be named truthfully matches ErrStale (its code or
// method changed since the sample) or ErrUnreadable.
func (n *Namer) Frame(pid int, kind FrameKind, addr, word uint64, returnAddr bool) (Frame, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.procs[pid]
	if p == nil {
		n.stats.Unreadable++
		return Frame{}, fmt.Errorf("jvm %d: not added: %w", pid, ErrUnreadable)
	}
	var f Frame
	var err error
	switch kind {
	case FrameInterpreted:
		f, err = n.interpreted(pid, p, addr, word)
	case FrameCompiled:
		f, err = n.compiled(pid, p, addr, int32(word>>32), ^uint32(0), uint32(word), returnAddr)
	default:
		err = fmt.Errorf("frame kind %d: %w", kind, ErrUnreadable)
	}
	return n.account(pid, addr, f, err)
}

// CompiledFrame names a frame of code in the code cache as the eBPF walker
// reports it: its PC, and what the PC's code blob held at the sample: the
// low 16 bits of its compile id and its Method* (0: none read). The blob
// holding the PC now must still hold that compile id and method; where it
// was freed or reused since, the method read at the sample still names
// the frame (its tier and line unknown: TierCompiled), when it reads as a
// method.
func (n *Namer) CompiledFrame(pid int, pc uint64, compileID uint16, method uint64, returnAddr bool) (Frame, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.procs[pid]
	if p == nil {
		n.stats.Unreadable++
		return Frame{}, fmt.Errorf("jvm %d: not added: %w", pid, ErrUnreadable)
	}
	lookup := pc
	if returnAddr {
		lookup-- // a call at the blob's very end returns past it
	}
	bk := entryKey{pid: pid, kind: blobEntry, addr: lookup, compileID: int32(compileID)}
	var blob uint64
	var err error
	if e := n.get(bk); e != nil {
		blob = e.blob
	} else {
		n.stats.Loads++
		if blob, err = p.vm.Kernel.BlobAt(p.mem, lookup); err == nil {
			n.put(&entry{key: bk, cost: 64, blob: blob})
		}
	}
	var f Frame
	if err == nil {
		f, err = n.compiledHint(pid, p, blob, int32(compileID), 0xffff, uint32(pc-blob), method, returnAddr)
	}
	if errors.Is(err, ErrStale) && method != 0 {
		if m, merr := n.method(pid, p, method, false); merr == nil {
			n.stats.MethodOnly++
			l := m.line(0)
			l.Line = m.onlyLine()
			return Frame{Tier: TierCompiled, Lines: []symbolize.Line{l}}, nil
		}
	}
	return n.account(pid, pc, f, err)
}

// account counts the outcome of naming a frame. n.mu is held.
func (n *Namer) account(pid int, addr uint64, f Frame, err error) (Frame, error) {
	switch {
	case err == nil:
		n.stats.Named++
	case errors.Is(err, ErrStale):
		n.stats.Stale++
	default:
		n.stats.Unreadable++
		if !errors.Is(err, ErrUnreadable) {
			err = fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
	}
	if err != nil {
		return Frame{}, fmt.Errorf("jvm %d frame at %#x: %w", pid, addr, err)
	}
	return f, nil
}

func (n *Namer) interpreted(pid int, p *namerProc, methodAddr, bcp uint64) (Frame, error) {
	for try := 0; try < 2; try++ {
		m, err := n.method(pid, p, methodAddr, try > 0)
		if err != nil {
			return Frame{}, err
		}
		if bcp >= m.codeStart && bcp < m.codeStart+m.codeSize {
			return Frame{Tier: TierInterpreted, Lines: []symbolize.Line{m.line(int32(bcp - m.codeStart))}}, nil
		}
		if m.native && bcp == 0 {
			// The interpreter's native method entry keeps no bcp: a native
			// method called from interpreted code, before (or without) a
			// compiled wrapper of its own.
			return Frame{Tier: TierNative, Lines: []symbolize.Line{m.line(0)}}, nil
		}
	}
	return Frame{}, fmt.Errorf("bcp %#x outside the method's bytecodes: %w", bcp, ErrStale)
}

func (m *method) line(bci int32) symbolize.Line {
	l := symbolize.Line{Function: m.function, SystemName: m.sys, File: m.file}
	if !m.native {
		l.Line = lineAt(m.lines, bci)
	}
	return l
}

// method returns the cached Method at addr, read again when fresh.
func (n *Namer) method(pid int, p *namerProc, addr uint64, fresh bool) (*method, error) {
	k := entryKey{pid: pid, kind: methodEntry, addr: addr}
	if !fresh {
		if e := n.get(k); e != nil {
			return e.m, nil
		}
	}
	n.stats.Loads++
	m, err := readMethod(p.mem, p.vm.l, addr)
	if err != nil {
		return nil, err
	}
	cost := int64(160 + len(m.function) + len(m.sys) + len(m.file) + 8*len(m.lines))
	n.put(&entry{key: k, cost: cost, m: m})
	return m, nil
}

// compiledHint is compiled where the sample also read the blob's method
// (method, 0: not read): a blob that holds another method is stale.
func (n *Namer) compiledHint(pid int, p *namerProc, blob uint64, compileID int32, idMask uint32, pcOff uint32, method uint64, returnAddr bool) (Frame, error) {
	f, err := n.compiled(pid, p, blob, compileID, idMask, pcOff, returnAddr)
	if err != nil || method == 0 || f.Tier == TierStub {
		return f, err
	}
	k := entryKey{pid: pid, kind: nmethodEntry, addr: blob, compileID: compileID}
	if e := n.get(k); e != nil && e.nm.method != method {
		return Frame{}, fmt.Errorf("blob holds method %#x, the sample saw %#x: %w", e.nm.method, method, ErrStale)
	}
	return f, nil
}

// compiled names the frame at pcOff of the blob at blob, which held the
// compile id compileID (the bits of idMask) at the sample.
func (n *Namer) compiled(pid int, p *namerProc, blob uint64, compileID int32, idMask uint32, pcOff uint32, returnAddr bool) (Frame, error) {
	l := p.vm.l
	k := entryKey{pid: pid, kind: nmethodEntry, addr: blob, compileID: compileID}
	var nm *nmethodInfo
	if e := n.get(k); e != nil {
		nm = e.nm
	} else if e := n.get(entryKey{pid: pid, kind: stubEntry, addr: blob, compileID: compileID}); e != nil {
		if pcOff >= e.stub.size {
			return Frame{}, fmt.Errorf("pc offset %#x beyond the blob's %#x bytes: %w", pcOff, e.stub.size, ErrStale)
		}
		return Frame{Tier: TierStub, Lines: []symbolize.Line{{Function: e.stub.name}}}, nil
	} else {
		n.stats.Loads++
		hdr, err := readBlobHeader(p.mem, l, blob)
		if err != nil {
			return Frame{}, err
		}
		if !hdr.nmethod {
			if pcOff >= hdr.size {
				return Frame{}, fmt.Errorf("pc offset %#x beyond the blob's %#x bytes: %w", pcOff, hdr.size, ErrStale)
			}
			name, err := readCString(p.mem, hdr.name, 256)
			if err != nil {
				return Frame{}, fmt.Errorf("blob name: %w", err)
			}
			n.put(&entry{key: entryKey{pid: pid, kind: stubEntry, addr: blob, compileID: compileID},
				cost: int64(96 + len(name)), stub: &stubInfo{name: name, size: hdr.size}})
			return Frame{Tier: TierStub, Lines: []symbolize.Line{{Function: name}}}, nil
		}
		if uint32(hdr.compileID)&idMask != uint32(compileID)&idMask {
			return Frame{}, fmt.Errorf("blob holds compile %d, the sample saw %d: %w", hdr.compileID, compileID, ErrStale)
		}
		if nm, err = readNmethod(p.mem, l, blob, hdr); err != nil {
			return Frame{}, err
		}
		cost := int64(256 + 8*len(nm.pcs) + len(nm.scopes) + 8*len(nm.metadata))
		n.put(&entry{key: k, cost: cost, nm: nm})
		// A Method cached before may have been freed and its memory reused
		// since: check the ones this new nmethod names.
		for _, a := range append([]uint64{nm.method}, nm.metadata...) {
			if e := n.get(entryKey{pid: pid, kind: methodEntry, addr: a}); e != nil {
				if cm, err := readU64(p.mem, a+l.methodConst.at); err != nil || cm != e.m.constMethod {
					n.cache.Remove(e.key)
				}
			}
		}
	}
	if pcOff >= nm.size || pcOff < nm.codeBegin {
		return Frame{}, fmt.Errorf("pc offset %#x outside the code [%#x, %#x): %w", pcOff, nm.codeBegin, nm.size, ErrStale)
	}
	top, err := n.method(pid, p, nm.method, false)
	if err != nil {
		return Frame{}, err
	}
	if nm.tier == TierNative || len(nm.pcs) == 0 {
		return Frame{Tier: nm.tier, Lines: []symbolize.Line{top.line(0)}}, nil
	}
	rel := int32(pcOff - nm.codeBegin)
	after := rel
	if returnAddr {
		after = rel - 1
	}
	d, ok := findPcDesc(nm.pcs, after)
	if !ok || d.scope == 0 {
		// No debug info after the pc (past the last safepoint, at the
		// sentinel): the method itself, on its one line if all its code
		// is on one line, else on an unknown line.
		return Frame{Tier: nm.tier, Lines: []symbolize.Line{{Function: top.function, SystemName: top.sys, File: top.file,
			Line: top.onlyLine()}}}, nil
	}
	var lines []symbolize.Line
	off := d.scope
	for depth := 0; off != 0; depth++ {
		if depth >= maxScopeDepth {
			return Frame{}, fmt.Errorf("scopes deeper than %d: %w", maxScopeDepth, ErrUnreadable)
		}
		sc, err := decodeScope(nm.scopes, off, l.unsigned5)
		if err != nil {
			return Frame{}, fmt.Errorf("scope at %d: %w", off, err)
		}
		if sc.metadata <= 0 || int(sc.metadata) > len(nm.metadata) {
			return Frame{}, fmt.Errorf("scope method %d of %d: %w", sc.metadata, len(nm.metadata), ErrUnreadable)
		}
		m, err := n.method(pid, p, nm.metadata[sc.metadata-1], false)
		if err != nil {
			return Frame{}, err
		}
		lines = append(lines, m.line(sc.bci))
		if sc.sender >= off {
			// Senders are written before the scopes they call.
			return Frame{}, fmt.Errorf("scope at %d: sender at %d: %w", off, sc.sender, ErrUnreadable)
		}
		off = sc.sender
	}
	if last := lines[len(lines)-1]; last.Function != top.function || last.SystemName != top.sys {
		return Frame{}, fmt.Errorf("outer scope %s is not the nmethod's %s: %w", last.SystemName, top.sys, ErrUnreadable)
	}
	return Frame{Tier: nm.tier, Lines: lines}, nil
}

func readU64(mem Memory, a uint64) (uint64, error) {
	var b [8]byte
	if err := mem.ReadAt(b[:], a); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// get reads a field of o's width from b (the object's bytes).
func (o off) get(b []byte) (uint64, bool) {
	if o.at+uint64(o.width) > uint64(len(b)) {
		return 0, false
	}
	switch o.width {
	case 1:
		return uint64(b[o.at]), true
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[o.at:])), true
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[o.at:])), true
	case 8:
		return binary.LittleEndian.Uint64(b[o.at:]), true
	}
	return 0, false
}

// readCString reads a NUL-terminated string of at most limit bytes, without
// reading past the page it ends in.
func readCString(mem Memory, a uint64, limit int) (string, error) {
	var out []byte
	for len(out) < limit {
		n := int(pageSize - a%pageSize)
		n = min(n, 64, limit-len(out))
		b := make([]byte, n)
		if err := mem.ReadAt(b, a); err != nil {
			return "", err
		}
		for i, c := range b {
			if c == 0 {
				return symbolString(append(out, b[:i]...)), nil
			}
		}
		out = append(out, b...)
		a += uint64(n)
	}
	return "", fmt.Errorf("string at %#x: longer than %d bytes: %w", a, limit, ErrUnreadable)
}
