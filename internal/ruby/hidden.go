package ruby

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
)

// Distributions build libruby with hidden visibility and strip it: Debian's
// Ruby 3.3 exports none of ruby_current_vm_ptr, ruby_current_ec and
// rb_vm_exec, and has no .symtab. Their places are then read from the code
// of three functions of Ruby's public C API, which every libruby exports:
//
//   - ruby_vm_at_exit loads the VM pointer (GET_VM()) before anything else;
//   - rb_current_receiver reads ruby_current_ec (GET_EC()) through
//     __tls_get_addr;
//   - rb_iseq_eval calls or jumps to the VM's exec function, which calls
//     vm_exec_core.
//
// Each finding is checked twice: here against the file's sections, and by
// tlsOffset against the process (the VM's main thread and the context the
// thread's ruby_current_ec holds must name each other).

// hiddenCode bounds the bytes read of each exported function.
const hiddenCode = 512

// ripLoad returns the address a function at file address at first loads a
// quadword from, RIP-relative: REX.W (R) 8B /r with mod 00 and r/m 101.
func ripLoad(code []byte, at uint64) (uint64, bool) {
	for i := 0; i+7 <= len(code); i++ {
		if (code[i] == 0x48 || code[i] == 0x4c) && code[i+1] == 0x8b && code[i+2]&0xc7 == 0x05 {
			disp := int64(int32(binary.LittleEndian.Uint32(code[i+3:])))
			return uint64(int64(at) + int64(i) + 7 + disp), true
		}
	}
	return 0, false
}

// tlsAccess decodes a function's first general- or local-dynamic access to
// a thread-local variable: lea rdi, [rip+got] (66-prefixed in the general
// model), a call (of __tls_get_addr) within the next few bytes, and a load
// from the address it returns, mov r64, [rax+disp]. It returns the GOT
// entry's address and disp.
func tlsAccess(code []byte, at uint64) (got uint64, disp int64, ok bool) {
	for i := 0; i+7 <= len(code); i++ {
		if code[i] != 0x48 || code[i+1] != 0x8d || code[i+2] != 0x3d {
			continue
		}
		got = uint64(int64(at) + int64(i) + 7 + int64(int32(binary.LittleEndian.Uint32(code[i+3:]))))
		j := i + 7
		for k := 0; k < 3 && j < len(code) && (code[j] == 0x66 || code[j] == 0x48); k++ {
			j++ // data16 data16 rex.W: the general model's padding
		}
		if j+5 > len(code) || code[j] != 0xe8 {
			return 0, 0, false
		}
		j += 5
		if j+3 > len(code) || (code[j] != 0x48 && code[j] != 0x4c) || code[j+1] != 0x8b || code[j+2]&7 != 0 {
			return 0, 0, false
		}
		switch mod := code[j+2] >> 6; {
		case mod == 0:
			return got, 0, true
		case mod == 1 && j+4 <= len(code):
			return got, int64(int8(code[j+3])), true
		case mod == 2 && j+7 <= len(code):
			return got, int64(int32(binary.LittleEndian.Uint32(code[j+3:]))), true
		}
		return 0, 0, false
	}
	return 0, 0, false
}

// hiddenVMPtr finds ruby_current_vm_ptr from ruby_vm_at_exit: an aligned
// word of a writable section.
func hiddenVMPtr(f *elf.File, fn elf.Symbol) (uint64, error) {
	code, err := readFunc(f, fn)
	if err != nil {
		return 0, fmt.Errorf("ruby_vm_at_exit: %w", err)
	}
	addr, ok := ripLoad(code, fn.Value)
	if !ok || addr%8 != 0 {
		return 0, errors.New("ruby_vm_at_exit loads no vm pointer")
	}
	s := sectionOf(f, addr)
	if s == nil || s.Flags&elf.SHF_WRITE == 0 || s.Flags&elf.SHF_TLS != 0 {
		return 0, fmt.Errorf("ruby_vm_at_exit loads %#x, not writable data", addr)
	}
	return addr, nil
}

// hiddenEC finds ruby_current_ec's offset in libruby's TLS block of size
// memsz from rb_current_receiver. The GOT entry's second word holds the
// variable's offset in the general-dynamic model (written by the linker for
// a local symbol) and 0 in the local-dynamic one, where the load's
// displacement holds it.
func hiddenEC(f *elf.File, fn elf.Symbol, memsz uint64) (uint64, error) {
	code, err := readFunc(f, fn)
	if err != nil {
		return 0, fmt.Errorf("rb_current_receiver: %w", err)
	}
	got, disp, ok := tlsAccess(code, fn.Value)
	if !ok {
		return 0, errors.New("rb_current_receiver reads no thread-local variable")
	}
	b, err := readAddr(f, got, 16)
	if err != nil {
		return 0, fmt.Errorf("rb_current_receiver's tls entry %#x: %w", got, err)
	}
	if len(b) < 16 {
		return 0, fmt.Errorf("rb_current_receiver's tls entry %#x: past its section", got)
	}
	off := int64(binary.LittleEndian.Uint64(b[8:])) + disp
	if off < 0 || off%8 != 0 || uint64(off)+8 > memsz {
		return 0, fmt.Errorf("rb_current_receiver reads tls offset %d of a %d-byte block", off, memsz)
	}
	return uint64(off), nil
}

// hiddenExec finds the exec function from rb_iseq_eval: of the functions
// it calls or jumps to (e8 or e9 rel32 to a function start), the one whose
// own largest callee (VMLoop) is largest. It returns the exec function's
// extent and vm_exec_core's.
func hiddenExec(f *elf.File, fn elf.Symbol, starts []uint64) (exec, core [2]uint64, err error) {
	code, err := readFunc(f, fn)
	if err != nil {
		return exec, core, fmt.Errorf("rb_iseq_eval: %w", err)
	}
	for i := 0; i+5 <= len(code); i++ {
		if code[i] != 0xe8 && code[i] != 0xe9 {
			continue
		}
		t := rel32(code, i, fn.Value)
		j, found := searchStart(starts, t)
		if !found || j+1 >= len(starts) || t == fn.Value {
			continue
		}
		e := starts[j+1]
		s, se, err := loopIn(f, t, e, starts)
		if err == nil && se-s > core[1]-core[0] {
			exec, core = [2]uint64{t, e}, [2]uint64{s, se}
		}
	}
	if core[1] == 0 {
		return exec, core, errors.New("no vm loop reached from rb_iseq_eval")
	}
	return exec, core, nil
}

// readFunc reads the first hiddenCode bytes of fn (all of it if smaller).
func readFunc(f *elf.File, fn elf.Symbol) ([]byte, error) {
	n := uint64(hiddenCode)
	if fn.Size > 0 {
		n = min(n, fn.Size)
	}
	return readAddr(f, fn.Value, int(n))
}

func sectionOf(f *elf.File, addr uint64) *elf.Section {
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && addr >= s.Addr && addr < s.Addr+s.Size {
			return s
		}
	}
	return nil
}
