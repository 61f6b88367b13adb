package jvm

import (
	"errors"
	"fmt"

	"github.com/sonde-dev/sonde/internal/symbolize"
)

// ErrNotJVM is matched when a process maps no libjvm.so.
var ErrNotJVM = errors.New("not a jvm")

// ErrUnknownVersion is matched when a JVM's tables lack an entry naming
// needs: its layout is not supported.
var ErrUnknownVersion = errors.New("jvm layout not supported")

// ErrNotReady is matched when a JVM is still starting: its tables, code
// cache or interpreter are not set up yet. Look again later.
var ErrNotReady = errors.New("jvm not ready")

// ErrStale is matched when a frame's code or method no longer holds what
// the sample saw (freed, swept, reused, replaced): naming it would lie.
var ErrStale = errors.New("jvm frame stale")

// ErrUnreadable is matched when a frame's memory cannot be read or is
// inconsistent.
var ErrUnreadable = errors.New("jvm frame unreadable")

// Memory reads another process's memory. ReadAt fills all of p or fails.
type Memory interface {
	ReadAt(p []byte, addr uint64) error
}

// VM is a HotSpot JVM found in a process.
type VM struct {
	Release  string // Abstract_VM_Version::_s_vm_release, "17.0.13+11-Debian-2"
	Major    int    // Abstract_VM_Version::_vm_major_version (or parsed from Release)
	Untested bool   // a major the tests here do not run (tested: 17, 25)
	Kernel   Kernel // what the eBPF walker needs

	// File is libjvm.so as the agent opened it.
	File string
	l    *layout
}

// Kernel is the eBPF walker's view of one JVM process. Addresses are the
// process's.
type Kernel struct {
	CodeLow, CodeHigh uint64     // CodeCache::_low_bound, _high_bound: every code blob is in [CodeLow, CodeHigh)
	Heaps             []CodeHeap // each CodeHeap of the code cache (JDK 8: one; 9+: up to 3), at most 4
	// InterpStart, InterpEnd bound the template interpreter's code:
	// AbstractInterpreter::_code's _stub_buffer .. + _buffer_limit.
	InterpStart, InterpEnd uint64
	HeapBlockSize          uint16 // sizeof(HeapBlock): a blob starts HeapBlockSize after its block
	// HeapBlockUsed is the offset in a HeapBlock of its _header._used
	// (bool): a block the segmap leads to may be free (on the free list).
	HeapBlockUsed uint16
	BlobFrameSize uint16 // offsetof CodeBlob::_frame_size (int32, in words)
	// BlobFrameComplete is offsetof CodeBlob::_frame_complete_offset
	// (bytes from code begin), an int32 or, from JDK 23, an int16:
	// BlobFrameCompleteWidth says which (4 or 2).
	BlobFrameComplete      uint16
	BlobFrameCompleteWidth uint8
	// BlobCodeBegin is offsetof CodeBlob::_code_begin (a pointer), or of
	// CodeBlob::_code_offset (an int32 from the blob's start) when
	// CodeBeginIsOffset.
	BlobCodeBegin     uint16
	CodeBeginIsOffset bool
	NmethodCompileID  uint16 // offsetof nmethod::_compile_id (int32)
	NmethodMethod     uint16 // offsetof nmethod::_method (or CompiledMethod's): a Method*
	// x86-64 interpreter frame slots, byte offsets from rbp (negative).
	InterpMethod, InterpBCP, InterpSenderSP int16
}

// MaxHeaps bounds Kernel.Heaps.
const MaxHeaps = 4

// CodeHeap is one heap of the code cache.
//
// The blob holding pc: i = (pc - Low) >> SegShift; while segmap[i] > 0
// (0xFF: free) { i -= segmap[i] }; blob = Low + i<<SegShift + HeapBlockSize.
type CodeHeap struct {
	Low, High uint64 // CodeHeap::_memory's _low_boundary.._high_boundary
	Segmap    uint64 // CodeHeap::_segmap's _low (one byte per segment)
	SegShift  uint8  // CodeHeap::_log2_segment_size
}

// FrameKind is how the eBPF walker reported a Java frame.
type FrameKind uint8

const (
	// FrameInterpreted is a frame of the template interpreter: addr is
	// the Method* read from the interpreter
	// frame, word the bcp read from it (an absolute address).
	FrameInterpreted FrameKind = 1
	// FrameCompiled is a frame in a code blob: addr is the start of the
	// CodeBlob holding the pc;
	// word is uint64(compileID)<<32 | uint32(pc-addr), compileID the
	// int32 at addr+NmethodCompileID read at the sample.
	FrameCompiled FrameKind = 2
)

// Tiers: how a frame ran (the location attribute sonde.frame.tier).
const (
	TierInterpreted = "interpreted"
	TierC1          = "c1"
	TierC2          = "c2"
	TierJVMCI       = "jvmci"
	TierNative      = "native" // a native method's wrapper
	TierStub        = "stub"   // a code blob that is no Java method
	// TierCompiled is compiled code of a method whose compiled method was
	// freed before it was named: its compiler and inlining are unknown.
	TierCompiled = "compiled"
)

// Frame is a named JVM frame.
type Frame struct {
	// Lines are innermost first: the methods inlined at the pc, then the
	// compiled (or interpreted) method.
	Lines []symbolize.Line
	Tier  string
}

// maxSegmapHops bounds the walk back through a segment map to a block's
// start (the eBPF walker takes at most 24 hops; user space takes more).
const maxSegmapHops = 4096

// BlobAt returns the start of the code blob holding pc in k's code heaps,
// read from mem as the eBPF walker reads it: back through the heap's
// segment map to the block's start, which must be in use.
func (k *Kernel) BlobAt(mem Memory, pc uint64) (uint64, error) {
	for _, h := range k.Heaps {
		if pc < h.Low || pc >= h.High {
			continue
		}
		seg := (pc - h.Low) >> h.SegShift
		var b [1]byte
		for range maxSegmapHops {
			if err := mem.ReadAt(b[:], h.Segmap+seg); err != nil {
				return 0, fmt.Errorf("segment map: %w", err)
			}
			hop := uint64(b[0])
			if hop == 0 {
				block := h.Low + seg<<h.SegShift
				if err := mem.ReadAt(b[:], block+uint64(k.HeapBlockUsed)); err != nil {
					return 0, fmt.Errorf("heap block: %w", err)
				}
				if b[0] == 0 {
					return 0, fmt.Errorf("pc %#x: heap block %#x free: %w", pc, block, ErrStale)
				}
				return block + uint64(k.HeapBlockSize), nil
			}
			if hop == 0xff || hop > seg {
				return 0, fmt.Errorf("pc %#x: no blob: %w", pc, ErrStale)
			}
			seg -= hop
		}
		return 0, fmt.Errorf("pc %#x: segment map longer than %d hops: %w", pc, maxSegmapHops, ErrUnreadable)
	}
	return 0, fmt.Errorf("pc %#x: outside the code heaps: %w", pc, ErrStale)
}
