//go:build linux

package profiler

import (
	"container/list"
	"sync/atomic"
	"time"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/tracer"
)

// Bounds of the off-CPU join. A start waits for its end at most
// offCPUExpiryIntervals reporting intervals (and offCPUMinExpiry), as the
// kernel clock of later records tells: a thread blocked longer (an idle
// worker, a daemon's accept) is dropped, so a host full of sleeping threads
// does not pin their stacks in memory.
const (
	maxPendingOffCPU      = 4096    // start records waiting for their end
	maxPendingOffCPUFrame = 1 << 17 // frames they hold, about 7 MiB at most
	offCPUExpiryIntervals = 3
	offCPUMinExpiry       = 10 * time.Second
)

// offCPUKey names one wait: the thread and the kernel time it left the CPU,
// which its start and end records both carry.
type offCPUKey struct {
	tid   uint32
	start uint64 // bpf_ktime_get_ns
}

// pendingOffCPU is a resolved start record waiting for its end. It owns its
// frames and its copy of the resource.
type pendingOffCPU struct {
	key      offCPUKey
	sample   profile.Sample
	resource profile.Resource
}

// offCPUJoin pairs off-CPU start records (a stack, resolved when it arrives,
// like an on-CPU sample) with their end records (how long the wait took),
// matched by (tid, start ktime). Starts wait in a table bounded in entries
// and frames; the oldest go first when it is full, and any older than
// maxAge (by the kernel clock the records carry) when a newer record
// arrives. Every start and end that does not make a sample is counted.
//
// Its methods are called from the resolver goroutine only; stats may be read
// from any goroutine.
type offCPUJoin struct {
	maxPending int
	maxFrames  int
	maxAge     uint64 // nanoseconds

	pending map[offCPUKey]*list.Element
	order   list.List // of *pendingOffCPU, oldest start first
	frames  int       // held by pending starts
	spare   []*pendingOffCPU

	stats offCPUStats
}

// offCPUStats count what the join did; they only grow.
type offCPUStats struct {
	samples    atomic.Uint64 // waits that became off-CPU samples
	short      atomic.Uint64 // waits shorter than off_cpu_min_duration, dropped
	expired    atomic.Uint64 // starts whose end did not come within maxAge
	evicted    atomic.Uint64 // starts dropped because the table was full
	orphanEnds atomic.Uint64 // ends whose start never arrived (lost, expired or evicted)
	duplicates atomic.Uint64 // starts with a key already pending (the older one is dropped)
}

func newOffCPUJoin(maxPending, maxFrames int, maxAge time.Duration) *offCPUJoin {
	return &offCPUJoin{
		maxPending: maxPending,
		maxFrames:  maxFrames,
		maxAge:     uint64(maxAge.Nanoseconds()),
		pending:    make(map[offCPUKey]*list.Element),
	}
}

// offCPUExpiry is how long a start waits for its end with this reporting
// interval.
func offCPUExpiry(reporterInterval time.Duration) time.Duration {
	return max(offCPUExpiryIntervals*reporterInterval, offCPUMinExpiry)
}

// start keeps a copy of s (its frames and resource) as the start of wait k.
func (j *offCPUJoin) start(k offCPUKey, s *profile.Sample) {
	j.expire(k.start, &j.stats.expired)
	if e, ok := j.pending[k]; ok {
		j.stats.duplicates.Add(1)
		j.remove(e)
	}
	for j.order.Len() > 0 && (j.order.Len() >= j.maxPending || j.frames+len(s.Frames) > j.maxFrames) {
		j.stats.evicted.Add(1)
		j.remove(j.order.Front())
	}
	if len(s.Frames) > j.maxFrames {
		j.stats.evicted.Add(1)
		return
	}
	p := j.newPending()
	p.key = k
	frames := append(p.sample.Frames[:0], s.Frames...)
	p.sample = *s
	p.sample.Frames = frames
	if s.Resource != nil {
		p.resource = *s.Resource
		p.sample.Resource = &p.resource
	}
	j.frames += len(frames)
	j.pending[k] = j.order.PushBack(p)
}

// end closes wait k, which lasted d; short says it was shorter than the
// minimum duration. When its start is pending and the wait counts, add gets
// the off-CPU sample, valued at d and timed when the wait ended; add must not
// keep it (the builder copies what it keeps).
func (j *offCPUJoin) end(k offCPUKey, d time.Duration, short bool, add func(profile.Sample)) {
	// Its own start is matched before older ones expire: a long wait that
	// ended while its start was still here is reported.
	defer j.expire(k.start+uint64(d), &j.stats.expired)
	e, ok := j.pending[k]
	switch {
	case short:
		// Whether its start is here or was lost, nothing is missing.
		j.stats.short.Add(1)
	case !ok:
		j.stats.orphanEnds.Add(1)
	default:
		s := e.Value.(*pendingOffCPU).sample
		s.Kind = profile.OffCPU
		s.Value = d.Nanoseconds()
		s.Time = s.Time.Add(d)
		add(s)
		j.stats.samples.Add(1)
	}
	if ok {
		j.remove(e)
	}
}

// expire drops the starts that left the CPU more than maxAge before now
// (kernel time), counting them in counter.
func (j *offCPUJoin) expire(now uint64, counter *atomic.Uint64) {
	if now < j.maxAge {
		return
	}
	cutoff := now - j.maxAge
	for j.order.Len() > 0 {
		e := j.order.Front()
		if e.Value.(*pendingOffCPU).key.start >= cutoff {
			return
		}
		counter.Add(1)
		j.remove(e)
	}
}

// Len is how many starts are waiting.
func (j *offCPUJoin) Len() int { return j.order.Len() }

func (j *offCPUJoin) remove(e *list.Element) {
	p := e.Value.(*pendingOffCPU)
	j.order.Remove(e)
	delete(j.pending, p.key)
	j.frames -= len(p.sample.Frames)
	clear(p.sample.Frames) // let the names and mappings go
	p.sample = profile.Sample{Frames: p.sample.Frames[:0]}
	p.resource = profile.Resource{}
	if len(j.spare) < 64 {
		j.spare = append(j.spare, p)
	}
}

func (j *offCPUJoin) newPending() *pendingOffCPU {
	if n := len(j.spare); n > 0 {
		p := j.spare[n-1]
		j.spare = j.spare[:n-1]
		return p
	}
	return &pendingOffCPU{}
}

// offCPUStart resolves an off-CPU start record into s exactly as an on-CPU
// sample is resolved, then drops the kernel frames above __schedule: the
// tracing machinery (the eBPF program, bpf_trace_run) the stack was taken
// from, not where the thread waits.
func (r *resolver) offCPUStart(rec *tracer.Record, p *process.Process, err error, s *profile.Sample) {
	r.resolveProc(rec, p, err, s)
	s.Kind = profile.OffCPU
	s.Value = 0
	s.Frames = fromScheduler(s.Frames)
}

// fromScheduler returns frames from the first leading kernel frame named
// __schedule on, or frames unchanged when none is (kernel symbols missing).
func fromScheduler(frames []profile.Frame) []profile.Frame {
	for i, f := range frames {
		if f.Type != profile.FrameKernel {
			break
		}
		if len(f.Lines) > 0 && f.Lines[0].Function == "__schedule" {
			return frames[i:]
		}
	}
	return frames
}
