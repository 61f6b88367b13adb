package symbolize

import (
	"debug/elf"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// fileSyms is the symbol data of one ELF file: what Symbolize consults. It
// is safe for concurrent use. Its tables read the file (and its debug file)
// in place, from read-only mappings that stay until unmap.
type fileSyms struct {
	layout *elf.File // only the PT_LOAD headers, for elfx.OffsetToVaddr
	goTab  *goTable
	// native is the function symbols. In a Go binary, whose pclntab names
	// the Go code, it names only the rest (a cgo binary's C code), and
	// nativeLater reads it when a lookup first needs it, not before: a big
	// Go binary's .strtab alone is megabytes. Both guarded by nativeMu.
	nativeMu    sync.Mutex
	native      *nativeTable
	nativeLater func() (*nativeTable, error)
	lines       *lineTable
	images      []*elfx.Image // the mappings the tables read; unmapped by unmap
	// refused is set when a compressed section was refused by the
	// per-file inflation cap: the file is named without it.
	refused error
}

// loadLimits bound what loading one file may take.
type loadLimits struct {
	maxDWARF uint64 // the largest DWARF indexed for lines
	// maxDWARFHeap bounds the heap indexing one file's DWARF may take
	// before any unit is parsed; a file past it is named from symbols.
	maxDWARFHeap int64
	inflate      int64 // the most bytes inflated (MiniDebugInfo, compressed DWARF)
	noMini       bool  // skip MiniDebugInfo (refused before: not inflated again)
	// dropRead, when set, lets go of the file pages of bytes the load has
	// read and will not read again (elfx.Image.DropRange): a compressed
	// section once inflated, the .debug_info the unit walk has passed.
	dropRead func(b []byte)
}

// loadSymsWith reads the symbol data of f and of its separate debug file
// (nil when there is none); fImg and debugImg are their bytes (read-only
// mappings, or nil to read sections through the files). Function symbols
// come from the best source present: the debug file's .symtab, f's .symtab,
// f's MiniDebugInfo (.gnu_debugdata), f's .dynsym. DWARF comes from the
// debug file when it has any, else from f.
func loadSymsWith(f *elf.File, fImg []byte, debug *elf.File, debugImg []byte, lim loadLimits) (*fileSyms, error) {
	fs := &fileSyms{layout: &elf.File{FileHeader: f.FileHeader}}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			fs.layout.Progs = append(fs.layout.Progs, &elf.Prog{ProgHeader: p.ProgHeader})
		}
	}
	inflate := lim.inflate
	var err error
	if fs.goTab, err = loadGo(f, fImg); err != nil {
		return nil, err
	}
	var mini func() (*nativeTable, error)
	if !lim.noMini {
		mini = func() (*nativeTable, error) {
			t, err := loadMiniDebug(f, fImg, int(max(inflate, 0)))
			if errors.Is(err, errInflateCap) {
				fs.refused = err
			}
			if t != nil {
				inflate -= t.memSize()
			}
			return t, err
		}
	}
	if fs.goTab != nil && fImg != nil && debug == nil && f.Section(".gnu_debugdata") == nil {
		// The mapping outlives the lookups (unmap); the symbol table is
		// read from it on first need. An unreadable one then names nothing
		// more than the pclntab does.
		fs.nativeLater = func() (*nativeTable, error) {
			t, err := loadNative(f, fImg, nil, nil, nil)
			if t != nil && fs.goTab.pcln != nil {
				t = t.outside(fs.goTab.pcln.Range()) // the pclntab names those
			}
			return t, err
		}
	} else if fs.native, err = loadNative(f, fImg, debug, debugImg, mini); err != nil {
		return nil, err
	}
	// Go code is named from the pclntab; DWARF would only add memory.
	if fs.goTab == nil {
		dwarfFile, dwarfImg := f, fImg
		if debug != nil && hasDWARF(debug) {
			dwarfFile, dwarfImg = debug, debugImg
		}
		fs.lines, err = loadLines(dwarfFile, dwarfImg, lim.maxDWARF, lim.maxDWARFHeap, &inflate, lim.dropRead)
		if errors.Is(err, errInflateCap) {
			fs.refused, fs.lines, err = err, nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return fs, nil
}

// memSize is the memory the symbol data holds now: its heap and its
// inflated sections' mappings, spilled or anonymous (the files' own
// mappings are not counted: their pages are the page cache's).
func (fs *fileSyms) memSize() int64 {
	n := int64(256 + 64*len(fs.layout.Progs))
	if fs.goTab != nil {
		n += fs.goTab.size
	}
	if native := fs.nativeIfLoaded(); native != nil {
		n += native.memSize()
	}
	if fs.lines != nil {
		n += fs.lines.memSize()
	}
	return n
}

// nativeTab returns the function symbols, reading them now if they were
// left for the first lookup that needs them.
func (fs *fileSyms) nativeTab() *nativeTable {
	fs.nativeMu.Lock()
	defer fs.nativeMu.Unlock()
	if fs.nativeLater != nil {
		fs.native, _ = fs.nativeLater()
		fs.nativeLater = nil
	}
	return fs.native
}

// nativeIfLoaded returns the function symbols if they are read.
func (fs *fileSyms) nativeIfLoaded() *nativeTable {
	fs.nativeMu.Lock()
	defer fs.nativeMu.Unlock()
	return fs.native
}

// dropPages lets go of the file mappings' pages read so far (see
// elfx.Image.DropPages); the mappings stay usable.
func (fs *fileSyms) dropPages() {
	for _, m := range fs.images {
		m.DropPages()
	}
	if fs.lines != nil {
		fs.lines.dropPages()
	}
}

// unmap releases the mappings, the files' and the inflated sections', and
// the symbol index; fs must not be used afterwards.
func (fs *fileSyms) unmap() {
	if fs.lines != nil {
		fs.lines.unmap()
	}
	fs.nativeMu.Lock()
	fs.native.unmap()
	fs.nativeMu.Unlock()
	for _, m := range fs.images {
		m.Unmap()
	}
	fs.images = nil
}

// frames names the code at a file offset, innermost first; nil when nothing
// names it. The strings returned share no memory with the tables, so cached
// frames do not pin a file's symbol data after it is evicted.
func (fs *fileSyms) frames(off uint64) []Line {
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
	if native := fs.nativeTab(); native != nil {
		symName, _ = native.lookup(pc)
	}
	if symName == "" && (len(chain) == 0 || chain[len(chain)-1].name == "") {
		return nil // no function to name: a line alone is not a frame
	}
	if len(chain) == 0 {
		return []Line{nativeFrame(symName, "", 0)}
	}
	frames := make([]Line, len(chain))
	for i, c := range chain {
		name := c.name
		if name == "" && i == len(chain)-1 {
			name = symName // DWARF without a name for the function
		}
		frames[i] = nativeFrame(name, c.file, c.line)
	}
	return frames
}

// nativeFrame makes a line from a raw (possibly mangled) name: Function
// is the simplified demangled name, SystemName the raw one when they
// differ. The strings are copied so the line does not pin the tables (or
// the mapping) they come from. A line below 1 (a line program that
// advanced below zero, which real binaries on a host have) is unknown: 0.
func nativeFrame(raw, file string, line int64) Line {
	line = max(line, 0)
	fr := Line{Function: simplified(raw), File: strings.Clone(file), Line: line, Rust: rustSymbol(raw)}
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
	if native := fs.nativeIfLoaded(); native != nil {
		parts = append(parts, fmt.Sprintf("%s (%d funcs)", native.source, len(native.syms)))
	}
	if fs.lines != nil {
		parts = append(parts, fmt.Sprintf("dwarf (%d unit ranges)", len(fs.lines.units)))
	}
	if len(parts) == 0 {
		return "no symbols"
	}
	return strings.Join(parts, ", ")
}
