package elfx

import (
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

const (
	// maxNoteBytes bounds how much of one PT_NOTE segment or SHT_NOTE section
	// is read. Real note areas are a few hundred bytes.
	maxNoteBytes = 64 << 10
	// maxNoteDesc bounds the descriptor of a build-id note. A GNU build id is
	// 8 to 64 bytes, a Go build id about 90.
	maxNoteDesc = 1024

	ntGNUBuildID = 3 // NT_GNU_BUILD_ID
	ntGoBuildID  = 4 // the note type the Go linker uses for .note.go.buildid
)

// GNUBuildID returns the hex of the file's NT_GNU_BUILD_ID note, looked up in
// PT_NOTE segments and then in SHT_NOTE sections; "" with a nil error when the
// file has none.
func GNUBuildID(f *elf.File) (string, error) {
	desc, err := findNote(f, "GNU", ntGNUBuildID)
	if err != nil || desc == nil {
		return "", err
	}
	return hex.EncodeToString(desc), nil
}

// GoBuildID returns the Go build ID from the file's .note.go.buildid note;
// "" with a nil error when the file has none (not a Go binary, or built with
// -buildid=).
func GoBuildID(f *elf.File) (string, error) {
	desc, err := findNote(f, "Go", ntGoBuildID)
	if err != nil || desc == nil {
		return "", err
	}
	return string(desc), nil
}

// findNote returns the descriptor of the first note with the given owner name
// and type, or nil when there is none. Notes that cannot be read are reported
// only if no other note area has the note.
func findNote(f *elf.File, name string, typ uint32) ([]byte, error) {
	var readErr error
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := readBounded(p.Open(), p.Filesz)
		if err != nil {
			readErr = errors.Join(readErr, fmt.Errorf("read note segment at offset %#x: %w", p.Off, err))
			continue
		}
		if desc := scanNotes(data, f.ByteOrder, p.Align, name, typ); desc != nil {
			return desc, nil
		}
	}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOTE {
			continue
		}
		data, err := readBounded(s.Open(), s.Size)
		if err != nil {
			readErr = errors.Join(readErr, fmt.Errorf("read note section %s: %w", s.Name, err))
			continue
		}
		if desc := scanNotes(data, f.ByteOrder, s.Addralign, name, typ); desc != nil {
			return desc, nil
		}
	}
	return nil, readErr
}

// readBounded reads min(size, maxNoteBytes) bytes from r.
func readBounded(r io.Reader, size uint64) ([]byte, error) {
	buf := make([]byte, min(size, maxNoteBytes))
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// byteOrder is the subset of binary.ByteOrder that note parsing needs.
type byteOrder interface{ Uint32([]byte) uint32 }

// scanNotes walks the notes in data (an ELF note area) and returns a copy of
// the descriptor of the first note named name with type typ. Parsing stops at
// the first malformed note. The descriptor and the next note start at the
// area's alignment: 4 bytes, or 8 in areas aligned to 8 (.note.gnu.property).
func scanNotes(data []byte, bo byteOrder, align uint64, name string, typ uint32) []byte {
	pad := uint64(4)
	if align == 8 {
		pad = 8
	}
	const header = 12
	for uint64(len(data)) >= header {
		namesz := uint64(bo.Uint32(data[0:4]))
		descsz := uint64(bo.Uint32(data[4:8]))
		ntype := bo.Uint32(data[8:12])
		descOff := alignUp(header+namesz, pad)
		descEnd := descOff + descsz
		if descEnd > uint64(len(data)) {
			return nil
		}
		if ntype == typ && descsz > 0 && descsz <= maxNoteDesc && noteName(data[header:header+namesz]) == name {
			return append([]byte(nil), data[descOff:descEnd]...)
		}
		// The last note may lack its trailing padding.
		data = data[min(alignUp(descEnd, pad), uint64(len(data))):]
	}
	return nil
}

// noteName returns a note owner name without its terminating NUL bytes.
func noteName(b []byte) string {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return string(b)
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }
