package pclntab

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
)

// MaxSectionBytes bounds what OpenELF reads for the pclntab and the funcdata
// region each; the largest Go binaries have pclntabs of a few hundred MiB.
const MaxSectionBytes = 512 << 20

// ErrNoTable is returned by OpenELF for a file without a Go pclntab.
var ErrNoTable = errors.New("no Go pclntab")

// Section returns the section holding the Go pclntab: .gopclntab, or
// .data.rel.ro.gopclntab in externally linked PIE binaries; nil if none.
func Section(f *elf.File) *elf.Section {
	for _, name := range []string{".gopclntab", ".data.rel.ro.gopclntab"} {
		if s := f.Section(name); s != nil && s.Type != elf.SHT_NOBITS {
			return s
		}
	}
	return nil
}

// SectionData reads the pclntab section sect of f, bounded by
// MaxSectionBytes, and returns it with the start of f's .text (0 without).
func SectionData(f *elf.File, sect *elf.Section) (data []byte, textStart uint64, err error) {
	return sectionData(f, nil, sect)
}

// sectionData is SectionData for a file whose contents are image (nil: read
// the section into a new buffer).
func sectionData(f *elf.File, image []byte, sect *elf.Section) (data []byte, textStart uint64, err error) {
	if sect.Size > MaxSectionBytes {
		return nil, 0, fmt.Errorf("%s: %d bytes exceed the %d limit", sect.Name, sect.Size, uint64(MaxSectionBytes))
	}
	if data, err = sectionBytes(image, sect); err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", sect.Name, err)
	}
	if text := f.Section(".text"); text != nil {
		textStart = text.Addr
	}
	return data, textStart, nil
}

// OpenELF reads the pclntab of a Go executable and opens it. It finds
// textStart and the funcdata base from the runtime's moduledata, which
// stripped binaries keep too; when the moduledata cannot be found it falls
// back to the start of .text and a table without inline expansion.
// The returned Table does not reference f.
func OpenELF(f *elf.File) (*Table, error) { return OpenELFImage(f, nil) }

// OpenELFImage is OpenELF for a file whose whole contents are image, for
// example a read-only mapping of it: the Table then reads the pclntab and
// the funcdata region in place, and copies nothing. The Table, and the
// strings Frames returns, reference image, which must stay valid (mapped)
// while they are used. A nil image reads the sections into the heap.
func OpenELFImage(f *elf.File, image []byte) (*Table, error) {
	sect := Section(f)
	if sect == nil {
		return nil, ErrNoTable
	}
	data, textStart, err := sectionData(f, image, sect)
	if err != nil {
		return nil, err
	}
	var gofunc []byte
	if md, ok := findModuledata(f, image, sect.Addr, data); ok {
		textStart = md.text
		gofunc, err = funcdataRegion(f, image, md.gofunc, sect, data)
		if err != nil {
			return nil, err
		}
	}
	t, err := Open(data, textStart, gofunc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sect.Name, err)
	}
	return t, nil
}

// moduledata holds the fields of runtime.moduledata that OpenELF needs.
type moduledata struct {
	text, gofunc uint64
}

// Word indexes in runtime.moduledata: pcHeader, six slices (three words
// each), findfunctab, minpc, maxpc, then text. Go 1.20 inserted covctrs and
// ecovctrs before end, which moved gofunc from word 38 to 40.
const (
	mdFuncnametab = 1
	mdFtab        = 16
	mdText        = 22
	mdGofunc118   = 38
	mdGofunc120   = 40
)

// findModuledata finds the runtime.moduledata that points at the pclntab at
// addr: in .go.module from Go 1.26, in the data sections before.
func findModuledata(f *elf.File, image []byte, addr uint64, tab []byte) (moduledata, bool) {
	if len(tab) < 8 {
		return moduledata{}, false
	}
	ptr := int(tab[7])
	if ptr != 4 && ptr != 8 || len(tab) < 8+8*ptr {
		return moduledata{}, false
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if binary.BigEndian.Uint32(tab)&0xfffffff0 == 0xfffffff0 {
		bo = binary.BigEndian
	}
	word := func(b []byte, i int) uint64 {
		if (i+1)*ptr > len(b) {
			return 0
		}
		if ptr == 4 {
			return uint64(bo.Uint32(b[i*ptr:]))
		}
		return bo.Uint64(b[i*ptr:])
	}
	hdr := tab[8:]
	nameAt, ftabAt := addr+word(hdr, 3), addr+word(hdr, 7)
	gofuncAt := mdGofunc118
	if bo.Uint32(tab) == magic120 {
		gofuncAt = mdGofunc120
	}
	for _, name := range []string{".go.module", ".noptrdata", ".data.rel.ro", ".data"} {
		s := f.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS || s.Size > MaxSectionBytes {
			continue
		}
		b, err := sectionBytes(image, s)
		if err != nil {
			continue
		}
		for off := 0; off+(gofuncAt+1)*ptr <= len(b); off += ptr {
			md := b[off:]
			if word(md, 0) != addr || word(md, mdFuncnametab) != nameAt || word(md, mdFtab) != ftabAt {
				continue
			}
			return moduledata{text: word(md, mdText), gofunc: word(md, gofuncAt)}, true
		}
	}
	return moduledata{}, false
}

// funcdataRegion returns the bytes from the funcdata base at addr to the end
// of the section holding it: a sub-slice of the pclntab from Go 1.26, a copy
// of the tail of .rodata before.
func funcdataRegion(f *elf.File, image []byte, addr uint64, tabSect *elf.Section, tab []byte) ([]byte, error) {
	if addr >= tabSect.Addr && addr-tabSect.Addr < uint64(len(tab)) {
		return tab[addr-tabSect.Addr:], nil
	}
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOBITS || addr < s.Addr || addr-s.Addr >= s.Size {
			continue
		}
		n := s.Size - (addr - s.Addr)
		if n > MaxSectionBytes {
			return nil, fmt.Errorf("%s: funcdata of %d bytes exceeds the %d limit", s.Name, n, uint64(MaxSectionBytes))
		}
		if image != nil {
			whole, err := sectionBytes(image, s)
			if err != nil {
				return nil, fmt.Errorf("read funcdata in %s: %w", s.Name, err)
			}
			return whole[addr-s.Addr:], nil
		}
		b := make([]byte, n)
		if _, err := s.ReadAt(b, int64(addr-s.Addr)); err != nil {
			return nil, fmt.Errorf("read funcdata in %s: %w", s.Name, err)
		}
		return b, nil
	}
	return nil, nil
}

// sectionBytes returns the contents of s: a sub-slice of image when image
// holds the file, else a copy read from the file. Compressed sections are
// refused: no section the pclntab needs is compressed.
func sectionBytes(image []byte, s *elf.Section) ([]byte, error) {
	if image == nil {
		return s.Data()
	}
	if s.Flags&elf.SHF_COMPRESSED != 0 {
		return nil, fmt.Errorf("%s is compressed", s.Name)
	}
	if s.Offset > uint64(len(image)) || s.FileSize > uint64(len(image))-s.Offset {
		return nil, fmt.Errorf("%s: %d bytes at %#x lie outside the %d-byte file", s.Name, s.FileSize, s.Offset, len(image))
	}
	return image[s.Offset : s.Offset+s.FileSize : s.Offset+s.FileSize], nil
}
