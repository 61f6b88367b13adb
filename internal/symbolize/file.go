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
	return loadSymsWith(f, nil, maxDWARFBytes)
}

// loadSymsWith reads the symbol data of f and of its separate debug file
// (nil when there is none). Function symbols come from the best source
// present: the debug file's .symtab, f's .symtab, f's MiniDebugInfo
// (.gnu_debugdata), f's .dynsym. DWARF comes from the debug file when it
// has any, else from f.
func loadSymsWith(f, debug *elf.File, maxDWARFBytes uint64) (*fileSyms, error) {
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
	if fs.native, err = loadNative(f, debug); err != nil {
		return nil, err
	}
	// Go code is named from the pclntab; DWARF would only add memory.
	if fs.goTab == nil {
		dwarfFile := f
		if debug != nil && hasDWARF(debug) {
			dwarfFile = debug
		}
		if fs.lines, err = loadLines(dwarfFile, maxDWARFBytes); err != nil {
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
	var chain []dwarfFrame
	if fs.lines != nil {
		chain = fs.lines.lookup(pc)
	}
	var symName string
	if fs.native != nil {
		symName, _ = fs.native.lookup(pc)
	}
	if symName == "" && (len(chain) == 0 || chain[len(chain)-1].name == "") {
		return nil // no function to name: a line alone is not a frame
	}
	if len(chain) == 0 {
		return []Frame{nativeFrame(symName, "", 0)}
	}
	frames := make([]Frame, len(chain))
	for i, c := range chain {
		name := c.name
		if name == "" && i == len(chain)-1 {
			name = symName // DWARF without a name for the function
		}
		frames[i] = nativeFrame(name, c.file, c.line)
	}
	return frames
}

// nativeFrame makes a frame from a raw (possibly mangled) name, copying the
// strings so the frame does not pin the tables they come from.
func nativeFrame(raw, file string, line int64) Frame {
	fr := Frame{Function: demangled(raw), File: strings.Clone(file), Line: line}
	if fr.Function == raw {
		fr.Function = strings.Clone(raw)
	} else {
		fr.SystemName = strings.Clone(raw)
	}
	return fr
}

// describe names the sources loaded, for logs.
func (fs *fileSyms) describe() string {
	var parts []string
	if fs.goTab != nil {
		parts = append(parts, fmt.Sprintf("pclntab (%d funcs)", fs.goTab.numFuncs()))
	}
	if fs.native != nil {
		parts = append(parts, fmt.Sprintf("%s (%d funcs)", fs.native.source, len(fs.native.syms)))
	}
	if fs.lines != nil {
		parts = append(parts, fmt.Sprintf("dwarf (%d unit ranges)", len(fs.lines.units)))
	}
	if len(parts) == 0 {
		return "no symbols"
	}
	return strings.Join(parts, ", ")
}
