package python

import (
	"debug/elf"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
)

// Range is [Start, End) in a process's address space.
type Range struct{ Start, End uint64 }

// Interp is a CPython interpreter found in a process: where its state is
// and how to read it. Addresses are the process's.
type Interp struct {
	Minor  int
	Layout Layout
	// File is the ELF that holds the interpreter (the executable or
	// libpython), as the agent opened it.
	File string
	// Runtime is &_PyRuntime (0 on 3.6).
	Runtime uint64
	// InterpHead is the address of the pointer to the first interpreter
	// state: &_PyRuntime.interpreters.head, or &interp_head on 3.6.
	InterpHead uint64
	// Eval covers _PyEval_EvalFrameDefault and its cold part where the
	// symbol table names it (End 0: absent). Native frames there are
	// replaced by the Python frames they execute.
	Eval [2]Range
}

// ErrNotPython is matched when a process maps no CPython interpreter.
var ErrNotPython = errors.New("no python interpreter")

// interpName matches the files that hold a CPython 3 interpreter, with
// their minor version: python3.11, libpython3.11.so.1.0, libpython3.6m.so.
var interpName = regexp.MustCompile(`^(?:lib)?python3\.(\d+)[a-z]*(?:$|\.so|-)`)

// LayoutFunc returns the layout of CPython 3.minor, or an error matching
// ErrUnknownVersion.
type LayoutFunc func(minor int) (Layout, error)

// Find locates the interpreter in p. mem is p's memory, read for the
// _Py_DebugOffsets of 3.13 and later. An unsupported version's error
// matches ErrUnknownVersion; a process without one matches ErrNotPython.
func Find(p *process.Process, mem Memory) (*Interp, error) {
	return FindWith(p, mem, LayoutFor)
}

// FindWith is Find with the versions layouts knows instead of the table's:
// tests hide a version to see how an unknown one is handled.
func FindWith(p *process.Process, mem Memory, layouts LayoutFunc) (*Interp, error) {
	// libpython first: an executable linked to it holds no runtime.
	var libs, exes []process.Mapping
	seen := map[string]bool{}
	for _, m := range p.Mappings {
		if !m.FileBacked() || seen[m.Path] {
			continue
		}
		base := filepath.Base(m.Path)
		if !interpName.MatchString(base) {
			continue
		}
		seen[m.Path] = true
		if base[0] == 'l' {
			libs = append(libs, m)
		} else {
			exes = append(exes, m)
		}
	}
	var firstErr error
	for _, m := range append(libs, exes...) {
		minor, _ := strconv.Atoi(interpName.FindStringSubmatch(filepath.Base(m.Path))[1])
		in, err := findIn(p, m, minor, mem, layouts)
		if err == nil {
			return in, nil
		}
		if firstErr == nil || errors.Is(err, ErrUnknownVersion) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrNotPython
}

// findIn reads the interpreter symbols of the file mapped by m.
func findIn(p *process.Process, m process.Mapping, minor int, mem Memory, layouts LayoutFunc) (*Interp, error) {
	path := p.FilePath(m)
	if path == "" {
		return nil, fmt.Errorf("python file %s: not readable", m.Path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("python file %s: %w", m.Path, err)
	}
	defer f.Close()
	base, err := loadBase(f, m)
	if err != nil {
		return nil, fmt.Errorf("python file %s: %w", m.Path, err)
	}
	syms := symbols(f, "_PyRuntime", "interp_head", "_PyEval_EvalFrameDefault", "_PyEval_EvalFrameDefault.cold")
	eval, ok := syms["_PyEval_EvalFrameDefault"]
	if !ok {
		return nil, fmt.Errorf("python file %s: no _PyEval_EvalFrameDefault: %w", m.Path, ErrNotPython)
	}
	l, err := layouts(minor)
	if err != nil {
		return nil, err
	}
	in := &Interp{Minor: minor, Layout: l, File: path}
	in.Eval[0] = Range{base + eval.Value, base + eval.Value + eval.Size}
	if cold, ok := syms["_PyEval_EvalFrameDefault.cold"]; ok {
		in.Eval[1] = Range{base + cold.Value, base + cold.Value + cold.Size}
	}
	if minor == 6 {
		head, ok := syms["interp_head"]
		if !ok {
			return nil, fmt.Errorf("python file %s: no interp_head (stripped 3.6): %w", m.Path, ErrNotPython)
		}
		in.InterpHead = base + head.Value
		return in, nil
	}
	rt, ok := syms["_PyRuntime"]
	if !ok {
		return nil, fmt.Errorf("python file %s: no _PyRuntime: %w", m.Path, ErrNotPython)
	}
	in.Runtime = base + rt.Value
	if minor >= 13 {
		b := make([]byte, debugOffsetsSize)
		if err := mem.ReadAt(b, in.Runtime); err != nil {
			return nil, fmt.Errorf("python 3.%d debug offsets: %w", minor, err)
		}
		if in.Layout, err = parseDebugOffsets(b, l); err != nil {
			return nil, fmt.Errorf("python 3.%d: %w", minor, err)
		}
	}
	in.InterpHead = in.Runtime + uint64(in.Layout.RuntimeInterpretersHead)
	return in, nil
}

// loadBase is what the file's virtual addresses are moved by in the
// process: found from the executable segment m maps.
func loadBase(f *elf.File, m process.Mapping) (uint64, error) {
	return elfx.LoadBias(f, m.Start, m.Offset)
}

// symbols returns the named symbols found in .dynsym, then .symtab.
func symbols(f *elf.File, names ...string) map[string]elf.Symbol {
	return elfx.FindSymbols(f, names...)
}
