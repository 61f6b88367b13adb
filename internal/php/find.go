package php

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/unwind"
)

// Memory reads another process's memory; python.ProcMem is one.
type Memory = python.Memory

// Range is [Start, End) in a process's address space.
type Range struct{ Start, End uint64 }

// Interp is a Zend Engine found in a process: where its state is and how to
// read it. Addresses are the process's.
type Interp struct {
	Version string // "8.2.36"
	Minor   int
	Layout  Layout
	// File is the ELF that holds the engine (php8.2, php-fpm8.2,
	// libphp.so), as the agent opened it.
	File string
	// CurrentEx is &executor_globals.current_execute_data: the innermost
	// PHP frame of the process's (only) thread.
	CurrentEx uint64
	// Exec is execute_ex, the VM: a native frame there runs the PHP
	// frames from the current one up to its entry frame.
	Exec Range
	// JIT is opcache's JIT buffer where the process maps one (End 0:
	// none). The hybrid VM's JIT code runs on execute_ex's native frame:
	// a PC there is unwound as ExecBody, a PC of execute_ex's body.
	JIT      Range
	ExecBody uint64
}

// ErrNotPHP is matched when a process maps no Zend Engine.
var ErrNotPHP = errors.New("no php engine")

// ErrZTS is matched for a thread-safe (ZTS) build, whose executor globals
// are per thread: not supported, its processes keep native stacks.
var ErrZTS = errors.New("php zts build not supported")

// engineName matches the files that may hold the engine: php8.2, php,
// php-fpm8.2, php-cgi8.2, libphp8.2.so, libphp.so.
var engineName = regexp.MustCompile(`^(?:php(?:-fpm|-cgi|-cli)?|libphp)[0-9.]*(?:\.so(?:\.[0-9.]+)?)?$`)

// Find locates the engine in p with the table's layouts. mem is p's memory,
// read to check the layout against the executor globals. An unsupported
// version's error matches ErrUnknownVersion; a process without one matches
// ErrNotPHP.
func Find(p *process.Process, mem Memory) (*Interp, error) {
	return FindWith(p, mem, LayoutFor)
}

// FindWith is Find with the versions layouts knows instead of the table's:
// tests hide a version to see how an unknown one is handled.
func FindWith(p *process.Process, mem Memory, layouts LayoutFunc) (*Interp, error) {
	seen := map[string]bool{}
	var firstErr error
	for _, m := range p.Mappings {
		if !m.FileBacked() || !m.Executable() || seen[m.Path] || !engineName.MatchString(filepath.Base(m.Path)) {
			continue
		}
		seen[m.Path] = true
		in, err := findIn(p, m, mem, layouts)
		if err == nil {
			return in, nil
		}
		if firstErr == nil || !errors.Is(err, ErrNotPHP) {
			firstErr = err
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, ErrNotPHP
}

// binInfo is what one engine binary says, whichever process maps it.
type binInfo struct {
	version      string
	minor, api   int
	zts          bool
	eg, exec     elf.Symbol
	hasEG, hasEx bool

	bodyMu sync.Mutex
	body   uint64 // a pc of execute_ex's body (file address), 0: not found yet
}

// binCache keeps the binInfo of the binaries read so far by device and
// inode (and size and mtime, against a file replaced in place), up to
// maxBins: PHP-FPM's workers all map one binary. Safe for concurrent use.
var binCache = struct {
	sync.Mutex
	m map[binKey]*binInfo
}{m: map[binKey]*binInfo{}}

const maxBins = 64

type binKey struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

// readBin reads path's symbols and version, or finds them cached.
func readBin(path string) (*binInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var key binKey
	if ids, ok := statIDs(st); ok {
		key = binKey{ids[0], ids[1], st.Size(), st.ModTime().UnixNano()}
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
	syms := elfx.FindSymbols(f, "executor_globals", "execute_ex")
	bi.eg, bi.hasEG = syms["executor_globals"]
	bi.exec, bi.hasEx = syms["execute_ex"]
	if bi.hasEx {
		ro := f.Section(".rodata")
		if ro == nil || ro.Type == elf.SHT_NOBITS || ro.Size > 64<<20 {
			return nil, errors.New("no .rodata")
		}
		data, err := ro.Data()
		if err != nil {
			return nil, fmt.Errorf(".rodata: %w", err)
		}
		v, err := ParseVersion(data)
		if err != nil {
			return nil, err
		}
		bi.version, bi.minor, bi.api, bi.zts = v.String(), v.Minor, v.API, v.ZTS
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

// findIn reads the engine symbols of the file mapped by m.
func findIn(p *process.Process, m process.Mapping, mem Memory, layouts LayoutFunc) (*Interp, error) {
	path := p.FilePath(m)
	if path == "" {
		return nil, fmt.Errorf("php file %s: not readable: %w", m.Path, ErrNotPHP)
	}
	bi, err := readBin(path)
	if err != nil {
		return nil, fmt.Errorf("php file %s: %w", m.Path, err)
	}
	if !bi.hasEx {
		return nil, fmt.Errorf("php file %s: no execute_ex: %w", m.Path, ErrNotPHP)
	}
	if bi.zts {
		return nil, fmt.Errorf("php %s (%s): %w", bi.version, m.Path, ErrZTS)
	}
	if !bi.hasEG {
		return nil, fmt.Errorf("php file %s: no executor_globals: %w", m.Path, ErrNotPHP)
	}
	l, err := layouts(bi.minor)
	if err != nil {
		return nil, fmt.Errorf("php %s: %w", bi.version, err)
	}
	if l.APINo != 0 && bi.api != 0 && l.APINo != bi.api {
		return nil, fmt.Errorf("php %s: module api %d, the layout's is %d: %w", bi.version, bi.api, l.APINo, ErrUnknownVersion)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("php file %s: %w", m.Path, err)
	}
	base, err := elfx.LoadBias(f, m.Start, m.Offset)
	_ = f.Close() // read only
	if err != nil {
		return nil, fmt.Errorf("php file %s: %w", m.Path, err)
	}
	in := &Interp{Version: bi.version, Minor: bi.minor, Layout: l, File: path,
		CurrentEx: base + bi.eg.Value + uint64(l.EGCurrentExecuteData),
		Exec:      Range{base + bi.exec.Value, base + bi.exec.Value + bi.exec.Size}}
	if err := in.checkGlobals(mem); err != nil {
		return nil, fmt.Errorf("php %s: %w", bi.version, err)
	}
	if jit, ok := jitBuffer(p); ok {
		body, err := bi.execBody(path)
		if err != nil {
			return nil, fmt.Errorf("php %s: jit: %w", bi.version, err)
		}
		in.JIT, in.ExecBody = jit, base+body
	}
	return in, nil
}

// jitBuffer finds opcache's JIT buffer in p: the executable part of its
// shared memory, which the kernel shows as a deleted /dev/zero.
func jitBuffer(p *process.Process) (Range, bool) {
	for _, m := range p.Mappings {
		if m.Path == "/dev/zero" && m.Deleted && m.Executable() {
			return Range{m.Start, m.End}, true
		}
	}
	return Range{}, false
}

// execBody returns a pc of execute_ex's body: the row of its CFI that
// covers the most code, which is where every handler runs and where the
// JIT's code runs too. Found once per binary, from path (the binary as this
// process maps it).
func (bi *binInfo) execBody(path string) (uint64, error) {
	bi.bodyMu.Lock()
	defer bi.bodyMu.Unlock()
	if bi.body != 0 {
		return bi.body, nil
	}
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	t, err := unwind.FromELF(f)
	if err != nil {
		return 0, err
	}
	body, err := bodyOf(t.Rows, bi.exec.Value, bi.exec.Value+bi.exec.Size)
	if err != nil {
		return 0, err
	}
	bi.body = body
	return body, nil
}

// bodyOf returns the pc of the row of rows (sorted) in [start, end) that
// covers the most code, of those with an sp- or frame-pointer-based CFA.
// 8.2's execute_ex keeps a fixed sp-based frame (rsp+160) over its body;
// 8.4's sets up rbp and keeps rbp+16 there (its JIT code leaves rbp alone).
// A prologue's or an epilogue's rows cover a few bytes each.
func bodyOf(rows []unwind.Row, start, end uint64) (uint64, error) {
	var best unwind.Row
	var span uint64
	for i, r := range rows {
		if r.PC >= end {
			break
		}
		if r.PC < start || (r.CFA != unwind.CFASP && r.CFA != unwind.CFAFP) {
			continue
		}
		next := end
		if i+1 < len(rows) && rows[i+1].PC < end {
			next = rows[i+1].PC
		}
		if next-r.PC > span {
			best, span = r, next-r.PC
		}
	}
	if span == 0 {
		return 0, errors.New("execute_ex: no frame in its unwind table")
	}
	return best.PC, nil
}

// checkGlobals checks the layout against the executor globals: the VM
// stack's top, end, page and page size, which precede
// current_execute_data, make sense (or are all zero: no request yet).
func (in *Interp) checkGlobals(mem Memory) error {
	l := in.Layout
	n := l.EGCurrentExecuteData - l.EGVMStackTop
	if n != 32 {
		return fmt.Errorf("layout: vm stack words at %d, current frame at %d", l.EGVMStackTop, l.EGCurrentExecuteData)
	}
	var b [32]byte
	if err := mem.ReadAt(b[:], in.CurrentEx-32); err != nil {
		return fmt.Errorf("executor globals: %w", err)
	}
	return checkVMStack(b[:])
}

// checkVMStack checks executor_globals.vm_stack_top, vm_stack_end,
// vm_stack and vm_stack_page_size, as read.
func checkVMStack(b []byte) error {
	top := binary.LittleEndian.Uint64(b[0:])
	end := binary.LittleEndian.Uint64(b[8:])
	stack := binary.LittleEndian.Uint64(b[16:])
	page := binary.LittleEndian.Uint64(b[24:])
	if top == 0 && end == 0 && stack == 0 && page == 0 {
		return nil // no request has run yet (an FPM master, a worker not started)
	}
	if page != vmStackPageSize || stack == 0 || top < stack || top > end || end-stack > 1<<32 {
		return fmt.Errorf("executor globals do not match the layout (vm stack %#x..%#x at %#x, page size %d): %w",
			top, end, stack, page, ErrUnknownVersion)
	}
	return nil
}

// Version is a PHP version as its binary states it.
type Version struct {
	Major, Minor, Patch int
	API                 int  // ZEND_MODULE_API_NO, 0: not found
	ZTS                 bool // a thread-safe build
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

var (
	poweredBy = []byte("X-Powered-By: PHP/")
	apiRe     = regexp.MustCompile(`API(20[0-9]{6}),(NTS|TS)(?:,|\x00)`)
)

// ParseVersion finds the version a PHP binary's read-only data states: the
// X-Powered-By header's "PHP/8.2.36" and the module API "API20220829,NTS".
// Only PHP 8 is recognised.
func ParseVersion(rodata []byte) (Version, error) {
	var v Version
	i := bytes.Index(rodata, poweredBy)
	if i < 0 {
		return v, fmt.Errorf("no php version string: %w", ErrNotPHP)
	}
	s := rodata[i+len(poweredBy):]
	if len(s) > 32 {
		s = s[:32]
	}
	nums := [3]int{}
	k := 0
	for j := 0; k < 3; k++ {
		start := j
		for j < len(s) && s[j] >= '0' && s[j] <= '9' && j-start < 4 {
			j++
		}
		if j == start {
			return v, fmt.Errorf("php version %q: %w", s, ErrNotPHP)
		}
		nums[k], _ = strconv.Atoi(string(s[start:j]))
		if k < 2 {
			if j >= len(s) || s[j] != '.' {
				return v, fmt.Errorf("php version %q: %w", s, ErrNotPHP)
			}
			j++
		}
	}
	v.Major, v.Minor, v.Patch = nums[0], nums[1], nums[2]
	if v.Major != 8 {
		return v, fmt.Errorf("php %s: %w", v, ErrUnknownVersion)
	}
	if m := apiRe.FindSubmatch(rodata); m != nil {
		v.API, _ = strconv.Atoi(string(m[1]))
		v.ZTS = string(m[2]) == "TS"
	}
	return v, nil
}
