package symbolize

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

	"github.com/sonde-dev/sonde/internal/elfx"
)

const (
	// defaultDebugDir is where distributions install separate debug files.
	defaultDebugDir = "/usr/lib/debug"
	// maxDebuglinkName bounds the file name a .gnu_debuglink may hold.
	maxDebuglinkName = 255
	// maxDebugFileBytes bounds a debug file whose CRC is computed.
	maxDebugFileBytes = 4 << 30
)

// fileView is where a file is seen from: the root directory of the process
// that maps it and the file's path inside that root. Debug files are looked
// for inside the same root, so a container's libc gets the container's debug
// files.
type fileView struct {
	root  string // "" for the host's root
	inner string // the path inside root; "" when unknown
}

// viewOf works out the view of a path Open was given: /proc/PID/root/x is
// /x inside /proc/PID/root; /proc/PID/map_files/A-B is the mapped path
// (as the link names it) inside /proc/PID/root; anything else is a host path.
func viewOf(p string) fileView {
	if root, rel, ok := splitProcRoot(p); ok {
		return fileView{root: root, inner: rel}
	}
	if rest, ok := strings.CutPrefix(p, "/proc/"); ok {
		pid, after, _ := strings.Cut(rest, "/")
		if isPID(pid) && strings.HasPrefix(after, "map_files/") {
			v := fileView{root: "/proc/" + pid + "/root"}
			if target, err := os.Readlink(p); err == nil && path.IsAbs(target) {
				v.inner = strings.TrimSuffix(target, " (deleted)")
			}
			return v
		}
	}
	return fileView{inner: p}
}

// open opens p inside the view's root.
func (v fileView) open(p string) (*os.File, error) {
	if v.root == "" {
		return os.Open(p)
	}
	return elfx.OpenInRoot(v.root, p)
}

// debugFile is an open separate debug file. The caller closes it.
type debugFile struct {
	elf  *elf.File
	file *os.File
	path string // as found, for logs
	how  string // "build-id" or "debuglink"
}

func (d *debugFile) Close() error { return d.file.Close() }

// findDebugFile looks for the separate debug file of f, best first: by GNU
// build id under <dir>/.build-id/xx/yyyy.debug, then by .gnu_debuglink
// (name and CRC32) next to the file, in its .debug/ subdirectory and under
// <dir>/<file's directory>/. Each is looked for under /usr/lib/debug inside
// the view's root (for a file in another process's root), then in each of
// debugDirs on the host. It returns nil
// when there is none; a candidate that does not match is skipped.
func findDebugFile(f *elf.File, v fileView, debugDirs []string) (*debugFile, error) {
	type place struct {
		v   fileView
		dir string
	}
	var places []place
	if v.root != "" {
		places = append(places, place{v: fileView{root: v.root}, dir: defaultDebugDir})
	}
	for _, d := range debugDirs {
		if d != "" {
			places = append(places, place{v: fileView{}, dir: d})
		}
	}
	var errs []error
	if id, err := elfx.GNUBuildID(f); err == nil && len(id) > 2 {
		for _, pl := range places {
			p := path.Join(pl.dir, ".build-id", id[:2], id[2:]+".debug")
			df, err := openDebugCandidate(pl.v, p, func(df *elf.File, _ *os.File) bool {
				got, err := elfx.GNUBuildID(df)
				return err == nil && got == id
			})
			if err != nil {
				errs = append(errs, err)
			}
			if df != nil {
				df.how = "build-id"
				return df, nil
			}
		}
	}
	name, crc, ok := debuglink(f)
	if ok && v.inner != "" {
		dir := path.Dir(v.inner)
		cands := []place{{v: fileView{root: v.root}, dir: dir}, {v: fileView{root: v.root}, dir: path.Join(dir, ".debug")}}
		for _, pl := range places {
			cands = append(cands, place{v: pl.v, dir: path.Join(pl.dir, dir)})
		}
		for _, c := range cands {
			p := path.Join(c.dir, name)
			if c.v == (fileView{root: v.root}) && p == v.inner {
				continue // the link names the file itself
			}
			df, err := openDebugCandidate(c.v, p, func(_ *elf.File, osf *os.File) bool { return fileCRC(osf) == crc })
			if err != nil {
				errs = append(errs, err)
			}
			if df != nil {
				df.how = "debuglink"
				return df, nil
			}
		}
	}
	return nil, errors.Join(errs...)
}

// openDebugCandidate opens p and keeps it when it is an ELF file that
// matches; a missing file is not an error.
func openDebugCandidate(v fileView, p string, matches func(*elf.File, *os.File) bool) (*debugFile, error) {
	osf, err := v.open(p)
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
	if v.root != "" {
		shown = v.root + p
	}
	return &debugFile{elf: ef, file: osf, path: shown}, nil
}

// debuglink parses f's .gnu_debuglink section: a NUL-terminated file name,
// padding to 4 bytes, and the CRC32 of the debug file.
func debuglink(f *elf.File) (name string, crc uint32, ok bool) {
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

func parseDebuglink(data []byte, bo interface{ Uint32([]byte) uint32 }) (string, uint32, bool) {
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
