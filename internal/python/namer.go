package python

import (
	"fmt"
	"sync"
)

// DefaultCacheBytes bounds a Namer's code objects unless told otherwise.
const DefaultCacheBytes = 8 << 20

// Namer names Python frames of the processes it was told about. Code
// objects are read once per (process, address) and kept within a byte
// bound; a full cache is emptied (counted in Stats), not grown. It is safe
// for concurrent use.
type Namer struct {
	mu       sync.Mutex
	procfs   string
	maxBytes int64
	bytes    int64
	procs    map[int]*namerProc
	codes    map[codeKey]*Code
	stats    NamerStats
}

// NamerStats count what naming did.
type NamerStats struct {
	Named  uint64 // frames named
	Failed uint64 // frames whose code object could not be read
	Resets uint64 // times the cache was emptied to stay within its bound
	Bytes  int64  // bytes the cache holds now
	Codes  int    // code objects it holds now
}

type codeKey struct {
	pid  int
	addr uint64
}

type namerProc struct {
	in  *Interp
	mem *ProcMem
	r   *Reader
}

// NewNamer returns a Namer that reads memory under procfs and keeps at
// most maxBytes of code objects (0: DefaultCacheBytes).
func NewNamer(procfs string, maxBytes int64) *Namer {
	if maxBytes <= 0 {
		maxBytes = DefaultCacheBytes
	}
	return &Namer{procfs: procfs, maxBytes: maxBytes, procs: map[int]*namerProc{}, codes: map[codeKey]*Code{}}
}

// Add registers pid's interpreter, replacing what was known of pid.
func (n *Namer) Add(pid int, in *Interp) error {
	mem, err := OpenMem(n.procfs, pid)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.forgetLocked(pid)
	n.procs[pid] = &namerProc{in: in, mem: mem, r: NewReader(mem, in.Layout)}
	return nil
}

// Forget drops pid and its code objects (exit, exec).
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
	for k, c := range n.codes {
		if k.pid == pid {
			n.bytes -= c.size
			delete(n.codes, k)
		}
	}
}

// Known reports whether pid has a registered interpreter.
func (n *Namer) Known(pid int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.procs[pid]
	return ok
}

// Name returns the qualified name, file and line of the frame (code,
// instr) that the eBPF walker reported for pid.
func (n *Namer) Name(pid int, code, instr uint64) (name, file string, line int64, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := n.codeLocked(pid, code)
	if err != nil {
		n.stats.Failed++
		return "", "", 0, err
	}
	n.stats.Named++
	return c.Name, c.File, c.Line(instr), nil
}

func (n *Namer) codeLocked(pid int, addr uint64) (*Code, error) {
	k := codeKey{pid, addr}
	if c, ok := n.codes[k]; ok {
		return c, nil
	}
	p, ok := n.procs[pid]
	if !ok {
		return nil, fmt.Errorf("python frame of %d: process not known", pid)
	}
	c, err := p.r.Code(addr)
	if err != nil {
		return nil, err
	}
	if c.size > n.maxBytes {
		return c, nil // named, but too large to keep
	}
	if n.bytes+c.size > n.maxBytes {
		clear(n.codes)
		n.bytes = 0
		n.stats.Resets++
	}
	n.codes[k] = c
	n.bytes += c.size
	return c, nil
}

// Stats returns the counters and the cache's size.
func (n *Namer) Stats() NamerStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.stats
	s.Bytes = n.bytes
	s.Codes = len(n.codes)
	return s
}
