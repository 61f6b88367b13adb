//go:build linux

package profiler

import (
	"testing"

	"github.com/sonde-dev/sonde/tracer"
)

// A pipeline that keeps a few records in flight uses those few again and
// again, however many the pool may lend: the others, never made, hold no
// buffers.
func TestRecordPoolReusesTheRecordsInFlight(t *testing.T) {
	p := newRecordPool(256)
	seen := map[*tracer.Record]bool{}
	for range 100 {
		var out []*tracer.Record
		for range 10 {
			r := p.get()
			seen[r] = true
			out = append(out, r)
		}
		for _, r := range out {
			p.put(r)
		}
	}
	if len(seen) != 10 {
		t.Errorf("%d distinct records lent with at most 10 out at once, want 10", len(seen))
	}
}

// The pool lends out no more than its size: once all are out, the next
// get waits for a put, and gets the record put.
func TestRecordPoolBound(t *testing.T) {
	p := newRecordPool(3)
	out := []*tracer.Record{p.get(), p.get(), p.get()}
	if len(p.slots) != 0 {
		t.Fatalf("%d slots left with all 3 records out", len(p.slots))
	}
	got := make(chan *tracer.Record)
	go func() { got <- p.get() }()
	p.put(out[1])
	// Had it not waited, it would have made a new record.
	if r := <-got; r != out[1] {
		t.Errorf("the fourth get received %p, want the record given back, %p", r, out[1])
	}
}
