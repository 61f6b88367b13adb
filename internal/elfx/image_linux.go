package elfx

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

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

// Reserve reserves size bytes of anonymous memory outside the Go heap for
// a build that knows only an upper bound of what it will write: a page is
// backed once written, so the build costs what it writes, and the heap's
// goal never counts it. release unmaps it; nothing may use b afterwards.
// ok is false where the host refuses the reservation (it does not
// overcommit): the caller builds in the heap instead.
func Reserve(size int) (b []byte, release func(), ok bool) {
	if size <= 0 {
		return nil, func() {}, false
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, func() {}, false
	}
	return b, func() { _ = unix.Munmap(b) }, true
}

// MapSpill is MapAnon for data that is written once and then read a
// little at a time (inflated debug sections): the first size bytes of r,
// spilled (see Spill). Fewer is io.ErrUnexpectedEOF; what r holds past
// them is not read.
func MapSpill(size int64, r io.Reader) (*Image, error) {
	if size <= 0 {
		return &Image{}, nil
	}
	s, err := NewSpill(size)
	if err != nil {
		return nil, err
	}
	if _, err := io.CopyN(s, r, size); err != nil {
		s.Discard()
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return s.Map()
}

// Magic numbers of file systems whose files live in memory (statfs(2)).
const (
	tmpfsMagic = 0x01021994
	ramfsMagic = 0x858458f6
)

// A Spill collects bytes written once, in order, and then maps them
// read-only (Map): derived data (an inflated section, the kernel's symbol
// table) that is read a little at a time, kept out of the Go heap. The
// bytes go to an unlinked file in the system's temporary directory through
// write(2), so they are page cache from the start: they never count in the
// process's RSS while written, and once mapped only the pages reads touch
// do, until DropPages. The kernel may reclaim them; the file's disk space
// goes with the mapping. Where the directory cannot take the file, or is
// held in memory itself (tmpfs), the bytes go to anonymous memory (as
// MapAnon's), which is the process's own.
type Spill struct {
	f    *os.File      // the spill file, or nil
	w    *bufio.Writer // buffers writes to f
	anon []byte        // the anonymous mapping being filled, where size is known and f is nil
	heap []byte        // the bytes so far, where neither
	size int64         // the exact size promised, or 0 for any
	n    int64         // bytes written
	err  error         // the first write error
}

// NewSpill starts a Spill of exactly size bytes, or of any size where
// size is 0.
func NewSpill(size int64) (*Spill, error) { return newSpill(os.TempDir(), size) }

func newSpill(dir string, size int64) (*Spill, error) {
	if size < 0 || int64(int(size)) != size {
		return nil, fmt.Errorf("spill %d bytes: too many", size)
	}
	if f := spillFile(dir); f != nil {
		return &Spill{f: f, w: bufio.NewWriterSize(f, 64<<10), size: size}, nil
	}
	s := &Spill{size: size}
	if size > 0 {
		data, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, fmt.Errorf("map %d anonymous bytes: %w", size, err)
		}
		s.anon = data
	}
	return s, nil
}

// SpillFile creates an unlinked file in the temporary directory, for the
// caller to fill and map: its pages are page cache, which the process's RSS
// counts only while they are mapped and touched. It is nil where that
// directory cannot hold one or holds it in memory (tmpfs).
func SpillFile() *os.File { return spillFile(os.TempDir()) }

// spillFile creates an unlinked file in dir; nil when dir cannot hold one
// or holds it in memory.
func spillFile(dir string) *os.File {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type == tmpfsMagic || st.Type == ramfsMagic {
		return nil
	}
	f, err := os.CreateTemp(dir, "sonde-spill-*")
	if err != nil {
		return nil
	}
	_ = os.Remove(f.Name()) // unlinked: gone with the mapping, whatever becomes of the agent
	return f
}

// Write appends p. Past the promised size it writes nothing and fails.
func (s *Spill) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.size > 0 && int64(len(p)) > s.size-s.n {
		s.err = fmt.Errorf("spill: more than the %d bytes promised", s.size)
		return 0, s.err
	}
	var err error
	switch {
	case s.f != nil:
		_, err = s.w.Write(p)
	case s.anon != nil:
		copy(s.anon[s.n:], p)
	default:
		s.heap = append(s.heap, p...)
	}
	if err != nil {
		s.err = fmt.Errorf("spill: %w", err)
		return 0, s.err
	}
	s.n += int64(len(p))
	return len(p), nil
}

// Len is the number of bytes written so far.
func (s *Spill) Len() int64 { return s.n }

// Spilled reports whether the bytes go to a file (else to memory).
func (s *Spill) Spilled() bool { return s.f != nil }

// Map maps the bytes written, read-only, and ends the Spill: it must not
// be written to again. Fewer bytes than promised is io.ErrUnexpectedEOF.
func (s *Spill) Map() (*Image, error) {
	defer s.Discard()
	if s.err != nil {
		return nil, s.err
	}
	if s.size > 0 && s.n != s.size {
		return nil, fmt.Errorf("spill: %d of %d bytes: %w", s.n, s.size, io.ErrUnexpectedEOF)
	}
	switch {
	case s.n == 0:
		return &Image{}, nil
	case s.f != nil:
		if err := s.w.Flush(); err != nil {
			return nil, fmt.Errorf("spill %d bytes: %w", s.n, err)
		}
		return MapImage(s.f, s.n)
	case s.anon != nil:
		data := s.anon
		s.anon = nil // the Image owns it now
		if err := unix.Mprotect(data, unix.PROT_READ); err != nil {
			_ = unix.Munmap(data)
			return nil, fmt.Errorf("protect %d anonymous bytes: %w", len(data), err)
		}
		return &Image{data: data, anon: true}, nil
	default:
		return MapAnon(s.n, func(b []byte) error { copy(b, s.heap); return nil })
	}
}

// Discard drops what was written. Safe after Map, and more than once.
func (s *Spill) Discard() {
	if s.f != nil {
		_ = s.f.Close() // a mapping made by Map keeps the file
		s.f, s.w = nil, nil
	}
	if s.anon != nil {
		_ = unix.Munmap(s.anon)
		s.anon = nil
	}
	s.heap = nil
	if s.err == nil {
		s.err = errors.New("spill: already mapped or discarded")
	}
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

// DropRange is DropPages for the whole pages of the mapping that b, a
// slice of Bytes, covers: a section read once (inflated, indexed) need not
// wait in the RSS for the next DropPages. A b outside the mapping, and an
// anonymous mapping, are left alone.
func (m *Image) DropRange(b []byte) {
	if m == nil || len(m.data) == 0 || m.anon || len(b) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))
	from := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - base
	if from >= uintptr(len(m.data)) || uintptr(len(b)) > uintptr(len(m.data))-from {
		return
	}
	page := uintptr(os.Getpagesize())
	lo := (from + page - 1) &^ (page - 1)
	hi := (from + uintptr(len(b))) &^ (page - 1)
	if lo >= hi {
		return
	}
	_ = unix.Madvise(m.data[lo:hi], unix.MADV_DONTNEED) // only fails for a range that is not a mapping
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
