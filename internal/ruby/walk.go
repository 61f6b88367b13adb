package ruby

import (
	"encoding/binary"
	"fmt"
)

// Frame kinds as the eBPF walker reports them (ruby.h's enum
// ruby_frame_kind).
const (
	KindIseq = 1 // a frame running an instruction sequence: method, block, class body, top
)

// StackFrame is one Ruby frame of a stack read from a process's memory.
type StackFrame struct {
	CFP  uint64 // the rb_control_frame_t
	Iseq uint64 // its instruction sequence: the address the walker reports
	PC   uint64 // its pc
	// ME is a method frame's method entry (ep[-2]), 0 for others; Word
	// packs it with the pc's position, as the walker reports it.
	ME, Word uint64
	Flags    uint64 // ep[0]: frame magic and flags
	// Finish: the frame has VM_FRAME_FLAG_FINISH, the last of the run of
	// one vm_exec_core native frame.
	Finish bool
	Name   string
	File   string
	Line   int64 // 0: unknown
}

// maxStack bounds a stack read by Stack.
const maxStack = 4096

// EC returns the execution context of the thread whose thread pointer
// (fsbase) is tp: its ruby_current_ec.
func (in *Interp) EC(mem Memory, tp uint64) (uint64, error) {
	r := NewReader(mem, in.Layout)
	ec, err := r.ptr(tp - in.TLSOffset)
	if err != nil {
		return 0, fmt.Errorf("ruby_current_ec: %w", err)
	}
	return ec, nil
}

// MainThread returns the main thread's thread pointer.
func (in *Interp) MainThread(mem Memory) (uint64, error) {
	r := NewReader(mem, in.Layout)
	vm, err := r.ptr(in.VMPtr)
	if err != nil {
		return 0, fmt.Errorf("vm: %w", err)
	}
	if vm == 0 {
		return 0, ErrNotStarted
	}
	th, err := r.ptr(vm + uint64(in.Layout.VMMainThread))
	if err != nil {
		return 0, fmt.Errorf("main thread: %w", err)
	}
	if th == 0 {
		return 0, ErrNotStarted
	}
	return r.threadPointer(th)
}

// Stack reads the Ruby frames of the execution context ec, innermost
// first, the way the eBPF walker does (ruby.h): the control frames from
// ec->cfp up to the end of ec's VM stack, skipping C functions' frames (they
// run as native code, which the native unwinder reports) and dummy frames.
// It is what tests compare the walker's frames with, and its
// specification.
func (in *Interp) Stack(mem Memory, ec uint64) ([]StackFrame, error) {
	l := in.Layout
	r := NewReader(mem, l)
	if !okPtr(ec) {
		return nil, fmt.Errorf("context at %#x: bad address", ec)
	}
	b := make([]byte, max(l.ECVMStack, l.ECVMStackSize, l.ECCFP)+8)
	if err := mem.ReadAt(b, ec); err != nil {
		return nil, fmt.Errorf("context at %#x: %w", ec, err)
	}
	stack := binary.LittleEndian.Uint64(b[l.ECVMStack:])
	words := binary.LittleEndian.Uint64(b[l.ECVMStackSize:])
	cfp := binary.LittleEndian.Uint64(b[l.ECCFP:])
	if !okPtr(stack) || words > 1<<28 {
		return nil, fmt.Errorf("context at %#x: vm stack %#x of %d words", ec, stack, words)
	}
	end := stack + words*8
	if cfp < stack || cfp > end || (end-cfp)%uint64(l.CFPSize) != 0 {
		return nil, fmt.Errorf("context at %#x: frame %#x outside its stack %#x..%#x", ec, cfp, stack, end)
	}
	f := make([]byte, l.CFPSize)
	var out []StackFrame
	for i := 0; cfp < end; i, cfp = i+1, cfp+uint64(l.CFPSize) {
		if i == maxStack {
			return out, fmt.Errorf("more than %d frames", maxStack)
		}
		if err := mem.ReadAt(f, cfp); err != nil {
			return out, fmt.Errorf("frame at %#x: %w", cfp, err)
		}
		iseq := binary.LittleEndian.Uint64(f[l.CFPIseq:])
		pc := binary.LittleEndian.Uint64(f[l.CFPPC:])
		ep := binary.LittleEndian.Uint64(f[l.CFPEP:])
		if !okPtr(ep) {
			return out, fmt.Errorf("frame at %#x: ep %#x", cfp, ep)
		}
		flags, err := r.u64(ep)
		if err != nil {
			return out, fmt.Errorf("frame at %#x: flags: %w", cfp, err)
		}
		magic := flags & frameMagic
		if flags&flagCFrame != 0 || magic == magicCFunc || magic == magicIFunc || magic == magicDummy || iseq == 0 || pc == 0 {
			continue
		}
		sf := StackFrame{CFP: cfp, Iseq: iseq, PC: pc, Flags: flags, Finish: flags&flagFinish != 0}
		if magic == magicMethod && ep >= 16 {
			if me, err := r.u64(ep - 16); err == nil && okPtr(me) {
				sf.ME = me
			}
		}
		s, err := r.Iseq(iseq)
		if err != nil {
			return out, fmt.Errorf("frame at %#x: %w", cfp, err)
		}
		pos := uint64(PosUnknown)
		if pc >= s.Encoded && (pc-s.Encoded)/8 < PosUnknown {
			pos = (pc - s.Encoded) / 8
		}
		sf.Word = Word(pos, s.Body, sf.ME, iseq)
		sf.Name, sf.File, sf.Line = s.Label, s.File, r.LineAt(s, pos)
		if sf.ME != 0 {
			if o, err := r.Owner(sf.ME, in.Classes); err == nil {
				sf.Name = o.Prefix + sf.Name
			}
		}
		out = append(out, sf)
	}
	return out, nil
}
