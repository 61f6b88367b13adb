//go:build linux

package profiler

import (
	"time"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/tracer"
)

// A stack seen before in its interval costs a lookup and a count. The
// resolver's result for a sample record is a function of the record's
// frame words and flags and of the process entry that names them, unless
// resolution met something that may come out otherwise later (a refresh
// that read new maps, a handle not known yet, a failed lookup, an exiting
// process: resolver.unstable); a repeat of frames named through the maps
// makes the refresh resolving would (sameMaps). So a sample whose process entry is
// the one its record was read with is keyed by the entry's generation
// (unique among all entries: a new image, a refresh or a reused pid makes a
// new one), the pid, the flags and every frame word; the interval's builder
// keeps, per key, the resource and stack the first such sample resolved to,
// and adds the next ones by key (profile.Builder.AddKnown) without
// resolving them. The thread, CPU and time of each sample are its own.

// Bits of a user frame's first key word: its PC below, its flags above.
const (
	keyFlagsShift = 61
	keyPCBits     = 48 // a runtime frame's address; its runtime and kind above
)

// stackKey returns the key of rec, of process proc as read with rec (procErr
// when it could not be), in words the resolver reuses; ok is false when rec
// cannot be keyed: its process is not the one of the resolver's current
// entry for its pid (none yet, another image, gone, exiting), or it carries
// a stack snapshot.
func (r *resolver) stackKey(rec *tracer.Record, proc *process.Process, procErr error) (key []uint64, ok bool) {
	if procErr != nil || proc == nil || rec.Snapshot != nil || rec.Flags&tracer.FlagSnapshot != 0 {
		return nil, false
	}
	pid := int(rec.PID)
	e := r.procsByPID[pid]
	if e == nil || e.proc != proc {
		return nil, false
	}
	if _, exiting := r.exited[pid]; exiting {
		return nil, false
	}
	if len(rec.UserFlags) != len(rec.User) || len(rec.UserFiles) != len(rec.User) {
		return nil, false
	}
	n := 3 + len(rec.Kernel) + 2*len(rec.User)
	if cap(r.key) < n {
		r.key = make([]uint64, n, n+n/2)
	}
	key = r.key[:n]
	key[0] = uint64(rec.PID) | uint64(len(rec.Kernel))<<32
	key[1] = e.gen
	key[2] = uint64(rec.Flags) | uint64(len(rec.User))<<32
	copy(key[3:], rec.Kernel)
	words := key[3+len(rec.Kernel):]
	flags, files := rec.UserFlags[:len(rec.User)], rec.UserFiles[:len(rec.User)]
	for i, pc := range rec.User {
		f, ref := uint64(flags[i]), files[i]
		if f>>(64-keyFlagsShift) != 0 || pc>>keyFlagsShift != 0 {
			return nil, false
		}
		w := words[2*i : 2*i+2 : 2*i+2]
		if flags[i]&tracer.FrameRuntime != 0 {
			// Its runtime and kind, and its whole second word.
			if pc>>keyPCBits != 0 || ref.File>>8 != 0 {
				return nil, false
			}
			w[0], w[1] = pc|uint64(ref.File)<<keyPCBits|f<<keyFlagsShift, ref.Offset
			continue
		}
		if ref.Offset>>32 != 0 {
			return nil, false
		}
		w[0], w[1] = pc|f<<keyFlagsShift, uint64(ref.File)<<32|ref.Offset
	}
	return key, true
}

// Bits of the aux word a key's entry keeps: what resolving the sample
// counted per sample, to count again at each repeat (auxTruncated), and
// whether it named file-backed frames through the process's maps
// (auxUnhandled: resolver.unhandled).
const (
	auxTruncated = 1 << iota
	auxUnhandled
)

// sameMaps reports whether a repeat of rec, whose key's first sample named
// file-backed frames through the maps of proc, would be named with proc's
// maps now. Resolving it would refresh them first once the process is
// prepared (a frame the unwinder could not place may say they changed):
// this makes that same, rate-limited, refresh, and reports whether it
// left the process as it was.
func (r *resolver) sameMaps(rec *tracer.Record, proc *process.Process) bool {
	pid := int(rec.PID)
	if r.unwinder == nil || !r.unwinder.Prepared(pid) {
		return true
	}
	p, err := r.procs.RefreshSince(pid, rec.Time)
	return err == nil && p == proc
}

// repeat counts again, for a sample added by its key, what resolving it
// counted: the [truncated] frame.
func (r *resolver) repeat(aux uint32) {
	if aux&auxTruncated != 0 {
		r.stats.truncated.Add(1)
	}
}

// addSample resolves an on-CPU sample record of proc, as read with it
// (procErr: why there was none), and adds it to the interval of its capture
// time; sample is scratch space. A sample whose key its interval holds is
// added by key, unresolved.
func (p *Profiler) addSample(rec *tracer.Record, proc *process.Process, procErr error, sample *profile.Sample) {
	c, fp := classifyStack(rec.Flags, len(rec.User))
	key, keyed := p.resolver.stackKey(rec, proc, procErr)
	if keyed && p.addKnown(rec, proc, key, c, fp) {
		return
	}
	truncated := p.resolver.stats.truncated.Load()
	p.resolver.resolveProc(rec, proc, procErr, sample)
	var aux uint32
	if p.resolver.stats.truncated.Load() != truncated {
		aux |= auxTruncated
	}
	if p.resolver.unhandled {
		aux |= auxUnhandled
	}
	if p.resolver.unstable {
		keyed = false
	} else {
		// The entry resolveProc used for proc: the one the key names.
		key, keyed = p.resolver.stackKey(rec, proc, procErr)
	}
	p.mu.Lock()
	b := p.intervalFor(sample.Time)
	n := b.Len()
	if keyed {
		if !b.AddKeyed(key, aux, *sample) && b.Len() > n {
			p.unkeyed++
		}
	} else {
		b.Add(*sample)
	}
	tell := p.added(b, n, c, fp)
	p.mu.Unlock()
	if tell {
		p.logBacklog(false)
	}
}

// addKnown adds rec by its key if its interval holds the key, and reports
// whether it did.
func (p *Profiler) addKnown(rec *tracer.Record, proc *process.Process, key []uint64, c StackOutcome, fp bool) bool {
	p.mu.Lock()
	b, k, ok := p.known(rec.Time, key)
	if ok && k.Aux&auxUnhandled != 0 {
		// The refresh may read /proc: not under p.mu.
		p.mu.Unlock()
		same := p.resolver.sameMaps(rec, proc)
		p.mu.Lock()
		if b, k, ok = p.known(rec.Time, key); !same {
			ok = false
		}
	}
	if !ok {
		p.mu.Unlock()
		return false
	}
	n := b.Len()
	b.AddKnown(k, profile.Sample{Kind: profile.OnCPU, TID: int64(rec.TID), ThreadName: rec.Comm,
		CPU: int64(rec.CPU), Time: rec.Time, Value: 1})
	p.repeated++
	tell := p.added(b, n, c, fp)
	p.mu.Unlock()
	p.resolver.repeat(k.Aux)
	if tell {
		p.logBacklog(false)
	}
	return true
}

// known looks key up in the open interval of capture time t. Called with
// p.mu held.
func (p *Profiler) known(t time.Time, key []uint64) (*profile.Builder, profile.Known, bool) {
	b := p.openInterval(t)
	if b == nil {
		return nil, profile.Known{}, false
	}
	k, ok := b.Known(key)
	return b, k, ok
}

// added counts a sample given to b, which held n events before, and drops
// the oldest intervals if the backlog is too big; it reports whether that
// is to be logged. Called with p.mu held.
func (p *Profiler) added(b *profile.Builder, n int, c StackOutcome, fp bool) bool {
	p.samples++
	p.stacks[c][b2i(fp)]++
	if b.Len() == n {
		p.intervalFull++
	}
	p.pending += b.Len() - n
	p.trimBacklog()
	return p.backlogUntold
}

// openInterval returns the builder of the open interval that holds
// capture time t, or nil when there is none or t is late: intervalFor
// without its side effects. Called with p.mu held.
func (p *Profiler) openInterval(t time.Time) *profile.Builder {
	if t.Before(p.closedEnd) {
		return nil
	}
	every := p.opts.ReporterInterval
	start := p.t0.Add(t.Sub(p.t0) / every * every)
	for _, iv := range p.open {
		if iv.start.Equal(start) {
			return iv.b
		}
	}
	return nil
}
