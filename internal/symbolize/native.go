package symbolize

import (
	"bytes"
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/ianlancetaylor/demangle"

	"github.com/sonde-dev/sonde/internal/elfx"
)

const (
	// maxSymtabBytes and maxStrtabBytes bound the sections read for one
	// symbol table (a 1M-symbol binary has a 24 MiB .symtab).
	maxSymtabBytes = 256 << 20
	maxStrtabBytes = 256 << 20
	// maxSymbolName bounds a kept symbol name; longer names are cut.
	maxSymbolName = 4096
	// demangleMaxLength bounds a demangled name (2^16 bytes) against names
	// crafted to expand exponentially; past it the raw name is shown.
	demangleMaxLength = 16
	// nativeBackScan is how many lower symbols Lookup inspects when the
	// nearest one does not contain the address (nested symbols).
	nativeBackScan = 8

	// nativeSymSize is unsafe.Sizeof(nativeSym{}) (checked by a test).
	nativeSymSize = 16
)

// nativeTable holds the function symbols of one ELF file, sorted by address
// with one entry per address. It is immutable once built.
type nativeTable struct {
	// syms live in mem, anonymous memory outside the heap (a big C++
	// program's .dynsym is 30k functions, 0.5 MB the collector's goal would
	// double), unmapped by unmap or once the table is collected.
	syms []nativeSym
	mem  *elfx.Image
	// names holds every name NUL-terminated: the file's string table in
	// place (a read-only mapping: no heap) or a compact heap copy.
	names     string
	namesHeap bool   // names is a heap copy, charged to the budget
	source    string // ".symtab", ".dynsym" or ".gnu_debugdata"
}

// nativeSym is one function: [addr, addr+size) named by the NUL-terminated
// string at names[name:]. It takes nativeSymSize bytes.
type nativeSym struct {
	addr uint64
	size uint32
	name uint32
}

// loadNative reads the function symbols of the best source present: the
// .symtab of debug (a separate debug file, may be nil), the .symtab of f,
// f's MiniDebugInfo, then f's .dynsym. A source with no functions passes to
// the next. A corrupt MiniDebugInfo is skipped: .dynsym still names exported
// code. It returns nil without error when no source has functions. fImg and
// debugImg hold the files' bytes (read-only mappings), nil to read sections
// into the heap.
func loadNative(f *elf.File, fImg []byte, debug *elf.File, debugImg []byte, mini func() (*nativeTable, error)) (*nativeTable, error) {
	if debug != nil {
		if t, err := symbolSection(debug, debugImg, elf.SHT_SYMTAB); err != nil || t != nil {
			return t, err
		}
	}
	if t, err := symbolSection(f, fImg, elf.SHT_SYMTAB); err != nil || t != nil {
		return t, err
	}
	if mini != nil {
		if t, err := mini(); err == nil && t != nil {
			return t, nil
		}
	}
	return symbolSection(f, fImg, elf.SHT_DYNSYM)
}

// symbolSection reads the first section of type typ; nil when there is none
// or it holds no functions.
func symbolSection(f *elf.File, img []byte, typ elf.SectionType) (*nativeTable, error) {
	for _, s := range f.Sections {
		if s.Type != typ {
			continue
		}
		t, err := readSymbols(f, img, s, img != nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		if len(t.syms) > 0 {
			return t, nil
		}
		return nil, nil
	}
	return nil, nil
}

// symCandidate is a function symbol before aliases are merged.
type symCandidate struct {
	addr, size, sectEnd uint64
	name, nameLen       uint32
	rank                int  // lower wins among aliases
	label               bool // an untyped label in code (isCodeLabel)
}

// readSymbols parses a SHT_SYMTAB or SHT_DYNSYM section of f, whose bytes
// are img (nil: read sections from f). Symbols are read in place; names are
// kept in place only when mapped says img is a file mapping that outlives
// the table, else the kept names are copied into a compact string.
func readSymbols(f *elf.File, img []byte, s *elf.Section, mapped bool) (*nativeTable, error) {
	entSize := uint64(24)
	if f.Class == elf.ELFCLASS32 {
		entSize = 16
	}
	if s.Size > maxSymtabBytes {
		return nil, fmt.Errorf("%d bytes of symbols exceed the %d limit", s.Size, maxSymtabBytes)
	}
	if int(s.Link) <= 0 || int(s.Link) >= len(f.Sections) {
		return nil, fmt.Errorf("string table index %d out of range", s.Link)
	}
	strSect := f.Sections[s.Link]
	if strSect.Size > maxStrtabBytes {
		return nil, fmt.Errorf("%d bytes of symbol names exceed the %d limit", strSect.Size, maxStrtabBytes)
	}
	if img != nil && (s.Flags|strSect.Flags)&elf.SHF_COMPRESSED != 0 {
		img = nil // rare: read (and inflate) into the heap, within the limits above
	}
	symData, err := elfx.SectionBytes(img, s)
	if err != nil {
		return nil, fmt.Errorf("read symbols: %w", err)
	}
	strData, err := elfx.SectionBytes(img, strSect)
	if err != nil {
		return nil, fmt.Errorf("read symbol names: %w", err)
	}
	inPlace := mapped && img != nil && len(strData) > 0 && uint64(len(strData)) < 1<<32

	var names strings.Builder
	// The candidates gather outside the heap too, in room for every entry.
	var cands []symCandidate
	if n := len(symData) / int(entSize); n > 0 {
		if b, release, ok := elfx.Reserve(n * int(unsafe.Sizeof(symCandidate{}))); ok {
			defer release() // setSyms copies what it keeps
			cands = unsafe.Slice((*symCandidate)(unsafe.Pointer(unsafe.SliceData(b))), n)[:0]
		}
	}
	bo := f.ByteOrder
	// Entry 0 is the reserved null symbol.
	for off := entSize; off+entSize <= uint64(len(symData)); off += entSize {
		e := symData[off : off+entSize]
		var nameOff uint32
		var value, size uint64
		var info byte
		var shndx uint16
		if entSize == 24 {
			nameOff, info, shndx = bo.Uint32(e[0:4]), e[4], bo.Uint16(e[6:8])
			value, size = bo.Uint64(e[8:16]), bo.Uint64(e[16:24])
		} else {
			nameOff, value, size = bo.Uint32(e[0:4]), uint64(bo.Uint32(e[4:8])), uint64(bo.Uint32(e[8:12]))
			info, shndx = e[12], bo.Uint16(e[14:16])
		}
		typ := elf.ST_TYPE(info)
		if typ != elf.STT_FUNC && typ != elf.STT_GNU_IFUNC && typ != elf.STT_NOTYPE {
			continue
		}
		if shndx == uint16(elf.SHN_UNDEF) || shndx >= uint16(elf.SHN_LORESERVE) || value == 0 {
			continue
		}
		name := cString(strData, nameOff)
		if len(name) == 0 {
			continue
		}
		label := typ == elf.STT_NOTYPE
		if label && !isCodeLabel(f, shndx, name) {
			continue
		}
		var sectEnd uint64
		if int(shndx) < len(f.Sections) {
			sec := f.Sections[shndx]
			sectEnd = sec.Addr + sec.Size
		}
		at := nameOff
		if !inPlace {
			if uint64(names.Len())+uint64(len(name))+1 > 1<<32-1 {
				return nil, errors.New("symbol names exceed 4 GiB")
			}
			at = uint32(names.Len())
			names.Write(name)
			names.WriteByte(0)
		}
		rank := aliasRank(elf.ST_BIND(info), size, name)
		if label {
			rank += 4 << 20 // a function at the same address wins
		}
		cands = append(cands, symCandidate{
			addr: value, size: size, sectEnd: sectEnd,
			name: at, nameLen: uint32(len(name)),
			rank: rank, label: label,
		})
	}
	t := &nativeTable{source: s.Name}
	if inPlace {
		t.names = unsafe.String(&strData[0], len(strData))
	} else {
		// A Builder keeps up to twice the room it needed: keep an exact copy.
		t.names, t.namesHeap = strings.Clone(names.String()), true
	}
	if err := t.setSyms(cands); err != nil {
		return nil, err
	}
	return t, nil
}

// isCodeLabel reports whether an untyped (STT_NOTYPE) symbol names code:
// hand-written assembly leaves its entry points untyped (ld.so's _start
// and _dl_start_user), and perf names them too. It must be in an
// executable section and not be a mapping symbol ("$x", "$d" on arm64) or
// an assembler-local label (".L").
func isCodeLabel(f *elf.File, shndx uint16, name []byte) bool {
	if int(shndx) >= len(f.Sections) || f.Sections[shndx].Flags&elf.SHF_EXECINSTR == 0 {
		return false
	}
	return name[0] != '$' && !bytes.HasPrefix(name, []byte(".L"))
}

// dropInnerLabels removes, from candidates sorted by address, the labels
// inside a sized function after its start: there the function names the
// code, not a label of its body. It returns what is kept.
func dropInnerLabels(cands []symCandidate) []symCandidate {
	kept := cands[:0]
	var start, end uint64 // the sized function that reaches furthest so far
	for _, c := range cands {
		if c.label && c.addr > start && c.addr < end {
			continue
		}
		if !c.label && c.size > 0 && satAdd(c.addr, c.size) > end {
			start, end = c.addr, satAdd(c.addr, c.size)
		}
		kept = append(kept, c)
	}
	return kept
}

// setSyms sorts cands and keeps one symbol per address (mergeAliases) as
// t's symbols, in anonymous memory that t owns.
func (t *nativeTable) setSyms(cands []symCandidate) error {
	sortCandidates(cands)
	cands = dropInnerLabels(cands)
	n := mergeAliases(cands, func(nativeSym) {})
	return t.fill(n, func(out []nativeSym) { mergeAliases(cands, func(s nativeSym) { out = append(out, s) }) })
}

// unmap releases the symbols' memory now, not once t is collected; t must
// not be used afterwards (a lookup that still did would find nothing).
func (t *nativeTable) unmap() {
	if t == nil {
		return
	}
	t.syms = nil
	t.mem.Unmap()
}

// fill maps room for n symbols outside the heap, lets add append them to
// the empty slice it is given, and makes them t's, unmapped once t is
// collected.
func (t *nativeTable) fill(n int, add func([]nativeSym)) error {
	if n == 0 {
		t.syms, t.mem = nil, nil
		return nil
	}
	m, err := elfx.MapAnon(int64(n)*nativeSymSize, func(b []byte) error {
		add(unsafe.Slice((*nativeSym)(unsafe.Pointer(unsafe.SliceData(b))), n)[:0])
		return nil
	})
	if err != nil {
		return fmt.Errorf("symbol index: %w", err)
	}
	t.syms = unsafe.Slice((*nativeSym)(unsafe.Pointer(unsafe.SliceData(m.Bytes()))), n)
	t.mem = m
	runtime.AddCleanup(t, func(m *elfx.Image) { m.Unmap() }, m)
	return nil
}

// outside returns t without the symbols in [lo, hi); one that started
// before lo now ends there at the latest. t must not be used afterwards.
// A Go binary's symbol table is mostly its Go functions, which the pclntab
// names: 60k of the reference collector's 62k, a megabyte kept for nothing.
func (t *nativeTable) outside(lo, hi uint64) *nativeTable {
	in := func(s nativeSym) bool { return s.addr >= lo && s.addr < hi }
	n := 0
	for _, s := range t.syms {
		if !in(s) {
			n++
		}
	}
	out := &nativeTable{names: t.names, namesHeap: t.namesHeap, source: t.source}
	err := out.fill(n, func(kept []nativeSym) {
		for _, s := range t.syms {
			if in(s) {
				continue
			}
			if s.addr < lo && uint64(s.size) > lo-s.addr {
				s.size = uint32(lo - s.addr)
			}
			kept = append(kept, s)
		}
	})
	if err != nil {
		return t // all of it, rather than nothing
	}
	t.unmap()
	return out
}

// cString returns the NUL-terminated string at off in tab, cut to
// maxSymbolName bytes; nil when off is outside tab.
func cString(tab []byte, off uint32) []byte {
	if uint64(off) >= uint64(len(tab)) {
		return nil
	}
	b := tab[off:]
	n := 0
	for n < len(b) && n < maxSymbolName && b[n] != 0 {
		n++
	}
	return b[:n]
}

// aliasRank orders symbols sharing an address, best first: global before
// weak before local, sized before unsized, fewer leading underscores (so
// "qsort" beats "__qsort").
func aliasRank(bind elf.SymBind, size uint64, name []byte) int {
	r := 0
	switch bind {
	case elf.STB_GLOBAL:
	case elf.STB_WEAK:
		r += 1 << 20
	default:
		r += 2 << 20
	}
	if size == 0 {
		r += 1 << 16
	}
	u := 0
	for u < len(name) && name[u] == '_' {
		u++
	}
	return r + min(u, 255)<<8
}

// sortCandidates orders candidates by address, the best alias first
// (aliasRank), then as the table lists them.
func sortCandidates(cands []symCandidate) {
	slices.SortFunc(cands, func(a, b symCandidate) int {
		if c := cmp.Compare(a.addr, b.addr); c != 0 {
			return c
		}
		if c := cmp.Compare(a.rank, b.rank); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name) // first in the table wins
	})
}

// mergeAliases emits one symbol per address of sorted candidates, and
// returns how many; an unsized symbol ends at the next symbol or at the end
// of its section.
func mergeAliases(cands []symCandidate, emit func(nativeSym)) int {
	n := 0
	for i := 0; i < len(cands); {
		best := cands[i]
		var end uint64 // the largest sized end among the aliases
		sectEnd := best.sectEnd
		j := i
		for ; j < len(cands) && cands[j].addr == best.addr; j++ {
			if sz := cands[j].size; sz > 0 {
				end = max(end, satAdd(best.addr, sz))
			}
		}
		if end == 0 {
			end = best.addr // not yet known: set below
			if j < len(cands) {
				end = cands[j].addr
			}
			if sectEnd > best.addr && (j == len(cands) || sectEnd < end) {
				end = sectEnd
			}
		}
		emit(nativeSym{addr: best.addr, size: uint32(min(end-best.addr, 1<<32-1)), name: best.name})
		n++
		i = j
	}
	return n
}

func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// lookup returns the raw name of the function containing addr.
func (t *nativeTable) lookup(addr uint64) (string, bool) {
	i, found := slices.BinarySearchFunc(t.syms, addr, func(s nativeSym, a uint64) int { return cmp.Compare(s.addr, a) })
	if !found {
		i--
	}
	for k := i; k >= 0 && k > i-nativeBackScan; k-- {
		if s := t.syms[k]; addr-s.addr < uint64(s.size) {
			return t.name(s.name), true
		}
	}
	return "", false
}

// name returns the name at off in names, cut at its NUL or maxSymbolName.
// It points into names (possibly a mapping): copy what outlives the table.
func (t *nativeTable) name(off uint32) string {
	if uint64(off) >= uint64(len(t.names)) {
		return ""
	}
	n := t.names[off:]
	if i := strings.IndexByte(n[:min(len(n), maxSymbolName)], 0); i >= 0 {
		return n[:i]
	}
	return n[:min(len(n), maxSymbolName)]
}

// memSize is the table's heap footprint in bytes: the index, and the names
// when they are a copy.
func (t *nativeTable) memSize() int64 {
	n := int64(cap(t.syms))*nativeSymSize + 64
	if t.namesHeap {
		n += int64(len(t.names))
	}
	return n
}

// demangled returns the full demangled name of a raw symbol name, with
// parameter lists and template arguments (as addr2line -C prints it): C++
// (Itanium) and Rust (legacy and v0) names are demangled, anything else is
// returned as is.
func demangled(raw string) string {
	if !strings.HasPrefix(raw, "_Z") && !strings.HasPrefix(raw, "_R") {
		return raw
	}
	return demangle.Filter(raw, demangle.MaxLength(demangleMaxLength))
}

// simplifiedOptions simplify a demangled name the way pprof does by
// default: namespaces and classes stay; parameter lists, template
// arguments and return types go. A flame graph then shows
// "clang::Sema::ActOnComment" instead of fragments of its parameters.
var simplifiedOptions = []demangle.Option{
	demangle.NoParams, demangle.NoEnclosingParams, demangle.NoTemplateParams,
	demangle.MaxLength(demangleMaxLength),
}

// simplified returns the simplified demangled name of a raw symbol name
// (see simplifiedOptions); anything not mangled is returned as is.
func simplified(raw string) string {
	if !strings.HasPrefix(raw, "_Z") && !strings.HasPrefix(raw, "_R") {
		return raw
	}
	return demangle.Filter(raw, simplifiedOptions...)
}

// rustSymbol reports whether raw is mangled as Rust mangles: v0 ("_R...")
// or legacy, an Itanium-like path ending in a hash segment
// ("_ZN...17h<16 hex digits>E", perhaps with a ".llvm.N" suffix).
func rustSymbol(raw string) bool {
	if strings.HasPrefix(raw, "_R") {
		return len(raw) > 2
	}
	if !strings.HasPrefix(raw, "_ZN") {
		return false
	}
	if i := strings.IndexByte(raw, '.'); i > 0 {
		raw = raw[:i]
	}
	const hashSeg = len("17h0123456789abcdefE")
	if len(raw) < len("_ZN")+hashSeg || !strings.HasSuffix(raw, "E") || raw[len(raw)-hashSeg:len(raw)-hashSeg+3] != "17h" {
		return false
	}
	for _, c := range raw[len(raw)-hashSeg+3 : len(raw)-1] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
