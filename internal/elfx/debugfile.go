package elfx

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path"
	"strings"
)

const (
	// DefaultDebugDir is where distributions install separate debug files.
	DefaultDebugDir = "/usr/lib/debug"
	// maxDebuglinkName bounds the file name a .gnu_debuglink may hold.
	maxDebuglinkName = 255
	// maxDebugFileBytes bounds a debug file whose CRC is computed.
	maxDebugFileBytes = 4 << 30
)

// View is where a file is seen from: the root directory of the process that
// maps it and the file's path inside that root. Debug files are looked for
// inside the same root, so a container's libc gets the container's debug
// files.
type View struct {
	Root string // "" for the host's root
	Path string // the path inside Root; "" when unknown
}

// ViewOf works out the view of a path: /proc/PID/root/x is /x inside
// /proc/PID/root; /proc/PID/map_files/A-B is the mapped path (as the link
// names it) inside /proc/PID/root; anything else is a host path.
func ViewOf(p string) View {
	if root, rel, ok := SplitProcRoot(p); ok {
		return View{Root: root, Path: rel}
	}
	if rest, ok := strings.CutPrefix(p, "/proc/"); ok {
		pid, after, _ := strings.Cut(rest, "/")
		if isPID(pid) && strings.HasPrefix(after, "map_files/") {
			v := View{Root: "/proc/" + pid + "/root"}
			if target, err := os.Readlink(p); err == nil && path.IsAbs(target) {
				v.Path = strings.TrimSuffix(target, " (deleted)")
			}
			return v
		}
	}
	return View{Path: p}
}

// Open opens p inside the view's root. The caller closes the file.
func (v View) Open(p string) (*os.File, error) {
	if v.Root == "" {
		return os.Open(p)
	}
	return OpenInRoot(v.Root, p)
}

// OpenFile opens path read-only; a path in a process's root directory
// (/proc/PID/root/...) is resolved inside that root, as OpenInRoot does.
// The caller closes the file.
func OpenFile(path string) (*os.File, error) {
	if root, rel, ok := SplitProcRoot(path); ok {
		return OpenInRoot(root, rel)
	}
	return os.Open(path)
}

// SplitProcRoot splits "/proc/PID/root/x/y" into "/proc/PID/root" and "/x/y".
func SplitProcRoot(path string) (root, rel string, ok bool) {
	const prefix = "/proc/"
	rest, found := strings.CutPrefix(path, prefix)
	if !found {
		return "", "", false
	}
	pid, after, found := strings.Cut(rest, "/")
	if !found || !isPID(pid) {
		return "", "", false
	}
	rel, found = strings.CutPrefix(after, "root/")
	if !found {
		return "", "", false
	}
	return prefix + pid + "/root", "/" + rel, true
}

func isPID(s string) bool {
	if s == "self" || s == "thread-self" {
		return true
	}
	if s == "" || len(s) > 10 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// DebugFile is an open separate debug file. The caller closes it.
type DebugFile struct {
	ELF  *elf.File
	Path string // where it was found, for logs
	How  string // "build-id" or "debuglink"
	file *os.File
}

// Close closes the debug file.
func (d *DebugFile) Close() error { return d.file.Close() }

// File returns the open debug file, for example to map it; it is closed by
// Close.
func (d *DebugFile) File() *os.File { return d.file }

// FindDebugFile looks for the separate debug file of f, seen through v, best
// first: by GNU build id under <dir>/.build-id/xx/yyyy.debug, then by
// .gnu_debuglink (name and CRC32) next to the file, in its .debug/
// subdirectory and under <dir>/<file's directory>/. Each is looked for
// under DefaultDebugDir inside the view's root (for a file in another
// process's root), then in each of debugDirs on the host. It returns nil
// when there is none; a candidate that does not match is skipped, and the
// error reports candidates that could not be read.
func FindDebugFile(f *elf.File, v View, debugDirs []string) (*DebugFile, error) {
	type place struct {
		v   View
		dir string
	}
	var places []place
	if v.Root != "" {
		places = append(places, place{v: View{Root: v.Root}, dir: DefaultDebugDir})
	}
	for _, d := range debugDirs {
		if d != "" {
			places = append(places, place{v: View{}, dir: d})
		}
	}
	var errs []error
	if id, err := GNUBuildID(f); err == nil && len(id) > 2 {
		for _, pl := range places {
			p := path.Join(pl.dir, ".build-id", id[:2], id[2:]+".debug")
			df, err := openDebugCandidate(pl.v, p, func(df *elf.File, _ *os.File) bool {
				got, err := GNUBuildID(df)
				return err == nil && got == id
			})
			if err != nil {
				errs = append(errs, err)
			}
			if df != nil {
				df.How = "build-id"
				return df, nil
			}
		}
	}
	name, crc, ok := Debuglink(f)
	if ok && v.Path != "" {
		dir := path.Dir(v.Path)
		cands := []place{{v: View{Root: v.Root}, dir: dir}, {v: View{Root: v.Root}, dir: path.Join(dir, ".debug")}}
		for _, pl := range places {
			cands = append(cands, place{v: pl.v, dir: path.Join(pl.dir, dir)})
		}
		for _, c := range cands {
			p := path.Join(c.dir, name)
			if c.v == (View{Root: v.Root}) && p == v.Path {
				continue // the link names the file itself
			}
			df, err := openDebugCandidate(c.v, p, func(_ *elf.File, osf *os.File) bool { return fileCRC(osf) == crc })
			if err != nil {
				errs = append(errs, err)
			}
			if df != nil {
				df.How = "debuglink"
				return df, nil
			}
		}
	}
	return nil, errors.Join(errs...)
}

// openDebugCandidate opens p and keeps it when it is an ELF file that
// matches; a missing file is not an error.
func openDebugCandidate(v View, p string, matches func(*elf.File, *os.File) bool) (*DebugFile, error) {
	osf, err := v.Open(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("debug file %s: %w", p, err)
	}
	ef, err := elf.NewFile(osf)
	if err != nil || !matches(ef, osf) {
		osf.Close()
		return nil, nil
	}
	shown := p
	if v.Root != "" {
		shown = v.Root + p
	}
	return &DebugFile{ELF: ef, file: osf, Path: shown}, nil
}

// Debuglink parses f's .gnu_debuglink section: a NUL-terminated file name,
// padding to 4 bytes, and the CRC32 of the debug file. ok is false when f
// has no usable link; a name that is a path is refused.
func Debuglink(f *elf.File) (name string, crc uint32, ok bool) {
	s := f.Section(".gnu_debuglink")
	if s == nil || s.Type == elf.SHT_NOBITS || s.Size > 4096 {
		return "", 0, false
	}
	data, err := s.Data()
	if err != nil {
		return "", 0, false
	}
	return parseDebuglink(data, f.ByteOrder)
}

func parseDebuglink(data []byte, bo byteOrder) (string, uint32, bool) {
	n := bytes.IndexByte(data, 0)
	if n <= 0 || n > maxDebuglinkName {
		return "", 0, false
	}
	name := string(data[:n])
	if strings.Contains(name, "/") || name == "." || name == ".." {
		return "", 0, false // a link names a file, never a path
	}
	off := (n + 4) &^ 3
	if off+4 > len(data) {
		return "", 0, false
	}
	return name, bo.Uint32(data[off:]), true
}

// fileCRC returns the CRC32 (IEEE) of the whole file, the checksum a
// .gnu_debuglink carries; 0 for a file that cannot be read or is too big
// (a real debug file with CRC 0 is then missed, which is harmless).
func fileCRC(f *os.File) uint32 {
	h := crc32.NewIEEE()
	n, err := io.Copy(h, io.NewSectionReader(f, 0, maxDebugFileBytes+1))
	if err != nil || n > maxDebugFileBytes {
		return 0
	}
	return h.Sum32()
}
