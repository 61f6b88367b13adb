//go:build linux

package profiler

import (
	"time"

	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/unwind"
	"github.com/sonde-dev/sonde/tracer"
)

// Stats is a snapshot of the profiler's counters and gauges. Counters only
// grow from New on; gauges say how things are now.
type Stats struct {
	// Records is how many ring-buffer records were read, decodable or not.
	Records uint64
	// RecordsMalformed were read but could not be decoded, and dropped.
	RecordsMalformed uint64
	// Samples is how many on-CPU samples were resolved and handed to an
	// interval (taken or refused as IntervalFull).
	Samples uint64
	// Repeated counts the samples among them added as a repeat of a stack
	// resolved before in their interval (same process image, same frame
	// words): a lookup and a count, not resolved again. Unkeyed counts
	// the stacks an interval could not remember for that because it held
	// profile.MaxKeyWords key words already; their repeats are resolved.
	Repeated, Unkeyed uint64
	// Stacks counts those samples by how their user-stack walk ended:
	// [outcome][0] without, [outcome][1] with the frame-pointer fallback.
	// They sum to Samples.
	Stacks [NumStackOutcomes][2]uint64
	// IntervalFull is how many samples an interval refused: it held its
	// maximum of sample events.
	IntervalFull uint64
	// Pending (gauge) is how many samples the open intervals hold: those
	// waiting for the next consumer, at most Options.MaxPendingSamples
	// (but for the newest interval's) once the consumer has held the
	// reporter for a reporting interval.
	Pending int
	// Emitting (gauge) is how many samples the interval handed to the
	// next consumer holds while it has not returned; 0 between emits.
	Emitting int
	// Backlog counts the intervals, and the samples they held, dropped
	// unsent because the next consumer fell behind: it held the reporter
	// for a reporting interval or more while more than
	// Options.MaxPendingSamples samples, or maxWaitingIntervals intervals,
	// waited.
	// They are counted as they are dropped, while the consumer still
	// blocks.
	Backlog struct{ Intervals, Samples uint64 }
	// Queued (gauge) is how many records were read and wait for the
	// resolver.
	Queued int
	// Late is how many samples went to another interval than their
	// capture time's: resolved after it was emitted, or past the bound of
	// open intervals. Their interval's window was widened to cover them.
	Late uint64
	// Lag (gauge) is the age of the newest sample of the last interval
	// emitted, when it was emitted: how far behind real time the pipeline
	// runs.
	Lag time.Duration
	// Shutdown counts the samples shutdown could not deliver: Unread were
	// left in the ring buffer, Unresolved were read but not resolved when
	// Close came, Unflushed were in intervals never emitted.
	Shutdown struct{ Unread, Unresolved, Unflushed uint64 }
	// FilteredInUser is how many samples of excluded processes were
	// dropped in user space, sampled before the kernel knew the decision.
	FilteredInUser uint64
	// WarmUp is how many samples of processes running when the profiler
	// started were dropped because their stack ended early and they were
	// taken before the process was prepared (no tables yet: frame
	// pointers only).
	WarmUp uint64
	// ExitsSwept is how many processes a sweep found gone without their
	// exit record (a full ring buffer dropped it), and forgot as if it
	// had come.
	ExitsSwept uint64

	// Intervals were emitted without error, with EmittedProfiles profiles
	// (one per process and interval) and EmittedSamples samples.
	Intervals, EmittedProfiles, EmittedSamples uint64
	// EmitErrors intervals were refused by emit, and EmitDropped is how
	// many samples those held.
	EmitErrors, EmitDropped uint64

	// Processes (gauge) is how many processes the process table holds.
	Processes int
	// Preparer is the work of keeping the unwinder's tables in step.
	Preparer PreparerStats
	// Resolver counts what went wrong while naming frames.
	Resolver ResolverStats
	// Unwind is the unwind tables' loader.
	Unwind UnwindStats
	// Symbols is the symbolizer.
	Symbols SymbolStats
	// Python is the finding of CPython processes and the naming of their
	// frames.
	Python PythonStats
	// JVM is the finding of HotSpot JVMs and the naming of their frames.
	JVM JVMStats
	// V8 is the finding of V8 (Node.js) and the naming of its frames.
	V8 V8Stats
	// PHP is the finding of PHP (the Zend Engine) and the naming of its
	// frames.
	PHP PHPStats
	// Perl is the finding of Perl 5 and the naming of its frames.
	Perl PerlStats
	// Ruby is the finding of CRuby and the naming of its frames.
	Ruby RubyStats
	// OffCPU is the off-CPU join; OffCPUEnabled says whether waits are
	// traced at all.
	OffCPU        OffCPUStats
	OffCPUEnabled bool
	// Kernel is the eBPF side's counters, as last read (after Close: as
	// they were when the tracer closed).
	Kernel KernelCounters
}

// UnwindStats are the unwind table loader's counters and gauges.
type UnwindStats = unwind.LoaderStats

// SymbolStats are the symbolizer's counters and gauges.
type SymbolStats = symbolize.Stats

// KernelCounters are the eBPF side's counters.
type KernelCounters = tracer.Counters

// PreparerStats count the preparer's requests.
type PreparerStats struct {
	Queued   uint64 // requests accepted
	Handled  uint64 // requests handled; Queued - Handled are waiting
	Dropped  uint64 // requests dropped: the queue was full
	Excluded uint64 // process images the filters excluded
	Gone     uint64 // processes that exited before or while being prepared
	// ExecsSkipped counts processes that exec'd and exited within
	// execGrace unsampled: never prepared, at no cost.
	ExecsSkipped uint64
}

// ResolverStats count the resolver's problems.
type ResolverStats struct {
	ProcessGone uint64 // samples whose process was gone before it could be read
	Unmapped    uint64 // user frames no mapping covers, even after a refresh
	// FPOutsideCode counts stacks cut where a frame-pointer walk left the
	// process's executable mappings: the rest of that chain was data.
	FPOutsideCode uint64
	// Truncated counts samples whose user stack ended before its outermost
	// frame; each is shown under a [truncated] root frame.
	Truncated       uint64
	FileErrors      uint64 // mapped files that could not be opened or identified
	SymbolizeErrors uint64
	KernelUnnamed   uint64
	CacheResets     uint64
	// Snapshots counts the samples that carried a stack snapshot (their
	// unwinding met a file whose table was not loaded yet) and were
	// unwound on from it here; SnapshotsWhole those of them that reached
	// their outermost frame; SnapshotsSpliced those whose walk left the
	// snapshot's copy of the stack (a switch to another stack) and went on
	// with the frames the eBPF side found by frame pointers.
	Snapshots, SnapshotsWhole, SnapshotsSpliced uint64
	// SnapshotsCompared and SnapshotsDiffer: with the tests' snapshot
	// check, the stacks unwound both by the kernel and from their
	// snapshot, and those where the two differ.
	SnapshotsCompared, SnapshotsDiffer uint64
}

// PythonStats count CPython processes and their frames.
type PythonStats struct {
	Processes   uint64 // processes set up for the eBPF Python walker
	Unsupported uint64 // CPython processes of a version without a layout: native stacks only
	// UnknownVersions is how many versions without a layout were found
	// (each logged once).
	UnknownVersions uint64
	Failed          uint64 // CPython processes whose interpreter could not be read or set up: native stacks only
	Unnamed         uint64 // Python frames whose code object could not be read
	// Named counts Python frames named: once per stack and interval, as
	// a repeated stack is not named again (Stats.Repeated).
	Named       uint64
	CacheResets uint64 // times the code object cache was emptied to stay in its bound
	CacheBytes  int64  // (gauge) bytes of code objects cached
}

// JVMStats count HotSpot JVM processes and their frames.
type JVMStats struct {
	Processes   uint64 // processes set up for the eBPF JVM walker
	Unsupported uint64 // JVMs whose layout is not supported (or a kernel without the walker): native stacks only
	// UnknownVersions is how many layouts without support were found
	// (each logged once).
	UnknownVersions uint64
	Failed          uint64 // JVMs that could not be set up: native stacks only
	Unnamed         uint64 // Java frames that could not be named (stale or unreadable)
	// Named counts Java frames named: once per stack and interval, as a
	// repeated stack is not named again (Stats.Repeated).
	Named uint64
	// MethodOnly counts the Java frames among Named whose compiled code
	// was freed before they were named: the method read at the sample
	// names them, tier "compiled", without inlining or a line.
	MethodOnly     uint64
	Stale          uint64 // Java frames whose code or method changed between the sample and its naming
	CacheEvictions uint64 // method and compiled-code entries dropped to stay within the bound
	// CacheLoads counts the cache's misses: methods, compiled methods and
	// the code blobs of PCs read from the JVMs' memory to name frames.
	CacheLoads uint64
	CacheBytes int64 // (gauge) bytes of Java names and line tables cached
}

// OffCPUStats count what became of traced off-CPU waits in user space.
type OffCPUStats struct {
	Samples    uint64 // waits that became off-CPU samples
	Short      uint64 // waits shorter than OffCPUMinDuration, dropped
	Expired    uint64 // starts whose end did not come in time
	Evicted    uint64 // starts dropped because the join was full
	OrphanEnds uint64 // ends whose start never arrived
	Duplicates uint64 // starts with a key already pending
}

// StackOutcome is how the user-stack walk of a sample ended, from the flags
// the eBPF side set on it. Each sample has exactly one.
type StackOutcome uint8

// Stack outcomes, and their number.
const (
	StackNone        StackOutcome = iota // no user stack: a kernel thread, an exiting task past exit_mm, or no user registers
	StackComplete                        // an unwind row marked the outermost frame
	StackEnded                           // the frame-pointer chain or return addresses ran out, unconfirmed by CFI
	StackTruncated                       // frame limit reached, or a tail call failed mid-walk
	StackUnknownRule                     // failed: a PC whose CFI has no usable rule
	StackReadError                       // failed: user memory could not be read
	StackStackError                      // failed: the walk could not start (its tail call failed)
	NumStackOutcomes
)

// classifyStack maps a sample's flags to its outcome, and whether the
// frame-pointer fallback was used. The failure flags are checked first: a
// failed walk may have found frames by frame pointer.
func classifyStack(flags uint32, userFrames int) (StackOutcome, bool) {
	fp := flags&tracer.FlagFramePointers != 0
	switch {
	case flags&tracer.FlagUserStackErr != 0:
		return StackStackError, fp
	case flags&tracer.FlagUnknownRule != 0:
		return StackUnknownRule, fp
	case flags&tracer.FlagUserReadErr != 0:
		return StackReadError, fp
	case flags&tracer.FlagUserTruncated != 0:
		return StackTruncated, fp
	case flags&tracer.FlagUserComplete != 0:
		return StackComplete, fp
	case userFrames == 0:
		return StackNone, false
	}
	return StackEnded, fp
}

// Stats returns a snapshot of every counter and gauge. The samples, their
// stack outcomes and the open interval are read together: they agree.
func (p *Profiler) Stats() Stats {
	var s Stats
	p.mu.Lock()
	s.Samples = p.samples
	s.Repeated, s.Unkeyed = p.repeated, p.unkeyed
	s.Stacks = p.stacks
	s.IntervalFull = p.intervalFull
	s.Late = p.late
	s.Pending = p.pending
	s.Emitting = p.emitting
	s.Backlog.Intervals, s.Backlog.Samples = p.backlog.intervals, p.backlog.samples
	p.mu.Unlock()
	s.Queued = int(max(p.inflight.Load(), 0))
	s.Lag = time.Duration(p.lag.Load())
	s.Shutdown.Unread = p.unread.Load()
	s.Shutdown.Unresolved = p.unresolved.Load()
	s.Shutdown.Unflushed = p.unflushed.Load()
	s.Records = p.records.Load()
	s.RecordsMalformed = p.decodeErrors.Load()
	s.FilteredInUser = p.filtered.Load()
	s.WarmUp = p.warmUpHeld.Load()
	s.ExitsSwept = p.lostExitsAll.Load()
	s.Intervals = p.intervals.Load()
	s.EmittedProfiles = p.emitProfiles.Load()
	s.EmittedSamples = p.emitSamples.Load()
	s.EmitErrors = p.emitErrors.Load()
	s.EmitDropped = p.emitDropped.Load()

	s.Processes = p.procs.Len()
	pr := p.preparer
	s.Preparer = PreparerStats{
		Queued: pr.queued.Load(), Handled: pr.handled.Load(), Dropped: pr.dropped.Load(),
		Excluded: pr.excluded.Load(), Gone: pr.gone.Load(), ExecsSkipped: pr.skipped.Load(),
	}
	rs := &p.resolver.stats
	s.Resolver = ResolverStats{
		ProcessGone: rs.processGone.Load(), Unmapped: rs.unmapped.Load(), FPOutsideCode: rs.fpOutside.Load(), Truncated: rs.truncated.Load(), FileErrors: rs.fileErrors.Load(),
		SymbolizeErrors: rs.symbolizeErrs.Load(), KernelUnnamed: rs.kernelUnnamed.Load(), CacheResets: rs.cacheResets.Load(),
		Snapshots: rs.snapshots.Load(), SnapshotsWhole: rs.snapshotsWhole.Load(), SnapshotsSpliced: rs.snapshotsSpliced.Load(),
		SnapshotsCompared: rs.snapshotsCompared.Load(), SnapshotsDiffer: rs.snapshotsDiffer.Load(),
	}
	s.Unwind = pr.loader.Stats()
	s.Symbols = p.syms.Stats()
	if rts := p.preparer.runtimes; rts != nil {
		for _, rt := range rts.list {
			rt.stats(&s)
		}
	}
	j := &p.offCPU.stats
	s.OffCPU = OffCPUStats{
		Samples: j.samples.Load(), Short: j.short.Load(), Expired: j.expired.Load(),
		Evicted: j.evicted.Load(), OrphanEnds: j.orphanEnds.Load(), Duplicates: j.duplicates.Load(),
	}
	s.OffCPUEnabled = p.offCPUEnabled

	p.tracerMu.Lock()
	if !p.tracerClosed {
		if c, err := p.tracer.Counters(); err == nil {
			p.kernel = c
		}
	}
	s.Kernel = p.kernel
	p.tracerMu.Unlock()
	return s
}

// PHPStats count PHP processes and their frames.
type PHPStats struct {
	Processes   uint64 // processes set up for the eBPF PHP walker
	Unsupported uint64 // PHPs of a version without a layout, ZTS builds, or a kernel without the walker: native stacks only
	// UnknownVersions is how many versions without support were found
	// (each logged once).
	UnknownVersions uint64
	Failed          uint64 // PHPs that could not be set up: native stacks only
	Unnamed         uint64 // PHP frames that could not be named (stale or unreadable)
	Named           uint64 // PHP frames named
	NoLine          uint64 // user frames among Named without a line
	Gone            uint64 // frames among Named from the cache, their process's memory gone (exited)
	ByCode          uint64 // frames among Named after a closure read before with the same opcodes (its Closure freed)
	Stale           uint64 // frames whose function changed between the sample and its naming
	CacheEvictions  uint64 // functions dropped to stay within the bound
	CacheBytes      int64  // (gauge) bytes of PHP function names cached
}

// RubyStats count Ruby processes and their frames.
type RubyStats struct {
	Processes   uint64 // processes set up for the eBPF Ruby walker
	Unsupported uint64 // Rubies of a version without a layout, or a kernel without the walker: native stacks only
	// UnknownVersions is how many versions without support were found
	// (each logged once).
	UnknownVersions uint64
	Failed          uint64 // Rubies that could not be set up: native stacks only
	Unnamed         uint64 // Ruby frames that could not be named (stale or unreadable)
	Named           uint64 // Ruby frames named
	NoLine          uint64 // frames among Named without a line
	Stale           uint64 // frames whose iseq changed between the sample and its naming
	CacheEvictions  uint64 // iseqs dropped to stay within the bound
	CacheBytes      int64  // (gauge) bytes of Ruby iseq names cached
}

// PerlStats count Perl processes and their frames.
type PerlStats struct {
	Processes   uint64 // processes set up for the eBPF Perl walker
	Unsupported uint64 // Perls of a version without a layout, without MULTIPLICITY, or a kernel without the walker: native stacks only
	// UnknownVersions is how many versions without support were found
	// (each logged once).
	UnknownVersions uint64
	Failed          uint64 // Perls that could not be set up: native stacks only
	Unnamed         uint64 // Perl frames that could not be named (stale or unreadable)
	Named           uint64 // Perl frames named
	NoLine          uint64 // frames among Named without a line
	Gone            uint64 // frames among Named from the cache, their process's memory gone (exited)
	Stale           uint64 // frames whose sub or statement changed between the sample and its naming
	CacheEvictions  uint64 // entries dropped to stay within the bound
	CacheBytes      int64  // (gauge) bytes of Perl sub names cached
}

// V8Stats count V8 (Node.js) processes and their frames.
type V8Stats struct {
	Processes   uint64 // processes set up for the eBPF V8 walker
	Unsupported uint64 // V8s whose layout is not supported (or a kernel without the walker): native stacks only
	// UnknownVersions is how many layouts without support were found
	// (each logged once).
	UnknownVersions uint64
	Failed          uint64 // V8s that could not be set up: native stacks only
	Unnamed         uint64 // V8 frames that could not be named (stale or unreadable)
	Named           uint64 // V8 frames named
	NoLine          uint64 // frames among Named without a line (no position table collected)
	Gone            uint64 // frames among Named from the cache alone, their process's memory gone (exited)
	Stale           uint64 // frames whose function or code changed between the sample and its naming
	// Reused counts the cached objects named without a read: a read made
	// after their sample was taken found them unchanged (a receiver
	// behind its samples).
	Reused         uint64
	CacheEvictions uint64 // entries dropped to stay within the bound
	CacheBytes     int64  // (gauge) bytes of JavaScript names and line tables cached
}
