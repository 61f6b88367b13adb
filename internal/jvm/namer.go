package jvm

import (
	"fmt"
	"sync"
)

// NamerStats count what naming did.
type NamerStats struct {
	Named      uint64 // frames named
	Stale      uint64 // frames whose code or method changed since the sample
	Unreadable uint64 // frames whose memory could not be read or made no sense
	Evictions  uint64 // cache entries dropped to stay within the bound
	Bytes      int64  // bytes the cache holds now
	Entries    int    // entries it holds now
}

// Namer names the JVM frames of the processes added to it. Its cache of
// methods and code is bounded by maxBytes. It is safe for concurrent use.
type Namer struct {
	mu       sync.Mutex
	procfs   string
	maxBytes int64
	stats    NamerStats
}

// NewNamer returns a Namer reading processes under procfs ("/proc").
func NewNamer(procfs string, maxBytes int64) *Namer {
	return &Namer{procfs: procfs, maxBytes: maxBytes}
}

// Add opens pid's memory (kept open until Forget) to name its frames.
func (n *Namer) Add(pid int, vm *VM) error { return nil }

// Forget closes pid's memory and drops what the cache holds of it.
func (n *Namer) Forget(pid int) {}

// Frame names one frame. returnAddr says the frame's pc is a return
// address (a caller frame), not the interrupted pc of the leaf.
func (n *Namer) Frame(pid int, kind FrameKind, addr, word uint64, returnAddr bool) (Frame, error) {
	return Frame{}, fmt.Errorf("jvm frame: %w", ErrUnreadable)
}

// Stats returns the counters and the cache's size.
func (n *Namer) Stats() NamerStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}
