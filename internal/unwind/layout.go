package unwind

import (
	"debug/elf"
	"fmt"
	"sort"
)

// segment is one PT_LOAD segment of a file: its bytes [off, off+filesz)
// appear at ELF addresses [vaddr, vaddr+filesz).
type segment struct {
	off, vaddr, filesz uint64
	exec               bool
}

// loadSegments returns f's PT_LOAD segments.
func loadSegments(f *elf.File) []segment {
	var segs []segment
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			segs = append(segs, segment{off: p.Off, vaddr: p.Vaddr, filesz: p.Filesz, exec: p.Flags&elf.PF_X != 0})
		}
	}
	return segs
}

// fileRows re-keys a table from ELF addresses to file offsets, through the
// file's executable segments. The kernel knows every mapping's file offset
// exactly (start minus the page offset it maps), so an address in any
// mapping of the file finds its row without knowing which segment the
// mapping came from. Matching a mapping to a segment is what fails on lld
// and BOLT layouts: a segment's address and file offset differ by more than
// their page offsets, and the page a mapping starts at may belong to the
// segment before it in the file.
//
// Only code has rows: bytes outside every executable segment get
// CFAUnknown. Executable segments whose file ranges overlap cannot be told
// apart by offset and are an error.
func fileRows(rows []Row, segs []segment) ([]Row, error) {
	var code []segment
	for _, s := range segs {
		if s.exec && s.filesz > 0 {
			code = append(code, s)
		}
	}
	if len(code) == 0 {
		return nil, fmt.Errorf("no executable segment with file content")
	}
	sort.Slice(code, func(i, j int) bool { return code[i].off < code[j].off })
	for i := 1; i < len(code); i++ {
		if prev := code[i-1]; code[i].off < prev.off+prev.filesz {
			return nil, fmt.Errorf("executable segments at file offsets %#x and %#x overlap", prev.off, code[i].off)
		}
	}
	t := Table{Rows: rows}
	out := make([]Row, 0, len(rows)+2*len(code))
	add := func(r Row) {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.PC == r.PC {
				*last = r
				if n > 1 && out[n-2].sameRule(r) {
					out = out[:n-1]
				}
				return
			}
			if last.sameRule(r) {
				return
			}
		}
		out = append(out, r)
	}
	for _, s := range code {
		lo, hi := s.vaddr, s.vaddr+s.filesz
		at := func(pc uint64) uint64 { return pc - s.vaddr + s.off }
		first, ok := t.Lookup(lo)
		if !ok {
			first = Row{}
		}
		first.PC = at(lo)
		add(first)
		i := sort.Search(len(rows), func(i int) bool { return rows[i].PC > lo })
		for ; i < len(rows) && rows[i].PC < hi; i++ {
			r := rows[i]
			r.PC = at(r.PC)
			add(r)
		}
		add(Row{PC: at(hi)})
	}
	// A table that is only CFAUnknown has nothing to unwind with.
	for _, r := range out {
		if r.CFA != CFAUnknown {
			return out, nil
		}
	}
	return nil, ErrNoCFI
}
