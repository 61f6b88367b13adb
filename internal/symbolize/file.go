package symbolize

import (
	"debug/elf"
	"fmt"
	"strings"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// fileSyms is the symbol data of one ELF file: what Symbolize consults. It
// is immutable once loaded and safe for concurrent use.
type fileSyms struct {
	layout *elf.File // only the PT_LOAD headers, for elfx.OffsetToVaddr
	goTab  *goTable
	native *nativeTable
	lines  *lineTable
}

// loadSyms reads the symbol data of f. maxDWARFBytes bounds the DWARF
// sections it will index. A file without symbols gives an empty fileSyms.
func loadSyms(f *elf.File, maxDWARFBytes uint64) (*fileSyms, error) {
	fs := &fileSyms{layout: &elf.File{FileHeader: f.FileHeader}}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			fs.layout.Progs = append(fs.layout.Progs, &elf.Prog{ProgHeader: p.ProgHeader})
		}
	}
	var err error
	if fs.goTab, err = loadGo(f); err != nil {
		return nil, err
	}
	if fs.native, err = loadNative(f); err != nil {
		return nil, err
	}
	// Go code is named from the pclntab; DWARF would only add memory.
	if fs.goTab == nil {
		if fs.lines, err = loadLines(f, maxDWARFBytes); err != nil {
			return nil, err
		}
	}
	return fs, nil
}

// memSize estimates the heap the symbol data holds.
func (fs *fileSyms) memSize() int64 {
	n := int64(256 + 64*len(fs.layout.Progs))
	if fs.goTab != nil {
		n += fs.goTab.size
	}
	if fs.native != nil {
		n += fs.native.memSize()
	}
	if fs.lines != nil {
		n += fs.lines.size
	}
	return n
}

// empty reports whether the file has no symbol data at all.
func (fs *fileSyms) empty() bool { return fs.goTab == nil && fs.native == nil && fs.lines == nil }

// frames names the code at a file offset, innermost first; nil when nothing
// names it. The strings returned share no memory with the tables, so cached
// frames do not pin a file's symbol data after it is evicted.
func (fs *fileSyms) frames(off uint64) []Frame {
	pc, ok := elfx.OffsetToVaddr(fs.layout, off)
	if !ok {
		return nil
	}
	if fs.goTab != nil {
		if frames := fs.goTab.frames(pc); frames != nil {
			return frames // debug/gosym builds a separate string per name
		}
	}
	if fs.native == nil {
		return nil
	}
	raw, ok := fs.native.lookup(pc)
	if !ok {
		return nil
	}
	fr := Frame{Function: demangled(raw)}
	if fr.Function == raw {
		fr.Function = strings.Clone(raw)
	} else {
		fr.SystemName = strings.Clone(raw)
	}
	if fs.lines != nil {
		if file, line, ok := fs.lines.lookup(pc); ok {
			fr.File, fr.Line = file, line
		}
	}
	return []Frame{fr}
}

// describe names the sources loaded, for logs.
func (fs *fileSyms) describe() string {
	var parts []string
	if fs.goTab != nil {
		parts = append(parts, fmt.Sprintf("pclntab (%d funcs)", len(fs.goTab.tab.Funcs)))
	}
	if fs.native != nil {
		parts = append(parts, fmt.Sprintf("%s (%d funcs)", fs.native.source, len(fs.native.syms)))
	}
	if fs.lines != nil {
		parts = append(parts, fmt.Sprintf("dwarf lines (%d unit ranges)", len(fs.lines.units)))
	}
	if len(parts) == 0 {
		return "no symbols"
	}
	return strings.Join(parts, ", ")
}
