package symbolize

import (
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/sonde-dev/sonde/internal/pclntab"
)

// maxGoFuncs bounds the functions a legacy (Go 1.2-1.17) pclntab may
// declare: debug/gosym allocates a Func and a Sym for each up front, so a
// forged count in a small file would otherwise cost gigabytes.
const maxGoFuncs = 1 << 20

// goFuncOverhead estimates the heap debug/gosym keeps per function (a Func,
// its Sym and its name), for legacy tables only.
const goFuncOverhead = 160

// goTable names PCs of a Go binary from its pclntab: with internal/pclntab
// (Go 1.18+, inline frames, no per-function memory) or, for older binaries,
// with debug/gosym. Both are safe for concurrent reads.
type goTable struct {
	pcln   *pclntab.Table
	legacy *gosym.Table
	size   int64
}

// numFuncs is how many functions the table names.
func (g *goTable) numFuncs() int {
	if g.pcln != nil {
		return g.pcln.NumFuncs()
	}
	return len(g.legacy.Funcs)
}

// pclntabSection returns the section holding the Go pclntab, or nil.
func pclntabSection(f *elf.File) *elf.Section { return pclntab.Section(f) }

// loadGo builds the Go table of f, or returns nil when f has no pclntab.
// img holds f's bytes (a read-only mapping): Go 1.18+ tables are then read
// in place and hold no heap beyond the Table itself. nil reads them into
// the heap.
func loadGo(f *elf.File, img []byte) (*goTable, error) {
	tab, err := pclntab.OpenELFImage(f, img)
	switch {
	case errors.Is(err, pclntab.ErrNoTable):
		return nil, nil
	case errors.Is(err, pclntab.ErrUnsupported):
		return loadLegacyGo(f)
	case err != nil:
		return nil, err
	}
	g := newPclnGoTable(tab)
	if img != nil {
		g.size = goTableMapped
	}
	return g, nil
}

// goTableMapped is the heap of a goTable read in place: the Table's header.
const goTableMapped = 512

func newPclnGoTable(tab *pclntab.Table) *goTable {
	g := &goTable{pcln: tab, size: tab.Size()}
	return g
}

// loadLegacyGo reads a pre-1.18 pclntab with debug/gosym.
func loadLegacyGo(f *elf.File) (*goTable, error) {
	sect := pclntab.Section(f)
	data, textStart, err := pclntab.SectionData(f, sect)
	if err != nil {
		return nil, err
	}
	g, err := newGoTable(data, textStart, f.ByteOrder)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", sect.Name, err)
	}
	return g, nil
}

// newGoTable parses pclntab data for code starting at textStart. Without the
// ELF file it cannot find the funcdata region, so Go 1.18+ tables made here
// name PCs without inline expansion.
func newGoTable(data []byte, textStart uint64, bo binary.ByteOrder) (g *goTable, err error) {
	tab, err := pclntab.Open(data, textStart, nil)
	if err == nil {
		return newPclnGoTable(tab), nil
	}
	if !errors.Is(err, pclntab.ErrUnsupported) {
		return nil, err
	}
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
	legacy, err := gosym.NewTable(nil, gosym.NewLineTable(data, textStart))
	if err != nil {
		return nil, err
	}
	g = &goTable{legacy: legacy, size: int64(len(data)) + int64(len(legacy.Funcs))*goFuncOverhead}
	return g, nil
}

// frames names pc, innermost first: the calls inlined at pc, then the
// physical function; nil when no Go function covers it (for example C code
// linked in with cgo). The strings are copies: cached frames must not pin
// the pclntab. Legacy tables give one frame, named after the physical
// function, at the innermost position.
func (g *goTable) frames(pc uint64) []Line {
	if g.legacy != nil {
		return g.legacyFrames(pc)
	}
	raw, err := g.pcln.Frames(pc, make([]pclntab.Frame, 0, 4))
	if err != nil && len(raw) == 0 {
		return nil // a corrupt table: treat pc as unnamed
	}
	if len(raw) == 0 {
		return nil
	}
	out := make([]Line, len(raw))
	for i, r := range raw {
		out[i] = Line{Function: strings.Clone(r.Function), Go: true}
		if r.Line > 0 {
			out[i].File, out[i].Line = strings.Clone(r.File), r.Line
		}
	}
	return out
}

func (g *goTable) legacyFrames(pc uint64) (frames []Line) {
	defer func() {
		if recover() != nil {
			frames = nil // a corrupt line program: treat pc as unnamed
		}
	}()
	file, line, fn := g.legacy.PCToLine(pc)
	if fn == nil {
		return nil
	}
	return []Line{{Function: fn.Name, File: file, Line: int64(max(line, 0)), Go: true}}
}
