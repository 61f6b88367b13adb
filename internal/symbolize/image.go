package symbolize

import (
	"debug/elf"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// image is a read-only mapping of a whole file. Symbol data is parsed from
// it in place: its pages are the kernel's page cache, shared with every
// process that maps the file, not the agent's heap. Whatever outlives the
// mapping (names handed to callers) is copied out of it first.
type image struct {
	data []byte
}

// mapImage maps size bytes of f read-only. A mapping outlives f's
// descriptor: f may be closed once mapImage returns.
func mapImage(f *os.File, size int64) (*image, error) {
	if size <= 0 {
		return &image{}, nil
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("map %s: %d bytes do not fit in memory", f.Name(), size)
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	return &image{data: data}, nil
}

// bytes returns the mapped bytes; nil for a nil image.
func (m *image) bytes() []byte {
	if m == nil {
		return nil
	}
	return m.data
}

// unmap releases the mapping; nothing may read from it afterwards.
func (m *image) unmap() {
	if m == nil || m.data == nil {
		return
	}
	_ = unix.Munmap(m.data)
	m.data = nil
}

// sectionBytes returns the bytes of an uncompressed section of the file
// img maps, in place: no copy. A section whose bytes lie outside the file
// is an error; a compressed or SHT_NOBITS section gives nil (the caller
// inflates compressed sections itself, within its cap). A nil img (a file
// held in memory, as MiniDebugInfo's) reads the section into the heap.
func sectionBytes(img []byte, s *elf.Section) ([]byte, error) {
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
