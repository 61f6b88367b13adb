package perl

import (
	"encoding/binary"
	"fmt"
)

// StackFrame is one Perl frame of a stack read from a process's memory.
type StackFrame struct {
	Kind uint8 // Kind*
	// Addr and Word are the frame as the walker reports it: the CV of a
	// sub, else the frame's current statement (COP); and the line << 32 |
	// the check word (see Func.Check).
	Addr, Word uint64
	Cop        uint64 // the frame's current statement
	// Last: the frame is its run's entry (called from C: call_sv), the
	// last one an interpreter loop (Perl_runops_standard) frame runs.
	Last bool
	Name string
	File string
	Line int64 // 0: unknown
}

// maxStack bounds a stack read by Stack; maxStackInfos the stack infos
// (nested interpreter stacks) it follows.
const (
	maxStack      = 1024
	maxStackInfos = 64
	maxContexts   = 8192 // contexts looked at, frames or not
)

// Stack reads the process's current Perl frames, innermost first, the way
// the eBPF walker does (perl.h): the contexts of the current stack info
// from the innermost out, then those of the stack infos it was pushed on,
// and the program's top-level code last. A sub, format or eval context is
// a frame; its line is the current statement's (PL_curcop) for the
// innermost, else the statement the next inner frame was called from
// (its context's blk_oldcop). It is what tests compare the walker's
// frames with, and its specification.
func (in *Interp) Stack(mem Memory) ([]StackFrame, error) {
	r := NewReader(mem, in.Layout)
	l := in.Layout
	interp, err := r.u64(in.CurInterp)
	if err != nil {
		return nil, fmt.Errorf("interpreter: %w", err)
	}
	if interp == 0 {
		return nil, nil
	}
	cop, err := r.u64(interp + uint64(l.InterpCurcop))
	if err != nil {
		return nil, fmt.Errorf("current statement: %w", err)
	}
	si, err := r.u64(interp + uint64(l.InterpCurstackinfo))
	if err != nil {
		return nil, fmt.Errorf("stack info: %w", err)
	}
	var out []StackFrame
	cx := make([]byte, l.CxSize)
	seen := 0
	for n := 0; si != 0; n++ {
		if n == maxStackInfos {
			return out, fmt.Errorf("more than %d stack infos", maxStackInfos)
		}
		if !goodPtr(si) {
			return out, fmt.Errorf("stack info at %#x: bad address", si)
		}
		sib := make([]byte, max(l.SICxstack+8, l.SIPrev+8, l.SICxix+4, l.SIType+4))
		if err := mem.ReadAt(sib, si); err != nil {
			return out, fmt.Errorf("stack info at %#x: %w", si, err)
		}
		stack := binary.LittleEndian.Uint64(sib[l.SICxstack:])
		ix := int32(binary.LittleEndian.Uint32(sib[l.SICxix:]))
		typ := int32(binary.LittleEndian.Uint32(sib[l.SIType:]))
		for ; ix >= 0; ix-- {
			if len(out) == maxStack || seen == maxContexts {
				return out, fmt.Errorf("more than %d frames or %d contexts", maxStack, maxContexts)
			}
			seen++
			at := stack + uint64(ix)*uint64(l.CxSize)
			if err := mem.ReadAt(cx, at); err != nil {
				return out, fmt.Errorf("context %d at %#x: %w", ix, at, err)
			}
			t := cx[l.CxType]
			var f StackFrame
			switch t & cxTypeMask {
			case cxtSub, cxtFormat:
				f.Kind = KindSub
				f.Addr = binary.LittleEndian.Uint64(cx[l.CxSubCV:])
			case cxtEval:
				f.Kind = KindEval
				if t&cxpEvalBlk == 0 && int(binary.LittleEndian.Uint16(cx[l.CxU16:])>>eopTypeShft) == l.OpRequire {
					f.Kind = KindRequire
				}
				f.Addr = cop
			default:
				continue // a loop, a block: part of the frame it is in
			}
			f.Cop = cop
			f.Last = binary.LittleEndian.Uint64(cx[l.CxRetop:]) == 0
			if err := in.name(r, &f); err != nil {
				return out, fmt.Errorf("context %d: %w", ix, err)
			}
			out = append(out, f)
			cop = binary.LittleEndian.Uint64(cx[l.CxOldcop:])
		}
		if typ == perlsiMain {
			f := StackFrame{Kind: KindMain, Addr: cop, Cop: cop, Last: true}
			if err := in.name(r, &f); err != nil {
				return out, fmt.Errorf("top-level code: %w", err)
			}
			out = append(out, f)
			break
		}
		si = binary.LittleEndian.Uint64(sib[l.SIPrev:])
	}
	return out, nil
}

// name fills in f's name, file, line and word.
func (in *Interp) name(r *Reader, f *StackFrame) error {
	_, line, _, err := r.Cop(f.Cop)
	if err != nil {
		return err
	}
	var fn *Func
	if f.Kind == KindSub {
		fn, err = r.Sub(f.Addr)
	} else {
		fn, err = r.Code(f.Addr, f.Kind)
	}
	if err != nil {
		return err
	}
	f.Name, f.File, f.Line = fn.Name, fn.File, line
	f.Word = uint64(line)<<32 | uint64(fn.Check)
	return nil
}
