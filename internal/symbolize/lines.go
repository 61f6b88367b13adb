package symbolize

import (
	"cmp"
	"compress/zlib"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"sync"

	"github.com/sonde-dev/sonde/internal/elfx"
)

const (
	// maxDWARFUnits bounds the compile-unit ranges indexed for one file.
	maxDWARFUnits = 1 << 20
	// maxLineRows bounds the rows kept from one unit's line program.
	maxLineRows = 1 << 22
	// maxUnitNodes bounds the function and inline ranges kept for one unit.
	maxUnitNodes = 1 << 20
	// maxUnitEntries bounds the entries read from one unit.
	maxUnitEntries = 1 << 24
	// maxOriginHops bounds DW_AT_abstract_origin/DW_AT_specification chains.
	maxOriginHops = 8
	// maxInlineDepth bounds the frames one address expands to.
	maxInlineDepth = 64
	// unitCacheBytes bounds the parsed units a lineTable keeps (LRU).
	unitCacheBytes = 8 << 20
	// dwarfUnitOverhead and dwarfAbbrevFactor estimate what debug/dwarf
	// holds per unit header and per byte of .debug_abbrev (its parsed
	// abbreviation tables), as measured with libc's debug file (983 KB of
	// abbreviations held 12.9 MB) and small C++ programs alike.
	dwarfUnitOverhead = 200
	dwarfAbbrevFactor = 13
)

// attrMIPSLinkageName is DW_AT_MIPS_linkage_name, which GCC emitted before
// DWARF 4 standardised DW_AT_linkage_name.
const attrMIPSLinkageName dwarf.Attr = 0x2007

// dwarfSections are the sections a lineTable reads; the rest of a file's
// DWARF (locations, frames, macros, types in .debug_types) is never loaded.
var dwarfSections = []string{"abbrev", "info", "line", "ranges", "str", "addr", "line_str", "rnglists", "str_offsets"}

// lineTable names addresses from a file's DWARF: the chain of inlined calls
// from DW_TAG_subprogram and DW_TAG_inlined_subroutine entries, and source
// lines from the line programs. When loaded it only indexes compile units by
// address range; the first lookup in a unit parses that unit's entries and
// line program, and a bounded LRU keeps the parsed units. Safe for
// concurrent use: lookups serialise on mu.
type lineTable struct {
	d     *dwarf.Data
	units []unitRange // sorted by lo
	size  int64       // heap held apart from the parsed units

	mu          sync.Mutex
	parsed      *lru[dwarf.Offset, *unitInfo] // guarded by mu
	parsedBytes int64                         // guarded by mu
	evicted     uint64                        // parsed units dropped by unitCacheBytes; guarded by mu
}

type unitRange struct {
	lo, hi uint64
	off    dwarf.Offset // the compile unit's entry
}

// unitInfo is one parsed compile unit.
type unitInfo struct {
	files  []string  // the line program's file table, joined with the unit's directory
	rows   []lineRow // sorted by lo, stable in program order
	ranges []fnRange // address ranges of functions and inlined calls
	fns    []fnNode
	size   int64
}

// lineRow is [lo, hi) of one line-table row.
type lineRow struct {
	lo, hi uint64
	file   uint32
	line   uint32
}

type fnRange struct {
	lo, hi uint64
	fn     int32 // index into fns
}

// fnNode is a concrete function (depth 0) or an inlined call in it.
type fnNode struct {
	name     string // raw: the linkage name when there is one
	parent   int32  // enclosing fnNode, -1 for a function
	depth    int32
	callFile uint32 // index into files; for inlined calls
	callLine uint32
}

// debugSectionData returns the contents of a DWARF section and the heap
// bytes it took: in place in img (the file's bytes, or nil to read from f)
// when stored plainly, else inflated into the heap whether it is
// SHF_COMPRESSED (zlib, zstd) or a legacy .zdebug_ section. limit bounds
// the uncompressed size; inflate is what the file may still inflate, and
// is reduced by what this section takes (more is errInflateCap).
func debugSectionData(f *elf.File, img []byte, name string, limit uint64, inflate *int64) ([]byte, int64, error) {
	if s := f.Section(".debug_" + name); s != nil && s.Type != elf.SHT_NOBITS {
		if s.Size > limit {
			return nil, 0, fmt.Errorf("%s: %d bytes exceed the limit", s.Name, s.Size)
		}
		if s.Flags&elf.SHF_COMPRESSED == 0 && img != nil {
			b, err := elfx.SectionBytes(img, s)
			return b, 0, err
		}
		if s.Flags&elf.SHF_COMPRESSED != 0 {
			if int64(s.Size) > *inflate {
				return nil, 0, fmt.Errorf("%s: %d bytes: %w", s.Name, s.Size, errInflateCap)
			}
			*inflate -= int64(s.Size)
		}
		b, err := s.Data()
		return b, int64(len(b)), err
	}
	s := f.Section(".zdebug_" + name)
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, 0, nil
	}
	// A .zdebug_ section is "ZLIB", the size as 8 big-endian bytes, then a
	// zlib stream.
	var hdr [12]byte
	if _, err := s.ReadAt(hdr[:], 0); err != nil || string(hdr[:4]) != "ZLIB" {
		return nil, 0, fmt.Errorf("%s: no ZLIB header", s.Name)
	}
	n := binary.BigEndian.Uint64(hdr[4:])
	if n > limit {
		return nil, 0, fmt.Errorf("%s: %d bytes exceed the limit", s.Name, n)
	}
	if n > uint64(max(*inflate, 0)) {
		return nil, 0, fmt.Errorf("%s: %d bytes: %w", s.Name, n, errInflateCap)
	}
	*inflate -= int64(n)
	zr, err := zlib.NewReader(io.NewSectionReader(s, 12, int64(min(s.Size, 1<<62))))
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", s.Name, err)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(zr, buf); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", s.Name, err)
	}
	return buf, int64(n), nil
}

// dwarfSize returns the uncompressed size of the DWARF sections a lineTable
// reads.
func dwarfSize(f *elf.File) uint64 {
	var n uint64
	for _, name := range dwarfSections {
		if s := f.Section(".debug_" + name); s != nil && s.Type != elf.SHT_NOBITS {
			n += s.Size
		} else if s := f.Section(".zdebug_" + name); s != nil && s.Type != elf.SHT_NOBITS {
			var hdr [12]byte
			if _, err := s.ReadAt(hdr[:], 0); err == nil && string(hdr[:4]) == "ZLIB" {
				n += binary.BigEndian.Uint64(hdr[4:])
			}
		}
	}
	return n
}

// dwarfHeapEstimate is the heap indexing f's DWARF takes before any unit
// is parsed: the sections it must inflate and debug/dwarf's parsed
// abbreviation tables.
func dwarfHeapEstimate(f *elf.File) int64 {
	var n int64
	for _, name := range dwarfSections {
		var size uint64
		compressed := false
		if s := f.Section(".debug_" + name); s != nil && s.Type != elf.SHT_NOBITS {
			size, compressed = s.Size, s.Flags&elf.SHF_COMPRESSED != 0
		} else if s := f.Section(".zdebug_" + name); s != nil && s.Type != elf.SHT_NOBITS {
			var hdr [12]byte
			if _, err := s.ReadAt(hdr[:], 0); err == nil && string(hdr[:4]) == "ZLIB" {
				size, compressed = binary.BigEndian.Uint64(hdr[4:]), true
			}
		}
		size = min(size, 1<<40)
		if compressed {
			n += int64(size)
		}
		if name == "abbrev" {
			n += int64(size) * dwarfAbbrevFactor
		}
	}
	return n
}

// hasDWARF reports whether f has the sections lines are read from.
func hasDWARF(f *elf.File) bool {
	has := func(name string) bool {
		for _, prefix := range []string{".debug_", ".zdebug_"} {
			if s := f.Section(prefix + name); s != nil && s.Type != elf.SHT_NOBITS {
				return true
			}
		}
		return false
	}
	return has("info") && has("line")
}

// loadLines indexes the DWARF of f, whose bytes are img (a read-only
// mapping; nil reads sections from f). It returns nil without error when f
// has no .debug_info or .debug_line, and when the sections it reads exceed
// maxBytes (so one huge unstripped binary cannot take the whole budget).
// Plain sections are read in place; compressed ones are inflated within
// what inflate allows, which is reduced by what they take.
func loadLines(f *elf.File, img []byte, maxBytes uint64, maxHeap int64, inflate *int64) (lt *lineTable, err error) {
	if !hasDWARF(f) {
		return nil, nil
	}
	size := dwarfSize(f)
	if size > maxBytes || dwarfHeapEstimate(f) > maxHeap {
		return nil, nil
	}
	data := make(map[string][]byte, len(dwarfSections))
	var heap int64
	for _, name := range dwarfSections {
		b, n, err := debugSectionData(f, img, name, maxBytes, inflate)
		if err != nil {
			return nil, fmt.Errorf("dwarf: %w", err)
		}
		data[name] = b
		heap += n
	}
	// debug/dwarf can panic on some malformed input.
	defer func() {
		if r := recover(); r != nil {
			lt, err = nil, fmt.Errorf("dwarf: corrupt data: %v", r)
		}
	}()
	d, err := dwarf.New(data["abbrev"], nil, nil, data["info"], data["line"], nil, data["ranges"], data["str"])
	if err != nil {
		return nil, fmt.Errorf("dwarf: %w", err)
	}
	for _, name := range []string{"addr", "line_str", "rnglists", "str_offsets"} {
		if data[name] != nil {
			if err := d.AddSection(".debug_"+name, data[name]); err != nil {
				return nil, fmt.Errorf("dwarf: %w", err)
			}
		}
	}
	return indexUnits(d, heap, uint64(len(data["abbrev"])))
}

// indexUnits builds a lineTable over d, indexing its compile units by
// address range; heap is the bytes of d's sections held in the heap
// (inflated ones), abbrev the size of its abbreviations.
func indexUnits(d *dwarf.Data, heap int64, abbrev uint64) (lt *lineTable, err error) {
	defer func() {
		if r := recover(); r != nil {
			lt, err = nil, fmt.Errorf("dwarf: corrupt data: %v", r)
		}
	}()
	lt = &lineTable{d: d, parsed: newLRU[dwarf.Offset, *unitInfo]()}
	units := 0
	r := d.Reader()
	last := dwarf.Offset(0)
	for step := 0; ; step++ {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("dwarf: read units: %w", err)
		}
		if e == nil {
			break
		}
		// debug/dwarf can step in place on corrupt input: entries must advance.
		if e.Tag != 0 && step > 0 && e.Offset <= last || step > maxDWARFUnits {
			return nil, errors.New("dwarf: unit entries do not advance")
		}
		if e.Tag != 0 {
			last = e.Offset
		}
		if e.Tag == dwarf.TagCompileUnit || e.Tag == dwarf.TagPartialUnit {
			units++
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
	lt.units = slices.Clip(lt.units)
	// debug/dwarf keeps a header per unit and the parsed abbreviation
	// tables (a few times .debug_abbrev); the parsed units are charged as
	// they are parsed (memSize).
	lt.size = heap + int64(cap(lt.units))*24 + int64(units)*dwarfUnitOverhead + int64(abbrev)*dwarfAbbrevFactor + 512
	return lt, nil
}

// dwarfFrame is one level of the inline chain at an address, innermost
// first, with the raw function name.
type dwarfFrame struct {
	name string
	file string
	line int64
}

// lookup returns the inline chain at pc, innermost first. The innermost
// level's position comes from the line table and each outer level's from
// the call site of the level inside it. A level's name is "" when DWARF
// names no function there; the result is nil when pc is in no unit.
func (lt *lineTable) lookup(pc uint64) []dwarfFrame {
	i, found := slices.BinarySearchFunc(lt.units, pc, func(u unitRange, pc uint64) int { return cmp.Compare(u.lo, pc) })
	if !found {
		i--
	}
	// Unit ranges rarely overlap; look at a few lower ones too.
	for k := i; k >= 0 && k > i-4; k-- {
		if u := lt.units[k]; pc < u.hi {
			if frames := lt.lookupUnit(u.off, pc); frames != nil {
				return frames
			}
		}
	}
	return nil
}

func (lt *lineTable) lookupUnit(off dwarf.Offset, pc uint64) []dwarfFrame {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	u, ok := lt.parsed.get(off)
	if !ok {
		u = lt.parseUnit(off)
		lt.parsed.put(off, u)
		lt.parsedBytes += u.size
		for lt.parsedBytes > unitCacheBytes && lt.parsed.len() > 1 {
			_, old, _ := lt.parsed.removeOldest()
			lt.parsedBytes -= old.size
			lt.evicted++
		}
	}
	return u.frames(pc)
}

// parseUnit reads the unit at off. A unit that cannot be read gives an
// empty unitInfo, cached like any other so it is not read again.
func (lt *lineTable) parseUnit(off dwarf.Offset) (u *unitInfo) {
	u = &unitInfo{}
	defer func() {
		if recover() != nil {
			u = &unitInfo{size: 64}
		}
		// Appending left up to twice the room needed: keep exact copies.
		u.rows, u.ranges, u.fns, u.files = tight(u.rows), tight(u.ranges), tight(u.fns), tight(u.files)
		u.size = 64 + int64(cap(u.rows))*24 + int64(cap(u.ranges))*24 + int64(cap(u.fns))*48
		for _, f := range u.files {
			u.size += int64(len(f)) + 16
		}
		for _, fn := range u.fns {
			u.size += int64(len(fn.name))
		}
	}()
	r := lt.d.Reader()
	r.Seek(off)
	cu, err := r.Next()
	if err != nil || cu == nil {
		return u
	}
	compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
	if lr, err := lt.d.LineReader(cu); err == nil && lr != nil {
		u.readLines(lr, compDir)
	}
	if cu.Children {
		u.readFunctions(lt.d, r, lt.d.Reader())
	}
	return u
}

// tight returns s in an array of exactly its length.
func tight[T any](s []T) []T {
	if cap(s) == len(s) {
		return s
	}
	return append(make([]T, 0, len(s)), s...)
}

// readLines reads a unit's line program into rows.
func (u *unitInfo) readLines(lr *dwarf.LineReader, compDir string) {
	var prev, cur dwarf.LineEntry
	havePrev := false
	var rowFiles []*dwarf.LineFile
	for n := 0; n < maxLineRows; n++ {
		if err := lr.Next(&cur); err != nil {
			break
		}
		if havePrev && !prev.EndSequence && prev.Address < cur.Address && prev.File != nil {
			u.rows = append(u.rows, lineRow{lo: prev.Address, hi: cur.Address, line: uint32(max(prev.Line, 0))})
			rowFiles = append(rowFiles, prev.File)
		}
		prev, havePrev = cur, true
	}
	files := lr.Files()
	index := make(map[*dwarf.LineFile]uint32, len(files))
	u.files = make([]string, len(files))
	for i, f := range files {
		if f == nil {
			continue
		}
		// debug/dwarf joins a file with its line-table directory only; a relative
		// result is relative to the unit's compilation directory, as addr2line shows.
		name := f.Name
		if compDir != "" && name != "" && !path.IsAbs(name) {
			name = path.Join(compDir, name)
		}
		u.files[i] = name
		if _, dup := index[f]; !dup {
			index[f] = uint32(i)
		}
	}
	for i := range u.rows {
		if fi, ok := index[rowFiles[i]]; ok {
			u.rows[i].file = fi
		} else {
			u.rows[i].file = ^uint32(0)
		}
	}
	// Sequences need not be sorted by address (each COMDAT function has its
	// own); a stable sort keeps program order among rows at one address.
	slices.SortStableFunc(u.rows, func(a, b lineRow) int { return cmp.Compare(a.lo, b.lo) })
}

// readFunctions walks the unit's entries after the unit entry and records
// every concrete function and inlined call with its address ranges. r is
// positioned after the unit entry; or reads the entries names come from.
func (u *unitInfo) readFunctions(d *dwarf.Data, r, or *dwarf.Reader) {
	names := map[dwarf.Offset]string{}
	// stack holds, per open entry with children, the fnNode it is (or -1).
	stack := []int32{-1}
	enclosing := func() int32 {
		for i := len(stack) - 1; i >= 0; i-- {
			if stack[i] >= 0 {
				return stack[i]
			}
		}
		return -1
	}
	last := dwarf.Offset(0)
	for steps := 0; len(stack) > 0 && steps < maxUnitEntries; steps++ {
		e, err := r.Next()
		if err != nil || e == nil {
			return
		}
		if e.Tag != 0 {
			if e.Offset <= last {
				return // corrupt input: entries must advance
			}
			last = e.Offset
		}
		if e.Tag == 0 {
			stack = stack[:len(stack)-1]
			continue
		}
		node := int32(-1)
		if e.Tag == dwarf.TagSubprogram || e.Tag == dwarf.TagInlinedSubroutine {
			node = u.addFunction(d, or, e, enclosing(), names)
		}
		if e.Children {
			stack = append(stack, node)
		}
		if len(u.ranges) >= maxUnitNodes {
			return
		}
	}
}

// addFunction records e if it has code; it returns its fnNode index or -1.
func (u *unitInfo) addFunction(d *dwarf.Data, or *dwarf.Reader, e *dwarf.Entry, parent int32, names map[dwarf.Offset]string) int32 {
	ranges, err := d.Ranges(e)
	if err != nil || len(ranges) == 0 {
		return -1
	}
	fn := fnNode{name: entryName(or, e, names), parent: -1}
	if e.Tag == dwarf.TagInlinedSubroutine && parent >= 0 {
		fn.parent = parent
		fn.depth = u.fns[parent].depth + 1
		if cf, ok := e.Val(dwarf.AttrCallFile).(int64); ok && cf >= 0 && cf < 1<<31 {
			fn.callFile = uint32(cf)
		} else {
			fn.callFile = ^uint32(0)
		}
		if cl, ok := e.Val(dwarf.AttrCallLine).(int64); ok && cl >= 0 && cl < 1<<31 {
			fn.callLine = uint32(cl)
		}
	}
	idx := int32(len(u.fns))
	u.fns = append(u.fns, fn)
	for _, rg := range ranges {
		if rg[0] < rg[1] && len(u.ranges) < maxUnitNodes {
			u.ranges = append(u.ranges, fnRange{lo: rg[0], hi: rg[1], fn: idx})
		}
	}
	return idx
}

// entryName returns the raw name of a function entry: its linkage name,
// else its name, else that of its abstract origin or specification.
func entryName(or *dwarf.Reader, e *dwarf.Entry, cache map[dwarf.Offset]string) string {
	start := e.Offset
	if name, ok := cache[start]; ok {
		return name
	}
	var name string
	for hop := 0; e != nil && hop <= maxOriginHops; hop++ {
		if n, ok := e.Val(dwarf.AttrLinkageName).(string); ok && n != "" {
			name = n
			break
		}
		if n, ok := e.Val(attrMIPSLinkageName).(string); ok && n != "" {
			name = n
			break
		}
		if n, ok := e.Val(dwarf.AttrName).(string); ok && n != "" {
			name = n
			// A declaration may still carry the linkage name: keep looking.
		}
		if n, ok := cache[e.Offset]; ok && e.Offset != start {
			if n != "" {
				name = n
			}
			break
		}
		ref, ok := e.Val(dwarf.AttrAbstractOrigin).(dwarf.Offset)
		if !ok {
			if ref, ok = e.Val(dwarf.AttrSpecification).(dwarf.Offset); !ok {
				break
			}
		}
		or.Seek(ref)
		next, err := or.Next()
		if err != nil || next == nil {
			break
		}
		e = next
	}
	cache[start] = name
	return name
}

// frames returns the inline chain at pc from a parsed unit, or nil when
// neither a function nor a line of the unit covers pc.
func (u *unitInfo) frames(pc uint64) []dwarfFrame {
	file, line, haveLine := u.line(pc)
	deepest := int32(-1)
	for _, rg := range u.ranges {
		if rg.lo <= pc && pc < rg.hi && (deepest < 0 || u.fns[rg.fn].depth > u.fns[deepest].depth) {
			deepest = rg.fn
		}
	}
	if deepest < 0 {
		if !haveLine {
			return nil
		}
		return []dwarfFrame{{file: file, line: line}}
	}
	var out []dwarfFrame
	for fi := deepest; fi >= 0 && len(out) < maxInlineDepth; {
		fn := u.fns[fi]
		out = append(out, dwarfFrame{name: fn.name, file: file, line: line})
		file, line = u.file(fn.callFile), int64(fn.callLine)
		fi = fn.parent
	}
	return out
}

// line returns the source position of pc from the unit's line program: the
// row with the highest start that covers pc.
func (u *unitInfo) line(pc uint64) (string, int64, bool) {
	i, _ := slices.BinarySearchFunc(u.rows, pc, func(r lineRow, pc uint64) int {
		if r.lo <= pc {
			return -1
		}
		return 1
	})
	// rows[:i] start at or below pc; the last of them that covers pc wins.
	for k := i - 1; k >= 0 && k >= i-64; k-- {
		if r := u.rows[k]; pc < r.hi {
			return u.file(r.file), int64(r.line), true
		}
	}
	return "", 0, false
}

func (u *unitInfo) file(i uint32) string {
	if int(i) < len(u.files) {
		return u.files[i]
	}
	return ""
}

// memSize is the heap the table holds now, parsed units included.
func (lt *lineTable) memSize() int64 {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.size + lt.parsedBytes
}

// unitStats returns how many parsed units are cached and how many were
// dropped by the cache bound.
func (lt *lineTable) unitStats() (parsed int, evicted uint64) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.parsed.len(), lt.evicted
}
