package v8

import (
	"encoding/binary"
	"fmt"
)

// This file is the executable specification of the eBPF walker
// (support/ebpf/v8.h): Walk makes the reads Kernel's documentation lists,
// in that order, and decides as it says. The live tests run it on real
// node processes stopped with ptrace.

// WalkedFrame is one frame as the walker reports it.
type WalkedFrame struct {
	Kind       FrameKind
	Addr, Word uint64
	// ReturnAddr says the frame's pc was a return address (every frame
	// but the first).
	ReturnAddr bool
}

// WalkStop says why a walk ended.
type WalkStop uint8

// Why a walk ended.
const (
	StopEnd       WalkStop = iota // fp 0, or not above the previous one
	StopEntry                     // an entry frame: native code called JavaScript
	StopNotJS                     // a frame neither typed nor JavaScript
	StopReadFail                  // a read failed
	StopMaxFrames                 // MaxFrames frames
	StopNative                    // a pc that is not V8 code
)

// Walk walks V8 frames from (pc, sp, fp) as the eBPF walker does, reading
// mem, and returns the frames, why it stopped, and (for StopEntry) the
// native caller's pc, sp and fp to go on with. jit says whether a pc is
// in V8's code space (executable memory no file backs). It is the
// contract's executable specification: at most two reads a frame, four
// at the leaf.
func (k *Kernel) Walk(mem Memory, jit func(pc uint64) bool, pc, sp, fp uint64) (frames []WalkedFrame, stop WalkStop, next [3]uint64) {
	start := int64(k.FrameReadStart)
	buf := make([]byte, k.FrameReadSize)
	slot := func(o int16) uint64 { return binary.LittleEndian.Uint64(buf[int64(o)-start:]) }
	prev := uint64(0)
	ret := false // pc is a return address
	for i := 0; ; i++ {
		if fp == 0 || fp%8 != 0 || fp <= prev {
			return frames, StopEnd, next
		}
		if i >= MaxFrames {
			return frames, StopMaxFrames, next
		}
		if jit != nil && !k.InBuiltins(pc) && !jit(pc) {
			// Not V8 code: the native unwinder's (a caller's sp is the
			// previous frame's fp+16).
			if prev != 0 {
				sp = prev + 16
			}
			return frames, StopNative, [3]uint64{pc, sp, fp}
		}
		if i == 0 && !k.InBuiltins(pc) {
			switch st, ra, callerSP, callerFP, ok := prologue(mem, pc, sp, fp); {
			case !ok:
			case st == prologueNoFrame:
				// The caller's frame is at fp; go on with it.
				frames = append(frames, WalkedFrame{Kind: FrameCompiled, Word: pc})
				pc, sp, ret = ra, callerSP, true
				continue
			default:
				frames = append(frames, WalkedFrame{Kind: FrameCompiled, Word: pc})
				prev = fp
				pc, fp, ret = ra, callerFP, true
				continue
			}
		}
		if err := mem.ReadAt(buf, uint64(int64(fp)+start)); err != nil {
			return frames, StopReadFail, next
		}
		marker := slot(k.FPMarker)
		callerFP, callerPC := slot(0), slot(8)
		if marker&uint64(k.SmiTagMask) == 0 {
			typ := marker >> k.MarkerShift
			frames = append(frames, WalkedFrame{Kind: FrameStub, Addr: pc, Word: typ, ReturnAddr: ret})
			if typ == uint64(k.EntryTypes[0]) || typ == uint64(k.EntryTypes[1]) {
				return frames, StopEntry, [3]uint64{callerPC, fp + 16, callerFP}
			}
		} else {
			fn := slot(k.FPFunction)
			if fn&uint64(k.HeapObjectTagMask) != uint64(k.HeapObjectTag) {
				return frames, StopNotJS, next
			}
			var b [8]byte
			if err := mem.ReadAt(b[:], fn-uint64(k.HeapObjectTag)+uint64(k.JSFunctionShared)); err != nil {
				return frames, StopReadFail, next
			}
			sfi := binary.LittleEndian.Uint64(b[:])
			if sfi&uint64(k.HeapObjectTagMask) != uint64(k.HeapObjectTag) {
				return frames, StopNotJS, next
			}
			off, bc := slot(k.FPBytecodeOffset), slot(k.FPBytecodeArray)
			smiLow := uint64(1)<<k.SmiShift - 1
			switch {
			case k.InBuiltins(pc) && off&smiLow == 0 && bc&uint64(k.HeapObjectTagMask) == uint64(k.HeapObjectTag):
				w := uint64(uint32(off>>k.SmiShift))<<32 | uint64(uint32(bc))
				frames = append(frames, WalkedFrame{Kind: FrameInterpreted, Addr: sfi, Word: w, ReturnAddr: ret})
			case k.InBuiltins(pc) && i == 0 && k.framelessLeaf(mem, jit, sp, &b):
				// The leaf is a builtin without a frame of its own,
				// called from compiled code whose return address is on
				// top of the stack.
				ra := binary.LittleEndian.Uint64(b[:])
				frames = append(frames, WalkedFrame{Kind: FrameStub, Addr: pc, Word: 0},
					WalkedFrame{Kind: FrameCompiled, Addr: sfi, Word: ra, ReturnAddr: true})
			case k.InBuiltins(pc):
				frames = append(frames, WalkedFrame{Kind: FrameBuiltin, Addr: sfi, Word: pc, ReturnAddr: ret})
			default:
				frames = append(frames, WalkedFrame{Kind: FrameCompiled, Addr: sfi, Word: pc, ReturnAddr: ret})
			}
		}
		prev = fp
		pc, fp, ret = callerPC, callerFP, true
	}
}

// Where a leaf in compiled code stands in its prologue (Kernel.Walk, step 0).
const (
	prologueNoFrame = iota + 1 // before or just after push rbp: fp is the caller's
	prologueNoFunc             // fp set, the function slot not yet written
)

// x64FramePrologue is push rbp; mov rbp, rsp, as a little-endian u32.
const x64FramePrologue = 0xe5894855

// prologue reads the code around a leaf pc in V8's code space and, when
// the pc is in the prologue that builds the frame of Maglev or TurboFan
// code, says where, with the return address into the caller and, for
// prologueNoFunc, the caller's fp.
//
// For prologueNoFrame it returns the caller's sp too (above the return
// address), for prologueNoFunc the caller's fp.
func prologue(mem Memory, pc, sp, fp uint64) (where int, ra, callerSP, callerFP uint64, ok bool) {
	var code [16]byte
	if pc < 8 || mem.ReadAt(code[:], pc-8) != nil {
		return 0, 0, 0, 0, false
	}
	at := func(i int) bool { return binary.LittleEndian.Uint32(code[i:]) == x64FramePrologue }
	var b [16]byte
	switch {
	case at(8), at(7):
		slot := sp
		if at(7) {
			slot += 8 // rbp pushed
		}
		if mem.ReadAt(b[:8], slot) != nil {
			return 0, 0, 0, 0, false
		}
		return prologueNoFrame, binary.LittleEndian.Uint64(b[:]), slot + 8, 0, true
	case at(4), at(3) && code[7] == 0x56:
		if mem.ReadAt(b[:], fp) != nil {
			return 0, 0, 0, 0, false
		}
		return prologueNoFunc, binary.LittleEndian.Uint64(b[8:]), 0, binary.LittleEndian.Uint64(b[:]), true
	}
	return 0, 0, 0, 0, false
}

func (s WalkStop) String() string {
	switch s {
	case StopEnd:
		return "end"
	case StopEntry:
		return "entry"
	case StopNotJS:
		return "not js"
	case StopReadFail:
		return "read failed"
	case StopMaxFrames:
		return "max frames"
	case StopNative:
		return "native"
	}
	return fmt.Sprintf("stop(%d)", uint8(s))
}

// framelessLeaf reads the word at sp into b (the third read, at the leaf
// only) and says whether it is a return address into V8's code space.
func (k *Kernel) framelessLeaf(mem Memory, jit func(uint64) bool, sp uint64, b *[8]byte) bool {
	if jit == nil || mem.ReadAt(b[:], sp) != nil {
		return false
	}
	return jit(binary.LittleEndian.Uint64(b[:]))
}
