package unwind

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sort"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// ErrNoCFI is returned when a file has neither .eh_frame nor .debug_frame.
var ErrNoCFI = errors.New("no call frame information")

// FromELF builds the unwind table of an x86-64 or aarch64 ELF file from its .eh_frame
// and .debug_frame; where both describe an address, .eh_frame wins (it is
// what the runtime itself unwinds with). Broken single entries are counted in
// Stats and leave a CFAUnknown gap; an error is returned only when no table
// can be built.
func FromELF(f *elf.File) (*Table, error) {
	eh, dbg, err := frameSections(f, nil)
	if err != nil {
		return nil, err
	}
	if eh == nil && dbg == nil {
		return nil, fmt.Errorf("unwind tables: %w", ErrNoCFI)
	}
	t, err := fromSections(eh, dbg, pcRange{}, nil)
	return t.onHeap(), err
}

// frameSections returns f's .eh_frame and .debug_frame (nil when absent),
// after checking f is an x86-64 or aarch64 file. img, if not nil, holds f's bytes:
// sections stored as they are are read there, in place.
func frameSections(f *elf.File, img []byte) (eh, dbg *section, err error) {
	if f.Machine != elf.EM_X86_64 && f.Machine != elf.EM_AARCH64 || f.Class != elf.ELFCLASS64 {
		return nil, nil, fmt.Errorf("unwind tables: machine %v %v: only x86-64 and aarch64 are supported", f.Class, f.Machine)
	}
	if eh, err = sectionOf(f, img, ".eh_frame", false); err != nil {
		return nil, nil, err
	}
	if dbg, err = sectionOf(f, img, ".debug_frame", true); err != nil {
		return nil, nil, err
	}
	if f.Machine == elf.EM_AARCH64 {
		plt := pltRanges(f)
		for _, s := range []*section{eh, dbg} {
			if s != nil {
				s.plt = plt
			}
		}
	}
	return eh, dbg, nil
}

// pltRanges returns the PLT sections of an aarch64 file. Its stubs (adrp,
// ldr, add, br x17) touch neither sp nor x30, and no linker writes CFI for
// them: they unwind as CFASPLR rows, the return address in the link
// register.
func pltRanges(f *elf.File) []pcRange {
	var out []pcRange
	for _, s := range f.Sections {
		if (s.Name == ".plt" || s.Name == ".iplt") && s.Flags&elf.SHF_EXECINSTR != 0 && s.Size > 0 && s.Addr+s.Size > s.Addr {
			out = append(out, pcRange{s.Addr, s.Addr + s.Size})
		}
	}
	return out
}

// FromSeparateDebug builds the table of f (the loaded file) and adds the
// .debug_frame of debug, its separate debug file (found through build id or
// debuglink), for addresses the loaded file's CFI does not cover.
func FromSeparateDebug(f, debug *elf.File) (*Table, error) {
	t, err := fromSeparateDebug(f, nil, debug, pcRange{}, nil)
	return t.onHeap(), err
}

// fromSeparateDebug is FromSeparateDebug with the rows outside the heap
// (the table must be released), and f's sections read in place from img
// (f's bytes) when it is not nil; the FDEs wholly inside skip are left out.
// drop, if set, lets go of the pages of img read so far; the parse calls
// it as it goes.
func fromSeparateDebug(f *elf.File, img []byte, debug *elf.File, skip pcRange, drop func()) (*Table, error) {
	eh, dbg, err := frameSections(f, img)
	if err != nil {
		return nil, err
	}
	if dbg == nil && debug != nil {
		if dbg, err = sectionOf(debug, nil, ".debug_frame", true); err != nil {
			return nil, fmt.Errorf("separate debug file: %w", err)
		}
	}
	if eh == nil && dbg == nil {
		return nil, fmt.Errorf("unwind tables: %w", ErrNoCFI)
	}
	return fromSections(eh, dbg, skip, drop)
}

// sectionOf reads a CFI section; nil when it is absent or empty. A section
// stored as it is, inside img (f's bytes, or nil), is parsed in place
// instead of copied into the heap: LLVM's .eh_frame is 10 MB. A compressed
// one (an unstripped Go binary's .debug_frame: 2.3 MB inflated) is
// inflated into a spill (elfx.MapSpill), outside the heap, unmapped once
// the section is unreachable.
func sectionOf(f *elf.File, img []byte, name string, debug bool) (*section, error) {
	s := f.Section(name)
	if s == nil || s.Type == elf.SHT_NOBITS || s.Size == 0 {
		return nil, nil
	}
	if s.Size > maxSectionSize {
		return nil, fmt.Errorf("section %s: %d bytes exceeds %d", name, s.Size, maxSectionSize)
	}
	var data []byte
	var spill *elfx.Image
	switch {
	case s.Flags&elf.SHF_COMPRESSED == 0 && s.Offset <= uint64(len(img)) && s.Size <= uint64(len(img))-s.Offset:
		data = img[s.Offset : s.Offset+s.Size : s.Offset+s.Size]
	case s.Flags&elf.SHF_COMPRESSED != 0:
		m, err := elfx.MapSpill(int64(s.Size), s.Open())
		if err != nil {
			return nil, fmt.Errorf("section %s: %w", name, err)
		}
		data, spill = m.Bytes(), m
	default:
		var err error
		if data, err = s.Data(); err != nil {
			return nil, fmt.Errorf("section %s: %w", name, err)
		}
	}
	sec := &section{data: data, addr: s.Addr, debug: debug, arm64: f.Machine == elf.EM_AARCH64}
	if spill != nil {
		// Whatever reads data holds sec (a Finder its sections, a build
		// its own until the rows are made): data goes with it.
		runtime.AddCleanup(sec, func(m *elfx.Image) { m.Unmap() }, spill)
	}
	sec.ctx = ptrCtx{secAddr: s.Addr, deref: derefFunc(f)}
	if debug {
		// .debug_frame is not loaded: pc-relative pointers do not occur.
		sec.ctx.secAddr = 0
	}
	if t := f.Section(".text"); t != nil {
		sec.ctx.textBase = t.Addr
	}
	if g := f.Section(".got"); g != nil {
		sec.ctx.dataBase = g.Addr
	}
	return sec, nil
}

// derefFunc returns a reader of 8-byte pointers at virtual addresses in f's
// PT_LOAD segments, for DW_EH_PE_indirect.
func derefFunc(f *elf.File) func(uint64) (uint64, error) {
	return func(addr uint64) (uint64, error) {
		for _, p := range f.Progs {
			if p.Type != elf.PT_LOAD || addr < p.Vaddr || addr-p.Vaddr > p.Filesz || p.Filesz-(addr-p.Vaddr) < 8 {
				continue
			}
			var b [8]byte
			if _, err := p.ReadAt(b[:], int64(addr-p.Vaddr)); err != nil {
				return 0, err
			}
			return binary.LittleEndian.Uint64(b[:]), nil
		}
		return 0, fmt.Errorf("address %#x not in a loaded segment", addr)
	}
}

// fromSections parses both sections (either may be nil) and builds the
// table, whose rows live outside the heap until it is released. The FDEs
// wholly inside skip are left out (counted in Stats.Skipped). drop, if
// set, lets go of the sections' pages read so far (those of a mapping).
func fromSections(eh, dbg *section, skip pcRange, drop func()) (*Table, error) {
	var st Stats
	p := parser{st: &st, skip: skip, dropInput: drop}
	// The buffers are reserved at what the input can hold: every row but
	// an FDE's first needs an advance of at least one byte of CFI, and an
	// FDE takes at least 8 bytes. If the mappings cannot be made, they are
	// sized from what GCC output averages, 5 bytes of CFI per row and 40
	// per FDE, and grow.
	size := 0
	var plt []pcRange
	for _, s := range []*section{eh, dbg} {
		if s != nil {
			size += len(s.data)
			plt = s.plt
		}
	}
	size += len(plt)
	var scratch releases
	defer scratch.run()
	p.rows = reserve[Row](&scratch, size+1, min(size/5+1, maxPrealloc))
	p.fdes = reserve[fdeRows](&scratch, size/8+1, min(size/32+1, maxPrealloc))
	p.scratch = scratch
	var ehErr error
	if eh != nil {
		if err := p.parseSection(eh); err != nil {
			ehErr = fmt.Errorf("section .eh_frame: %w", err)
		}
	}
	nEH := len(p.fdes)
	if dbg != nil {
		if err := p.parseSection(dbg); err != nil && nEH == 0 && len(p.fdes) == 0 {
			return nil, errors.Join(ehErr, fmt.Errorf("section .debug_frame: %w", err))
		}
	}
	if ehErr != nil && len(p.fdes) == 0 {
		return nil, ehErr
	}
	// After both sections: a PLT an FDE covers keeps the FDE's rows.
	for _, r := range plt {
		if skip.holds(r.lo, r.hi) {
			continue
		}
		p.fdes = append(p.fdes, fdeRows{begin: r.lo, end: r.hi, first: len(p.rows), n: 1})
		p.rows = append(p.rows, Row{PC: r.lo, CFA: CFASPLR})
	}
	fdes := p.fdes
	if nEH > 0 && len(fdes) > nEH {
		fdes = dropCovered(fdes, nEH, &st)
	}
	return build(fdes, p.rows, &st, scratch), nil
}

// dropCovered removes the FDEs after the first nEH (those from .debug_frame)
// that overlap any of the first nEH (those from .eh_frame).
func dropCovered(fdes []fdeRows, nEH int, st *Stats) []fdeRows {
	eh := append([]fdeRows(nil), fdes[:nEH]...)
	sort.Slice(eh, func(i, j int) bool { return eh[i].begin < eh[j].begin })
	// maxEnd[i] is the largest end among eh[:i+1], so that one search finds
	// any earlier FDE reaching into a range.
	maxEnd := make([]uint64, len(eh))
	var m uint64
	for i, f := range eh {
		m = max(m, f.end)
		maxEnd[i] = m
	}
	out := fdes[:nEH:nEH]
	for _, f := range fdes[nEH:] {
		// The last eh FDE starting before f.end overlaps f if any eh FDE up
		// to it ends after f.begin.
		i := sort.Search(len(eh), func(i int) bool { return eh[i].begin >= f.end })
		if i > 0 && maxEnd[i-1] > f.begin {
			st.Overlapping++
			continue
		}
		out = append(out, f)
	}
	return out
}
