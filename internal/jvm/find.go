package jvm

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
)

// isLibJVM says whether a mapped file is HotSpot's libjvm.so.
func isLibJVM(path string) bool {
	return filepath.Base(path) == "libjvm.so"
}

// Find locates the JVM in p and reads its layout from mem (p's memory).
// A process that maps no libjvm.so matches ErrNotJVM; a JVM whose tables
// lack a needed entry matches ErrUnknownVersion.
func Find(p *process.Process, mem Memory) (*VM, error) {
	var firstErr error
	seen := map[string]bool{}
	for _, m := range p.Mappings {
		if !m.FileBacked() || seen[m.Path] || !isLibJVM(m.Path) || !strings.Contains(m.Perms, "x") {
			continue
		}
		seen[m.Path] = true
		vm, err := findIn(p, m, mem)
		if err == nil {
			return vm, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrNotJVM
}

// findIn reads the tables of the libjvm.so mapped by m.
func findIn(p *process.Process, m process.Mapping, mem Memory) (*VM, error) {
	path := p.FilePath(m)
	if path == "" {
		return nil, fmt.Errorf("jvm file %s: not readable", m.Path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("jvm file %s: %w", m.Path, err)
	}
	defer f.Close()
	base, err := loadBase(f, m)
	if err != nil {
		return nil, fmt.Errorf("jvm file %s: %w", m.Path, err)
	}
	syms := symbols(f, tableSymbols...)
	for n, v := range syms {
		syms[n] = base + v
	}
	// While ld.so maps libjvm.so, its code can be mapped before its data:
	// the data's addresses then still show the file's first bytes, read
	// only, and would read as garbage (a layout not supported, for good).
	maps, err := readMaps(p)
	if err != nil {
		return nil, fmt.Errorf("jvm file %s: %w", m.Path, err)
	}
	if n, ok := unwritable(maps, syms); ok {
		return nil, fmt.Errorf("jvm file %s: %s at %#x not in writable memory yet: %w", m.Path, n, syms[n], ErrNotReady)
	}
	t, err := readTables(mem, syms)
	if err != nil {
		return nil, fmt.Errorf("jvm file %s: %w", m.Path, err)
	}
	vm, err := newVM(t, mem)
	if err != nil {
		return nil, fmt.Errorf("jvm file %s: %w", m.Path, err)
	}
	vm.File = path
	return vm, nil
}

// readMaps reads all of p's mappings now (p.Mappings holds the executable
// ones only).
func readMaps(p *process.Process) ([]process.Mapping, error) {
	f, err := os.Open(p.MapsPath())
	if err != nil {
		return nil, fmt.Errorf("maps: %w", err)
	}
	defer f.Close()
	maps, err := process.ParseMaps(f)
	if err != nil {
		return nil, fmt.Errorf("maps: %w", err)
	}
	return maps, nil
}

// unwritable returns a symbol of syms whose address no writable mapping
// holds: the gHotSpot* variables are libjvm.so's data (.data, .bss), which
// is writable once mapped.
func unwritable(maps []process.Mapping, syms symAddrs) (string, bool) {
	names := make([]string, 0, len(syms))
	for n := range syms {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		a := syms[n]
		i := slices.IndexFunc(maps, func(m process.Mapping) bool { return m.Start <= a && a < m.End })
		if i < 0 || len(maps[i].Perms) < 2 || maps[i].Perms[1] != 'w' {
			return n, true
		}
	}
	return "", false
}

// loadBase is what the file's virtual addresses are moved by in the
// process, found from the executable segment m maps.
func loadBase(f *elf.File, m process.Mapping) (uint64, error) {
	return elfx.LoadBias(f, m.Start, m.Offset)
}

// symbols returns the values of the named symbols found in .dynsym, then
// .symtab.
func symbols(f *elf.File, names ...string) symAddrs {
	out := symAddrs{}
	for n, s := range elfx.FindSymbols(f, names...) {
		out[n] = s.Value
	}
	return out
}
