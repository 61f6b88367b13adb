package unwind

import (
	"errors"
	"fmt"
	"strings"
)

// Caps on hostile input. Real files stay far below them: libc has about
// 4,000 FDEs with at most a few dozen rows each.
const (
	maxEntries     = 1 << 20 // CIEs + FDEs per section
	maxCIEs        = 1 << 14 // distinct CIEs per section
	maxRowsPerFDE  = 1 << 16
	maxStateDepth  = 64 // DW_CFA_remember_state nesting
	maxAugString   = 16
	maxSectionSize = 256 << 20
	maxPrealloc    = 1 << 20 // rows or FDEs reserved up front; more grow on demand
)

// x86-64 DWARF register numbers.
const (
	regRBP = 6
	regRSP = 7
	regRA  = 16
)

// aarch64 DWARF register numbers: the frame pointer x29, the link register
// x30 (the return address column), sp.
const (
	regX29   = 29
	regX30   = 30
	regARMSP = 31
)

// section is one CFI section to parse.
type section struct {
	data  []byte
	addr  uint64 // virtual address of data[0] (for pcrel pointers)
	debug bool   // .debug_frame layout (CIE ids, absolute addresses) rather than .eh_frame
	arm64 bool   // an aarch64 file's (else x86-64's)
	// plt: code without CFI that unwinds as a PLT stub (aarch64's .plt,
	// for which linkers write no CFI).
	plt []pcRange
	ctx ptrCtx
}

// cie is the parsed common information of a CIE.
type cie struct {
	codeAlign uint64
	dataAlign int64
	raReg     uint64
	fdeEnc    uint8
	hasAugLen bool // 'z': FDEs carry an augmentation length
	signal    bool // 'S'
	arm64     bool // aarch64's registers and rules (else x86-64's)
	addrSize  int  // .debug_frame v4 address size (default 8)
	initial   []byte
	err       error // non-nil if the CIE could not be parsed
}

// entry is the header of one CIE or FDE.
type entry struct {
	start  int  // offset of the length field
	body   int  // offset just past the CIE id / CIE pointer
	end    int  // offset just past the entry
	isCIE  bool //
	cieOff int  // for an FDE: offset of its CIE
}

// next reads the entry header at off. ok is false at the end of the section
// (or at an .eh_frame zero terminator).
func (s *section) next(off int) (e entry, ok bool, err error) {
	b := buf{data: s.data, off: off}
	if b.left() < 4 {
		return e, false, nil
	}
	e.start = off
	length := uint64(b.u32())
	is64 := false
	if length == 0 {
		if !s.debug {
			return e, false, nil // .eh_frame terminator
		}
		// A zero-length entry in .debug_frame is padding.
		e.end = b.off
		e.body = b.off
		e.isCIE = true
		return e, true, errors.New("zero-length entry")
	}
	if length == 0xffffffff {
		length = b.u64()
		is64 = true
	}
	if b.err != nil || length > uint64(b.left()) {
		return e, false, fmt.Errorf("entry at %#x: length %d beyond section", off, length)
	}
	e.end = b.off + int(length)
	idPos := b.off
	var id uint64
	if is64 {
		id = b.u64()
	} else {
		id = uint64(b.u32())
	}
	if b.err != nil || b.off > e.end {
		return e, false, fmt.Errorf("entry at %#x: truncated header", off)
	}
	e.body = b.off
	switch {
	case !s.debug:
		e.isCIE = id == 0
		if !e.isCIE {
			if id > uint64(idPos) {
				return e, true, fmt.Errorf("fde at %#x: cie pointer %#x out of section", off, id)
			}
			e.cieOff = idPos - int(id)
		}
	case is64:
		e.isCIE = id == 0xffffffffffffffff
		if !e.isCIE {
			if id >= uint64(len(s.data)) {
				return e, true, fmt.Errorf("fde at %#x: cie offset %#x out of section", off, id)
			}
			e.cieOff = int(id)
		}
	default:
		e.isCIE = id == 0xffffffff
		if !e.isCIE {
			if id >= uint64(len(s.data)) {
				return e, true, fmt.Errorf("fde at %#x: cie offset %#x out of section", off, id)
			}
			e.cieOff = int(id)
		}
	}
	return e, true, nil
}

// parseCIE parses the CIE entry e.
func (s *section) parseCIE(e entry) *cie {
	c := &cie{addrSize: 8, codeAlign: 1, arm64: s.arm64}
	b := buf{data: s.data[:e.end], off: e.body}
	version := b.u8()
	if b.err == nil && version != 1 && version != 3 && version != 4 {
		c.err = fmt.Errorf("cie at %#x: version %d", e.start, version)
		return c
	}
	aug := b.cstring(maxAugString)
	if strings.Contains(aug, "eh") {
		b.u64() // old GCC exception table pointer
	}
	if version == 4 {
		c.addrSize = int(b.u8())
		if seg := b.u8(); b.err == nil && (c.addrSize != 8 && c.addrSize != 4 || seg != 0) {
			c.err = fmt.Errorf("cie at %#x: address size %d, segment size %d", e.start, c.addrSize, seg)
			return c
		}
	}
	c.codeAlign = b.uleb()
	c.dataAlign = b.sleb()
	if version == 1 {
		c.raReg = uint64(b.u8())
	} else {
		c.raReg = b.uleb()
	}
	c.fdeEnc = peAbsptr
	if s.debug && c.addrSize == 4 {
		c.fdeEnc = peUdata4
	}
	if strings.HasPrefix(aug, "z") {
		c.hasAugLen = true
		n := b.uleb()
		data := b.bytes(n)
		ab := buf{data: data}
		ctx := s.ctx
		ctx.deref = nil // personality routines are not needed; never dereference
		for _, ch := range aug[1:] {
			switch ch {
			case 'R':
				c.fdeEnc = ab.u8()
			case 'P':
				enc := ab.u8()
				ab.pointer(enc, &ctx, false)
			case 'L':
				ab.u8() // LSDA encoding; the LSDA itself is not needed
			case 'S':
				c.signal = true
			case 'B', 'G':
				// AArch64 BTI/MTE markers: no data.
			default:
				// Unknown augmentations after 'z' are skipped via the length.
			}
			if ab.err != nil {
				break
			}
		}
		if ab.err != nil {
			c.err = fmt.Errorf("cie at %#x: augmentation %q: %w", e.start, aug, ab.err)
			return c
		}
	} else if aug != "" && aug != "eh" {
		c.err = fmt.Errorf("cie at %#x: unknown augmentation %q", e.start, aug)
		return c
	}
	if b.err != nil {
		c.err = fmt.Errorf("cie at %#x: %w", e.start, b.err)
		return c
	}
	if c.codeAlign == 0 || c.codeAlign > 1<<16 || c.dataAlign > 1<<16 || c.dataAlign < -(1<<16) {
		c.err = fmt.Errorf("cie at %#x: alignment factors %d, %d", e.start, c.codeAlign, c.dataAlign)
		return c
	}
	c.initial = b.data[b.off:]
	return c
}

// parser walks one section and appends interpreted FDEs to a shared buffer.
type parser struct {
	st   *Stats
	rows []Row
	fdes []fdeRows
	vm   machine
	skip pcRange // FDEs wholly inside are not interpreted
	// scratch holds rows and fdes; parseFDE drops its pages every
	// dropRows rows (dropped counts up to the next drop), and the input's
	// with dropInput when set.
	scratch   releases
	dropped   int
	dropInput func()
}

// pcRange is the code in [lo, hi); the zero range holds none.
type pcRange struct{ lo, hi uint64 }

// holds reports whether [begin, end) lies wholly inside r.
func (r pcRange) holds(begin, end uint64) bool {
	return r.lo < r.hi && begin >= r.lo && end <= r.hi
}

// parseSection interprets every FDE of s. Errors in single entries are
// counted in Stats and skipped; an error is returned only when the section's
// framing is broken (the rest of it cannot be walked).
func (p *parser) parseSection(s *section) error {
	if len(s.data) > maxSectionSize {
		return fmt.Errorf("section of %d bytes exceeds %d", len(s.data), maxSectionSize)
	}
	cies := make(map[int]*cie)
	off := 0
	for n := 0; ; n++ {
		if n >= maxEntries {
			return fmt.Errorf("more than %d entries", maxEntries)
		}
		e, ok, err := s.next(off)
		if !ok {
			return err
		}
		off = e.end
		if err != nil {
			if !e.isCIE {
				p.st.BadFDEs++
			}
			continue
		}
		if e.isCIE {
			if _, seen := cies[e.start]; !seen {
				if len(cies) >= maxCIEs {
					return fmt.Errorf("more than %d cies", maxCIEs)
				}
				c := s.parseCIE(e)
				cies[e.start] = c
				p.countCIE(c)
			}
			continue
		}
		c, seen := cies[e.cieOff]
		if !seen {
			ce, ok, err := s.next(e.cieOff)
			if !ok || err != nil || !ce.isCIE || ce.start != e.cieOff {
				p.st.BadFDEs++
				continue
			}
			if len(cies) >= maxCIEs {
				return fmt.Errorf("more than %d cies", maxCIEs)
			}
			c = s.parseCIE(ce)
			cies[e.cieOff] = c
			p.countCIE(c)
		}
		if c.err != nil {
			p.st.BadFDEs++
			continue
		}
		if err := p.parseFDE(s, e, c); err != nil {
			p.st.BadFDEs++
		}
	}
}

func (p *parser) countCIE(c *cie) {
	if c.err != nil {
		p.st.BadCIEs++
	} else {
		p.st.CIEs++
	}
}

// parseFDE interprets one FDE and appends its rows.
func (p *parser) parseFDE(s *section, e entry, c *cie) error {
	b := buf{data: s.data[:e.end], off: e.body}
	ctx := s.ctx
	begin := b.pointer(c.fdeEnc, &ctx, true)
	size := b.pointer(c.fdeEnc&0x0f, &ctx, false)
	if c.hasAugLen {
		b.bytes(b.uleb())
	}
	if b.err != nil {
		return fmt.Errorf("fde at %#x: %w", e.start, b.err)
	}
	if size == 0 {
		p.st.EmptyFDEs++
		return nil
	}
	end := begin + size
	if end < begin {
		return fmt.Errorf("fde at %#x: range wraps", e.start)
	}
	if p.skip.holds(begin, end) {
		p.st.Skipped++
		return nil
	}
	ctx.funcBase = begin
	first := len(p.rows)
	rows, err := p.vm.run(p.rows, program{
		cie:     c,
		initial: c.initial,
		body:    b.data,
		begin:   begin,
		end:     end,
		ctx:     &ctx,
		secOff:  b.off,
	})
	if err != nil {
		p.rows = p.rows[:first]
		return fmt.Errorf("fde at %#x: %w", e.start, err)
	}
	p.rows = rows
	p.st.FDEs++
	p.fdes = append(p.fdes, fdeRows{begin: begin, end: end, first: first, n: len(rows) - first})
	if p.dropped += len(rows) - first; p.dropped >= dropRows {
		p.dropped = 0
		p.scratch.drop()
		if p.dropInput != nil {
			p.dropInput()
		}
	}
	return nil
}
