package php

import (
	"encoding/binary"
	"fmt"
)

// StackFrame is one PHP frame of a stack read from a process's memory.
type StackFrame struct {
	Ex   uint64 // the zend_execute_data
	Func uint64 // the zend_function
	// Addr and Word are the frame as the walker reports it: the
	// function's address (top-level code: its file name's, CodeKind),
	// and its line << 32 | check word.
	Addr, Word uint64
	Kind       uint8  // Kind*
	Opline     uint64 // the frame's opline: saved, or from VMRegs
	Name       string
	File       string
	Line       int64 // 0: unknown
}

// VMRegs are the registers the hybrid VM (and the JIT) keeps its state in
// on x86-64 while it runs: r14 holds the current zend_execute_data and r15
// its opline, which the frame's own opline field is not updated with at
// each instruction. Callee-saved, they still hold it while the VM calls C,
// and the innermost execute_ex's at any time.
type VMRegs struct {
	Ex, Opline uint64 // r14, r15
}

// maxStack bounds a stack read by Stack.
const maxStack = 1024

// Stack reads the process's current PHP frames, innermost first, the way
// the eBPF walker does (php.h): from executor_globals.current_execute_data
// along prev_execute_data, skipping frames without a function. It is what
// tests compare the walker's frames with, and its specification. The frame
// regs.Ex is takes its line from regs.Opline when that is one of its
// opcodes (see VMRegs), else from its saved opline.
func (in *Interp) Stack(mem Memory, regs VMRegs) ([]StackFrame, error) {
	r := NewReader(mem, in.Layout)
	l := in.Layout
	ex, err := r.u64(in.CurrentEx)
	if err != nil {
		return nil, fmt.Errorf("current frame: %w", err)
	}
	n := max(l.ExOpline, l.ExFunc, l.ExCallInfo, l.ExPrev) + 8
	b := make([]byte, n)
	var out []StackFrame
	for i := 0; ex != 0; i++ {
		if i == maxStack {
			return out, fmt.Errorf("more than %d frames", maxStack)
		}
		if ex&7 != 0 || ex >= 1<<47 {
			return out, fmt.Errorf("frame at %#x: bad address", ex)
		}
		if err := mem.ReadAt(b, ex); err != nil {
			return out, fmt.Errorf("frame at %#x: %w", ex, err)
		}
		fn := binary.LittleEndian.Uint64(b[l.ExFunc:])
		info := binary.LittleEndian.Uint32(b[l.ExCallInfo:])
		opline := binary.LittleEndian.Uint64(b[l.ExOpline:])
		prev := binary.LittleEndian.Uint64(b[l.ExPrev:])
		at := ex
		ex = prev
		if fn == 0 {
			continue
		}
		hdr, err := r.header(fn)
		if err != nil {
			return out, err
		}
		kind := uint8(KindFunction)
		switch {
		case hdr[l.FnType] == internalFunction:
			kind = KindInternal
		case info&l.CallCode == 0:
		case hdr[l.FnType] == evalCode:
			kind = KindEval
		case prev == 0:
			kind = KindMain
		default:
			kind = KindInclude
		}
		f, err := r.Function(fn, kind)
		if err != nil {
			return out, err
		}
		sf := StackFrame{Ex: at, Func: fn, Addr: fn, Kind: kind, Opline: opline, Name: f.Name, File: f.File}
		if !f.Internal {
			if at == regs.Ex && regs.Ex != 0 {
				if line := r.Line(fn, regs.Opline); line != 0 {
					sf.Opline = regs.Opline
				}
			}
			sf.Line = r.Line(fn, sf.Opline)
		}
		sf.Word = uint64(sf.Line)<<32 | uint64(f.Check)
		if CodeKind(kind) {
			if sf.Addr, err = r.u64(fn + uint64(l.OpFilename)); err != nil {
				return out, fmt.Errorf("function at %#x: file: %w", fn, err)
			}
			sf.Word = uint64(sf.Line)<<32 | uint64(uint32(sf.Addr))
		}
		out = append(out, sf)
	}
	return out, nil
}
