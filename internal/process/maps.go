package process

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"

	"golang.org/x/sys/unix"
)

// Bounds on /proc/PID/maps input. The kernel writes a path of at most PATH_MAX
// bytes, escaping '\n' as "\012" (4 bytes each), after at most ~110 bytes of
// fields; vm.max_map_count defaults to 65530. Anything beyond these bounds is
// not kernel output and is rejected rather than buffered.
const (
	maxMapsLineLen = 4*4096 + 256
	maxMapsLines   = 1 << 18
)

// deletedSuffix is what d_path appends to the path of an unlinked file.
const deletedSuffix = " (deleted)"

// Mapping is one line of /proc/PID/maps: a virtual memory area of a process.
type Mapping struct {
	Start, End uint64 // [Start, End)
	Offset     uint64 // file offset of Start
	Perms      string // "r-xp"
	// Dev is the device of the mapped file encoded with unix.Mkdev, so it
	// equals the st_dev that stat(2) reports for the file.
	Dev   uint64
	Inode uint64
	// Path is as printed by the kernel: "" for anonymous memory, pseudo
	// paths such as "[vdso]" and "[heap]" kept, " (deleted)" removed (and
	// Deleted set). The kernel escapes '\n' in file names as "\012"; Path
	// keeps that escape.
	Path    string
	Deleted bool
}

// Executable reports whether the mapping may hold code (its x permission).
func (m Mapping) Executable() bool { return len(m.Perms) >= 3 && m.Perms[2] == 'x' }

// FileBacked reports whether the mapping is backed by a file that can be
// opened (an absolute path, as opposed to anonymous memory or "[vdso]").
func (m Mapping) FileBacked() bool { return len(m.Path) > 0 && m.Path[0] == '/' }

// FileOffset returns the offset in the mapped file of the address addr, which
// must lie in [m.Start, m.End).
func (m Mapping) FileOffset(addr uint64) uint64 { return addr - m.Start + m.Offset }

// ParseMaps parses the text of /proc/PID/maps. Lines longer than the kernel
// can produce, more lines than a process can have, and malformed lines are
// errors; the result is never partial.
func ParseMaps(r io.Reader) ([]Mapping, error) {
	var out []Mapping
	_, err := parseMaps(r, func(m *Mapping) { out = append(out, *m) })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// parseMaps calls keep for every mapping in r, in order, and returns how many
// lines it parsed. keep may retain the Mapping value it is given (but not the
// pointer).
func parseMaps(r io.Reader, keep func(*Mapping)) (int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxMapsLineLen)
	var (
		n        int
		lastPath string // consecutive mappings of one file share one string
		m        Mapping
	)
	for sc.Scan() {
		n++
		if n > maxMapsLines {
			return 0, fmt.Errorf("maps: more than %d lines", maxMapsLines)
		}
		if err := parseMapsLine(sc.Bytes(), &m, &lastPath); err != nil {
			return 0, fmt.Errorf("maps line %d: %w", n, err)
		}
		keep(&m)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return 0, fmt.Errorf("maps line %d: longer than %d bytes: %w", n+1, maxMapsLineLen, err)
		}
		return 0, fmt.Errorf("maps: %w", err)
	}
	return n, nil
}

var errMapsSyntax = errors.New("malformed")

// parseMapsLine parses
//
//	start-end perms offset major:minor inode   path
//
// into m. lastPath is reused for m.Path when the path repeats, to save an
// allocation per line.
func parseMapsLine(line []byte, m *Mapping, lastPath *string) error {
	var fields [5][]byte
	rest := line
	for i := range fields {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexByte(rest, ' ')
		if end < 0 {
			if i != len(fields)-1 {
				return fmt.Errorf("%w: %d fields, want at least 5", errMapsSyntax, i+1)
			}
			end = len(rest)
		}
		fields[i], rest = rest[:end], rest[end:]
	}

	addr := fields[0]
	dash := bytes.IndexByte(addr, '-')
	if dash < 0 {
		return fmt.Errorf("%w: address range %q", errMapsSyntax, addr)
	}
	var err error
	if m.Start, err = parseHex(addr[:dash]); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if m.End, err = parseHex(addr[dash+1:]); err != nil {
		return fmt.Errorf("end: %w", err)
	}
	if m.End < m.Start {
		return fmt.Errorf("%w: end %#x before start %#x", errMapsSyntax, m.End, m.Start)
	}

	perms := fields[1]
	if len(perms) != 4 ||
		(perms[0] != 'r' && perms[0] != '-') ||
		(perms[1] != 'w' && perms[1] != '-') ||
		(perms[2] != 'x' && perms[2] != '-') ||
		(perms[3] != 'p' && perms[3] != 's') {
		return fmt.Errorf("%w: permissions %q", errMapsSyntax, perms)
	}
	m.Perms = permString(perms)

	if m.Offset, err = parseHex(fields[2]); err != nil {
		return fmt.Errorf("offset: %w", err)
	}

	dev := fields[3]
	colon := bytes.IndexByte(dev, ':')
	if colon < 0 {
		return fmt.Errorf("%w: device %q", errMapsSyntax, dev)
	}
	major, err := parseHex(dev[:colon])
	if err != nil || major > 0xfff {
		return fmt.Errorf("%w: device major %q", errMapsSyntax, dev[:colon])
	}
	minor, err := parseHex(dev[colon+1:])
	if err != nil || minor > 0xfffff {
		return fmt.Errorf("%w: device minor %q", errMapsSyntax, dev[colon+1:])
	}
	m.Dev = unix.Mkdev(uint32(major), uint32(minor))

	if m.Inode, err = strconv.ParseUint(string(fields[4]), 10, 64); err != nil {
		return fmt.Errorf("%w: inode %q", errMapsSyntax, fields[4])
	}

	// The path is the rest of the line after the padding; it may itself
	// contain spaces.
	path := bytes.TrimLeft(rest, " ")
	m.Deleted = false
	if bytes.HasSuffix(path, []byte(deletedSuffix)) {
		path = path[:len(path)-len(deletedSuffix)]
		m.Deleted = true
	}
	if string(path) != *lastPath {
		*lastPath = string(path)
	}
	m.Path = *lastPath
	return nil
}

// parseHex parses an unsigned hexadecimal number of at most 16 digits.
func parseHex(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 16 {
		return 0, fmt.Errorf("%w: hex number %q", errMapsSyntax, b)
	}
	var v uint64
	for _, c := range b {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, fmt.Errorf("%w: hex number %q", errMapsSyntax, b)
		}
		v = v<<4 | uint64(d)
	}
	return v, nil
}

// permString returns a shared string for the common permission sets so a
// parse does not allocate one per line.
func permString(p []byte) string {
	switch string(p) {
	case "r-xp":
		return "r-xp"
	case "r--p":
		return "r--p"
	case "rw-p":
		return "rw-p"
	case "---p":
		return "---p"
	case "rwxp":
		return "rwxp"
	case "r--s":
		return "r--s"
	case "rw-s":
		return "rw-s"
	}
	return string(p)
}
