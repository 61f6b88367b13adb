package symbolize

import (
	"cmp"
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
)

// maxDWARFUnits bounds the compile-unit ranges indexed for one file.
const maxDWARFUnits = 1 << 20

// lineTable maps addresses to source lines with a file's DWARF line
// programs. It indexes compile units by address range when loaded and scans
// one unit's line program per lookup; the Symbolizer caches the results.
type lineTable struct {
	mu    sync.Mutex // debug/dwarf readers share state in dwarf.Data
	d     *dwarf.Data
	units []unitRange // sorted by lo
	size  int64
}

type unitRange struct {
	lo, hi uint64
	off    dwarf.Offset // the compile unit's entry
}

// dwarfBytes returns the total size of f's .debug_* sections.
func dwarfBytes(f *elf.File) uint64 {
	var n uint64
	for _, s := range f.Sections {
		if strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
			n += s.Size
		}
	}
	return n
}

// loadLines indexes the DWARF line information of f. It returns nil without
// error when f has no .debug_line, and when the debug sections exceed
// maxBytes (so one huge unstripped binary cannot take the whole budget).
func loadLines(f *elf.File, maxBytes uint64) (lt *lineTable, err error) {
	if f.Section(".debug_line") == nil || f.Section(".debug_info") == nil {
		return nil, nil
	}
	size := dwarfBytes(f)
	if size > maxBytes {
		return nil, nil
	}
	// debug/dwarf can panic on some malformed input.
	defer func() {
		if r := recover(); r != nil {
			lt, err = nil, fmt.Errorf("dwarf: corrupt data: %v", r)
		}
	}()
	d, err := f.DWARF()
	if err != nil {
		return nil, fmt.Errorf("dwarf: %w", err)
	}
	lt = &lineTable{d: d}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("dwarf: read units: %w", err)
		}
		if e == nil {
			break
		}
		if e.Tag == dwarf.TagCompileUnit || e.Tag == dwarf.TagPartialUnit {
			ranges, err := d.Ranges(e)
			if err != nil {
				return nil, fmt.Errorf("dwarf: unit at %#x: %w", e.Offset, err)
			}
			for _, rg := range ranges {
				if rg[0] >= rg[1] {
					continue
				}
				if len(lt.units) >= maxDWARFUnits {
					return nil, errors.New("dwarf: too many unit ranges")
				}
				lt.units = append(lt.units, unitRange{lo: rg[0], hi: rg[1], off: e.Offset})
			}
		}
		if e.Children {
			r.SkipChildren()
		}
	}
	slices.SortFunc(lt.units, func(a, b unitRange) int { return cmp.Compare(a.lo, b.lo) })
	lt.size = int64(size) + int64(len(lt.units))*24
	return lt, nil
}

// lookup returns the source file and line of pc.
func (lt *lineTable) lookup(pc uint64) (file string, line int64, ok bool) {
	i, found := slices.BinarySearchFunc(lt.units, pc, func(u unitRange, pc uint64) int { return cmp.Compare(u.lo, pc) })
	if !found {
		i--
	}
	// Unit ranges rarely overlap; look at a few lower ones too.
	for k := i; k >= 0 && k > i-4; k-- {
		if u := lt.units[k]; pc < u.hi {
			if file, line, ok := lt.lookupUnit(u.off, pc); ok {
				return file, line, true
			}
		}
	}
	return "", 0, false
}

func (lt *lineTable) lookupUnit(off dwarf.Offset, pc uint64) (file string, line int64, ok bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	defer func() {
		if recover() != nil {
			file, line, ok = "", 0, false
		}
	}()
	r := lt.d.Reader()
	r.Seek(off)
	e, err := r.Next()
	if err != nil || e == nil {
		return "", 0, false
	}
	lr, err := lt.d.LineReader(e)
	if err != nil || lr == nil {
		return "", 0, false
	}
	le, ok := findRow(lr, pc)
	if !ok {
		return "", 0, false
	}
	// debug/dwarf joins a file with its line-table directory only; a relative
	// result is relative to the unit's compilation directory, as addr2line shows.
	file = le.File.Name
	if compDir, _ := e.Val(dwarf.AttrCompDir).(string); compDir != "" && file != "" && !path.IsAbs(file) {
		file = path.Join(compDir, file)
	}
	return file, int64(le.Line), true
}

// maxLineRows bounds the rows scanned in one unit's line program.
const maxLineRows = 1 << 22

// findRow returns the line-table row covering pc: the last row at or below
// pc whose sequence continues past pc. It scans the whole program, because
// sequences need not be sorted by address (each COMDAT function, such as a
// C++ template instance, has its own), which LineReader.SeekPC assumes.
func findRow(lr *dwarf.LineReader, pc uint64) (dwarf.LineEntry, bool) {
	var prev, cur, best dwarf.LineEntry
	havePrev, found := false, false
	for n := 0; n < maxLineRows; n++ {
		if err := lr.Next(&cur); err != nil {
			break
		}
		if havePrev && !prev.EndSequence && prev.Address <= pc && pc < cur.Address {
			if !found || prev.Address >= best.Address {
				best, found = prev, true
			}
		}
		prev, havePrev = cur, true
	}
	if !found || best.File == nil {
		return dwarf.LineEntry{}, false
	}
	return best, true
}
