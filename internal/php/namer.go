package php

import (
	"errors"
	"fmt"
	"github.com/sonde-dev/sonde/internal/lru"
	"sync"

	"github.com/sonde-dev/sonde/internal/python"
)

// DefaultCacheBytes bounds a Namer's functions unless told otherwise.
const DefaultCacheBytes = 4 << 20

// ErrStale is matched by the error for a frame whose function was freed or
// replaced since the sample (its check word differs): it is left unnamed
// rather than named after whatever took its place.
var ErrStale = errors.New("php function changed since the sample")

// NamerStats count what naming did.
type NamerStats struct {
	Named      uint64 // frames named
	Stale      uint64 // frames whose function changed since the sample
	Unreadable uint64 // frames whose function could not be read or made no sense
	NoLine     uint64 // user frames named without a line (the walker found none)
	Gone       uint64 // frames among Named from the cache where memory could not be read any more
	ByCode     uint64 // frames among Named after a closure read before with the same opcodes
	Evictions  uint64 // functions dropped from the cache to stay within its bound
	Bytes      int64  // bytes the cache holds now
	Entries    int    // functions it holds now
}

// Frame is one named PHP frame.
type Frame struct {
	Name string
	File string
	Line int64 // 0: unknown
}

// Namer names the PHP frames of the processes added to it. Functions are
// read once per (process, address) and kept within a byte bound, least
// recently used first out (counted in Stats). A cached function is checked
// against the process's memory at each use (its first bytes must be
// unchanged) and against the check word the walker read at the sample, so
// a function freed and replaced at the same address (the next request of
// an FPM worker) is read again or reported stale, never misnamed; one whose
// memory cannot be read any more (its process exited) is named from the
// cache where the check word matches. It is
// safe for concurrent use; it owns the memory files Add opens and Forget
// closes them.
type Namer struct {
	mu     sync.Mutex
	procfs string
	procs  map[int]*namerProc
	cache  *lru.Cache[entryKey, *Func]
	stats  NamerStats
}

type namerProc struct {
	in  *Interp
	mem *python.ProcMem
	r   *Reader
}

type entryKey struct {
	pid  int
	addr uint64
	kind uint8
}

// closureKind keys the closures read by their code (addr: their check
// word, the low half of their opcodes' address) beside the functions
// keyed by address.
const closureKind = 0xff

// NewNamer returns a Namer that reads memory under procfs and keeps at
// most maxBytes of functions (0: DefaultCacheBytes).
func NewNamer(procfs string, maxBytes int64) *Namer {
	if maxBytes <= 0 {
		maxBytes = DefaultCacheBytes
	}
	return &Namer{procfs: procfs, procs: map[int]*namerProc{},
		cache: lru.New[entryKey, *Func](maxBytes)}
}

// Add registers pid's engine, replacing what was known of pid.
func (n *Namer) Add(pid int, in *Interp) error {
	mem, err := python.OpenMem(n.procfs, pid)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.forgetLocked(pid)
	n.procs[pid] = &namerProc{in: in, mem: mem, r: NewReader(mem, in.Layout)}
	return nil
}

// Forget drops pid and its functions (exit, exec).
func (n *Namer) Forget(pid int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.forgetLocked(pid)
}

// Close forgets every process, closing the memory files Add opened: the
// profiler's end. The Namer may be used again.
func (n *Namer) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for pid := range n.procs {
		n.forgetLocked(pid)
	}
}

func (n *Namer) forgetLocked(pid int) {
	p, ok := n.procs[pid]
	if !ok {
		return
	}
	_ = p.mem.Close() // read only
	delete(n.procs, pid)
	n.cache.RemoveIf(func(k entryKey) bool { return k.pid == pid })
}

// Known reports whether pid has a registered engine.
func (n *Namer) Known(pid int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.procs[pid]
	return ok
}

// Name names the frame the walker reported for pid: its kind (Kind*), the
// zend_function's address (a file name's for top-level code, CodeKind) and
// its word (the line in the high 32 bits, the check word in the low 32).
func (n *Namer) Name(pid int, kind uint8, fn, word uint64) (Frame, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.procs[pid]
	if !ok {
		n.stats.Unreadable++
		return Frame{}, fmt.Errorf("php frame of %d: process not known", pid)
	}
	check := uint32(word)
	f, err := n.funcLocked(p, entryKey{pid, fn, kind}, check)
	if err != nil && kind == KindFunction {
		// A closure's function is a copy in its Closure object, often
		// freed before its samples are named (usort's comparator); its
		// opcodes, which the check word witnesses, are its declaring
		// function's and outlive it: a closure read before with the
		// same opcodes names it.
		if c, ok := n.cache.Get(entryKey{pid, uint64(check), closureKind}); ok {
			f, err = c, nil
			n.stats.ByCode++
		}
	}
	if err != nil {
		if errors.Is(err, ErrStale) {
			n.stats.Stale++
		} else {
			n.stats.Unreadable++
		}
		return Frame{}, err
	}
	n.stats.Named++
	fr := Frame{Name: f.Name, File: f.File}
	if !f.Internal {
		fr.Line = int64(word >> 32)
		if fr.Line == 0 {
			n.stats.NoLine++
		}
	}
	return fr, nil
}

// funcLocked returns the function at k.addr whose check word is check,
// from the cache if memory still holds it, else read.
func (n *Namer) funcLocked(p *namerProc, k entryKey, check uint32) (*Func, error) {
	if f, ok := n.cache.Get(k); ok {
		// Memory that cannot be read any more (the process exited since
		// the sample, as it has for a short script's last second of
		// samples) cannot have changed since: the check word the walker
		// read at the sample is the witness that the cached function is
		// the sample's.
		same, readable := p.r.Same(f, k.addr)
		if !readable {
			if f.Check != check {
				// The sample's function was another, freed since.
				return nil, fmt.Errorf("php function at %#x: %w", k.addr, ErrStale)
			}
			n.stats.Gone++
			return f, nil
		}
		if same && f.Check == check {
			return f, nil
		}
		// Changed, or another function with the same first bytes there:
		// closures of one class share them, and one closure object's
		// memory is often the next one's. Read again.
		n.cache.Remove(k)
	}
	var f *Func
	var err error
	if CodeKind(k.kind) {
		f, err = p.r.Code(k.addr, k.kind)
	} else {
		f, err = p.r.Function(k.addr, k.kind)
	}
	if err != nil {
		return nil, err
	}
	// What memory holds now is kept, the sample's function or not; one
	// too large to keep is named all the same.
	n.cache.Put(k, f, f.memSize())
	if f.Closure {
		n.cache.Put(entryKey{k.pid, uint64(f.Check), closureKind}, f, f.memSize())
	}
	if f.Check != check {
		return nil, fmt.Errorf("php function at %#x: %w", k.addr, ErrStale)
	}
	return f, nil
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
