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
//
// fileRows consumes rows: where their array has room for the rows it adds
// (two per segment at most), the result is written over them, as a big
// binary's second copy of a million rows would be the largest allocation
// of its build. mem holds rows (nil: the heap): its pages are dropped as
// fileRows goes.
func fileRows(rows []Row, segs []segment, mem *releases) ([]Row, error) {
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
	// What each segment takes from rows, found before anything is written:
	// the rule in force at its start and its rows' index range.
	type span struct {
		first  Row
		lo, hi int
	}
	spans := make([]span, len(code))
	t := Table{Rows: rows}
	inOrder := true
	for i, s := range code {
		first, ok := t.Lookup(s.vaddr)
		if !ok {
			first = Row{}
		}
		lo := sort.Search(len(rows), func(i int) bool { return rows[i].PC > s.vaddr })
		hi := sort.Search(len(rows), func(i int) bool { return rows[i].PC >= s.vaddr+s.filesz })
		spans[i] = span{first, lo, max(lo, hi)}
		if i > 0 && lo < spans[i-1].hi {
			inOrder = false
		}
	}
	// In place, the rows move up by the most that segments add, so that
	// the output, which grows by at most one row per row read plus two per
	// segment, never overtakes what is still to be read.
	extra := 2 * len(code)
	src := rows
	var out []Row
	if inOrder && cap(rows)-len(rows) >= extra {
		// Moved a stretch at a time from the end, so that the pages in
		// between can go.
		src = rows[extra : extra+len(rows)]
		for hi := len(rows); hi > 0; {
			lo := max(0, hi-dropRows)
			copy(src[lo:hi], rows[lo:hi])
			mem.drop()
			hi = lo
		}
		out = rows[:0]
	} else {
		out = make([]Row, 0, len(rows)+extra)
	}
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
	for i, s := range code {
		at := func(pc uint64) uint64 { return pc - s.vaddr + s.off }
		sp := spans[i]
		first := sp.first
		first.PC = at(s.vaddr)
		add(first)
		for j, r := range src[sp.lo:sp.hi] {
			r.PC = at(r.PC)
			add(r)
			mem.passed(j)
		}
		add(Row{PC: at(s.vaddr + s.filesz)})
	}
	// A table that is only CFAUnknown has nothing to unwind with.
	for _, r := range out {
		if r.CFA != CFAUnknown {
			return out, nil
		}
	}
	return nil, ErrNoCFI
}
