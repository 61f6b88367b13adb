package elfx

import (
	"debug/elf"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Image is a read-only mapping of a whole file. Tables parsed from it in
// place live in the kernel's page cache, shared with every process that
// maps the file, not in the agent's heap. Whatever must outlive the mapping
// is copied out of it first.
type Image struct {
	data []byte
}

// MapImage maps size bytes of f read-only. The mapping outlives f's
// descriptor: f may be closed once MapImage returns.
func MapImage(f *os.File, size int64) (*Image, error) {
	if size <= 0 {
		return &Image{}, nil
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("map %s: %d bytes do not fit in memory", f.Name(), size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	return &Image{data: data}, nil
}

// Bytes returns the mapped bytes; nil for a nil Image.
func (m *Image) Bytes() []byte {
	if m == nil {
		return nil
	}
	return m.data
}

// DropPages unmaps the pages read so far from the process, not from the
// page cache: they stop counting in the agent's RSS and the next read of
// one faults it back in from the cache. Safe while other goroutines read.
func (m *Image) DropPages() {
	if m == nil || len(m.data) == 0 {
		return
	}
	_ = unix.Madvise(m.data, unix.MADV_DONTNEED) // only fails for a range that is not a mapping
}

// Unmap releases the mapping; nothing may read from it afterwards.
func (m *Image) Unmap() {
	if m == nil || m.data == nil {
		return
	}
	_ = unix.Munmap(m.data) // only fails for a range that is not a mapping
	m.data = nil
}

// SectionBytes returns the bytes of an uncompressed section of the file
// img holds, in place: no copy. A section whose bytes lie outside the file
// is an error; a compressed or SHT_NOBITS section gives nil (the caller
// inflates compressed sections itself, within its cap). A nil img (a file
// held in memory, as MiniDebugInfo's) reads the section into the heap.
func SectionBytes(img []byte, s *elf.Section) ([]byte, error) {
	if s.Type == elf.SHT_NOBITS {
		return nil, nil
	}
	if img == nil {
		return s.Data()
	}
	if s.Flags&elf.SHF_COMPRESSED != 0 {
		return nil, nil
	}
	if s.Offset > uint64(len(img)) || s.FileSize > uint64(len(img))-s.Offset {
		return nil, fmt.Errorf("%s: %d bytes at %#x lie outside the %d-byte file", s.Name, s.FileSize, s.Offset, len(img))
	}
	return img[s.Offset : s.Offset+s.FileSize : s.Offset+s.FileSize], nil
}
