package symbolize

import (
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"fmt"
)

// maxPclntabBytes bounds the .gopclntab read for one binary; the largest Go
// binaries in the wild have pclntabs of a few hundred MiB at most.
const maxPclntabBytes = 512 << 20

// maxGoFuncs bounds the functions a pclntab may declare. debug/gosym
// allocates a Func and a Sym for each up front, so a forged count in a small
// file would otherwise cost gigabytes. Large real binaries have ~300k.
const maxGoFuncs = 1 << 20

// goFuncOverhead estimates the heap debug/gosym keeps per function (a Func,
// its Sym and its name).
const goFuncOverhead = 160

// goTable names PCs of a Go binary from its pclntab. debug/gosym tables are
// safe for concurrent reads.
type goTable struct {
	tab  *gosym.Table
	size int64
}

// pclntabSection returns the section holding the Go pclntab: .gopclntab, or
// .data.rel.ro.gopclntab in externally linked PIE binaries.
func pclntabSection(f *elf.File) *elf.Section {
	for _, name := range []string{".gopclntab", ".data.rel.ro.gopclntab"} {
		if s := f.Section(name); s != nil && s.Type != elf.SHT_NOBITS {
			return s
		}
	}
	return nil
}

// loadGo builds the Go table of f, or returns nil when f has no pclntab.
func loadGo(f *elf.File) (g *goTable, err error) {
	sect := pclntabSection(f)
	if sect == nil {
		return nil, nil
	}
	if sect.Size > maxPclntabBytes {
		return nil, fmt.Errorf("%s: %d bytes exceed the %d limit", sect.Name, sect.Size, maxPclntabBytes)
	}
	data, err := sect.Data()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", sect.Name, err)
	}
	var textStart uint64
	if text := f.Section(".text"); text != nil {
		textStart = text.Addr
	}
	g, err = newGoTable(data, textStart, f.ByteOrder)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", sect.Name, err)
	}
	return g, nil
}

// newGoTable parses pclntab data for code starting at textStart.
func newGoTable(data []byte, textStart uint64, bo binary.ByteOrder) (g *goTable, err error) {
	// Header: magic (4 bytes), two zero bytes, PC quantum, pointer size,
	// then the function count (one pointer wide).
	if len(data) < 16 {
		return nil, fmt.Errorf("%d bytes is too short for a header", len(data))
	}
	var nfunc uint64
	switch data[7] {
	case 4:
		nfunc = uint64(bo.Uint32(data[8:]))
	case 8:
		nfunc = bo.Uint64(data[8:])
	default:
		return nil, fmt.Errorf("pointer size %d", data[7])
	}
	if nfunc > maxGoFuncs {
		return nil, fmt.Errorf("%d functions exceed the %d limit", nfunc, maxGoFuncs)
	}
	// debug/gosym trusts the table it parses and can panic on a corrupt one.
	defer func() {
		if r := recover(); r != nil {
			g, err = nil, fmt.Errorf("corrupt table: %v", r)
		}
	}()
	// Go 1.3 and later keep no separate .gosymtab data; the pclntab has it all.
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, textStart))
	if err != nil {
		return nil, err
	}
	return &goTable{tab: tab, size: int64(len(data)) + int64(len(tab.Funcs))*goFuncOverhead}, nil
}

// frames names pc, innermost first, or returns nil when no Go function
// covers it (for example C code linked in with cgo).
//
// Inline expansion belongs here: when the pclntab's inline tree
// (FUNCDATA_InlTree, PCDATA_InlTreeIndex) marks pc as inlined, the frames of
// the inlined calls go before the outer function's frame. debug/gosym does
// not decode that tree, so today the innermost position is reported under the
// name of the outermost function.
func (g *goTable) frames(pc uint64) (frames []Frame) {
	defer func() {
		if recover() != nil {
			frames = nil // a corrupt line program: treat pc as unnamed
		}
	}()
	file, line, fn := g.tab.PCToLine(pc)
	if fn == nil {
		return nil
	}
	return []Frame{{Function: fn.Name, File: file, Line: int64(line)}}
}
