//go:build linux

package profiler

import (
	"errors"
	"slices"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/unwind"
	"github.com/sonde-dev/sonde/tracer"
)

// Stack snapshots. Until a file's unwind table is built and loaded (a
// program just started, a library just loaded, a table the budget refused)
// the eBPF unwinder can only follow frame pointers through it, which most
// native code lacks: the stack would end at its first frame there. Instead
// the sample carries a copy of the stack from that frame on
// (tracer.Snapshot), and the resolver unwinds the rest here, with the rows
// the table will hold, read from the file at each PC (unwind.Finder). A
// sample taken a millisecond after its program started is then as whole as
// one taken a minute later.

// unfinishedWant is how much a walk that ran out of the snapshot's copy
// of the stack counts toward the demand for its files' tables.
const unfinishedWant = 16

// maxFinders bounds the files the resolver keeps a Finder of: each holds a
// mapping of its file (address space; its pages are dropped every
// interval) and the CIEs it has read.
const maxFinders = 32

// finderEntry is the Finder of one file, or why there is none.
type finderEntry struct {
	fd   *unwind.Finder
	err  error
	used uint64 // the resolver's tick at its last use
}

// snapshotWalk unwinds rec's user stack on from its snapshot, in process p
// (the table's, when rec was read; err: it was gone), in place of the
// frames the eBPF side found by frame pointers from there on. It returns
// the process as it is now, after a refresh of its mappings if the walk
// needed one.
//
// With checkSnapshots (tests), a snapshot taken at a stack's first frame
// is unwound the same way and compared with what the eBPF side found with
// its tables, and the eBPF side's frames stay.
func (r *resolver) snapshotWalk(rec *tracer.Record, p *process.Process, err error) *process.Process {
	snap := rec.Snapshot
	if snap == nil {
		r.wantTable(rec)
		return p
	}
	r.stats.snapshots.Add(1)
	if err != nil {
		return p
	}
	r.finderMu.Lock()
	defer r.finderMu.Unlock()
	pid := int(rec.PID)
	refreshed := false
	mappingAt := func(addr uint64) (process.Mapping, bool) {
		m, ok := p.FindMapping(addr)
		if !ok && !refreshed {
			// Mapped after the process was read: a new program's
			// libraries, a library just loaded.
			refreshed = true
			if np, err := r.procs.Refresh(pid); err == nil {
				p = np
				m, ok = p.FindMapping(addr)
			}
		}
		return m, ok
	}
	entry := r.entry(pid, p)

	r.snapPCs = append(r.snapPCs[:0], rec.User[:snap.Frame]...)
	r.snapFlags = append(r.snapFlags[:0], rec.UserFlags[:snap.Frame]...)
	r.snapFiles = append(r.snapFiles[:0], rec.UserFiles[:snap.Frame]...)
	stack := unwind.Stack{SP: snap.SP, Bytes: snap.Stack, SP2: snap.SP2, Bytes2: snap.Stack2}
	regs := unwind.Regs{PC: rec.User[snap.Frame], SP: snap.SP, FP: snap.FP, LR: snap.LR, Return: !snap.Interrupted}
	// The snapshot's frame was found as the eBPF side found it (by frame
	// pointers, where it came after a frame without a table); its callers
	// as the walk finds them.
	how := rec.UserFlags[snap.Frame] & tracer.FrameFromFramePointer
	end := unwind.StepNoCaller
	r.snapWanted = r.snapWanted[:0]
	r.snapWants = r.snapWants[:0]
	for len(r.snapPCs) < tracer.MaxUserFrames && regs.PC != 0 {
		f := how
		if !regs.Return {
			f |= tracer.FrameInterrupted
		}
		r.snapPCs = append(r.snapPCs, regs.PC)
		r.snapFlags = append(r.snapFlags, f)
		r.snapFiles = append(r.snapFiles, tracer.FileRef{})
		var row tracer.Row
		have := false
		if m, ok := mappingAt(regs.Lookup()); ok && m.FileBacked() {
			if entry.proc != p {
				entry = r.entry(pid, p)
			}
			if fd, id := r.finder(entry, m); fd != nil {
				row, have = fd.Row(m.FileOffset(regs.Lookup()))
				if i := slices.Index(r.snapWanted, id); i >= 0 {
					r.snapWants[i]++
				} else {
					r.snapWanted = append(r.snapWanted, id)
					r.snapWants = append(r.snapWants, 1)
				}
			}
		}
		next, res := unwind.Step(regs, row, have, stack)
		if !res.More() {
			end = res
			break
		}
		how = 0
		if res == unwind.StepFramePointer {
			how = tracer.FrameFromFramePointer
		}
		regs = next
	}
	// Each file whose rows the walk read is wanted once more per frame
	// walked in it: a file sampled often gets its table, and its stacks
	// are unwound in the kernel again (unwind.LoaderOptions.Demand). A
	// walk the snapshot could not finish (a stack deeper than its copy, a
	// switch to a stack it does not hold) wants them unfinishedWant times
	// as much: the kernel, which reads the live stack, would have.
	if r.unwinder != nil {
		k := 1
		if end == unwind.StepUnreadable {
			k = unfinishedWant
		}
		for i, id := range r.snapWanted {
			r.unwinder.Want(id, k*r.snapWants[i])
		}
	}
	if r.checkSnapshots && snap.Frame == 0 {
		r.compareSnapshot(rec, end)
		return p
	}
	if end == unwind.StepUnreadable && r.spliceFramePointers(rec, regs) {
		return p
	}
	flags := rec.Flags &^ (tracer.FlagUserComplete | tracer.FlagUserTruncated | tracer.FlagFramePointers |
		tracer.FlagUnknownRule | tracer.FlagUserReadErr)
	switch {
	case end == unwind.StepComplete:
		flags |= tracer.FlagUserComplete
		r.stats.snapshotsWhole.Add(1)
	case end == unwind.StepUnknownRule:
		flags |= tracer.FlagUnknownRule
	case end == unwind.StepUnreadable:
		flags |= tracer.FlagUserReadErr
	case len(r.snapPCs) >= tracer.MaxUserFrames:
		flags |= tracer.FlagUserTruncated
	}
	if slices.ContainsFunc(r.snapFlags, func(f tracer.FrameFlags) bool { return f&tracer.FrameFromFramePointer != 0 }) {
		flags |= tracer.FlagFramePointers
	}
	rec.Flags = flags
	rec.User, rec.UserFlags, rec.UserFiles = r.snapPCs, r.snapFlags, r.snapFiles
	return p
}

// wantTable counts toward the demand for its table the file in which the
// eBPF side, for want of a table, went on by frame pointers, or stopped, in
// a stack without a snapshot: an off-CPU stack (the off-CPU path takes
// none), or a sample whose snapshot was skipped (the ring buffer was half
// full). That stack was cut short there, as a walk that ran out of its
// snapshot would have been, and counts as much (unfinishedWant). Want
// ignores files whose table is not lazy.
func (r *resolver) wantTable(rec *tracer.Record) {
	if r.unwinder == nil || rec.Flags&tracer.FlagUserComplete != 0 {
		return
	}
	for i := range rec.User {
		if i+1 < len(rec.User) && rec.UserFlags[i+1]&tracer.FrameFromFramePointer == 0 {
			continue
		}
		if h := rec.UserFiles[i].File; h != 0 && rec.UserFlags[i]&tracer.FrameRuntime == 0 {
			if id, ok := r.unwinder.File(h); ok {
				r.unwinder.Want(id, unfinishedWant)
			}
		}
		return
	}
}

// spliceFramePointers finishes a walk that left the snapshot's copy of the
// stack (at the frame with registers last, the walk's last) with the
// frames the eBPF side found by frame pointers after the snapshot's frame,
// where those are the callers the walk was about to find: a switch to
// another stack (a cgo call's system stack, a signal stack) leaves the copy
// behind, and the frame-pointer chain crosses it. They are when the last
// frame still has the snapshot's frame pointer (the frames in between kept
// RBP), so the eBPF side's first frame-pointer step read the same link; or
// when the eBPF side's frames hold the last frame and its callee, both by
// PC, so its chain passed through the same frame. It reports whether it
// spliced.
func (r *resolver) spliceFramePointers(rec *tracer.Record, last unwind.Regs) bool {
	snap := rec.Snapshot
	e := rec.User[snap.Frame:]
	if len(e) < 2 || rec.UserFlags[snap.Frame+1]&tracer.FrameFromFramePointer == 0 {
		return false
	}
	at := -1 // the eBPF side's frame (in e) whose callers follow
	n := len(r.snapPCs)
	if last.FP == snap.FP {
		at = 0
	} else if n-2 >= snap.Frame {
		for j := 1; j < len(e); j++ {
			if e[j] == last.PC && e[j-1] == r.snapPCs[n-2] {
				at = j
				break
			}
		}
	}
	if at < 0 || at+1 >= len(e) {
		return false
	}
	from := snap.Frame + at + 1
	tail := min(len(rec.User)-from, tracer.MaxUserFrames-n)
	r.snapPCs = append(r.snapPCs, rec.User[from:from+tail]...)
	r.snapFlags = append(r.snapFlags, rec.UserFlags[from:from+tail]...)
	r.snapFiles = append(r.snapFiles, rec.UserFiles[from:from+tail]...)
	// The tail ended as the eBPF side's walk did.
	rec.Flags |= tracer.FlagFramePointers
	rec.User, rec.UserFlags, rec.UserFiles = r.snapPCs, r.snapFlags, r.snapFiles
	r.stats.snapshotsSpliced.Add(1)
	return true
}

// compareSnapshot compares the stack the walk from rec's snapshot found
// (r.snapPCs, ended by end) with rec's own, which the eBPF side unwound
// with its tables: where that one reached the root by table rows alone,
// the walk must find the same frames, and the root too unless the stack
// went past the snapshot's copy.
func (r *resolver) compareSnapshot(rec *tracer.Record, end unwind.StepResult) {
	if rec.Flags&tracer.FlagUserComplete == 0 || rec.Flags&tracer.FlagFramePointers != 0 {
		return
	}
	r.stats.snapshotsCompared.Add(1)
	n := min(len(r.snapPCs), len(rec.User))
	same := slices.Equal(r.snapPCs[:n], rec.User[:n])
	switch end {
	case unwind.StepComplete:
		same = same && len(r.snapPCs) == len(rec.User)
	case unwind.StepUnreadable:
	default:
		same = false
	}
	if !same {
		if r.stats.snapshotsDiffer.Add(1) <= 5 {
			r.log.Warn("a stack unwound from its snapshot differs from the kernel's",
				zap.Uint32("pid", rec.PID), zap.Uint64s("snapshot", r.snapPCs), zap.Uint64s("kernel", rec.User),
				zap.Uint8("end", uint8(end)))
		}
	}
}

// finder returns the Finder of the file behind m in entry's process and
// the file's id, or a nil Finder when it has none (no CFI, unreadable):
// opened once per file, through the descriptor the resolver holds it open
// by.
func (r *resolver) finder(entry *procEntry, m process.Mapping) (*unwind.Finder, elfx.FileID) {
	fe := r.file(entry, m)
	if fe.err != nil || fe.info == nil {
		return nil, elfx.FileID{}
	}
	r.tick++
	if e, ok := r.finders[fe.info.ID]; ok {
		e.used = r.tick
		return e.fd, fe.info.ID
	}
	e := &finderEntry{used: r.tick}
	if f := fe.handle.File(); f != nil {
		e.fd, e.err = unwind.NewFinderFile(f, fe.info.Path, r.debugDirs, r.log)
	} else {
		e.err = errors.New("not held open")
	}
	if e.err != nil && !errors.Is(e.err, unwind.ErrNoCFI) {
		r.logOnce("cannot read a file's unwind information for a stack snapshot", zap.String("file", m.Path), zap.Error(e.err))
	}
	if len(r.finders) >= maxFinders {
		r.evictFinder()
	}
	r.finders[fe.info.ID] = e
	return e.fd, fe.info.ID
}

// evictFinder drops the least recently used Finder.
func (r *resolver) evictFinder() {
	var oldest elfx.FileID
	var at uint64
	first := true
	for id, e := range r.finders {
		if first || e.used < at {
			oldest, at, first = id, e.used, false
		}
	}
	if e, ok := r.finders[oldest]; ok {
		e.fd.Close()
		delete(r.finders, oldest)
	}
}

// dropFinderPages lets go of the pages the Finders read since the last
// call (a Finder not read since costs nothing).
func (r *resolver) dropFinderPages() {
	r.finderMu.Lock()
	defer r.finderMu.Unlock()
	for _, e := range r.finders {
		if e.fd != nil {
			e.fd.DropPages()
		}
	}
}

// closeFinders releases every Finder.
func (r *resolver) closeFinders() {
	r.finderMu.Lock()
	defer r.finderMu.Unlock()
	for id, e := range r.finders {
		e.fd.Close()
		delete(r.finders, id)
	}
}
