package python

import (
	"errors"
	"fmt"
)

// Bounds of a walk in user space.
const (
	maxThreads = 4096
	maxFrames  = 4096
)

// Frame is one Python frame as the walkers report it: its code object and
// its instruction (f_lasti, or the instruction pointer from 3.11 on).
type Frame struct {
	Code  uint64
	Instr uint64
	// Entry: the last frame of one run of the eval loop (3.11+), or every
	// frame on earlier versions, where each frame has its own run.
	Entry bool
}

// Thread is one thread's Python stack, leaf first.
type Thread struct {
	ID     uint64 // pthread_self(): the thread pointer (fsbase on x86-64)
	Frames []Frame
}

// errChain is wrapped by walk errors: a pointer chain that loops or runs
// past its bound.
var errChain = errors.New("frame chain too long")

// Threads walks every thread of the first interpreter in mem, the way the
// eBPF walker does. It reads a live process without stopping it, so a
// thread that runs meanwhile may show a stack that is a moment old.
func (in *Interp) Threads(mem Memory) ([]Thread, error) {
	r := NewReader(mem, in.Layout)
	l := &in.Layout
	is, err := r.u64(in.InterpHead)
	if err != nil {
		return nil, fmt.Errorf("interpreter head: %w", err)
	}
	ts, err := r.u64(is + uint64(l.InterpThreadsHead))
	if err != nil {
		return nil, fmt.Errorf("thread list: %w", err)
	}
	var out []Thread
	for i := 0; ts != 0; i++ {
		if i >= maxThreads {
			return out, errChain
		}
		id, err := r.u64(ts + uint64(l.ThreadID))
		if err != nil {
			return out, err
		}
		frames, err := in.stack(r, ts)
		out = append(out, Thread{ID: id, Frames: frames})
		if err != nil {
			return out, err
		}
		if ts, err = r.u64(ts + uint64(l.ThreadNext)); err != nil {
			return out, err
		}
	}
	return out, nil
}

// stack returns the frames of the thread state at ts, leaf first.
func (in *Interp) stack(r *Reader, ts uint64) ([]Frame, error) {
	l := &in.Layout
	f, err := r.u64(ts + uint64(l.ThreadFrame))
	if err != nil {
		return nil, err
	}
	if l.CFrameCurrent >= 0 && f != 0 {
		if f, err = r.u64(f + uint64(l.CFrameCurrent)); err != nil {
			return nil, err
		}
	}
	var out []Frame
	for f != 0 {
		if len(out) >= maxFrames {
			return out, errChain
		}
		fr, skip, err := in.frame(r, f)
		if err != nil {
			return out, err
		}
		if skip {
			if n := len(out); n > 0 {
				out[n-1].Entry = true
			}
		} else {
			out = append(out, fr)
		}
		if f, err = r.u64(f + uint64(l.FrameBack)); err != nil {
			return out, err
		}
	}
	return out, nil
}

// frame reads one frame; skip says it is a shim of the C stack (3.12+).
func (in *Interp) frame(r *Reader, f uint64) (Frame, bool, error) {
	l := &in.Layout
	var b [1]byte
	if l.FrameOwner >= 0 && l.OwnerShimFrom >= 0 {
		if err := r.mem.ReadAt(b[:], f+uint64(l.FrameOwner)); err != nil {
			return Frame{}, false, err
		}
		if int64(b[0]) >= l.OwnerShimFrom {
			return Frame{}, true, nil
		}
	}
	code, err := r.u64(f + uint64(l.FrameCode))
	if err != nil {
		return Frame{}, false, err
	}
	code &^= l.ExecutableMask
	instr, err := r.u64(f + uint64(l.FrameInstr))
	if err != nil {
		return Frame{}, false, err
	}
	fr := Frame{Code: code, Instr: instr, Entry: true}
	if !l.InstrIsPointer() {
		fr.Instr = uint64(uint32(instr)) // an int
	}
	if l.FrameIsEntry >= 0 {
		if err := r.mem.ReadAt(b[:], f+uint64(l.FrameIsEntry)); err != nil {
			return Frame{}, false, err
		}
		fr.Entry = b[0] != 0
	} else if l.OwnerShimFrom >= 0 {
		fr.Entry = false // the shim that follows marks the end of the run
	}
	return fr, false, nil
}
