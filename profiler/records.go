//go:build linux

package profiler

import (
	"sync"

	"github.com/sonde-dev/sonde/tracer"
)

// recordPool lends out at most n records, the one given back last first.
// Each record keeps the buffers of the deepest stack it has held, so the
// order matters: lent in turn (a FIFO), all n would grow to hold deep
// stacks; lent last-in first-out, only as many as are ever in flight at
// once do, and the rest are never made.
type recordPool struct {
	slots chan struct{} // one for each record that may be lent out
	mu    sync.Mutex
	idle  []*tracer.Record // given back, the last one on top
}

func newRecordPool(n int) *recordPool {
	p := &recordPool{slots: make(chan struct{}, n)}
	for range n {
		p.slots <- struct{}{}
	}
	return p
}

// get lends out a record, waiting while all n are out.
func (p *recordPool) get() *tracer.Record {
	<-p.slots
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle); n > 0 {
		r := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		return r
	}
	return new(tracer.Record)
}

// put gives a record back.
func (p *recordPool) put(r *tracer.Record) {
	p.mu.Lock()
	p.idle = append(p.idle, r)
	p.mu.Unlock()
	p.slots <- struct{}{}
}
