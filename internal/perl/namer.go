package perl

import (
	"errors"
	"fmt"
	"sync"

	"github.com/sonde-dev/sonde/internal/lru"
	"github.com/sonde-dev/sonde/internal/python"
)

// DefaultCacheBytes bounds a Namer's subs unless told otherwise.
const DefaultCacheBytes = 4 << 20

// ErrStale is matched by the error for a frame whose sub or statement was
// freed or replaced since the sample (its check word differs): it is left
// unnamed rather than named after whatever took its place.
var ErrStale = errors.New("perl sub changed since the sample")

// NamerStats count what naming did.
type NamerStats struct {
	Named      uint64 // frames named
	Stale      uint64 // frames whose sub or statement changed since the sample
	Unreadable uint64 // frames whose sub could not be read or made no sense
	NoLine     uint64 // frames named without a line (the walker found none)
	Gone       uint64 // frames among Named from the cache where memory could not be read any more
	Evictions  uint64 // entries dropped from the cache to stay within its bound
	Bytes      int64  // bytes the cache holds now
	Entries    int    // entries it holds now
}

// Frame is one named Perl frame.
type Frame struct {
	Name string
	File string
	Line int64 // 0: unknown
}

// Namer names the Perl frames of the processes added to it. Subs and
// statements are read once per (process, address, kind) and kept within a
// byte bound, least recently used first out (counted in Stats). A cached
// entry is checked against the process's memory at each use (the bytes it
// was read from must be unchanged) and against the check word the walker
// read at the sample, so a sub freed and replaced at the same address is
// read again or reported stale, never misnamed; one whose memory cannot be
// read any more (its process exited), or the program's top-level code once
// freed, is named from the cache where the check word matches. It is safe for concurrent
// use; it owns the memory files Add opens and Forget closes them.
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

// NewNamer returns a Namer that reads memory under procfs and keeps at
// most maxBytes of subs (0: DefaultCacheBytes).
func NewNamer(procfs string, maxBytes int64) *Namer {
	if maxBytes <= 0 {
		maxBytes = DefaultCacheBytes
	}
	return &Namer{procfs: procfs, procs: map[int]*namerProc{},
		cache: lru.New[entryKey, *Func](maxBytes)}
}

// Add registers pid's interpreter, replacing what was known of pid.
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

// Forget drops pid and its entries (exit, exec).
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

// Known reports whether pid has a registered interpreter.
func (n *Namer) Known(pid int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.procs[pid]
	return ok
}

// Name names the frame the walker reported for pid: its kind (Kind*), its
// address (a sub's CV, else its statement's COP) and its word (the line in
// the high 32 bits, the check word in the low 32).
func (n *Namer) Name(pid int, kind uint8, addr, word uint64) (Frame, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.procs[pid]
	if !ok {
		n.stats.Unreadable++
		return Frame{}, fmt.Errorf("perl frame of %d: process not known", pid)
	}
	f, err := n.funcLocked(p, entryKey{pid, addr, kind}, uint32(word))
	if err != nil {
		if errors.Is(err, ErrStale) {
			n.stats.Stale++
		} else {
			n.stats.Unreadable++
		}
		return Frame{}, err
	}
	n.stats.Named++
	fr := Frame{Name: f.Name, File: f.File, Line: int64(word >> 32)}
	if fr.Line == 0 {
		n.stats.NoLine++
	}
	return fr, nil
}

// funcLocked returns the sub or statement at k.addr whose check word is
// check, from the cache if memory still holds it, else read.
func (n *Namer) funcLocked(p *namerProc, k entryKey, check uint32) (*Func, error) {
	if k.kind < KindSub || k.kind > KindMain {
		return nil, fmt.Errorf("perl frame kind %d: %w", k.kind, ErrNotSub)
	}
	if f, ok := n.cache.Get(k); ok {
		// Memory that cannot be read any more (the process exited since
		// the sample, which is common for its last samples) cannot have
		// changed since: the check word the walker read at the sample is
		// the witness that the cached object is the sample's.
		same, readable := p.r.same(f, k.addr, k.kind)
		// The program's top-level code is freed while the process
		// still runs (perl_destruct frees the main op tree first), and
		// its samples may be resolved after that: the check word the
		// walker read at the sample is the file's name pointer, so
		// where it is the cached one the sample ran the cached code.
		// Not so for eval and require, whose file names are built
		// anew, maybe where an earlier one was.
		mainFreed := k.kind == KindMain && f.Check == check
		if same || !readable || mainFreed {
			if f.Check != check {
				return nil, fmt.Errorf("perl frame at %#x: %w", k.addr, ErrStale)
			}
			if !readable {
				n.stats.Gone++
			}
			return f, nil
		}
		n.cache.Remove(k)
	}
	var f *Func
	var err error
	if k.kind == KindSub {
		f, err = p.r.Sub(k.addr)
	} else {
		f, err = p.r.Code(k.addr, k.kind)
	}
	if err != nil {
		return nil, err
	}
	if f.Check != check {
		return nil, fmt.Errorf("perl frame at %#x: %w", k.addr, ErrStale)
	}
	n.cache.Put(k, f, f.memSize())
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
