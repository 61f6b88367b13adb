package elfx

import (
	"debug/elf"
	"fmt"
)

// OffsetToVaddr translates a file offset to the virtual address it is loaded
// at, using the PT_LOAD segment whose file range contains it (an executable
// segment wins if several do). This turns a PC into a symbol-table address:
// the caller computes the file offset from /proc/PID/maps, which works the
// same for executables, PIE binaries and shared libraries. It reports false
// when no loaded segment holds the offset.
func OffsetToVaddr(f *elf.File, off uint64) (uint64, bool) {
	var found *elf.Prog
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || off < p.Off || off-p.Off >= p.Filesz {
			continue
		}
		if found == nil || (found.Flags&elf.PF_X == 0 && p.Flags&elf.PF_X != 0) {
			found = p
		}
	}
	if found == nil {
		return 0, false
	}
	return found.Vaddr + (off - found.Off), true
}

// LoadBias is what a file's virtual addresses are moved by in a process
// that maps it at start from file offset off, which must fall in an
// executable PT_LOAD segment (the mapping of its code).
func LoadBias(f *elf.File, start, off uint64) (uint64, error) {
	for _, ph := range f.Progs {
		if ph.Type != elf.PT_LOAD || ph.Flags&elf.PF_X == 0 {
			continue
		}
		if off >= ph.Off && off < ph.Off+ph.Filesz {
			return start - (ph.Vaddr + (off - ph.Off)), nil
		}
	}
	return 0, fmt.Errorf("no executable segment at offset %#x", off)
}

// FindSymbols returns those of the named symbols that have a value, from
// .dynsym where it has them, else from .symtab.
func FindSymbols(f *elf.File, names ...string) map[string]elf.Symbol {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]elf.Symbol{}
	for _, read := range []func() ([]elf.Symbol, error){f.DynamicSymbols, f.Symbols} {
		syms, err := read()
		if err != nil {
			continue
		}
		for _, s := range syms {
			if _, ok := out[s.Name]; !ok && want[s.Name] && s.Value != 0 {
				out[s.Name] = s
			}
		}
		if len(out) == len(want) {
			break
		}
	}
	return out
}
