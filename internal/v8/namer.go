package v8

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sonde-dev/sonde/internal/lru"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/symbolize"
)

// NamerStats count what naming did.
type NamerStats struct {
	Named      uint64 // frames named
	Stale      uint64 // frames whose function or code changed since the sample
	Unreadable uint64 // frames whose memory could not be read or made no sense
	// NoLine counts frames named without a line: their position table
	// was not collected (V8 collects source positions lazily) or their
	// tier keeps none the namer reads (baseline code).
	NoLine uint64
	// Reused counts the cached objects taken without reading them again:
	// they were read and found unchanged after the sample was taken.
	Reused uint64
	// Gone counts frames among Named named from the cache alone, their
	// process's memory gone (it exited before they were named).
	Gone      uint64
	Evictions uint64 // cache entries dropped to stay within the bound
	Bytes     int64  // bytes the cache holds now
	Entries   int    // entries it holds now
}

// Namer names the V8 frames of the processes added to it. Its cache of
// functions, scripts and code is bounded by maxBytes; the least recently
// used entries go first (counted in Stats). Every cached object is checked
// against the process's memory at each use (its header bytes must be
// unchanged), so a moved or freed object is read again, or reported stale.
// It is safe for concurrent use; it owns the memory files Add opens and
// Forget closes them.
type Namer struct {
	mu     sync.Mutex
	procfs string
	procs  map[int]*namerProc
	cache  *lru.Cache[entryKey, *entry]
	// maxBytes is the cache's bound.
	maxBytes int64
	stats    NamerStats
	// captured is when the sample of the frame being named was taken
	// (FrameCaptured; zero: unknown).
	captured time.Time
	// gone: the process of the frame being named has exited (namerProc).
	gone bool
}

type namerProc struct {
	pid   int
	vm    *VM
	h     heap
	close func() error
	// codeMaps are the maps of the code space's code objects found so
	// far: one per isolate (Node's workers each have one) unless they
	// share a read-only heap.
	codeMaps map[uint64]bool
	// notMaps are words found not to be that map (bounded).
	notMaps map[uint64]bool
	// codeStarts are the starts of the code objects the namer holds for
	// the process, sorted: a pc is looked up in the one before it before
	// the memory is scanned for its code's header (codeHolding). Starts
	// whose entries were evicted are dropped when met, and all at once
	// when there are more than the cache could hold.
	codeStarts []uint64
	// gone: a read found the process's memory gone (io.EOF: it has
	// exited). Its frames are named from the cache alone from then on,
	// where the frame's own words agree with what is cached (the
	// function's bytecode, the code's function and range), since nothing
	// can be checked against memory any more.
	gone bool
}

type entryKey struct {
	pid  int
	kind uint8
	addr uint64
}

const (
	funcEntry uint8 = iota
	scriptEntry
	codeEntry
)

type entry struct {
	key  entryKey
	cost int64
	// checked is a time before the last read that found the object as
	// cached (funcEntry, scriptEntry, codeEntry).
	checked time.Time
	fn      *funcInfo
	sc      *scriptInfo
	code    *codeInfo
}

// funcInfo is what naming needs of one SharedFunctionInfo.
type funcInfo struct {
	hdr      []byte // the fields naming read, to check it is unchanged
	name     string
	script   uint64 // 0: none
	builtin  bool   // function data is a builtin id
	bytecode uint64 // its BytecodeArray (tagged), 0 if none
	bcPos    []posEntry
	bcPosOK  bool
	anon     string // displayName of an anonymous function
}

// scriptInfo is what naming needs of one Script.
type scriptInfo struct {
	hdr     []byte
	name    string
	lines   *lineTable // nil where noLines
	noLines bool       // its source could not be read
}

// codeInfo is what naming needs of one code object in the code space.
type codeInfo struct {
	hdr         []byte // the code object's first bytes
	code        uint64 // the Code (tagged)
	start, size uint64 // its instructions
	tier        string
	sfi         uint64
	positions   []posEntry
	posOK       bool
	inlining    []inlinePos
	inlined     []uint64 // SharedFunctionInfos by inlined function id
	// inlinedSFI holds inlined's entries unwrapped (inlinedSFIOf), 0
	// where not yet.
	inlinedSFI []uint64
	bytecode   uint64 // baseline: its BytecodeArray
	offsets    []byte // baseline: its bytecode offset table
	bytecodes  []byte // baseline: its bytecodes
}

// inlinePos is one InliningPosition: where the inlined function was
// called (a raw SourcePosition in its caller) and which function it is.
type inlinePos struct {
	pos int64
	fn  int32
}

// NewNamer returns a Namer reading processes under procfs ("/proc") with
// a cache of at most maxBytes.
func NewNamer(procfs string, maxBytes int64) *Namer {
	return &Namer{procfs: procfs, procs: map[int]*namerProc{},
		cache: lru.New[entryKey, *entry](maxBytes), maxBytes: maxBytes}
}

// Add opens pid's memory (kept open until Forget) to name its frames.
func (n *Namer) Add(pid int, vm *VM) error {
	mem, err := python.OpenMem(n.procfs, pid)
	if err != nil {
		return fmt.Errorf("v8 %d: %w", pid, err)
	}
	n.addMem(pid, vm, mem, mem.Close)
	return nil
}

// addMem is Add with memory already open; closer (if not nil) releases it.
func (n *Namer) addMem(pid int, vm *VM, mem Memory, closer func() error) {
	n.mu.Lock()
	old := n.procs[pid]
	n.procs[pid] = &namerProc{pid: pid, vm: vm, h: heap{mem: mem, l: vm.l}, close: closer, notMaps: map[uint64]bool{},
		codeMaps: map[uint64]bool{}}
	n.dropPID(pid)
	n.mu.Unlock()
	if old != nil && old.close != nil {
		_ = old.close()
	}
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
	n.dropPID(pid)
	n.mu.Unlock()
	if p != nil && p.close != nil {
		_ = p.close()
	}
}

// dropPID drops pid's entries. n.mu is held.
func (n *Namer) dropPID(pid int) {
	n.cache.RemoveIf(func(k entryKey) bool { return k.pid == pid })
}

// Stats returns the counters and the cache's size.
func (n *Namer) Stats() NamerStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	s.Bytes = n.cache.Cost()
	for _, p := range n.procs {
		s.Bytes += 8 * int64(cap(p.codeStarts))
	}
	s.Entries = n.cache.Len()
	s.Evictions = n.cache.Evictions()
	return s
}

// checkedSince returns the cached entry k if a read after the current
// frame's sample found it unchanged. n.mu is held.
func (n *Namer) checkedSince(k entryKey) *entry {
	e := n.get(k)
	if e == nil {
		return nil
	}
	if n.gone {
		return e
	}
	if n.captured.IsZero() || !e.checked.After(n.captured) {
		return nil
	}
	n.stats.Reused++
	return e
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

// Frame names one frame the walker reported. returnAddr says the frame's
// pc is a return address (a caller frame), not the interrupted pc of the
// leaf. The error of a frame that cannot be named truthfully matches
// ErrStale (its function or code changed since the sample) or
// ErrUnreadable.
func (n *Namer) Frame(pid int, kind FrameKind, addr, word uint64, returnAddr bool) (Frame, error) {
	return n.FrameCaptured(time.Time{}, pid, kind, addr, word, returnAddr)
}

// FrameCaptured is Frame for a frame of a sample taken at captured. Every
// cached object a frame names is checked against memory, but a check made
// after captured stands for this sample too: the object's memory was read
// as cached after the sample was taken, as a read now would be. A
// receiver that has fallen behind (samples taken before the frames of
// later ones were named) so names them without reading again; one that
// keeps up reads every object once per sample. A zero captured checks
// everything.
func (n *Namer) FrameCaptured(captured time.Time, pid int, kind FrameKind, addr, word uint64, returnAddr bool) (Frame, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.captured = captured
	p := n.procs[pid]
	if p == nil {
		n.stats.Unreadable++
		return Frame{}, fmt.Errorf("v8 %d: not added: %w", pid, ErrUnreadable)
	}
	n.gone = p.gone
	f, err := n.frame(pid, p, kind, addr, word, returnAddr)
	if err != nil && !p.gone && errors.Is(err, io.EOF) {
		// The process exited since the sample: what the cache holds of
		// it is all there is.
		p.gone, n.gone = true, true
		f, err = n.frame(pid, p, kind, addr, word, returnAddr)
	}
	if err == nil && n.gone {
		n.stats.Gone++
	}
	return n.account(pid, addr, f, err)
}

// frame names one frame of p. n.mu is held.
func (n *Namer) frame(pid int, p *namerProc, kind FrameKind, addr, word uint64, returnAddr bool) (Frame, error) {
	switch kind {
	case FrameInterpreted:
		return n.interpreted(pid, p, addr, uint32(word>>32), uint32(word))
	case FrameCompiled:
		return n.compiled(pid, p, addr, word, returnAddr)
	case FrameBuiltin:
		return n.builtinJS(pid, p, addr, word)
	case FrameStub:
		return n.stub(p, addr, word), nil
	}
	return Frame{}, fmt.Errorf("frame kind %d: %w", kind, ErrUnreadable)
}

// account counts the outcome of naming a frame. n.mu is held.
func (n *Namer) account(pid int, addr uint64, f Frame, err error) (Frame, error) {
	switch {
	case err == nil:
		n.stats.Named++
		if len(f.Lines) > 0 && f.Lines[0].Line == 0 && f.Tier != TierStub && f.Tier != TierBuiltin {
			n.stats.NoLine++
		}
	case errors.Is(err, ErrStale):
		n.stats.Stale++
	default:
		n.stats.Unreadable++
		if !errors.Is(err, ErrUnreadable) {
			err = fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
	}
	if err != nil {
		return Frame{}, fmt.Errorf("v8 %d frame at %#x: %w", pid, addr, err)
	}
	return f, nil
}

// stub names a typed frame: the builtin its pc is in, else its type.
func (n *Namer) stub(p *namerProc, pc, typ uint64) Frame {
	if name, ok := p.vm.builtinAt(pc); ok {
		return Frame{Tier: TierStub, Lines: []symbolize.Line{{Function: name}}}
	}
	name, ok := p.vm.l.frameTypes[int64(typ)]
	if typ == 0 {
		name, ok = "frameless builtin", true
	}
	if !ok {
		name = fmt.Sprintf("frame type %d", typ)
	}
	return Frame{Tier: TierStub, Lines: []symbolize.Line{{Function: "<" + name + ">"}}}
}

// builtinAt names the embedded builtin holding pc.
func (vm *VM) builtinAt(pc uint64) (string, bool) {
	for i, r := range vm.Kernel.Builtins {
		if pc >= r.Start && pc < r.End && i < len(vm.builtinOffs) {
			return vm.builtins.at(pc - r.Start + vm.builtinOffs[i])
		}
	}
	return "", false
}

// builtinJS names a frame of a builtin with JavaScript linkage.
func (n *Namer) builtinJS(pid int, p *namerProc, sfi, pc uint64) (Frame, error) {
	fn, err := n.function(pid, p, sfi)
	if err != nil {
		return Frame{}, err
	}
	l := symbolize.Line{Function: fn.displayName()}
	if fn.script != 0 {
		if sc, err := n.script(pid, p, fn.script); err == nil {
			l.File = sc.name
		}
	}
	if fn.name == "" {
		if name, ok := p.vm.builtinAt(pc); ok {
			l.Function = name
		}
	}
	return Frame{Tier: TierBuiltin, Lines: []symbolize.Line{l}}, nil
}

// displayName is the function's name, or for an anonymous function
// "<anonymous>" with the line and column it starts at where known
// ("<anonymous@12:5>").
func (fn *funcInfo) displayName() string {
	if fn.name == "" {
		return fn.anon
	}
	return fn.name
}

// interpreted names an Ignition frame: the function sfi at the bytecode
// offset the raw offset slot says, if the bytecode array the frame held
// (its low half, bcLow) is the function's.
func (n *Namer) interpreted(pid int, p *namerProc, sfi uint64, rawOffset, bcLow uint32) (Frame, error) {
	fn, err := n.function(pid, p, sfi)
	if err != nil {
		return Frame{}, err
	}
	if fn.builtin {
		// A builtin with JavaScript linkage whose slots looked like an
		// interpreter frame's.
		return Frame{Tier: TierBuiltin, Lines: []symbolize.Line{{Function: fn.displayName()}}}, nil
	}
	if fn.bytecode == 0 || uint32(fn.bytecode) != bcLow {
		return Frame{}, fmt.Errorf("function %s: bytecode %#x, the frame held ...%08x: %w", fn.name, fn.bytecode, bcLow, ErrStale)
	}
	l := symbolize.Line{Function: fn.displayName()}
	off := int64(rawOffset) - int64(p.vm.l.bytecodeData-p.vm.l.tag)
	if fn.script != 0 {
		sc, err := n.script(pid, p, fn.script)
		if err != nil {
			return Frame{}, err
		}
		l.File = sc.name
		if fn.bcPosOK && off >= 0 {
			if raw, ok := positionAt(fn.bcPos, int32(off)); ok {
				sp := splitPosition(raw)
				if sp.scriptOffset >= 0 && !sp.external {
					l.Line = sc.line(sp.scriptOffset)
				}
			}
		}
	}
	return Frame{Tier: TierInterpreted, Lines: []symbolize.Line{l}}, nil
}

// sfiHeaderSize is how much of a SharedFunctionInfo is read and compared.
func (l *layout) sfiHeaderSize() int {
	return int(max(l.sfiName, l.sfiScript, l.sfiFunctionData) + 8)
}

// function returns what naming needs of the SharedFunctionInfo sfi,
// cached while its fields are unchanged.
func (n *Namer) function(pid int, p *namerProc, sfi uint64) (*funcInfo, error) {
	h := p.h
	l := h.l
	if !h.isTagged(sfi) {
		return nil, fmt.Errorf("function %#x: not a heap object: %w", sfi, ErrUnreadable)
	}
	k := entryKey{pid: pid, kind: funcEntry, addr: sfi}
	if e := n.checkedSince(k); e != nil {
		return e.fn, nil
	}
	now := time.Now()
	hdr, err := h.fields(sfi, l.sfiHeaderSize())
	if err != nil {
		return nil, fmt.Errorf("function: %w: %w", err, ErrStale)
	}
	if e := n.get(k); e != nil && string(e.fn.hdr) == string(hdr) {
		e.checked = now
		return e.fn, nil
	}
	if err := h.expect(sfi, l.typeSFI, "function"); err != nil {
		return nil, err
	}
	word := func(off uint64) uint64 { return binary.LittleEndian.Uint64(hdr[off:]) }
	fn := &funcInfo{hdr: hdr}
	fn.name, err = n.functionName(h, word(l.sfiName))
	if err != nil {
		return nil, fmt.Errorf("function name: %w", err)
	}
	if s := word(l.sfiScript); h.isTagged(s) {
		if t, err := h.typeOf(s); err == nil && t == l.typeScript {
			fn.script = s
		}
	}
	fd := word(l.sfiFunctionData)
	if h.isSmi(fd) {
		fn.builtin = true
	} else if bc, err := n.bytecodeOf(h, fd); err == nil {
		fn.bytecode = bc
		if pt, err := h.field(bc, l.bytecodePositions); err == nil {
			if b, err := h.byteArray(pt, maxByteArray); err == nil {
				if es, err := decodePositions(b, l.flaggedPositions); err == nil && len(es) > 0 {
					fn.bcPos, fn.bcPosOK = es, true
				}
			}
		}
	}
	fn.anon = "<anonymous>"
	if fn.name == "" && fn.bcPosOK && fn.script != 0 && fn.bcPos[0].codeOffset == -1 {
		// The function's entry position (its first entry, at code
		// offset -1) is where its source starts.
		sp := splitPosition(fn.bcPos[0].pos)
		if sc, err := n.script(pid, p, fn.script); err == nil && !sc.noLines && sp.scriptOffset >= 0 && !sp.external {
			line, col := sc.lines.lineOf(sp.scriptOffset)
			fn.anon = fmt.Sprintf("<anonymous@%d:%d>", line, col)
		}
	}
	n.put(&entry{key: k, cost: int64(128 + len(hdr) + len(fn.name) + len(fn.anon) + 16*len(fn.bcPos)), fn: fn, checked: now})
	return fn, nil
}

// bytecodeOf follows a function's data to its BytecodeArray: the array
// itself, an InterpreterData's, or a baseline Code's.
func (n *Namer) bytecodeOf(h heap, fd uint64) (uint64, error) {
	l := h.l
	for range 3 {
		t, err := h.typeOf(fd)
		if err != nil {
			return 0, err
		}
		switch t {
		case l.typeBytecode:
			return fd, nil
		case l.typeInterpreterData:
			if fd, err = h.field(fd, l.interpreterDataBytecode); err != nil {
				return 0, err
			}
		case l.typeCode:
			if fd, err = h.field(fd, l.codeDeoptData); err != nil {
				return 0, err
			}
		default:
			return 0, fmt.Errorf("function data %#x: instance type %d: %w", fd, t, ErrStale)
		}
	}
	return 0, fmt.Errorf("function data %#x: no bytecode: %w", fd, ErrStale)
}

// functionName reads a function's name from its name_or_scope_info: a
// String, or a ScopeInfo holding it after the context locals.
func (n *Namer) functionName(h heap, v uint64) (string, error) {
	l := h.l
	if h.isSmi(v) {
		return "", nil
	}
	t, err := h.typeOf(v)
	if err != nil {
		return "", err
	}
	if h.isString(t) {
		return h.str(v, maxStringLen)
	}
	if t != l.typeScopeInfo {
		return "", fmt.Errorf("name %#x: instance type %d: %w", v, t, ErrStale)
	}
	// A ScopeInfo: tagged slots after the map; the context local names
	// and their infos, then (if any) the function's name.
	nlv, err := h.field(v, 8*(1+l.scopeInfoContextLocals))
	if err != nil {
		return "", err
	}
	nl := h.smi(nlv)
	if !h.isSmi(nlv) || nl < 0 || nl > 1<<16 {
		return "", fmt.Errorf("scope info %#x: %d context locals: %w", v, nl, ErrUnreadable)
	}
	skip := 2 * nl
	if nl > maxInlinedLocalNames {
		skip = 1 + nl // the names in a hash table
	}
	first := 1 + int64(l.scopeInfoFirstVars) + skip
	for i := first; i < first+3; i++ {
		s, err := h.field(v, uint64(8*i))
		if err != nil {
			return "", err
		}
		if !h.isTagged(s) {
			continue
		}
		if t, err := h.typeOf(s); err == nil && h.isString(t) {
			return h.str(s, maxStringLen)
		}
	}
	return "", nil
}

// maxInlinedLocalNames is how many context local names a ScopeInfo keeps
// inline; more go to a hash table.
const maxInlinedLocalNames = 75

// scriptHeaderSize is how much of a Script is read and compared.
func (l *layout) scriptHeaderSize() int {
	return int(max(l.scriptName, l.scriptSource, l.scriptLineEnds) + 8)
}

// script returns the name and line ends of a Script, cached while its
// fields are unchanged.
func (n *Namer) script(pid int, p *namerProc, s uint64) (*scriptInfo, error) {
	h := p.h
	l := h.l
	k := entryKey{pid: pid, kind: scriptEntry, addr: s}
	if e := n.checkedSince(k); e != nil {
		return e.sc, nil
	}
	now := time.Now()
	hdr, err := h.fields(s, l.scriptHeaderSize())
	if err != nil {
		return nil, fmt.Errorf("script: %w: %w", err, ErrStale)
	}
	if e := n.get(k); e != nil && string(e.sc.hdr) == string(hdr) {
		e.checked = now
		return e.sc, nil
	}
	if err := h.expect(s, l.typeScript, "script"); err != nil {
		return nil, err
	}
	word := func(off uint64) uint64 { return binary.LittleEndian.Uint64(hdr[off:]) }
	sc := &scriptInfo{hdr: hdr}
	var ends []int32
	if name := word(l.scriptName); h.isTagged(name) {
		if t, err := h.typeOf(name); err == nil && h.isString(t) {
			if sc.name, err = h.str(name, maxStringLen); err != nil {
				return nil, fmt.Errorf("script name: %w", err)
			}
		}
	}
	if le := word(l.scriptLineEnds); h.isTagged(le) {
		if t, err := h.typeOf(le); err == nil && t == l.typeFixedArray {
			vs, err := h.fixedArray(le, maxArrayLen)
			if err != nil {
				return nil, fmt.Errorf("line ends: %w", err)
			}
			ends = make([]int32, len(vs))
			for i, v := range vs {
				ends[i] = int32(h.smi(v))
			}
		}
	}
	if ends == nil {
		// V8 computes line ends when it first needs them: read the
		// source instead.
		// Sources behind a C++ resource (Node's own modules) are not
		// read: their lines stay unknown.
		if b, ok, err := h.flatOneByte(word(l.scriptSource), maxSourceLen); ok {
			ends = lineEndsOneByte(b)
		} else if err != nil {
			sc.noLines = true
		} else if src, err := h.str16(word(l.scriptSource), maxSourceLen); err == nil {
			ends = lineEnds(src)
		} else {
			sc.noLines = true
		}
	}
	cost := int64(96 + len(hdr) + len(sc.name))
	if !sc.noLines {
		sc.lines = newLineTable(ends)
		cost += sc.lines.size()
	}
	n.put(&entry{key: k, cost: cost, sc: sc, checked: now})
	return sc, nil
}

// line is the 1-based line of a script offset, 0 if unknown. An offset
// past the script's end is no position of it (code and script read at
// different moments of a churning heap): unknown, not the line after.
func (sc *scriptInfo) line(off int32) int64 {
	if sc.noLines || off < 0 || sc.lines.n > 0 && off > sc.lines.last {
		return 0
	}
	l, _ := sc.lines.lineOf(off)
	return l
}
