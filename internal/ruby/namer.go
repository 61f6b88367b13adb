package ruby

import (
	"errors"
	"fmt"
	"sync"

	"github.com/sonde-dev/sonde/internal/lru"
	"github.com/sonde-dev/sonde/internal/python"
)

// DefaultCacheBytes bounds a Namer's iseqs and class names (a quarter)
// unless told otherwise.
const DefaultCacheBytes = 4 << 20

// ErrStale is matched by the error for a frame whose iseq was freed or
// replaced since the sample (its pc is not one of the iseq's now): it is
// left unnamed rather than named after whatever took its place.
var ErrStale = errors.New("ruby iseq changed since the sample")

// NamerStats count what naming did.
type NamerStats struct {
	Named      uint64 // frames named
	Stale      uint64 // frames whose iseq changed since the sample
	Unreadable uint64 // frames whose iseq could not be read or made no sense
	NoLine     uint64 // frames named without a line
	NoClass    uint64 // method frames named without their class (anonymous, or unreadable)
	Evictions  uint64 // iseqs dropped from the cache to stay within its bound
	Bytes      int64  // bytes the cache holds now
	Entries    int    // iseqs it holds now
}

// Frame is one named Ruby frame.
type Frame struct {
	Name string
	File string
	Line int64 // 0: unknown
}

// Namer names the Ruby frames of the processes added to it. Iseqs are read
// once per (process, address) and kept within a byte bound, least recently
// used first out (counted in Stats). A cached iseq is checked against the
// process's memory at each use (its first words must be unchanged), and
// the sample's pc must be one of its instructions, so an iseq freed and
// replaced at the same address is read again or reported stale, never
// misnamed. It is safe for concurrent use; it owns the memory files Add
// opens and Forget closes them.
type Namer struct {
	mu     sync.Mutex
	procfs string
	procs  map[int]*namerProc
	cache  *lru.Cache[entryKey, *Iseq]
	owners *lru.Cache[entryKey, *Owner] // method entries' class names
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
}

// NewNamer returns a Namer that reads memory under procfs and keeps at
// most maxBytes of iseqs (0: DefaultCacheBytes).
func NewNamer(procfs string, maxBytes int64) *Namer {
	if maxBytes <= 0 {
		maxBytes = DefaultCacheBytes
	}
	return &Namer{procfs: procfs, procs: map[int]*namerProc{}, cache: lru.New[entryKey, *Iseq](maxBytes - maxBytes/4),
		owners: lru.New[entryKey, *Owner](maxBytes / 4)}
}

// Add registers pid's VM, replacing what was known of pid.
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

// Update replaces what is known of pid's VM (its class IDs may be found
// after it starts) and keeps its memory file and what is cached of it: the
// same process, prepared again because its mapped files changed. It
// reports false where pid is not known, to be added.
func (n *Namer) Update(pid int, in *Interp) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.procs[pid]
	if !ok {
		return false
	}
	p.in, p.r = in, NewReader(p.mem, in.Layout)
	return true
}

// Forget drops pid and its iseqs (exit, exec).
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
	n.owners.RemoveIf(func(k entryKey) bool { return k.pid == pid })
}

// Name names the frame the walker reported for pid: its kind (Kind*), its
// iseq's address and its word (Word: the pc's position, a check of the
// iseq's body and a method frame's method entry).
func (n *Namer) Name(pid int, kind uint8, iseq, word uint64) (Frame, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.procs[pid]
	if !ok || kind != KindIseq {
		n.stats.Unreadable++
		return Frame{}, fmt.Errorf("ruby frame of %d (kind %d): process not known", pid, kind)
	}
	pos, check, me := SplitWord(word, iseq)
	s, err := n.iseqLocked(p, entryKey{pid, iseq})
	switch {
	case err != nil:
	case check != bodyCheck(s.Body):
		// The sample's iseq was freed since and its object reused.
		err = fmt.Errorf("ruby iseq at %#x: body %#x, the sample's ends %#x: %w", iseq, s.Body, check, ErrStale)
	case pos != PosUnknown && pos > s.Words:
		err = fmt.Errorf("ruby iseq at %#x: position %d of %d: %w", iseq, pos, s.Words, ErrStale)
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
	fr := Frame{Name: s.Label, File: s.File}
	if pos != PosUnknown {
		fr.Line = p.r.LineAt(s, pos)
	}
	if fr.Line == 0 {
		n.stats.NoLine++
	}
	if me != 0 {
		if o, err := n.ownerLocked(p, entryKey{pid, me}); err == nil {
			fr.Name = o.Prefix + fr.Name
		} else {
			n.stats.NoClass++
		}
	}
	return fr, nil
}

// ownerLocked returns the owner of the method entry at k.addr, from the
// cache if memory still holds it, else read.
func (n *Namer) ownerLocked(p *namerProc, k entryKey) (*Owner, error) {
	if o, ok := n.owners.Get(k); ok {
		same, readable := p.r.sameOwner(o, k.addr)
		if same || !readable {
			return o, nil
		}
		n.owners.Remove(k)
	}
	o, err := p.r.Owner(k.addr, p.in.Classes)
	if err != nil {
		return nil, err
	}
	n.owners.Put(k, o, o.memSize())
	return o, nil
}

// iseqLocked returns the iseq at k.addr, from the cache if memory still
// holds it, else read.
func (n *Namer) iseqLocked(p *namerProc, k entryKey) (*Iseq, error) {
	if s, ok := n.cache.Get(k); ok {
		same, readable := p.r.same(s, k.addr)
		if same || !readable {
			// Unreadable: the process has exited since the sample; what
			// was read while it lived names its last samples.
			return s, nil
		}
		n.cache.Remove(k)
	}
	s, err := p.r.Iseq(k.addr)
	if err != nil {
		return nil, err
	}
	n.cache.Put(k, s, s.memSize())
	return s, nil
}

// Stats returns the counters and the cache's size.
func (n *Namer) Stats() NamerStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	s.Bytes = n.cache.Cost() + n.owners.Cost()
	s.Entries = n.cache.Len() + n.owners.Len()
	s.Evictions = n.cache.Evictions() + n.owners.Evictions()
	return s
}
