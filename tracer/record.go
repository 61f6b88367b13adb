package tracer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/support"
)

// RecordType says what a Record holds.
type RecordType uint32

const (
	// RecordSample is a CPU sample.
	RecordSample = RecordType(support.SondeRecordTypeRECORD_SAMPLE)
	// RecordExec says a process called exec.
	RecordExec = RecordType(support.SondeRecordTypeRECORD_EXEC)
	// RecordExit says a process exited.
	RecordExit = RecordType(support.SondeRecordTypeRECORD_EXIT)
	// RecordUnknown says a process was sampled before its unwind information
	// was prepared (or at an address outside its prepared mappings).
	RecordUnknown = RecordType(support.SondeRecordTypeRECORD_UNKNOWN)
	// RecordOffCPUStart says a thread left the CPU to wait. It is decoded like
	// a sample: Time is when it left, KTime the key its RecordOffCPUEnd
	// names, and the stacks are where it waits.
	RecordOffCPUStart = RecordType(support.SondeRecordTypeRECORD_OFFCPU_START)
	// RecordOffCPUEnd says the thread TID of PID is back on a CPU. KTime is
	// the KTime of its start record, Time that start as wall-clock time,
	// OffCPU how long it was away; Flags may hold OffCPUShort.
	RecordOffCPUEnd = RecordType(support.SondeRecordTypeRECORD_OFFCPU_END)
)

// OffCPUShort flags an end record whose wait was shorter than
// Options.OffCPUMinDuration: its start is to be dropped.
const OffCPUShort = uint32(support.SondeOffcpuEndFlagsOFFCPU_END_SHORT)

// Sample flags, as the eBPF side sets them.
const (
	FlagKernelStackErr = uint32(support.SondeSampleFlagsSAMPLE_KERNEL_STACK_ERR)
	FlagUserStackErr   = uint32(support.SondeSampleFlagsSAMPLE_USER_STACK_ERR)
	FlagUserTruncated  = uint32(support.SondeSampleFlagsSAMPLE_USER_TRUNCATED)
	FlagFramePointers  = uint32(support.SondeSampleFlagsSAMPLE_FRAME_POINTERS)
	FlagUserComplete   = uint32(support.SondeSampleFlagsSAMPLE_USER_COMPLETE)
	FlagUnknownRule    = uint32(support.SondeSampleFlagsSAMPLE_USER_UNKNOWN_RULE)
	FlagUserReadErr    = uint32(support.SondeSampleFlagsSAMPLE_USER_READ_ERR)
	FlagSnapshot       = uint32(support.SondeSampleFlagsSAMPLE_SNAPSHOT)
)

// FrameFlags describe how one user frame was found.
type FrameFlags uint8

const (
	// FrameFromFramePointer means no unwind table covered the callee, so
	// this frame came from the frame-pointer chain.
	FrameFromFramePointer FrameFlags = 1 << iota
	// FrameInterrupted means the PC is where the thread was interrupted (the
	// leaf, or the code a signal interrupted), not a return address; it is
	// named as is, not at PC-1.
	FrameInterrupted
	// FrameRuntime marks a frame a runtime's walker reported (an
	// interpreter's or JIT's, not a native PC). Its User entry is an
	// address of the runtime's (RuntimeFrame says which runtime and kind);
	// its UserFiles entry's Offset is the runtime's second word. CPython:
	// the code object's address and the frame's instruction (f_lasti, or
	// the instruction pointer from 3.11 on).
	FrameRuntime
)

// Runtimes whose walkers report FrameRuntime frames.
const (
	RuntimePython = uint8(support.SondeRuntimeIdRUNTIME_PYTHON)
	RuntimeJVM    = uint8(support.SondeRuntimeIdRUNTIME_JVM)
	RuntimeV8     = uint8(support.SondeRuntimeIdRUNTIME_V8)
	RuntimePHP    = uint8(support.SondeRuntimeIdRUNTIME_PHP)
	RuntimePerl   = uint8(support.SondeRuntimeIdRUNTIME_PERL)
	RuntimeRuby   = uint8(support.SondeRuntimeIdRUNTIME_RUBY)
)

// RuntimeFrame says which runtime reported the FrameRuntime frame whose
// UserFiles entry is ref, and the runtime's kind of frame.
func RuntimeFrame(ref FileRef) (runtime, kind uint8) {
	return uint8(ref.File >> 4), uint8(ref.File & 0xf)
}

// Bits of a raw user frame, as the eBPF side encodes them.
const (
	pcFlagFramePointer = uint64(support.SondePcFlagsPC_FLAG_FRAME_POINTER)
	pcFlagNoAdjust     = uint64(support.SondePcFlagsPC_FLAG_NO_ADJUST)
	pcFlagRuntime      = uint64(support.SondePcFlagsPC_FLAG_RUNTIME)
	runtimeAddrMask    = uint64(support.SondePcFlagsPC_RUNTIME_ADDR_MASK)
	runtimeKindShift   = uint64(support.SondeRuntimeIdRUNTIME_KIND_SHIFT)
	pcFlagsMask        = uint64(support.SondePcFlagsPC_FLAGS_MASK)
)

// Record is one decoded ring-buffer record. For RecordExec and RecordExit only
// PID, Time and Comm are set; for RecordOffCPUEnd only PID, TID, KTime, Time,
// Flags and OffCPU. Kernel and User alias a buffer that the next ReadInto
// reuses: copy what must outlive it.
type Record struct {
	Type RecordType
	PID  uint32
	TID  uint32
	CPU  uint32
	Time time.Time
	// KTime is Time as the kernel's monotonic clock (bpf_ktime_get_ns) said.
	KTime uint64
	// OffCPU is how long the thread of a RecordOffCPUEnd was off the CPU.
	OffCPU    time.Duration
	Comm      string
	Flags     uint32
	Kernel    []uint64     // kernel PCs, leaf first
	User      []uint64     // user PCs, leaf first
	UserFlags []FrameFlags // how each user frame was found, parallel to User
	// UserFiles says in which file, at which offset, each user frame was,
	// as the unwinder saw it at sampling time (parallel to User). File 0:
	// not known to the unwinder; resolve the PC through the process's maps.
	UserFiles []FileRef
	// Snapshot is nil unless the unwinder met, at user frame
	// Snapshot.Frame, a file whose table it did not have (FlagSnapshot):
	// the frames from there on are the frame-pointer chain's, and the
	// snapshot holds what unwinding on from that frame needs.
	Snapshot *Snapshot

	snap  Snapshot
	stack []uint64
	flags []FrameFlags
	files []FileRef
}

// FileRef is a frame's place in a file: the handle user space gave the file
// in the unwinder's mappings (Mapping.File), and the offset in the file.
type FileRef struct {
	File   uint32
	Offset uint64
}

// Snapshot is a copy of a thread's user stack taken when the eBPF unwinder
// met code whose unwind table was not loaded yet, with the registers of the
// frame it met it in: user space unwinds the rest of the stack from it.
type Snapshot struct {
	// Frame is the index in Record.User of the frame the registers are
	// of; its PC is Record.User[Frame].
	Frame int
	// Interrupted: the PC is where the thread was interrupted, not a
	// return address (FrameInterrupted).
	Interrupted bool
	SP, FP      uint64
	// LR is the link register (aarch64) where it holds the frame's return
	// address (the interrupted frame's); 0: not known.
	LR uint64
	// Stack holds the user stack's bytes from SP on, as far as the eBPF
	// side could read them (at most MaxSnapshotBytes). ReleaseSnapshot, or
	// the next read into this Record, lets go of it.
	Stack []byte
	// Stack2, when not empty, holds the bytes from SP2 on (at most
	// MaxSnapshot2Bytes): where the frame-pointer chain the eBPF side
	// followed from the frame left Stack (a switch to another stack).
	SP2    uint64
	Stack2 []byte
}

// MaxUserFrames is the most user frames a sample holds.
const MaxUserFrames = maxUserFrames

// MaxSnapshotBytes and MaxSnapshot2Bytes are the most stack bytes a
// Snapshot's regions hold.
const (
	MaxSnapshotBytes  = int(support.SondeLimitsSNAPSHOT_BYTES)
	MaxSnapshot2Bytes = int(support.SondeLimitsSNAPSHOT_SECOND_BYTES)
)

// Layout of the C records, from their bpf2go types; TestRecordLayoutMatchesBTF
// checks those against the object's BTF.
var (
	sampleRec support.SondeSampleRecord
	snapRec   support.SondeStackSnapshot
	taskRec   support.SondeTaskRecord
	endRec    support.SondeOffcpuEndRecord
)

const (
	offType      = int(unsafe.Offsetof(sampleRec.Type))
	offPID       = int(unsafe.Offsetof(sampleRec.Pid))
	offTID       = int(unsafe.Offsetof(sampleRec.Tid))
	offCPU       = int(unsafe.Offsetof(sampleRec.Cpu))
	offKtime     = int(unsafe.Offsetof(sampleRec.Ktime))
	offComm      = int(unsafe.Offsetof(sampleRec.Comm))
	commLen      = len(sampleRec.Comm)
	offKernelLen = int(unsafe.Offsetof(sampleRec.KernelLen))
	offUserLen   = int(unsafe.Offsetof(sampleRec.UserLen))
	offFlags     = int(unsafe.Offsetof(sampleRec.Flags))
	offStack     = int(unsafe.Offsetof(sampleRec.Stack))

	taskOffPID   = int(unsafe.Offsetof(taskRec.Pid))
	taskOffKtime = int(unsafe.Offsetof(taskRec.Ktime))
	taskOffComm  = int(unsafe.Offsetof(taskRec.Comm))
	taskSize     = int(unsafe.Sizeof(taskRec))

	endOffPID      = int(unsafe.Offsetof(endRec.Pid))
	endOffTID      = int(unsafe.Offsetof(endRec.Tid))
	endOffFlags    = int(unsafe.Offsetof(endRec.Flags))
	endOffStart    = int(unsafe.Offsetof(endRec.Start))
	endOffDuration = int(unsafe.Offsetof(endRec.Duration))
	endSize        = int(unsafe.Sizeof(endRec))

	snapOffPC     = int(unsafe.Offsetof(snapRec.Pc))
	snapOffSP     = int(unsafe.Offsetof(snapRec.Sp))
	snapOffFP     = int(unsafe.Offsetof(snapRec.Fp))
	snapOffSP2    = int(unsafe.Offsetof(snapRec.Sp2))
	snapOffFrame  = int(unsafe.Offsetof(snapRec.Frame))
	snapOffBytes  = int(unsafe.Offsetof(snapRec.Bytes))
	snapOffBytes2 = int(unsafe.Offsetof(snapRec.Bytes2))
	snapOffLR     = int(unsafe.Offsetof(snapRec.Lr))
	snapSize      = int(unsafe.Sizeof(snapRec))

	maxWords        = len(sampleRec.Stack)
	maxKernelFrames = int(support.SondeLimitsMAX_KERNEL_FRAMES)
	maxUserFrames   = int(support.SondeLimitsMAX_USER_FRAMES)
)

// ErrMalformed is wrapped by decode errors: a record shorter than its header
// or than the frames it claims.
var ErrMalformed = errors.New("malformed record")

// ReadInto blocks until a record arrives and decodes it into rec, reusing its
// buffers. It returns ErrClosed after Close, and ErrDrained after Stop once
// the ring buffer is empty.
//
// It waits parked in the Go runtime's poller, not in a blocking system
// call: until the eBPF side wakes readers (once an eighth of the ring buffer
// is full) or the poll interval passes, whichever comes first; then it reads
// without blocking what the ring buffer holds.
func (t *Tracer) ReadInto(rec *Record) error {
	return t.noteTask(rec, t.readFrom(t.events, rec, t.poll))
}

// Kick makes a ReadInto that waits read what the ring buffer holds now,
// without waiting for its poll interval or a wake-up; it is safe to call
// from any goroutine. A reader that polls seldom is kicked when it must be
// up to date (the end of a reporting interval).
func (t *Tracer) Kick() { t.events.kick() }

// ErrEmpty is returned by TryReadInto when no record waits.
var ErrEmpty = errors.New("ring buffer empty")

// TryReadInto is ReadInto without the wait: it returns ErrEmpty at once
// when the ring buffer holds no record. A reader takes a batch of records
// with one ReadInto and TryReadIntos until ErrEmpty.
func (t *Tracer) TryReadInto(rec *Record) error {
	return t.noteTask(rec, t.readFrom(t.events, rec, 0))
}

// noteTask forgets the runtimes of a process that exec'd or exited, as the
// eBPF side forgot its walkers (task_events.h), and passes err on.
func (t *Tracer) noteTask(rec *Record, err error) error {
	if err == nil && (rec.Type == RecordExec || rec.Type == RecordExit) {
		t.ForgetTask(rec.PID)
	}
	return err
}

// SetLostExit makes rec, keeping its buffers, the exit of pid that no
// record in the ring buffer tells of: no capture time, no comm, no stack.
func (rec *Record) SetLostExit(pid uint32) {
	rec.ReleaseSnapshot()
	rec.Type, rec.OffCPU, rec.Comm = RecordExit, 0, ""
	rec.setTask(pid, 0, time.Time{})
}

// setTask sets the fields of a task record (exec, exit, unknown process)
// of pid: no thread, CPU, flags or frames.
func (rec *Record) setTask(pid uint32, ktime uint64, at time.Time) {
	rec.PID, rec.KTime, rec.Time = pid, ktime, at
	rec.TID, rec.CPU, rec.Flags = 0, 0, 0
	rec.Kernel, rec.User, rec.UserFlags, rec.UserFiles = nil, nil, nil, nil
}

// ForgetTask forgets the runtimes of a process that exited without an exit
// record reaching the reader (the ring buffer was full), as its exit record
// would have.
func (t *Tracer) ForgetTask(pid uint32) {
	t.runtimesMu.Lock()
	delete(t.runtimes, pid)
	t.runtimesMu.Unlock()
}

// Wait parks until the ring buffer may hold records: the eBPF side woke
// its readers, the poll interval passed, Kick, Stop or Close. It may
// return with nothing to read.
func (t *Tracer) Wait() { t.events.wait(t.poll) }

// ReadNotice is ReadInto for the requests for unwind information
// (RecordUnknown), which have a ring buffer of their own so that a slow
// reader of the samples never delays them. It is safe to call from another
// goroutine than ReadInto, one at a time.
//
// Every notice wakes its reader (BPF_RB_FORCE_WAKEUP): it waits for one
// without a poll interval, so an idle reader costs no wake-ups.
func (t *Tracer) ReadNotice(rec *Record) error {
	return t.readFrom(t.notices, rec, noticePoll)
}

// noticePoll is how long ReadNotice waits: notices wake it, and Stop and
// Close end its wait; the bound only keeps a lost wake-up from lasting.
const noticePoll = time.Minute

func (t *Tracer) readFrom(r *ring, rec *Record, poll time.Duration) error {
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return ErrClosed
		}
		if !r.hasData() {
			r.mu.Unlock()
			if poll <= 0 {
				return ErrEmpty
			}
			r.wait(poll)
			continue
		}
		// A deadline already passed: the reader takes what is there and
		// never blocks.
		r.reader.SetDeadline(time.Now())
		err := r.reader.ReadInto(&r.raw)
		if err == nil {
			err = rec.decode(r.raw.RawSample, t.clock)
			r.mu.Unlock()
			return err
		}
		r.mu.Unlock()
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if poll <= 0 {
				return ErrEmpty
			}
			r.wait(poll)
			continue
		case errors.Is(err, ringbuf.ErrClosed):
			return ErrClosed
		case errors.Is(err, ringbuf.ErrFlushed):
			return ErrDrained
		default:
			return fmt.Errorf("read ring buffer: %w", err)
		}
	}
}

func (rec *Record) decode(b []byte, c clock) error {
	le := binary.LittleEndian
	if len(b) < 4 {
		return fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	rec.Type = RecordType(le.Uint32(b[offType:]))
	rec.OffCPU = 0
	rec.ReleaseSnapshot()
	switch rec.Type {
	case RecordSample, RecordOffCPUStart:
		if len(b) < offStack {
			return fmt.Errorf("%w: sample of %d bytes", ErrMalformed, len(b))
		}
		rec.PID = le.Uint32(b[offPID:])
		rec.TID = le.Uint32(b[offTID:])
		rec.CPU = le.Uint32(b[offCPU:])
		rec.KTime = le.Uint64(b[offKtime:])
		rec.Time = c.wall(rec.KTime)
		rec.setComm(b[offComm : offComm+commLen])
		klen := int(le.Uint16(b[offKernelLen:]))
		ulen := int(le.Uint16(b[offUserLen:]))
		rec.Flags = le.Uint32(b[offFlags:])
		words := klen + 2*ulen
		if ulen > maxUserFrames || words > maxWords || len(b) < offStack+8*words {
			return fmt.Errorf("%w: %d+%d frames in %d bytes", ErrMalformed, klen, ulen, len(b))
		}
		// A record grows to the deepest stack it has held, not to the
		// deepest possible one (8 KiB): most stacks are a few dozen frames,
		// and hundreds of records may wait for the resolver.
		if n := klen + ulen; cap(rec.stack) < n {
			rec.stack = make([]uint64, min(max(n, 64)+n/2, maxWords))
		}
		if cap(rec.flags) < ulen {
			m := min(max(ulen, 32)+ulen/2, maxUserFrames)
			rec.flags = make([]FrameFlags, m)
			rec.files = make([]FileRef, m)
		}
		rec.stack = rec.stack[:klen+ulen]
		rec.flags = rec.flags[:ulen]
		rec.files = rec.files[:ulen]
		for i := range klen {
			rec.stack[i] = le.Uint64(b[offStack+8*i:])
		}
		rec.Kernel = rec.stack[:klen]
		rec.User = rec.stack[klen:]
		for i := range ulen {
			at := offStack + 8*(klen+2*i)
			raw := le.Uint64(b[at:])
			file := le.Uint64(b[at+8:])
			var f FrameFlags
			if raw&pcFlagFramePointer != 0 {
				f |= FrameFromFramePointer
			}
			if raw&pcFlagNoAdjust != 0 {
				f |= FrameInterrupted
			}
			rec.flags[i] = f
			rec.User[i] = raw &^ pcFlagsMask
			if raw&pcFlagRuntime != 0 {
				// The runtime and kind: 8 bits, (runtime << 4) | kind.
				rec.flags[i] = FrameRuntime | f&FrameInterrupted
				rec.User[i] = raw & runtimeAddrMask
				rec.files[i] = FileRef{File: uint32(raw>>runtimeKindShift) & 0xff, Offset: file}
				continue
			}
			rec.files[i] = FileRef{File: uint32(file >> 32), Offset: file & 0xffffffff}
		}
		rec.UserFlags = rec.flags
		rec.UserFiles = rec.files
		if rec.Flags&FlagSnapshot != 0 {
			if err := rec.decodeSnapshot(b[offStack+8*words:]); err != nil {
				return err
			}
		}
	case RecordExec, RecordExit, RecordUnknown:
		if len(b) < taskSize {
			return fmt.Errorf("%w: task record of %d bytes", ErrMalformed, len(b))
		}
		kt := le.Uint64(b[taskOffKtime:])
		rec.setTask(le.Uint32(b[taskOffPID:]), kt, c.wall(kt))
		rec.setComm(b[taskOffComm : taskOffComm+commLen])
	case RecordOffCPUEnd:
		if len(b) < endSize {
			return fmt.Errorf("%w: off-CPU end record of %d bytes", ErrMalformed, len(b))
		}
		rec.PID = le.Uint32(b[endOffPID:])
		rec.TID = le.Uint32(b[endOffTID:])
		rec.Flags = le.Uint32(b[endOffFlags:])
		rec.CPU = 0
		rec.KTime = le.Uint64(b[endOffStart:])
		rec.Time = c.wall(rec.KTime)
		d := le.Uint64(b[endOffDuration:])
		if d > math.MaxInt64 {
			return fmt.Errorf("%w: off-CPU duration %d ns", ErrMalformed, d)
		}
		rec.OffCPU = time.Duration(d)
		rec.Comm = ""
		rec.Kernel, rec.User, rec.UserFlags, rec.UserFiles = nil, nil, nil, nil
	default:
		return fmt.Errorf("%w: unknown type %d", ErrMalformed, rec.Type)
	}
	return nil
}

// decodeSnapshot decodes the stack snapshot that follows a sample's frames
// in b.
func (rec *Record) decodeSnapshot(b []byte) error {
	le := binary.LittleEndian
	if len(b) < snapSize {
		return fmt.Errorf("%w: snapshot header in %d bytes", ErrMalformed, len(b))
	}
	frame := int(le.Uint16(b[snapOffFrame:]))
	n := int(le.Uint32(b[snapOffBytes:]))
	n2 := int(le.Uint32(b[snapOffBytes2:]))
	if frame >= len(rec.User) || n > MaxSnapshotBytes || n2 > MaxSnapshot2Bytes || len(b)-snapSize < n+n2 {
		return fmt.Errorf("%w: snapshot of %d+%d bytes at frame %d of %d, in %d bytes", ErrMalformed, n, n2, frame, len(rec.User), len(b))
	}
	pc := le.Uint64(b[snapOffPC:])
	if pc&^pcFlagsMask != rec.User[frame] {
		return fmt.Errorf("%w: snapshot at %#x, its frame at %#x", ErrMalformed, pc&^pcFlagsMask, rec.User[frame])
	}
	// A copy of exactly the bytes read: few samples carry a snapshot (a new
	// program's first ones, while its table is built), but those wait in
	// the queue together, and a buffer of the largest size for each would
	// make the start-up's heap, and the collector's goal, needlessly big.
	buf := make([]byte, n+n2)
	copy(buf, b[snapSize:snapSize+n+n2])
	rec.snap = Snapshot{
		Frame:       frame,
		Interrupted: pc&pcFlagNoAdjust != 0,
		SP:          le.Uint64(b[snapOffSP:]),
		FP:          le.Uint64(b[snapOffFP:]),
		LR:          le.Uint64(b[snapOffLR:]),
		Stack:       buf[:n:n],
		Stack2:      buf[n:],
	}
	if n2 > 0 {
		rec.snap.SP2 = le.Uint64(b[snapOffSP2:])
	}
	rec.Snapshot = &rec.snap
	return nil
}

// ReleaseSnapshot lets go of rec's snapshot, if any, and sets Snapshot to
// nil. A reader that keeps Records in flight calls it once it is done with
// a record, so that a record waiting for reuse holds no snapshot; the next
// read into rec drops it otherwise.
func (rec *Record) ReleaseSnapshot() {
	rec.snap, rec.Snapshot = Snapshot{}, nil
}

// setComm keeps the previous string when the name did not change, so a
// stream of samples from one thread allocates no strings.
func (rec *Record) setComm(b []byte) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	if string(b) == rec.Comm {
		return
	}
	rec.Comm = string(b)
}

// clock converts bpf_ktime_get_ns (CLOCK_MONOTONIC) to wall-clock time.
type clock struct{ offset int64 }

func newClock() clock {
	var mono, wall unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono)
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &wall)
	return clock{offset: wall.Nano() - mono.Nano()}
}

func (c clock) wall(ktime uint64) time.Time { return time.Unix(0, int64(ktime)+c.offset) }
