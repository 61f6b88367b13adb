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
	// maxDWARFUnits bounds the units and the compile-unit ranges indexed
	// for one file.
	maxDWARFUnits = 1 << 20
	// maxLineRows bounds the rows kept from one unit's line program.
	maxLineRows = 1 << 22
	// maxUnitNodes bounds the function and inline ranges kept for one unit.
	maxUnitNodes = 1 << 20
	// maxUnitEntries bounds the entries read from one unit.
	maxUnitEntries = 1 << 24
	// maxOriginHops bounds DW_AT_abstract_origin/DW_AT_specification chains.
	maxOriginHops = 8
	// maxRefUnits bounds the other units a unit's DW_FORM_ref_addr
	// references are followed into while it is parsed; past it a name
	// there is not found.
	maxRefUnits = 16
	// maxInlineDepth bounds the frames one address expands to.
	maxInlineDepth = 64
	// unitCacheBytes bounds the parsed units a lineTable keeps (LRU).
	unitCacheBytes = 8 << 20
	// unitIndexShare estimates the index of a file's units (their headers
	// and address ranges) as a share of .debug_info, before it is built:
	// libc's debug file indexes 4126 units in under 1% of it.
	unitIndexShare = 32
)

// attrMIPSLinkageName is DW_AT_MIPS_linkage_name, which GCC emitted before
// DWARF 4 standardised DW_AT_linkage_name.
const attrMIPSLinkageName dwarf.Attr = 0x2007

// DWARF 5 unit types (DW_UT_*) that hold code: full and partial units.
// Units before DWARF 5 are taken as DW_UT_compile.
const (
	utCompile = 0x01
	utPartial = 0x03
)

// dwarfSections are the sections a lineTable reads; the rest of a file's
// DWARF (locations, frames, macros, types in .debug_types) is never loaded.
// .debug_aranges is read too while indexing, and let go afterwards.
var dwarfSections = []string{"abbrev", "info", "line", "ranges", "str", "addr", "line_str", "rnglists", "str_offsets"}

// lineTable names addresses from a file's DWARF: the chain of inlined calls
// from DW_TAG_subprogram and DW_TAG_inlined_subroutine entries, and source
// lines from the line programs. When loaded it only indexes compile units by
// address range, from .debug_aranges or each unit's own entry; the first
// lookup in a unit parses that unit's entries and line program through a
// dwarf.Data over just that unit (so only its abbreviations are ever parsed,
// and dropped after), and a bounded LRU keeps the parsed units. Safe for
// concurrent use: lookups serialise on mu.
type lineTable struct {
	sec  map[string][]byte // by name without ".debug_": in place, or in maps
	maps []*elfx.Image     // inflated sections; released by unmap
	// files are the file mappings the in-place sections lie in (the
	// caller's, set before the first lookup): parsing a unit reads
	// megabytes of them and of maps, which it lets go of once parsed.
	files []*elfx.Image
	heads []unitHead  // every unit of .debug_info, by offset
	units []unitRange // sorted by lo
	size  int64       // memory held apart from the parsed units
	// refUnits is how many other units a unit's DW_FORM_ref_addr
	// references are followed into while it is parsed (maxRefUnits).
	refUnits int

	mu          sync.Mutex
	parsed      *lru[int32, *unitInfo] // by index in heads; guarded by mu
	parsedBytes int64                  // guarded by mu
	evicted     uint64                 // parsed units dropped by unitCacheBytes; guarded by mu
}

// unitHead is where one unit lies in .debug_info: [off, end).
type unitHead struct {
	off, end uint64
}

type unitRange struct {
	lo, hi uint64
	unit   int32 // index into heads
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

// debugSectionData returns the contents of a DWARF section and the memory
// it holds: in place in img (the file's bytes, or nil to read from f, into
// the heap) when stored plainly, else inflated into a read-only mapping, m
// (elfx.MapSpill: a spill file's page cache, or anonymous memory), whether
// it is SHF_COMPRESSED (zlib, zstd) or a legacy .zdebug_ section; the
// caller owns m and unmaps it. limit bounds the
// uncompressed size; inflate is what the file may still inflate, and is
// reduced by what this section takes (more is errInflateCap).
func debugSectionData(f *elf.File, img []byte, name string, limit uint64, inflate *int64) (b []byte, m *elfx.Image, held int64, err error) {
	if s := f.Section(".debug_" + name); s != nil && s.Type != elf.SHT_NOBITS {
		if s.Size > limit {
			return nil, nil, 0, fmt.Errorf("%s: %d bytes exceed the limit", s.Name, s.Size)
		}
		if s.Flags&elf.SHF_COMPRESSED == 0 {
			if img != nil {
				b, err := elfx.SectionBytes(img, s)
				return b, nil, 0, err
			}
			b, err := s.Data()
			return b, nil, int64(len(b)), err
		}
		if int64(s.Size) > *inflate {
			return nil, nil, 0, fmt.Errorf("%s: %d bytes: %w", s.Name, s.Size, errInflateCap)
		}
		*inflate -= int64(s.Size)
		m, err := elfx.MapSpill(int64(s.Size), s.Open())
		if err != nil {
			return nil, nil, 0, fmt.Errorf("%s: %w", s.Name, err)
		}
		return m.Bytes(), m, m.Size(), nil
	}
	s := f.Section(".zdebug_" + name)
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, nil, 0, nil
	}
	// A .zdebug_ section is "ZLIB", the size as 8 big-endian bytes, then a
	// zlib stream.
	var hdr [12]byte
	if _, err := s.ReadAt(hdr[:], 0); err != nil || string(hdr[:4]) != "ZLIB" {
		return nil, nil, 0, fmt.Errorf("%s: no ZLIB header", s.Name)
	}
	n := binary.BigEndian.Uint64(hdr[4:])
	if n > limit {
		return nil, nil, 0, fmt.Errorf("%s: %d bytes exceed the limit", s.Name, n)
	}
	if n > uint64(max(*inflate, 0)) {
		return nil, nil, 0, fmt.Errorf("%s: %d bytes: %w", s.Name, n, errInflateCap)
	}
	*inflate -= int64(n)
	zr, err := zlib.NewReader(io.NewSectionReader(s, 12, int64(min(s.Size, 1<<62))))
	if err != nil {
		return nil, nil, 0, fmt.Errorf("%s: %w", s.Name, err)
	}
	m, err = elfx.MapSpill(int64(n), zr)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("%s: %w", s.Name, err)
	}
	return m.Bytes(), m, m.Size(), nil
}

// dropCompressed hands dropRead the bytes of img that the compressed DWARF
// section name (.debug_ or .zdebug_) takes in the file.
func dropCompressed(f *elf.File, img []byte, name string, dropRead func([]byte)) {
	if dropRead == nil || img == nil {
		return
	}
	s := f.Section(".debug_" + name)
	if s == nil {
		s = f.Section(".zdebug_" + name)
	}
	if s == nil || s.Type == elf.SHT_NOBITS || s.Offset > uint64(len(img)) || s.FileSize > uint64(len(img))-s.Offset {
		return
	}
	dropRead(img[s.Offset : s.Offset+s.FileSize])
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

// dwarfHeapEstimate is the memory indexing f's DWARF holds before any
// unit is parsed: the sections it must inflate (kept in anonymous
// mappings, outside the Go heap but in the budget) and the unit index.
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
		if name == "info" {
			n += int64(size) / unitIndexShare
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
// what inflate allows, which is reduced by what they take, into mappings
// the table owns until unmap. dropRead (nil: none) is handed the bytes of
// img a compressed section took once it is inflated, and the indexing
// lets go of the pages of .debug_info it has walked past, in img or
// inflated: a big debug file's load would otherwise hold them all in the
// RSS at once.
func loadLines(f *elf.File, img []byte, maxBytes uint64, maxHeap int64, inflate *int64, dropRead func([]byte)) (lt *lineTable, err error) {
	if !hasDWARF(f) {
		return nil, nil
	}
	size := dwarfSize(f)
	if size > maxBytes || dwarfHeapEstimate(f) > maxHeap {
		return nil, nil
	}
	sec := make(map[string][]byte, len(dwarfSections))
	var maps []*elfx.Image
	defer func() {
		if lt == nil {
			for _, m := range maps {
				m.Unmap()
			}
		}
	}()
	var held int64
	for _, name := range dwarfSections {
		b, m, n, err := debugSectionData(f, img, name, maxBytes, inflate)
		if err != nil {
			return nil, fmt.Errorf("dwarf: %w", err)
		}
		if m != nil {
			maps = append(maps, m)
			dropCompressed(f, img, name, dropRead)
		}
		sec[name], held = b, held+n
	}
	// .debug_aranges is optional: without it (or with one that does not
	// fit), each unit's entry gives its ranges.
	aranges, am, _, err := debugSectionData(f, img, "aranges", maxBytes, inflate)
	if err != nil {
		aranges = nil
	}
	defer am.Unmap()
	if am != nil {
		dropCompressed(f, img, "aranges", dropRead)
	}
	walked := func(b []byte) { // in place in img, or inflated
		if dropRead != nil {
			dropRead(b)
		}
		for _, m := range maps {
			m.DropRange(b)
		}
	}
	if lt, err = indexUnits(sec, aranges, walked); err != nil {
		return nil, err
	}
	lt.maps = maps
	lt.size += held
	return lt, nil
}

// dropPages lets go of the pages of the inflated sections read so far,
// where they are spilled to a file (elfx.MapSpill); the sections stay
// readable.
func (lt *lineTable) dropPages() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, m := range lt.maps {
		m.DropPages()
	}
}

// unmap releases the inflated sections; lt must not be used afterwards
// (a lookup that still did would find no sections, not unmapped memory).
func (lt *lineTable) unmap() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.sec = nil
	for _, m := range lt.maps {
		m.Unmap()
	}
	lt.maps = nil
}

// indexUnits builds a lineTable over the sections sec (by name without
// ".debug_"), indexing its compile units by address range: from aranges
// (.debug_aranges, nil when absent) for the units it lists, else from each
// unit's entry. The table's size counts its index, not sec.
func indexUnits(sec map[string][]byte, aranges []byte, dropRead func([]byte)) (lt *lineTable, err error) {
	defer func() {
		if r := recover(); r != nil {
			lt, err = nil, fmt.Errorf("dwarf: corrupt data: %v", r)
		}
	}()
	info := sec["info"]
	order, err := dwarfByteOrder(info)
	if err != nil {
		return nil, err
	}
	lt = &lineTable{sec: sec, refUnits: maxRefUnits, parsed: newLRU[int32, *unitInfo]()}
	var utypes []uint8
	if lt.heads, utypes, err = walkUnits(info, order, dropRead); err != nil {
		return nil, err
	}
	listed := make([]bool, len(lt.heads))
	if units, ok := arangesUnits(aranges, lt.heads, utypes); ok {
		lt.units = units
		for _, u := range units {
			listed[u.unit] = true
		}
	}
	behind := dropBehind{b: info, drop: dropRead}
	for i, h := range lt.heads {
		if listed[i] || utypes[i] != utCompile && utypes[i] != utPartial {
			continue
		}
		behind.passed(h.off)
		for _, rg := range lt.topRanges(h) {
			if rg[0] >= rg[1] {
				continue
			}
			if len(lt.units) >= maxDWARFUnits {
				return nil, errors.New("dwarf: too many unit ranges")
			}
			lt.units = append(lt.units, unitRange{lo: rg[0], hi: rg[1], unit: int32(i)})
		}
	}
	slices.SortFunc(lt.units, func(a, b unitRange) int { return cmp.Compare(a.lo, b.lo) })
	lt.units = slices.Clip(lt.units)
	lt.heads = slices.Clip(lt.heads)
	// The parsed units are charged as they are parsed (memSize).
	lt.size = int64(cap(lt.units))*24 + int64(cap(lt.heads))*16 + 512
	return lt, nil
}

// topRanges returns the address ranges of the unit h from its entry, nil
// when it cannot be read or is no compile or partial unit.
func (lt *lineTable) topRanges(h unitHead) (ranges [][2]uint64) {
	defer func() {
		if recover() != nil {
			ranges = nil // debug/dwarf can panic on some malformed input
		}
	}()
	d, err := lt.unitData(h)
	if err != nil {
		return nil
	}
	e, err := d.Reader().Next()
	if err != nil || e == nil || e.Tag != dwarf.TagCompileUnit && e.Tag != dwarf.TagPartialUnit {
		return nil
	}
	ranges, _ = d.Ranges(e)
	return ranges
}

// unitData returns a dwarf.Data over the unit h alone, with the other
// sections whole: entry offsets in it are relative to h.off, and only h's
// abbreviations are parsed (debug/dwarf parses every unit's up front and
// keeps them, a dozen times .debug_abbrev for all of a file).
func (lt *lineTable) unitData(h unitHead) (*dwarf.Data, error) {
	d, err := dwarf.New(lt.sec["abbrev"], nil, nil, lt.sec["info"][h.off:h.end:h.end], lt.sec["line"], nil, lt.sec["ranges"], lt.sec["str"])
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"addr", "line_str", "rnglists", "str_offsets"} {
		if b := lt.sec[name]; b != nil {
			if err := d.AddSection(".debug_"+name, b); err != nil {
				return nil, err
			}
		}
	}
	return d, nil
}

// dwarfByteOrder tells the byte order of .debug_info from its first unit's
// version, as debug/dwarf does.
func dwarfByteOrder(info []byte) (binary.ByteOrder, error) {
	off := 4
	if len(info) >= 4 && binary.LittleEndian.Uint32(info) == 0xffffffff {
		off = 12
	}
	if len(info) < off+2 {
		return nil, errors.New("dwarf: .debug_info too short")
	}
	switch x, y := info[off], info[off+1]; {
	case x == 0 && y == 0:
		return nil, errors.New("dwarf: unsupported version 0")
	case x == 0:
		return binary.BigEndian, nil
	case y == 0:
		return binary.LittleEndian, nil
	}
	return nil, errors.New("dwarf: cannot determine byte order")
}

// unitHeader is the header of one unit of .debug_info.
type unitHeader struct {
	end       uint64 // just past the unit
	version   uint16 // 0 for an empty unit (length 0), which is skipped
	utype     uint8  // DW_UT_*; DW_UT_compile before DWARF 5
	abbrevOff uint64
}

// readUnitHeader reads the header of the unit at off in info, in the 32-
// or 64-bit format, of DWARF 2 to 5.
func readUnitHeader(info []byte, off uint64, order binary.ByteOrder) (unitHeader, error) {
	var h unitHeader
	rest := uint64(len(info)) - min(off, uint64(len(info)))
	if rest < 4 {
		return h, fmt.Errorf("unit at %#x: truncated length", off)
	}
	n, hdr, offSize := uint64(order.Uint32(info[off:])), uint64(4), 4
	switch {
	case n == 0xffffffff:
		if rest < 12 {
			return h, fmt.Errorf("unit at %#x: truncated length", off)
		}
		n, hdr, offSize = order.Uint64(info[off+4:]), 12, 8
	case n >= 0xfffffff0:
		return h, fmt.Errorf("unit at %#x: reserved length %#x", off, n)
	}
	if n > rest-hdr {
		return h, fmt.Errorf("unit at %#x: %d bytes past the section", off, n)
	}
	h.end = off + hdr + n
	if n == 0 {
		return h, nil
	}
	b := info[off+hdr : h.end]
	if len(b) < 2 {
		return h, fmt.Errorf("unit at %#x: truncated header", off)
	}
	h.version = order.Uint16(b)
	if h.version < 2 || h.version > 5 {
		return h, fmt.Errorf("unit at %#x: unsupported DWARF version %d", off, h.version)
	}
	at := 2 // the abbreviation offset
	h.utype = utCompile
	if h.version >= 5 {
		at = 4
		if len(b) >= 3 {
			h.utype = b[2]
		}
	}
	need := at + offSize // the address size follows the offset before DWARF 5
	if h.version < 5 {
		need++
	}
	if len(b) < need {
		return h, fmt.Errorf("unit at %#x: truncated header", off)
	}
	if offSize == 8 {
		h.abbrevOff = order.Uint64(b[at:])
	} else {
		h.abbrevOff = uint64(order.Uint32(b[at:]))
	}
	return h, nil
}

// dropBehind hands drop (nil: none) each MiB of b that a walk in order of
// offset has passed: each read of a mapped section maps the 64 KiB around
// it, so a walk over a big section's units would otherwise leave most of
// its pages in the RSS.
type dropBehind struct {
	b    []byte
	done uint64 // b[:done] was handed over
	drop func([]byte)
}

// passed says the walk has reached off and will not read before it again.
func (d *dropBehind) passed(off uint64) {
	const every = 1 << 20
	if d.drop != nil && off > d.done && off-d.done >= every && off <= uint64(len(d.b)) {
		d.drop(d.b[d.done:off])
		d.done = off
	}
}

// walkUnits lists the units of .debug_info from their headers alone, with
// each one's unit type. dropRead (nil: none) is handed each MiB of info it
// has walked past (dropBehind).
func walkUnits(info []byte, order binary.ByteOrder, dropRead func([]byte)) (heads []unitHead, utypes []uint8, err error) {
	behind := dropBehind{b: info, drop: dropRead}
	for off := uint64(0); off < uint64(len(info)); {
		behind.passed(off)
		h, err := readUnitHeader(info, off, order)
		if err != nil {
			return nil, nil, fmt.Errorf("dwarf: %w", err)
		}
		if h.version != 0 {
			if len(heads) >= maxDWARFUnits {
				return nil, nil, errors.New("dwarf: too many units")
			}
			heads = append(heads, unitHead{off: off, end: h.end})
			utypes = append(utypes, h.utype)
		}
		off = h.end
	}
	return heads, utypes, nil
}

// findUnit returns the index of the unit holding the .debug_info offset
// off, or -1.
func findUnit(heads []unitHead, off uint64) int {
	i, found := slices.BinarySearchFunc(heads, off, func(h unitHead, off uint64) int { return cmp.Compare(h.off, off) })
	if !found {
		i--
	}
	if i < 0 || off >= heads[i].end {
		return -1
	}
	return i
}

// arangesUnits reads the address ranges of the units .debug_aranges lists.
// It reports false when there is no such section or anything in it does
// not fit (a unit offset that is no compile or partial unit's in heads, an
// unknown version or layout): then every unit's entry is read instead.
func arangesUnits(aranges []byte, heads []unitHead, utypes []uint8) (units []unitRange, ok bool) {
	if len(aranges) == 0 || len(heads) == 0 {
		return nil, false
	}
	order, err := dwarfByteOrder(aranges)
	if err != nil {
		return nil, false
	}
	for off := uint64(0); off < uint64(len(aranges)); {
		rest := uint64(len(aranges)) - off
		if rest < 4 {
			return nil, false
		}
		n, hdr, offSize := uint64(order.Uint32(aranges[off:])), uint64(4), uint64(4)
		if n == 0xffffffff {
			if rest < 12 {
				return nil, false
			}
			n, hdr, offSize = order.Uint64(aranges[off+4:]), 12, 8
		}
		if n > rest-hdr || n < 2+offSize+2 {
			return nil, false
		}
		set := aranges[off : off+hdr+n]
		next := off + hdr + n
		if order.Uint16(set[hdr:]) != 2 {
			return nil, false
		}
		var unitOff uint64
		if offSize == 8 {
			unitOff = order.Uint64(set[hdr+2:])
		} else {
			unitOff = uint64(order.Uint32(set[hdr+2:]))
		}
		asize, segSize := uint64(set[hdr+2+offSize]), set[hdr+3+offSize]
		u := findUnit(heads, unitOff)
		if asize != 4 && asize != 8 || segSize != 0 || u < 0 || heads[u].off != unitOff || utypes[u] != utCompile && utypes[u] != utPartial {
			return nil, false
		}
		// Tuples start at a multiple of their size from the set's start.
		for at := (hdr + 4 + offSize + 2*asize - 1) / (2 * asize) * (2 * asize); at+2*asize <= uint64(len(set)); at += 2 * asize {
			var lo, size uint64
			if asize == 8 {
				lo, size = order.Uint64(set[at:]), order.Uint64(set[at+8:])
			} else {
				lo, size = uint64(order.Uint32(set[at:])), uint64(order.Uint32(set[at+4:]))
			}
			if lo == 0 && size == 0 {
				break
			}
			if size == 0 {
				continue
			}
			if lo+size < lo || len(units) >= maxDWARFUnits {
				return nil, false
			}
			units = append(units, unitRange{lo: lo, hi: lo + size, unit: int32(u)})
		}
		off = next
	}
	return units, true
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
			if frames := lt.lookupUnit(u.unit, pc); frames != nil {
				return frames
			}
		}
	}
	return nil
}

func (lt *lineTable) lookupUnit(unit int32, pc uint64) []dwarfFrame {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	u, ok := lt.parsed.get(unit)
	if !ok {
		u = lt.parseUnit(unit)
		// What the unit needs is in u now: the pages it read (64 KiB
		// around each, the kernel's fault-around) would otherwise count
		// in the agent's RSS until the next DropPages.
		for _, m := range lt.maps {
			m.DropPages()
		}
		for _, m := range lt.files {
			m.DropPages()
		}
		lt.parsed.put(unit, u)
		lt.parsedBytes += u.size
		for lt.parsedBytes > unitCacheBytes && lt.parsed.len() > 1 {
			_, old, _ := lt.parsed.removeOldest()
			lt.parsedBytes -= old.size
			lt.evicted++
		}
	}
	return u.frames(pc)
}

// parseUnit reads the unit heads[unit]. A unit that cannot be read gives
// an empty unitInfo, cached like any other so it is not read again.
func (lt *lineTable) parseUnit(unit int32) (u *unitInfo) {
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
	p := &unitParse{lt: lt, units: map[int]*unitReader{}, names: map[uint64]string{}}
	ur := p.reader(int(unit))
	if ur == nil {
		return u
	}
	r := ur.d.Reader()
	cu, err := r.Next()
	if err != nil || cu == nil {
		return u
	}
	compDir, _ := cu.Val(dwarf.AttrCompDir).(string)
	if lr, err := ur.d.LineReader(cu); err == nil && lr != nil {
		u.readLines(lr, compDir)
	}
	if cu.Children {
		u.readFunctions(p, ur, r)
	}
	return u
}

// unitParse is the parse of one unit, with the other units its references
// lead into.
type unitParse struct {
	lt    *lineTable
	units map[int]*unitReader // by index in lt.heads; at most 1+lt.refUnits
	names map[uint64]string   // entry names by .debug_info offset
}

// unitReader reads one unit's entries through a dwarf.Data over that unit
// alone (lineTable.unitData); r follows references into it.
type unitReader struct {
	d    *dwarf.Data
	r    *dwarf.Reader
	head unitHead
	info []byte // the unit's bytes: entry offsets index them
	// refs holds the abbreviations whose DW_AT_abstract_origin or
	// DW_AT_specification is not relative to the unit; nil when none is.
	refs map[uint64]refForms
}

// How a reference attribute's form locates its target.
const (
	refInUnit    = iota // DW_FORM_ref1/2/4/8/udata: an offset in the unit
	refInSection        // DW_FORM_ref_addr: an offset in .debug_info
	refElsewhere        // another file's (ref_sup, GNU_ref_alt), or unknown (indirect)
)

// refForms are the forms of one abbreviation's origin and specification.
type refForms struct{ origin, spec uint8 }

// reader returns the reader of the unit lt.heads[i], opening it on first
// use; nil when it cannot be read or too many are open.
func (p *unitParse) reader(i int) *unitReader {
	if ur, ok := p.units[i]; ok {
		return ur
	}
	if len(p.units) > p.lt.refUnits {
		return nil
	}
	h := p.lt.heads[i]
	d, err := p.lt.unitData(h)
	if err != nil {
		p.units[i] = nil
		return nil
	}
	ur := &unitReader{d: d, r: d.Reader(), head: h, info: p.lt.sec["info"][h.off:h.end]}
	if order, err := dwarfByteOrder(ur.info); err == nil {
		if hdr, err := readUnitHeader(ur.info, 0, order); err == nil {
			ur.refs = abbrevRefs(p.lt.sec["abbrev"], hdr.abbrevOff)
		}
	}
	p.units[i] = ur
	return ur
}

// entry returns the entry at the .debug_info offset off and the reader of
// its unit; nil when there is none or its unit cannot be read.
func (p *unitParse) entry(off uint64) (*unitReader, *dwarf.Entry) {
	i := findUnit(p.lt.heads, off)
	if i < 0 || off == p.lt.heads[i].off {
		return nil, nil
	}
	ur := p.reader(i)
	if ur == nil {
		return nil, nil
	}
	ur.r.Seek(dwarf.Offset(off - ur.head.off))
	e, err := ur.r.Next()
	if err != nil || e == nil {
		return nil, nil
	}
	return ur, e
}

// ref returns the .debug_info offset e's abstract origin, else its
// specification, refers to.
func (ur *unitReader) ref(e *dwarf.Entry) (uint64, bool) {
	var forms refForms
	if ur.refs != nil && uint64(e.Offset) < uint64(len(ur.info)) {
		if code, n := binary.Uvarint(ur.info[e.Offset:]); n > 0 {
			forms = ur.refs[code]
		}
	}
	for _, a := range []struct {
		attr dwarf.Attr
		form uint8
	}{{dwarf.AttrAbstractOrigin, forms.origin}, {dwarf.AttrSpecification, forms.spec}} {
		off, ok := e.Val(a.attr).(dwarf.Offset)
		if !ok {
			continue
		}
		switch a.form {
		case refInUnit:
			return ur.head.off + uint64(off), true
		case refInSection:
			return uint64(off), true
		}
		return 0, false
	}
	return 0, false
}

// abbrevRefs reads the abbreviation table at off and returns the forms of
// the abbreviations whose DW_AT_abstract_origin or DW_AT_specification is
// not an offset in the unit, nil when there is none (the usual case).
func abbrevRefs(abbrev []byte, off uint64) map[uint64]refForms {
	if off >= uint64(len(abbrev)) {
		return nil
	}
	b := abbrev[off:]
	uleb := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			b = nil // truncated or overlong: the table ends here
			return 0
		}
		b = b[n:]
		return v
	}
	var refs map[uint64]refForms
	for len(b) > 0 {
		code := uleb()
		if code == 0 || len(b) == 0 {
			break
		}
		uleb() // tag
		if len(b) == 0 {
			break
		}
		b = b[1:] // children
		var forms refForms
		for len(b) > 0 {
			attr, form := uleb(), uleb()
			if attr == 0 && form == 0 {
				break
			}
			if form == 0x21 { // DW_FORM_implicit_const carries its value here
				uleb()
			}
			kind := uint8(refElsewhere)
			switch form {
			case 0x11, 0x12, 0x13, 0x14, 0x15:
				kind = refInUnit
			case 0x10:
				kind = refInSection
			}
			switch dwarf.Attr(attr) {
			case dwarf.AttrAbstractOrigin:
				forms.origin = kind
			case dwarf.AttrSpecification:
				forms.spec = kind
			}
		}
		if forms != (refForms{}) {
			if refs == nil {
				refs = map[uint64]refForms{}
			}
			refs[code] = forms
		}
	}
	return refs
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
// ur's, positioned after the unit entry.
func (u *unitInfo) readFunctions(p *unitParse, ur *unitReader, r *dwarf.Reader) {
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
			node = u.addFunction(p, ur, e, enclosing())
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
func (u *unitInfo) addFunction(p *unitParse, ur *unitReader, e *dwarf.Entry, parent int32) int32 {
	ranges, err := ur.d.Ranges(e)
	if err != nil || len(ranges) == 0 {
		return -1
	}
	fn := fnNode{name: p.entryName(ur, e), parent: -1}
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

// entryName returns the raw name of a function entry e of ur's unit: its
// linkage name, else its name, else that of its abstract origin or
// specification, which a DW_FORM_ref_addr may put in another unit. A name
// in a unit that cannot be read is not found.
func (p *unitParse) entryName(ur *unitReader, e *dwarf.Entry) string {
	start := ur.head.off + uint64(e.Offset)
	if name, ok := p.names[start]; ok {
		return name
	}
	var name string
	at := start
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
		if n, ok := p.names[at]; ok && at != start {
			if n != "" {
				name = n
			}
			break
		}
		ref, ok := ur.ref(e)
		if !ok {
			break
		}
		ur, e = p.entry(ref)
		if e != nil {
			at = ref
		}
	}
	p.names[start] = name
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
