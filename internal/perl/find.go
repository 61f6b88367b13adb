package perl

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
)

// Memory reads another process's memory; python.ProcMem is one.
type Memory = python.Memory

// Range is [Start, End) in a process's address space.
type Range struct{ Start, End uint64 }

// Interp is a Perl interpreter found in a process: where its state is and
// how to read it. Addresses are the process's.
type Interp struct {
	Version string // "5.36.0"
	Layout  Layout
	// File is the ELF that holds the interpreter (perl, libperl.so.5.36),
	// as the agent opened it.
	File string
	// CurInterp is &PL_curinterp: it points at the main thread's
	// interpreter once perl_alloc has run (0 before).
	CurInterp uint64
	// Runops is Perl_runops_standard, the interpreter loop: a native frame
	// there runs the Perl frames of one run (see Stack).
	Runops Range
}

// ErrNotPerl is matched when a process maps no Perl interpreter.
var ErrNotPerl = errors.New("no perl interpreter")

// ErrNoMultiplicity is matched for a Perl built without MULTIPLICITY,
// whose interpreter state is a set of globals: not supported.
var ErrNoMultiplicity = errors.New("perl without multiplicity not supported")

// fileName matches the files that may hold the interpreter: perl,
// perl5.36.0, libperl.so, libperl.so.5.36.0.
var fileName = regexp.MustCompile(`^(?:perl[0-9.]*|libperl\.so(?:\.[0-9.]+)?)$`)

// Find locates the interpreter in p with the table's layouts. An
// unsupported version's error matches ErrUnknownVersion; a process without
// one matches ErrNotPerl.
func Find(p *process.Process) (*Interp, error) { return FindWith(p, LayoutFor) }

// FindWith is Find with the versions layouts knows instead of the table's:
// tests hide a version to see how an unknown one is handled.
func FindWith(p *process.Process, layouts LayoutFunc) (*Interp, error) {
	seen := map[string]bool{}
	var firstErr error
	for _, m := range p.Mappings {
		if !m.FileBacked() || !m.Executable() || seen[m.Path] || !fileName.MatchString(filepath.Base(m.Path)) {
			continue
		}
		seen[m.Path] = true
		in, err := findIn(p, m, layouts)
		if err == nil {
			return in, nil
		}
		if firstErr == nil || !errors.Is(err, ErrNotPerl) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrNotPerl
}

// binInfo is what one interpreter binary says, whichever process maps it.
type binInfo struct {
	version          [3]int // revision, version, subversion
	hasVersion       bool
	curinterp, runop elf.Symbol
	hasCur, hasRunop bool
}

func (b *binInfo) String() string {
	return fmt.Sprintf("%d.%d.%d", b.version[0], b.version[1], b.version[2])
}

// binCache keeps the binInfo of the binaries read so far by device and
// inode (and size and mtime, against a file replaced in place), up to
// maxBins. Safe for concurrent use.
var binCache = struct {
	sync.Mutex
	m map[binKey]*binInfo
}{m: map[binKey]*binInfo{}}

const maxBins = 64

type binKey struct {
	dev, ino    uint64
	size, mtime int64
}

// readBin reads path's symbols and version, or finds them cached.
func readBin(path string) (*binInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var key binKey
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		key = binKey{s.Dev, s.Ino, st.Size(), st.ModTime().UnixNano()}
		binCache.Lock()
		bi, ok := binCache.m[key]
		binCache.Unlock()
		if ok {
			return bi, nil
		}
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bi := &binInfo{}
	syms := elfx.FindSymbols(f, "PL_curinterp", "Perl_runops_standard", "PL_revision", "PL_version", "PL_subversion")
	bi.curinterp, bi.hasCur = syms["PL_curinterp"]
	bi.runop, bi.hasRunop = syms["Perl_runops_standard"]
	if bi.hasRunop {
		bi.version, bi.hasVersion = readVersion(f, syms)
	}
	if key != (binKey{}) {
		binCache.Lock()
		if len(binCache.m) >= maxBins {
			clear(binCache.m)
		}
		binCache.m[key] = bi
		binCache.Unlock()
	}
	return bi, nil
}

// readVersion reads the bytes PL_revision, PL_version and PL_subversion
// hold in the file.
func readVersion(f *elf.File, syms map[string]elf.Symbol) ([3]int, bool) {
	var v [3]int
	for i, name := range []string{"PL_revision", "PL_version", "PL_subversion"} {
		s, ok := syms[name]
		if !ok {
			return v, false
		}
		b, ok := byteAt(f, s.Value)
		if !ok {
			return v, false
		}
		v[i] = int(b)
	}
	return v, true
}

// byteAt returns the byte at file address addr of an allocated section
// with contents.
func byteAt(f *elf.File, addr uint64) (byte, bool) {
	for _, s := range f.Sections {
		if s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_ALLOC == 0 || addr < s.Addr || addr >= s.Addr+s.Size {
			continue
		}
		var b [1]byte
		if _, err := s.ReadAt(b[:], int64(addr-s.Addr)); err != nil {
			return 0, false
		}
		return b[0], true
	}
	return 0, false
}

// findIn reads the interpreter symbols of the file mapped by m.
func findIn(p *process.Process, m process.Mapping, layouts LayoutFunc) (*Interp, error) {
	path := p.FilePath(m)
	if path == "" {
		return nil, fmt.Errorf("perl file %s: not readable: %w", m.Path, ErrNotPerl)
	}
	bi, err := readBin(path)
	if err != nil {
		return nil, fmt.Errorf("perl file %s: %w", m.Path, err)
	}
	if !bi.hasRunop {
		return nil, fmt.Errorf("perl file %s: no Perl_runops_standard: %w", m.Path, ErrNotPerl)
	}
	if !bi.hasVersion || bi.version[0] != 5 {
		return nil, fmt.Errorf("perl file %s: no perl 5 version: %w", m.Path, ErrUnknownVersion)
	}
	if !bi.hasCur {
		return nil, fmt.Errorf("perl %s (%s): %w", bi, m.Path, ErrNoMultiplicity)
	}
	l, err := layouts(bi.version[1])
	if err != nil {
		return nil, fmt.Errorf("perl %s: %w", bi, err)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("perl file %s: %w", m.Path, err)
	}
	base, err := elfx.LoadBias(f, m.Start, m.Offset)
	_ = f.Close() // read only
	if err != nil {
		return nil, fmt.Errorf("perl file %s: %w", m.Path, err)
	}
	return &Interp{Version: bi.String(), Layout: l, File: path,
		CurInterp: base + bi.curinterp.Value,
		Runops:    Range{base + bi.runop.Value, base + bi.runop.Value + bi.runop.Size}}, nil
}
