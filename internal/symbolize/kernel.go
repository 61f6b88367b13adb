package symbolize

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/sonde-dev/sonde/internal/elfx"
)

// ErrKernelAddressesHidden means kallsyms listed every address as zero: the
// kernel hides them from this process (kernel.kptr_restrict, or no
// CAP_SYSLOG). Kernel frames cannot be named; run as root or grant CAP_SYSLOG.
var ErrKernelAddressesHidden = errors.New("kernel symbol addresses are hidden (kptr_restrict or missing CAP_SYSLOG)")

const (
	// maxKernelSymbols bounds the table; a kernel with every module loaded
	// has about 300k text symbols.
	maxKernelSymbols = 4 << 20
	// maxKernelModules bounds the distinct module names (the index is 16 bits).
	maxKernelModules = 1 << 16
	// maxKernelLine bounds one kallsyms line; KSYM_NAME_LEN is 512.
	maxKernelLine = 4096
)

// Symbol is a kernel symbol.
type Symbol struct {
	Name   string
	Module string // "" for the core kernel, else the module name, e.g. "nf_tables"
	Addr   uint64
}

// Kernel is a kernel text symbol table read from kallsyms. It is immutable
// after loading and safe for concurrent use.
type Kernel struct {
	syms    []ksym   // sorted by address, one entry per address
	names   string   // every kept name, back to back
	modules []string // modules[0] is "", the core kernel
	skipped int
	// mem holds syms and names once the table is built: a mapping outside
	// the Go heap (5 MB for a distribution kernel, which the collector's
	// goal would double), spilled to a file's page cache where it can be
	// (elfx.Spill: the pages lookups read count in RSS until the next
	// DropPages), unmapped when k is collected. Nothing of it leaves k:
	// Lookup copies the names it returns.
	mem *elfx.Image
	// touched is set by a Lookup since the last Symbolizer.DropPages.
	touched atomic.Bool
}

// ksym is one symbol in 16 bytes; its name is names[name : name+nameLen].
type ksym struct {
	addr    uint64
	name    uint32
	nameLen uint16
	module  uint16
}

// LoadKernel reads a kallsyms file (normally /proc/kallsyms) and keeps its
// text symbols (types t, T, w, W). When every address reads as zero it
// returns ErrKernelAddressesHidden.
func LoadKernel(path string) (*Kernel, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load kernel symbols: %w", err)
	}
	defer f.Close()
	k, err := parseKallsyms(f)
	if err != nil {
		return nil, fmt.Errorf("load kernel symbols from %s: %w", path, err)
	}
	return k, nil
}

// parseKallsyms parses kallsyms text: "ADDR TYPE NAME" with an optional
// "\t[MODULE]". Malformed and overlong lines are skipped and counted.
// Names go straight to a spill (elfx.Spill) as they are read, and the
// sorted symbols after them; until then the symbols gather in memory
// reserved outside the heap (elfx.Reserve), so the build leaves the heap
// as it found it.
func parseKallsyms(r io.Reader) (*Kernel, error) {
	names, err := elfx.NewSpill(0)
	if err != nil {
		return nil, err
	}
	defer names.Discard()
	br := bufio.NewReaderSize(r, 64<<10)
	k := &Kernel{modules: []string{""}}
	moduleIndex := map[string]uint16{"": 0}
	// 2 MB for a distribution kernel, loaded as the agent starts: in the
	// heap, the collector's goal would double them while the first tables
	// are built.
	if b, release, ok := elfx.Reserve(maxKernelSymbols * int(unsafe.Sizeof(ksym{}))); ok {
		defer release() // mapTable copies them into the table's mapping
		k.syms = unsafe.Slice((*ksym)(unsafe.Pointer(unsafe.SliceData(b))), maxKernelSymbols)[:0]
	} else {
		k.syms = make([]ksym, 0, 1<<17) // a typical kernel has 100k-150k text symbols
	}

	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Far longer than any real line: skip the rest of it.
			k.skipped++
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			line = nil
		}
		if len(line) > 0 && (err == nil || errors.Is(err, io.EOF)) {
			if err := k.add(line, moduleIndex, names); err != nil {
				return nil, err
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("read: %w", err)
		}
	}
	if len(k.syms) == 0 {
		return nil, errors.New("no text symbols")
	}
	if !slices.ContainsFunc(k.syms, func(s ksym) bool { return s.addr != 0 }) {
		return nil, ErrKernelAddressesHidden
	}

	// kallsyms is mostly sorted already; modules may not be. Among aliases at
	// one address keep the one listed first.
	slices.SortStableFunc(k.syms, func(a, b ksym) int { return cmp.Compare(a.addr, b.addr) })
	k.syms = slices.CompactFunc(k.syms, func(a, b ksym) bool { return a.addr == b.addr })
	if err := k.mapTable(names); err != nil {
		return nil, err
	}
	return k, nil
}

// mapTable appends k's symbols to the names spilled so far, 16-byte
// aligned, and maps the whole: k.names and k.syms then read the mapping.
func (k *Kernel) mapTable(names *elfx.Spill) error {
	namesLen := names.Len()
	symOff := (namesLen + 15) &^ 15
	var pad [16]byte
	_, err := names.Write(pad[:symOff-namesLen])
	if err == nil {
		_, err = names.Write(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(k.syms))), len(k.syms)*int(unsafe.Sizeof(ksym{}))))
	}
	if err != nil {
		return fmt.Errorf("spill the symbol table: %w", err)
	}
	m, err := names.Map()
	if err != nil {
		return fmt.Errorf("map the symbol table: %w", err)
	}
	b := m.Bytes() // page-aligned, so symOff is aligned for ksym
	k.names = unsafe.String(&b[0], namesLen)
	k.syms = unsafe.Slice((*ksym)(unsafe.Pointer(&b[symOff])), len(k.syms))
	k.mem = m
	runtime.AddCleanup(k, func(m *elfx.Image) { m.Unmap() }, m)
	return nil
}

// add parses one line and keeps it if it is a text symbol.
func (k *Kernel) add(line []byte, moduleIndex map[string]uint16, names *elfx.Spill) error {
	addr, typ, name, module, ok := splitKallsymsLine(line)
	if !ok {
		k.skipped++
		return nil
	}
	if typ != 't' && typ != 'T' && typ != 'w' && typ != 'W' {
		return nil
	}
	if len(k.syms) >= maxKernelSymbols {
		return fmt.Errorf("more than %d text symbols", maxKernelSymbols)
	}
	mod, found := moduleIndex[string(module)] // no allocation for the lookup
	if !found {
		if len(k.modules) >= maxKernelModules {
			return fmt.Errorf("more than %d modules", maxKernelModules)
		}
		m := string(module)
		mod = uint16(len(k.modules))
		k.modules = append(k.modules, m)
		moduleIndex[m] = mod
	}
	if uint64(names.Len())+uint64(len(name)) > 1<<32-1 {
		return errors.New("symbol names exceed 4 GiB")
	}
	k.syms = append(k.syms, ksym{addr: addr, name: uint32(names.Len()), nameLen: uint16(len(name)), module: mod})
	if _, err := names.Write(name); err != nil {
		return err
	}
	return nil
}

// splitKallsymsLine splits one kallsyms line without allocating.
func splitKallsymsLine(line []byte) (addr uint64, typ byte, name, module []byte, ok bool) {
	for len(line) > 0 && (line[len(line)-1] == '\n' || line[len(line)-1] == '\r') {
		line = line[:len(line)-1]
	}
	if len(line) > maxKernelLine {
		return 0, 0, nil, nil, false
	}
	i := 0
	for ; i < len(line) && line[i] != ' '; i++ {
		d, isHex := hexDigit(line[i])
		if !isHex || i >= 16 {
			return 0, 0, nil, nil, false
		}
		addr = addr<<4 | uint64(d)
	}
	// " T name": a space, one type letter, a space, a name.
	if i == 0 || len(line) < i+4 || line[i+2] != ' ' {
		return 0, 0, nil, nil, false
	}
	typ = line[i+1]
	rest := line[i+3:]
	name = rest
	if tab := indexByte(rest, '\t'); tab >= 0 {
		name = rest[:tab]
		m := rest[tab+1:]
		if len(m) < 2 || m[0] != '[' || m[len(m)-1] != ']' {
			return 0, 0, nil, nil, false
		}
		module = m[1 : len(m)-1]
	}
	if len(name) == 0 || len(name) > 1<<16-1 || indexByte(name, ' ') >= 0 {
		return 0, 0, nil, nil, false
	}
	return addr, typ, name, module, true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// Lookup returns the text symbol at or below addr. Kernel symbols have no
// sizes, so a symbol extends to the next one; an address below the first
// symbol is not found.
func (k *Kernel) Lookup(addr uint64) (Symbol, bool) {
	i, found := slices.BinarySearchFunc(k.syms, addr, func(s ksym, a uint64) int { return cmp.Compare(s.addr, a) })
	if !found {
		i--
	}
	if i < 0 {
		return Symbol{}, false
	}
	s := k.syms[i]
	if !k.touched.Load() {
		k.touched.Store(true)
	}
	return Symbol{
		Name:   strings.Clone(k.names[s.name : s.name+uint32(s.nameLen)]),
		Module: k.modules[s.module],
		Addr:   s.addr,
	}, true
}

// Len returns the number of distinct symbol addresses kept.
func (k *Kernel) Len() int { return len(k.syms) }

// Skipped returns how many malformed lines the parser skipped.
func (k *Kernel) Skipped() int { return k.skipped }

// memSize is the memory the table holds, in the heap or its mapping.
func (k *Kernel) memSize() int64 {
	n := int64(cap(k.syms))*16 + int64(len(k.names)) + 256
	for _, m := range k.modules {
		n += int64(len(m)) + 16
	}
	return n
}
