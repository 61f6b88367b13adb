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
	anon bool // MapAnon's: its pages are its only copy
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

// MapAnon maps size bytes of private anonymous memory, lets fill write
// them, then makes them read-only. It holds data derived from a file (an
// inflated section) outside the Go heap: the collector neither scans it
// nor counts it in its heap goal, so it costs its size in RSS, not twice
// that. It is the process's own memory, not page cache: the caller
// accounts for it, and fill must keep no reference to the slice.
func MapAnon(size int64, fill func([]byte) error) (*Image, error) {
	if size <= 0 {
		return &Image{}, fill(nil)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("map %d anonymous bytes: too many", size)
	}
	data, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("map %d anonymous bytes: %w", size, err)
	}
	m := &Image{data: data, anon: true}
	if err := fill(data); err != nil {
		m.Unmap()
		return nil, err
	}
	if err := unix.Mprotect(data, unix.PROT_READ); err != nil {
		m.Unmap()
		return nil, fmt.Errorf("protect %d anonymous bytes: %w", size, err)
	}
	return m, nil
}

// MapSpill is MapAnon for data that is written once and then read a
// little at a time (inflated debug sections, the kernel's symbol table):
// it is written to an unlinked file in the system's temporary directory
// and mapped from there, so its pages are page cache, not the process's
// own memory. DropPages lets go of those read, and the kernel may reclaim
// them; the file's disk space goes with the mapping. Where the directory
// cannot take the file, or is held in memory itself (tmpfs), it is MapAnon.
func MapSpill(size int64, fill func([]byte) error) (*Image, error) {
	if m, ok, err := mapSpill(os.TempDir(), size, fill); ok {
		return m, err
	}
	return MapAnon(size, fill)
}

// Magic numbers of file systems whose files live in memory (statfs(2)).
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// mapSpill maps size bytes of a new unlinked file in dir, filled by fill.
// ok is false when dir cannot hold it, or holds it in memory: nothing was
// written and fill was not called.
func mapSpill(dir string, size int64, fill func([]byte) error) (_ *Image, ok bool, _ error) {
	if size <= 0 || int64(int(size)) != size {
		return nil, false, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type == tmpfsMagic || st.Type == ramfsMagic {
		return nil, false, nil
	}
	f, err := os.CreateTemp(dir, "sonde-spill-*")
	if err != nil {
		return nil, false, nil
	}
	defer f.Close()         // the mapping keeps the file
	_ = os.Remove(f.Name()) // unlinked: gone with the mapping, whatever becomes of the agent
	if err := f.Truncate(size); err != nil {
		return nil, false, nil
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, false, nil
	}
	m := &Image{data: data}
	if err := fill(data); err != nil {
		m.Unmap()
		return nil, true, err
	}
	if err := unix.Mprotect(data, unix.PROT_READ); err != nil {
		m.Unmap()
		return nil, true, fmt.Errorf("protect %d spilled bytes: %w", size, err)
	}
	// What fill wrote stays in the page cache (and goes to the file as
	// the kernel sees fit): the process need not hold it.
	m.DropPages()
	return m, true, nil
}

// Size is the memory the mapping takes: its length in whole pages.
func (m *Image) Size() int64 {
	if m == nil || len(m.data) == 0 {
		return 0
	}
	page := int64(os.Getpagesize())
	return (int64(len(m.data)) + page - 1) / page * page
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
// It does nothing to an anonymous mapping, whose pages hold the only copy.
func (m *Image) DropPages() {
	if m == nil || len(m.data) == 0 || m.anon {
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
