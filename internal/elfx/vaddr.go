package elfx

import "debug/elf"

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
