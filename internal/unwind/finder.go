package unwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/pclntab"
	"github.com/sonde-dev/sonde/tracer"
)

// Finder finds the unwind row that covers one address of one file: the row
// the file's table would hold there (buildFile), found by reading the
// file's CFI and pclntab in place at that address alone, without building
// the table. User space unwinds stack snapshots with it: the stacks the
// eBPF side took in files whose tables were not loaded yet (a new program,
// a library just loaded, a table refused for want of budget).
//
// A Finder holds a read-only mapping of the file; a lookup reads a few of
// its pages. Close releases it. A Finder is not safe for concurrent use.
type Finder struct {
	img  *elfx.Image
	ef   *elf.File
	code []segment // executable segments, by file offset

	eh, dbg *section
	// hdr is .eh_frame_hdr's search table (pairs of 4-byte initial
	// location and FDE address, relative to hdrAddr), when the file has a
	// usable one and no .debug_frame to merge: most files.
	hdr     []byte
	hdrAddr uint64
	// index holds the FDEs the table keeps, sorted and without overlaps,
	// where hdr cannot serve (built at the first lookup that needs it).
	index      []fdeRef
	indexBuilt bool
	indexErr   error

	gt         *pclntab.Table // nil: not a Go binary
	goLo, goHi uint64         // the addresses the Go rows cover
	haveCode   bool
	cfiNone    bool // the file has no CFI (ErrNoCFI)

	// entry is where the file's programs start (startsPrograms; 0: not a
	// program): EndAtEntry's stack end, if no row covers it.
	entry     uint64
	entryEnd  uint64 // the end of the CFAEnd range at entry; 0: none
	entryDone bool

	cies  map[cieKey]*cie
	reads int    // Row calls since the mapping's pages were last dropped
	p     parser // one FDE's program at a time
	st    Stats
	// The rows of the FDE last interpreted (lastOK: it could be), which
	// the next lookup in the same function reuses: a recursion's frames,
	// and a hostile FDE of tens of thousands of rows looked up again.
	last   fdeRef
	lastOK bool
	have   bool
}

// fdeRef is one FDE of a Finder's index.
type fdeRef struct {
	begin uint64
	size  uint32
	off   uint32 // the entry's offset in its section; debugBit: .debug_frame
}

const debugBit = 1 << 31

type cieKey struct {
	debug bool
	off   int
}

// NewFinder opens the file at path for lookups, with the .debug_frame of
// its separate debug file (searched in debugDirs) where the file has none,
// as the Loader's tables do.
func NewFinder(path string, debugDirs []string, log *zap.Logger) (*Finder, error) {
	f, err := elfx.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return newFinder(f, path, debugDirs, log)
}

// NewFinderFile is NewFinder for a file already open as f (which it does
// not close), named path.
func NewFinderFile(f *os.File, path string, debugDirs []string, log *zap.Logger) (*Finder, error) {
	return newFinder(f, path, debugDirs, log)
}

func newFinder(f *os.File, path string, debugDirs []string, log *zap.Logger) (_ *Finder, err error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	img, err := elfx.MapImage(f, st.Size())
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			img.Unmap()
		}
	}()
	ef, err := elf.NewFile(bytes.NewReader(img.Bytes()))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	fd := &Finder{img: img, ef: ef, cies: map[cieKey]*cie{}}
	for _, s := range loadSegments(ef) {
		if s.exec && s.filesz > 0 {
			fd.code = append(fd.code, s)
		}
	}
	sort.Slice(fd.code, func(i, j int) bool { return fd.code[i].off < fd.code[j].off })
	if fd.eh, fd.dbg, err = frameSections(ef, img.Bytes()); err != nil {
		return nil, err
	}
	if fd.dbg == nil {
		df, err := elfx.FindDebugFile(ef, elfx.ViewOf(path), debugDirs)
		if err != nil && log != nil {
			log.Debug("debug file lookup", zap.String("file", path), zap.Error(err))
		}
		if df != nil {
			if hasSection(df.ELF, ".debug_frame") {
				// Read into the heap: debug files are seldom mapped.
				fd.dbg, err = sectionOf(df.ELF, nil, ".debug_frame", true)
				if err != nil {
					fd.dbg = nil
				}
			}
			_ = df.Close()
		}
	}
	fd.cfiNone = fd.eh == nil && fd.dbg == nil
	if fd.dbg == nil && fd.eh != nil {
		fd.hdr, fd.hdrAddr = ehFrameHdr(ef, img.Bytes(), fd.eh)
	}
	if pclntab.Section(ef) != nil {
		if gt, err := pclntab.OpenELFImage(ef, img.Bytes()); err == nil {
			fd.gt = gt
			fd.goLo, fd.goHi = gt.Range()
			fd.haveCode = elfCode(ef) != nil
		}
	}
	if fd.gt == nil && fd.cfiNone {
		return nil, fmt.Errorf("%s: %w", path, ErrNoCFI)
	}
	if startsPrograms(ef) {
		fd.entry = ef.Entry
	}
	img.DropPages() // what the lookups need of the headers read is in fd
	return fd, nil
}

// Close releases the file's mapping.
func (fd *Finder) Close() {
	if fd != nil && fd.img != nil {
		fd.img.Unmap()
		fd.img = nil
	}
}

// DropPages lets go of the pages lookups have read (see elfx.Image); it
// costs nothing when no Row was read since the last call.
func (fd *Finder) DropPages() {
	if fd.img != nil && fd.reads > 0 {
		fd.img.DropPages()
	}
	fd.reads = 0
}

// dropAfterRows is how many Row calls may read the file's mapping before
// its pages are let go of. Each read maps the 64 KiB around it (the
// kernel's fault-around): 200 rows of a big Go binary, each a few places
// of its pclntab, would hold 10 MB of it.
const dropAfterRows = 8

// Row returns the kernel row that covers file offset off, as the eBPF
// unwinder would find it in the file's table. ok is false where the table
// has no row (below its first executable segment): the unwinder walks
// frame pointers there.
func (fd *Finder) Row(off uint64) (tracer.Row, bool) {
	if fd.reads >= dropAfterRows {
		fd.DropPages()
	}
	fd.reads++
	if len(fd.code) == 0 || off < fd.code[0].off {
		return tracer.Row{}, false
	}
	for _, s := range fd.code {
		if off >= s.off && off-s.off < s.filesz {
			r, ok := fd.vaddrRow(off - s.off + s.vaddr)
			if !ok {
				r = Row{}
			}
			return kernelRow(r, 0), true
		}
	}
	return kernelRow(Row{}, 0), true
}

// vaddrRow is the row of the file's table (before it is re-keyed by file
// offset) covering the ELF address v: the Go rows within the pclntab's
// range, the CFI's outside it, and the program's entry as a stack end.
func (fd *Finder) vaddrRow(v uint64) (Row, bool) {
	r, ok := fd.mergedRow(v)
	if (!ok || r.CFA == CFAUnknown) && fd.entry != 0 && v >= fd.entry && v < fd.entryRange() {
		return Row{PC: v, CFA: CFAEnd}, true
	}
	return r, ok
}

// mergedRow is vaddrRow before EndAtEntry (mergeOutside).
func (fd *Finder) mergedRow(v uint64) (Row, bool) {
	if fd.gt != nil && v >= fd.goLo && v < fd.goHi {
		return fd.goRow(v), true
	}
	if fd.cfiNone {
		if fd.gt != nil && v >= fd.goHi {
			return Row{}, true // the Go table's closing row
		}
		return Row{}, false
	}
	r, ok := fd.cfiRow(v)
	if !ok && fd.gt != nil && v >= fd.goHi {
		return Row{}, true
	}
	return r, ok
}

// entryRange returns the end of the range EndAtEntry makes a stack end:
// from the entry to the next row, if the entry has no rule of its own and
// some row follows it; 0 otherwise.
func (fd *Finder) entryRange() uint64 {
	if fd.entryDone {
		return fd.entryEnd
	}
	fd.entryDone = true
	if r, ok := fd.mergedRow(fd.entry); ok && r.CFA != CFAUnknown {
		return 0
	}
	next := uint64(0)
	take := func(pc uint64) {
		if pc > fd.entry && (next == 0 || pc < next) {
			next = pc
		}
	}
	if fd.gt != nil {
		take(fd.goLo)
		if fd.entry >= fd.goLo && fd.entry < fd.goHi {
			take(fd.goHi)
		}
	}
	if !fd.cfiNone {
		if b, ok := fd.nextFDE(fd.entry); ok {
			take(b)
		}
	}
	fd.entryEnd = next
	return next
}

// goRow is the Go table's row at v, within the pclntab's range.
func (fd *Finder) goRow(v uint64) Row {
	fn, ok := fd.gt.FuncAt(v)
	if !ok {
		return Row{}
	}
	g, special := classifyGo(fd.gt, fn, fd.haveCode, linkRegister(fd.gt))
	if special && g.stackEnd {
		return Row{PC: fn.Entry, CFA: CFAEnd}
	}
	// The function's ranges, padding aside: no row starts in the fill
	// after a function, the one before covers it.
	var ranges []spRange
	err := fd.gt.FuncSPDeltas(fn, func(start, stop uint64, delta int32) bool {
		if delta != pclntab.Padding {
			ranges = append(ranges, spRange{start, stop, delta})
		}
		return true
	})
	if err != nil || len(ranges) == 0 {
		return Row{}
	}
	if !special {
		r := Row{}
		lr := linkRegister(fd.gt)
		var frame int32
		for _, sr := range ranges {
			if sr.start > v {
				break
			}
			r = spRow(sr.start, sr.delta, lr)
			if lr {
				r = goFrameRow(r, sr.delta, &frame)
			}
		}
		return r
	}
	var rows []Row
	if err := specialRows(&g, ranges, elfCode(fd.ef), func(r Row) { rows = append(rows, r) }); err != nil {
		return Row{}
	}
	r := Row{}
	for _, x := range rows {
		if x.PC > v {
			break
		}
		r = x
	}
	return r
}

// cfiRow is the CFI table's row at v: ok is false below its first FDE;
// in a gap between FDEs and after the last one it is CFAUnknown.
func (fd *Finder) cfiRow(v uint64) (Row, bool) {
	var ref fdeRef
	if fd.hdr != nil {
		var found, usable bool
		ref, found, usable = fd.hdrFDE(v)
		if !usable {
			fd.hdr = nil // overlapping FDEs: the index sorts them out
			return fd.cfiRow(v)
		}
		if !found {
			return fd.pltRow(v, false)
		}
	} else {
		idx := fd.buildIndex()
		i := sort.Search(len(idx), func(i int) bool { return idx[i].begin > v })
		if i == 0 {
			return fd.pltRow(v, false)
		}
		ref = idx[i-1]
	}
	if v-ref.begin >= uint64(ref.size) {
		return fd.pltRow(v, true) // a gap, or past the last FDE
	}
	rows, ok := fd.fdeRows(ref)
	if !ok {
		return Row{}, true // an FDE the table drops: a gap
	}
	r := Row{}
	for _, x := range rows {
		if x.PC > v {
			break
		}
		r = x
	}
	return r, true
}

// pltRow is the row at v where no FDE covers it: an aarch64 PLT stub's
// (frameSections), as the table has it, or none (ok as given).
func (fd *Finder) pltRow(v uint64, ok bool) (Row, bool) {
	for _, s := range []*section{fd.eh, fd.dbg} {
		if s == nil {
			continue
		}
		for _, r := range s.plt {
			if v >= r.lo && v < r.hi {
				return Row{PC: r.lo, CFA: CFASPLR}, true
			}
		}
	}
	return Row{}, ok
}

// nextFDE returns the start of the first FDE the table keeps after v.
func (fd *Finder) nextFDE(v uint64) (uint64, bool) {
	if fd.hdr != nil {
		n := len(fd.hdr) / 8
		i := sort.Search(n, func(i int) bool { return fd.hdrBegin(i) > v })
		for end := min(n, i+hdrSkip); i < end; i++ {
			if ref, ok := fd.hdrRef(i); ok && ref.size > 0 {
				return ref.begin, true
			}
		}
		return 0, false
	}
	idx := fd.buildIndex()
	i := sort.Search(len(idx), func(i int) bool { return idx[i].begin > v })
	if i == len(idx) {
		return 0, false
	}
	return idx[i].begin, true
}

// ehFrameHdr returns the search table of f's .eh_frame_hdr and the address
// its entries are relative to, when it has the layout every linker writes
// (4-byte entries relative to the header) and points at eh; nil otherwise.
func ehFrameHdr(f *elf.File, img []byte, eh *section) ([]byte, uint64) {
	s := f.Section(".eh_frame_hdr")
	if s == nil || s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_COMPRESSED != 0 ||
		s.Offset > uint64(len(img)) || s.Size > uint64(len(img))-s.Offset || s.Size < 4 {
		return nil, 0
	}
	data := img[s.Offset : s.Offset+s.Size]
	const tableEnc = peDataRel | peSdata4
	if data[0] != 1 || data[3] != tableEnc {
		return nil, 0
	}
	b := buf{data: data, off: 4}
	ctx := ptrCtx{secAddr: s.Addr, dataBase: s.Addr}
	ehPtr := b.pointer(data[1], &ctx, true)
	count := b.pointer(data[2], &ctx, true)
	if b.err != nil || ehPtr != eh.addr || data[2] == peOmit || count > uint64(b.left())/8 {
		return nil, 0
	}
	return data[b.off : b.off+int(count)*8], s.Addr
}

func (fd *Finder) hdrBegin(i int) uint64 {
	return fd.hdrAddr + uint64(int64(int32(binary.LittleEndian.Uint32(fd.hdr[8*i:]))))
}

// hdrRef reads entry i of the search table and the range of its FDE.
func (fd *Finder) hdrRef(i int) (fdeRef, bool) {
	fde := fd.hdrAddr + uint64(int64(int32(binary.LittleEndian.Uint32(fd.hdr[8*i+4:]))))
	if fde < fd.eh.addr || fde-fd.eh.addr >= uint64(len(fd.eh.data)) {
		return fdeRef{}, false
	}
	off := int(fde - fd.eh.addr)
	begin, end, ok := fd.fdeRange(fd.eh, off)
	if !ok || end-begin > 1<<32-1 {
		return fdeRef{}, false
	}
	return fdeRef{begin: begin, size: uint32(end - begin), off: uint32(off)}, true
}

// hdrFDE finds, through the search table, the FDE the table keeps that
// starts last at or before v. usable is false where the search table
// cannot tell: its FDEs there overlap, which the table resolves by their
// order in the file.
func (fd *Finder) hdrFDE(v uint64) (ref fdeRef, found, usable bool) {
	n := len(fd.hdr) / 8
	i := sort.Search(n, func(i int) bool { return fd.hdrBegin(i) > v })
	// The last FDE with a range at or before v: empty and unreadable ones
	// are not in the table. A run of them longer than hdrSkip is no
	// linker's work: the index sorts such a file out, once.
	for skipped := 0; ; skipped++ {
		if i--; i < 0 {
			return ref, false, true
		}
		if skipped == hdrSkip {
			return ref, false, false
		}
		if r, ok := fd.hdrRef(i); ok && r.size > 0 {
			ref = r
			break
		}
	}
	for j, skipped := i-1, 0; j >= 0; j, skipped = j-1, skipped+1 {
		if skipped == hdrSkip {
			return ref, false, false
		}
		p, ok := fd.hdrRef(j)
		if !ok || p.size == 0 {
			continue
		}
		if p.begin+uint64(p.size) > ref.begin || p.begin == ref.begin {
			return ref, false, false
		}
		break
	}
	return ref, true, true
}

// hdrSkip bounds the empty or unreadable entries of the search table a
// lookup steps over.
const hdrSkip = 16

// fdeRange reads the address range of the FDE at off in s.
func (fd *Finder) fdeRange(s *section, off int) (begin, end uint64, ok bool) {
	e, ok, err := s.next(off)
	if !ok || err != nil || e.isCIE {
		return 0, 0, false
	}
	c := fd.cie(s, e.cieOff)
	if c == nil {
		return 0, 0, false
	}
	b := buf{data: s.data[:e.end], off: e.body}
	ctx := s.ctx
	begin = b.pointer(c.fdeEnc, &ctx, true)
	size := b.pointer(c.fdeEnc&0x0f, &ctx, false)
	if b.err != nil || begin+size < begin {
		return 0, 0, false
	}
	return begin, begin + size, true
}

// cie returns the parsed CIE at off in s, nil if it is unusable.
func (fd *Finder) cie(s *section, off int) *cie {
	k := cieKey{s.debug, off}
	if c, ok := fd.cies[k]; ok {
		return c
	}
	var c *cie
	if ce, ok, err := s.next(off); ok && err == nil && ce.isCIE && ce.start == off {
		if c = s.parseCIE(ce); c.err != nil {
			c = nil
		}
	}
	if len(fd.cies) < maxCIEs {
		fd.cies[k] = c
	}
	return c
}

// fdeRows interprets the program of FDE ref; ok is false where the table
// would drop it (a bad entry).
func (fd *Finder) fdeRows(ref fdeRef) ([]Row, bool) {
	if fd.have && fd.last == ref {
		return fd.p.rows, fd.lastOK
	}
	rows, ok := fd.interpret(ref)
	fd.last, fd.lastOK, fd.have = ref, ok, true
	return rows, ok
}

// interpret runs the program of FDE ref into fd.p.rows.
func (fd *Finder) interpret(ref fdeRef) ([]Row, bool) {
	fd.p.rows = fd.p.rows[:0]
	s := fd.eh
	if ref.off&debugBit != 0 {
		s = fd.dbg
	}
	off := int(ref.off &^ debugBit)
	e, ok, err := s.next(off)
	if !ok || err != nil || e.isCIE {
		return nil, false
	}
	c := fd.cie(s, e.cieOff)
	if c == nil {
		return nil, false
	}
	fd.p.st = &fd.st
	fd.p.rows = fd.p.rows[:0]
	fd.p.fdes = fd.p.fdes[:0]
	if err := fd.p.parseFDE(s, e, c); err != nil || len(fd.p.fdes) != 1 {
		return nil, false
	}
	return fd.p.rows, true
}

// buildIndex lists the FDEs of both sections as the table keeps them:
// .debug_frame's only where no .eh_frame FDE overlaps them, and among
// overlapping ones the first by start (by section order for equal starts).
func (fd *Finder) buildIndex() []fdeRef {
	if fd.indexBuilt {
		return fd.index
	}
	fd.indexBuilt = true
	var refs []fdeRef
	nEH := 0
	for _, s := range []*section{fd.eh, fd.dbg} {
		if s == nil {
			continue
		}
		var err error
		if refs, err = fd.scan(s, refs); err != nil && len(refs) == 0 {
			fd.indexErr = errors.Join(fd.indexErr, err)
		}
		if s == fd.eh {
			nEH = len(refs)
		}
	}
	if nEH > 0 && len(refs) > nEH {
		eh := make([]fdeRows, nEH)
		for i, r := range refs[:nEH] {
			eh[i] = fdeRows{begin: r.begin, end: r.begin + uint64(r.size), first: i}
		}
		all := append(eh, make([]fdeRows, 0, len(refs)-nEH)...)
		for i, r := range refs[nEH:] {
			all = append(all, fdeRows{begin: r.begin, end: r.begin + uint64(r.size), first: nEH + i})
		}
		var st Stats
		kept := dropCovered(all, nEH, &st)
		out := make([]fdeRef, 0, len(kept))
		for _, k := range kept {
			out = append(out, refs[k.first])
		}
		refs = out
	}
	sort.SliceStable(refs, func(i, j int) bool { return refs[i].begin < refs[j].begin })
	kept := refs[:0]
	var prevEnd uint64
	for _, r := range refs {
		if len(kept) > 0 && r.begin < prevEnd {
			continue
		}
		kept = append(kept, r)
		prevEnd = r.begin + uint64(r.size)
	}
	fd.index = kept
	return kept
}

// scan appends the FDEs of s whose programs the table would interpret: a
// readable header with a CIE and a non-empty range.
func (fd *Finder) scan(s *section, refs []fdeRef) ([]fdeRef, error) {
	if len(s.data) > maxSectionSize || len(s.data) >= debugBit {
		return refs, fmt.Errorf("section of %d bytes", len(s.data))
	}
	off := 0
	for n := 0; n < maxEntries; n++ {
		e, ok, err := s.next(off)
		if !ok {
			return refs, err
		}
		off = e.end
		if err != nil || e.isCIE {
			continue
		}
		begin, end, ok := fd.fdeRange(s, e.start)
		if !ok || end == begin || end-begin > 1<<32-1 {
			continue
		}
		o := uint32(e.start)
		if s.debug {
			o |= debugBit
		}
		refs = append(refs, fdeRef{begin: begin, size: uint32(end - begin), off: o})
	}
	return refs, fmt.Errorf("more than %d entries", maxEntries)
}
