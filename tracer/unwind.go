package tracer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/support"
)

// Row is one unwind-table row as the eBPF unwinder reads it: it covers
// [PC, next row's PC) of a table, relative to the table's base.
type Row = support.SondeUnwindRow

// Unwind rules of a Row.
const (
	CFAUnknown = uint8(support.SondeCfaTypeCFA_UNKNOWN)
	CFASP      = uint8(support.SondeCfaTypeCFA_SP)
	CFAFP      = uint8(support.SondeCfaTypeCFA_FP)
	CFAPLT     = uint8(support.SondeCfaTypeCFA_PLT)
	CFASignal  = uint8(support.SondeCfaTypeCFA_SIGNAL)
	CFAEnd     = uint8(support.SondeCfaTypeCFA_END)
	// aarch64's rules (sonde.h says where each finds the return address).
	CFASPLR     = uint8(support.SondeCfaTypeCFA_SP_LR)
	CFASPRecord = uint8(support.SondeCfaTypeCFA_SP_RECORD)
	CFAFPRecord = uint8(support.SondeCfaTypeCFA_FP_RECORD)
	CFASPRA     = uint8(support.SondeCfaTypeCFA_SP_RA)
	CFASPGo     = uint8(support.SondeCfaTypeCFA_SP_GO)
	CFAGoCgo    = uint8(support.SondeCfaTypeCFA_GO_CGO)

	FPSame    = uint8(support.SondeFpRuleFP_SAME)
	FPOffset  = uint8(support.SondeFpRuleFP_OFFSET)
	FPUnknown = uint8(support.SondeFpRuleFP_UNKNOWN)
)

// Layout of Row.Rule.
const (
	rowCFATypeMask = uint8(support.SondeRowBitsROW_CFA_TYPE_MASK)
	rowFPRuleShift = uint8(support.SondeRowBitsROW_FP_RULE_SHIFT)
	rowFPRuleMask  = uint8(support.SondeRowBitsROW_FP_RULE_MASK)
	rowCFAScaled   = uint8(support.SondeRowBitsROW_CFA_SCALED)
	rowFPFromBase  = uint8(support.SondeRowBitsROW_FP_FROM_BASE)
)

// MakeRow packs a rule into a Row at pc: CFA = (SP, FP, ...) + cfaOffset,
// and with FPOffset the caller's RBP at CFA + fpOffset (with CFASPRA,
// fpOffset is the return address's slot instead). ok is false when the
// offsets do not fit a row (a CFA offset beyond 512 KiB or not a multiple
// of 8 beyond 64 KiB; a slot not 8-aligned or beyond 1 KiB of the CFA, or
// for aarch64's rules of the CFA's register): the caller then keeps a
// weaker rule.
func MakeRow(pc uint32, cfaType uint8, cfaOffset int32, fpRule uint8, fpOffset int32) (r Row, ok bool) {
	r = Row{Pc: pc, Rule: cfaType&rowCFATypeMask | (fpRule&rowFPRuleMask)<<rowFPRuleShift}
	switch {
	case cfaOffset < 0:
		return r, false
	case cfaOffset <= 0xffff:
		r.CfaOffset = uint16(cfaOffset)
	case cfaOffset%8 == 0 && cfaOffset/8 <= 0xffff:
		r.CfaOffset = uint16(cfaOffset / 8)
		r.Rule |= rowCFAScaled
	default:
		return r, false
	}
	if fpRule == FPOffset || cfaType == CFASPRA {
		fits := func(off int32) bool { return off%8 == 0 && off/8 >= -128 && off/8 <= 127 }
		switch {
		case fits(fpOffset):
			r.FpOffset8 = int8(fpOffset / 8)
		case cfaType >= CFASPLR && fits(fpOffset+cfaOffset):
			// aarch64: the slot is near the CFA's register (the bottom
			// of a big frame, where GCC saves x29 and x30).
			r.FpOffset8 = int8((fpOffset + cfaOffset) / 8)
			r.Rule |= rowFPFromBase
		default:
			return r, false
		}
	}
	return r, true
}

// RowRule unpacks what MakeRow packed.
func RowRule(r Row) (cfaType uint8, cfaOffset int32, fpRule uint8, fpOffset int32) {
	cfaOffset = int32(r.CfaOffset)
	if r.Rule&rowCFAScaled != 0 {
		cfaOffset *= 8
	}
	fpOffset = int32(r.FpOffset8) * 8
	if r.Rule&rowFPFromBase != 0 {
		fpOffset -= cfaOffset
	}
	return r.Rule & rowCFATypeMask, cfaOffset, (r.Rule >> rowFPRuleShift) & rowFPRuleMask, fpOffset
}

// RowSize is the size of one row, the value size of a table's array (the
// generated type's size; TestTableLimitsMatchSpec checks the object's).
const RowSize = int(unsafe.Sizeof(Row{}))

// RowKernelBytes is the kernel memory one row takes: an array map stores
// each value in 8-byte steps.
const RowKernelBytes = int64(RowSize+7) &^ 7

// TableKernelBytes is the kernel memory the array of a table of n entries
// (TableEntries: its rows and page index) takes, as the kernel counts it:
// an mmapable array keeps its header on a page of its own and its values
// in whole pages.
func TableKernelBytes(n int) int64 {
	page := int64(unix.Getpagesize())
	return page + (int64(n)*RowKernelBytes+page-1)&^(page-1)
}

// Layout of a table's page index (sonde.h, enum row_page).
const (
	rowPageShift = uint32(support.SondeRowPageROW_PAGE_SHIFT)
	rowPageNone  = uint32(support.SondeRowPageROW_PAGE_NONE)
)

// TableEntries is how many array entries a table of rows takes: its rows,
// then its page index, two entries per row slot. The index covers every
// page (1 << rowPageShift bytes) from the first row's to the last's; a
// table sparser than a row per page gets none (the eBPF side then searches
// all its rows).
func TableEntries(rows []Row) int {
	return len(rows) + (indexPages(rows)+1)/2
}

// indexPages is how many pages rows' index covers (0: none).
func indexPages(rows []Row) int {
	if len(rows) == 0 {
		return 0
	}
	if n := int(rows[len(rows)-1].Pc>>rowPageShift) + 1; n <= len(rows) {
		return n
	}
	return 0
}

// pageIndex returns the page index of rows as row slots: entry p is the
// index of the last row whose pc is at or below p << rowPageShift, the
// row that covers the page's first byte (0 for the pages before the first
// row, which the eBPF side checks against).
func pageIndex(rows []Row) []Row {
	pages := indexPages(rows)
	if pages == 0 {
		return nil
	}
	slots := make([]Row, (pages+1)/2)
	i := 0
	for p := range pages {
		for i+1 < len(rows) && rows[i+1].Pc <= uint32(p)<<rowPageShift {
			i++
		}
		setEntry(slots, p, uint32(i))
	}
	if pages%2 == 1 {
		setEntry(slots, pages, rowPageNone)
	}
	return slots
}

// setEntry writes entry p of a page index laid out in row slots: the low
// 32 bits of slot p/2 for an even p, its high 32 bits for an odd one,
// little-endian as the eBPF side reads them.
func setEntry(slots []Row, p int, v uint32) {
	s := &slots[p/2]
	if p%2 == 0 {
		s.Pc = v
		return
	}
	s.CfaOffset, s.FpOffset8, s.Rule = uint16(v), int8(v>>16), uint8(v>>24)
}

// MaxTables bounds the table ids: 1..MaxTables-1 (the tables map's size).
const MaxTables = uint32(support.SondeLimitsMAX_TABLES)

// MaxTableRows bounds the rows of one table: the eBPF row search finds a
// row among at most this many.
const MaxTableRows = int(support.SondeLimitsMAX_TABLE_ROWS)

// ErrTableFull is returned by LoadTable when no table id is free.
var ErrTableFull = errors.New("unwind table slots full")

// LoadTable loads rows (sorted by PC) as table id, replacing any table with
// that id. The rows live in their own BPF array, sized to them, so kernel
// memory is what the table needs. copied, if not nil, is told as the copy
// into that array goes how many rows (a prefix of rows) are in; its call
// with len(rows) comes before the table is installed, which waits for an
// RCU grace period: from then on rows are not read, and their memory may
// go. A copy that fails makes no such call.
func (t *Tracer) LoadTable(id uint32, rows []Row, copied func(n int)) error {
	return loadTable(t.objs.Tables, id, rows, copied)
}

// loadTable puts rows as table id into tables, an array of tables as the
// programs declare it (the sampler's, or a test program's).
func loadTable(tables *ebpf.Map, id uint32, rows []Row, copied func(n int)) error {
	if id == 0 || id >= MaxTables {
		return fmt.Errorf("unwind table id %d out of range 1..%d: %w", id, MaxTables-1, ErrTableFull)
	}
	if len(rows) == 0 {
		return fmt.Errorf("unwind table %d: no rows", id)
	}
	if len(rows) > MaxTableRows {
		return fmt.Errorf("unwind table %d: %d rows, more than the %d the unwinder searches", id, len(rows), MaxTableRows)
	}
	index := pageIndex(rows)
	key, value := rowBTF()
	inner, err := ebpf.NewMap(&ebpf.MapSpec{
		Name:       "sonde_rows",
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  uint32(RowSize),
		MaxEntries: uint32(len(rows) + len(index)),
		// Must match the outer map's template: BPF_F_INNER_MAP lets sizes
		// differ, BPF_F_MMAPABLE lets fill write through a mapping.
		Flags: unix.BPF_F_INNER_MAP | unix.BPF_F_MMAPABLE,
		// So must what the kernel derives from the value's BTF: before
		// 6.2 it compares the offset of a bpf_timer in the value, which
		// is "none" for a struct without one but "unknown" for a map
		// without BTF, and refuses the table (EINVAL on 6.1).
		Key:   key,
		Value: value,
	})
	if err != nil {
		return fmt.Errorf("unwind table %d: create %d-row map: %w", id, len(rows), err)
	}
	defer func() { _ = inner.Close() }() // the outer map holds its own reference
	if err := fill(inner, 0, rows, copied); err != nil {
		return fmt.Errorf("unwind table %d: fill: %w", id, err)
	}
	if err := fill(inner, len(rows), index, nil); err != nil {
		return fmt.Errorf("unwind table %d: fill its page index: %w", id, err)
	}
	if err := tables.Put(id, inner); err != nil {
		return fmt.Errorf("unwind table %d: install: %w", id, err)
	}
	return nil
}

// rowBTF returns BTF for a table's key (__u32) and value (struct
// unwind_row), as the object declares them.
func rowBTF() (key, value btf.Type) {
	u8 := &btf.Int{Name: "__u8", Size: 1}
	s8 := &btf.Int{Name: "__s8", Size: 1, Encoding: btf.Signed}
	u16 := &btf.Int{Name: "__u16", Size: 2}
	u32 := &btf.Int{Name: "__u32", Size: 4}
	return u32, &btf.Struct{Name: "unwind_row", Size: uint32(RowSize), Members: []btf.Member{
		{Name: "pc", Type: u32, Offset: btf.Bits(8 * unsafe.Offsetof(Row{}.Pc))},
		{Name: "cfa_offset", Type: u16, Offset: btf.Bits(8 * unsafe.Offsetof(Row{}.CfaOffset))},
		{Name: "fp_offset8", Type: s8, Offset: btf.Bits(8 * unsafe.Offsetof(Row{}.FpOffset8))},
		{Name: "rule", Type: u8, Offset: btf.Bits(8 * unsafe.Offsetof(Row{}.Rule))},
	}}
}

// fillChunk is the rows fill writes through one mapping of the array: 128
// KiB, so the pages it maps into this process at a time stay few.
const fillChunk = 1 << 14

// An array stores each value in 8-byte steps: rows are packed exactly as
// fill copies them (a build fails if a Row's size stops being a multiple
// of 8).
var _ [RowKernelBytes - int64(RowSize)]struct{}
var _ [int64(RowSize) - RowKernelBytes]struct{}

// fill writes rows at indexes at..at+len(rows)-1 of the mmapable array
// inner, a chunk at a time through a shared mapping of the array's pages:
// a copy, where an update per row would cost a system call and a kernel
// copy each. copied, if not nil, is told after each chunk how many rows
// are in.
func fill(inner *ebpf.Map, at int, rows []Row, copied func(n int)) error {
	page := int64(unix.Getpagesize())
	for start := 0; start < len(rows); start += fillChunk {
		chunk := rows[start:min(start+fillChunk, len(rows))]
		off := int64(at+start) * RowKernelBytes
		base := off &^ (page - 1)
		end := off + int64(len(chunk))*RowKernelBytes
		mem, err := unix.Mmap(inner.FD(), base, int((end-base+page-1)&^(page-1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("map rows %d..%d: %w", at+start, at+start+len(chunk)-1, err)
		}
		copy(mem[off-base:end-base], unsafe.Slice((*byte)(unsafe.Pointer(&chunk[0])), len(chunk)*RowSize))
		if err := unix.Munmap(mem); err != nil {
			return fmt.Errorf("unmap rows %d..%d: %w", at+start, at+start+len(chunk)-1, err)
		}
		if copied != nil {
			copied(start + len(chunk))
		}
	}
	return nil
}

// UnloadTable removes table id; mappings still naming it fall back to frame
// pointers until they are updated.
func (t *Tracer) UnloadTable(id uint32) error {
	if err := t.objs.Tables.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unwind table %d: remove: %w", id, err)
	}
	return nil
}

// Mapping is one executable mapping of a process as the unwinder sees it:
// addresses in [Start, End) unwind with rows of Table at address - Bias;
// Table 0 means no table: frame pointers. Frames in it are reported as
// (File, address - FileBias): File is the caller's handle for the mapped
// file (0: none); FileBias is Start minus the mapping's file offset. Inode
// is the mapped file's, which the unwinder checks against the live mapping
// where the kernel allows (CheckedMappings). NoTable says the file will
// never have a table (no CFI, or none can be built from it): the unwinder
// takes no stack snapshot there, as nothing could unwind it later.
type Mapping struct {
	Start, End uint64
	Bias       uint64
	Table      uint32
	Rows       uint32
	File       uint32
	FileBias   uint64
	Inode      uint64
	NoTable    bool
}

// SetMappings makes mappings the unwind mappings of pid in place of old
// (what was set before for pid), and marks pid as prepared. Only what
// differs is written: a process that re-maps one library (dlopen,
// dlclose) keeps the trie entries of its other mappings untouched, and
// none of its addresses is without an entry meanwhile.
func (t *Tracer) SetMappings(pid uint32, old, mappings []Mapping) error {
	var errs []error
	next := make(map[support.SondeMappingKey]support.SondeMappingInfo, 2*len(mappings))
	for _, m := range mappings {
		info := support.SondeMappingInfo{
			Start: m.Start, End: m.End, Bias: m.Bias, FileBias: m.FileBias, Inode: m.Inode,
			TableId: m.Table, Rows: m.Rows, File: m.File,
		}
		if m.NoTable {
			info.Flags = uint32(support.SondeMappingInfoFlagsMAPPING_NO_TABLE)
		}
		for _, k := range mappingKeys(pid, m.Start, m.End) {
			next[k] = info
		}
	}
	was := make(map[support.SondeMappingKey]Mapping, 2*len(old))
	changed := false // an entry was written or deleted
	for _, m := range old {
		for _, k := range mappingKeys(pid, m.Start, m.End) {
			if _, kept := next[k]; kept {
				was[k] = m
				continue
			}
			changed = true
			if err := t.objs.Mappings.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
	}
	for _, m := range mappings {
		for _, k := range mappingKeys(pid, m.Start, m.End) {
			if prev, ok := was[k]; ok && prev == m {
				continue
			}
			changed = true
			if err := t.objs.Mappings.Put(k, next[k]); err != nil {
				errs = append(errs, fmt.Errorf("pid %d mapping %#x-%#x: %w", pid, m.Start, m.End, err))
				break
			}
		}
	}
	// The first entries of an image (a new process, or one that exec'd)
	// are often set while its dynamic loader still maps its libraries:
	// its request for them is forgotten, so the first stack that meets
	// one of those libraries asks again at once, not a second later.
	known, lerr := t.knownEntry(pid)
	first := errors.Is(lerr, ebpf.ErrKeyNotExist)
	// Fingerprint 0: the eBPF side takes the fingerprint of pid's address
	// space at its next stack, and trusts these entries while it holds. A
	// new generation where an entry changed: what the CPUs cached of the
	// old entries goes unused. Where none did (a process whose heap moves
	// is read again every second, and its code mostly stays), the CPUs'
	// copies are still the entries, and keep serving: a stack whose
	// mapping was copied need not look in the trie, nor at the VMA anew.
	gen := known.Gen
	if lerr != nil || changed || gen == 0 {
		gen = t.mappingGen.Add(1)
	}
	t.runtimesMu.Lock()
	err := t.putKnown(pid, support.SondeKnownProc{Gen: gen, Runtimes: t.runtimes[pid]}, false)
	t.runtimesMu.Unlock()
	if err != nil {
		errs = append(errs, fmt.Errorf("pid %d: mark prepared: %w", pid, err))
	}
	if first && len(mappings) > 0 {
		if err := t.objs.Notified.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("pid %d: forget its request: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}

// ForgetProcess removes pid's mappings (old) and its prepared mark.
func (t *Tracer) ForgetProcess(pid uint32, old []Mapping) error {
	err := t.SetMappings(pid, old, nil)
	t.runtimesMu.Lock()
	defer t.runtimesMu.Unlock()
	return errors.Join(err, t.deleteKnown(pid))
}

// maxKnownSlots bounds known_slots: 2 MiB of kernel memory. Beyond it
// (a host that runs more processes than that at once, under a pid_max
// above it), pids that share a slot go to known_pids.
const maxKnownSlots = 1 << 16

// knownSlotsFor sizes known_slots: a power of two of at least
// min(maxProcesses, pidMax, maxKnownSlots) slots, so that where pid_max
// is that small no two pids share one. pidMax 0: not known.
func knownSlotsFor(maxProcesses, pidMax uint32) uint32 {
	n := min(max(maxProcesses, 1), maxKnownSlots)
	if pidMax > 0 {
		n = min(n, pidMax)
	}
	return 1 << bits.Len32(n-1)
}

// pidMax reads the kernel's pid_max: every pid is below it. 0 where it
// cannot be read.
func pidMax() uint32 {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0
	}
	return uint32(n)
}

// knownEntry reads pid's entry of the prepared processes: from its slot in
// known_slots where the slot is pid's, else from known_pids. The error
// matches ebpf.ErrKeyNotExist where pid has none.
func (t *Tracer) knownEntry(pid uint32) (support.SondeKnownProc, error) {
	var k support.SondeKnownProc
	if err := t.objs.KnownSlots.Lookup(pid&t.knownMask, &k); err != nil {
		return k, fmt.Errorf("pid %d: known slot: %w", pid, err)
	}
	if k.Pid == pid && pid != 0 {
		return k, nil
	}
	k = support.SondeKnownProc{}
	return k, t.objs.KnownPids.Lookup(pid, &k)
}

// putKnown writes pid's entry of the prepared processes: in its slot where
// the slot is free or pid's, else (another live process holds it) in
// known_pids. With existing, only an entry pid has is written: one the
// eBPF side dropped (at an exec or exit) stays dropped, but for a slot
// dropped between the look and the write. Called with runtimesMu held,
// which orders the writes.
func (t *Tracer) putKnown(pid uint32, k support.SondeKnownProc, existing bool) error {
	slot := pid & t.knownMask
	var cur support.SondeKnownProc
	if err := t.objs.KnownSlots.Lookup(slot, &cur); err != nil {
		return fmt.Errorf("pid %d: known slot: %w", pid, err)
	}
	k.Pid = pid
	if cur.Pid != pid && (existing || cur.Pid != 0) {
		flags := ebpf.UpdateAny
		if existing {
			flags = ebpf.UpdateExist
		}
		err := t.objs.KnownPids.Update(pid, k, flags)
		if existing && errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil // dropped since
		}
		return err
	}
	if err := t.objs.KnownSlots.Put(slot, k); err != nil {
		return fmt.Errorf("pid %d: known slot: %w", pid, err)
	}
	// A pid set while another held its slot has an entry in known_pids:
	// the slot, looked in first, replaces it.
	if err := t.objs.KnownPids.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pid %d: known entry: %w", pid, err)
	}
	return nil
}

// deleteKnown drops pid's entry of the prepared processes, wherever it is.
// Called with runtimesMu held.
func (t *Tracer) deleteKnown(pid uint32) error {
	slot := pid & t.knownMask
	var cur support.SondeKnownProc
	err := t.objs.KnownSlots.Lookup(slot, &cur)
	if err == nil && cur.Pid == pid && pid != 0 {
		err = t.objs.KnownSlots.Put(slot, support.SondeKnownProc{})
	}
	if err != nil {
		err = fmt.Errorf("pid %d: known slot: %w", pid, err)
	}
	if derr := t.objs.KnownPids.Delete(pid); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
		err = errors.Join(err, derr)
	}
	return err
}

// ProcessEntries counts, by pid, the entries the unwinder's per-process
// maps hold: one for a prepared pid (its slot in known_slots, or
// known_pids) and one per block of its mappings. It walks the three maps,
// for tests and diagnostics.
func (t *Tracer) ProcessEntries() (map[uint32]int, error) {
	n := map[uint32]int{}
	var pid uint32
	keys := t.objs.KnownPids.Iterate()
	for v := (support.SondeKnownProc{}); keys.Next(&pid, &v); {
		n[pid]++
	}
	if err := keys.Err(); err != nil {
		return nil, fmt.Errorf("known pids: %w", err)
	}
	var slot uint32
	slots := t.objs.KnownSlots.Iterate()
	for v := (support.SondeKnownProc{}); slots.Next(&slot, &v); {
		if v.Pid != 0 {
			n[v.Pid]++
		}
	}
	if err := slots.Err(); err != nil {
		return nil, fmt.Errorf("known slots: %w", err)
	}
	var k support.SondeMappingKey
	var info support.SondeMappingInfo
	blocks := t.objs.Mappings.Iterate()
	for blocks.Next(&k, &info) {
		n[k.Pid]++
	}
	if err := blocks.Err(); err != nil {
		return nil, fmt.Errorf("mappings: %w", err)
	}
	return n, nil
}

// mappingKeys splits [start, end) into the aligned power-of-two blocks an
// LPM trie can hold, each as a key (pid, block start) with its prefix length.
func mappingKeys(pid uint32, start, end uint64) []support.SondeMappingKey {
	var keys []support.SondeMappingKey
	for start < end {
		// The largest block 2^k aligned at start that fits in [start, end).
		k := min(bits.TrailingZeros64(start), 63)
		for k > 0 && end-start < uint64(1)<<k {
			k--
		}
		keys = append(keys, support.SondeMappingKey{
			Prefixlen: 32 + uint32(64-k),
			Pid:       pid,
			AddrBe:    bigEndian64(start),
		})
		start += uint64(1) << k
	}
	return keys
}

// bigEndian64 stores v so that its in-memory bytes are big-endian, as the
// trie compares keys byte by byte.
func bigEndian64(v uint64) uint64 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return binary.NativeEndian.Uint64(b[:])
}

// ErrFiltersOff is returned by Filter when the Tracer was made without
// filters (Options.FilterPending 0): samples do not look decisions up.
var ErrFiltersOff = errors.New("process filters are off")

// Filter makes the eBPF side drop pid's samples before any work until
// monotonic time until (CLOCK_MONOTONIC nanoseconds; ExcludeForever: for the
// process's life). The decision is cleared at exec and exit. It needs
// filters on (Options.FilterPending).
func (t *Tracer) Filter(pid uint32, until uint64) error {
	if !t.filtering {
		return fmt.Errorf("pid %d: set filter: %w", pid, ErrFiltersOff)
	}
	if err := t.objs.PidFilter.Put(pid, until); err != nil {
		return fmt.Errorf("pid %d: set filter: %w", pid, err)
	}
	return nil
}

// ExcludeForever is the Filter time that never comes.
const ExcludeForever = ^uint64(0)

// Unfilter removes pid's filter decision.
func (t *Tracer) Unfilter(pid uint32) error {
	if err := t.objs.PidFilter.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pid %d: clear filter: %w", pid, err)
	}
	return nil
}

// Cost is what sampling a process cost the eBPF side.
type Cost struct {
	Samples  uint64 // samples unwound and sent
	Filtered uint64 // samples dropped by the filters before any work
	Frames   uint64 // user frames unwound
}

// Cost returns what sampling pid has cost so far; ok is false when pid was
// not sampled (or has exited: its entry goes with it), or when the tracer
// does not count costs (Options.CountCosts).
func (t *Tracer) Cost(pid uint32) (c Cost, ok bool, err error) {
	var ps support.SondePidStats
	if err := t.objs.PidCosts.Lookup(pid, &ps); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Cost{}, false, nil
		}
		return Cost{}, false, fmt.Errorf("pid %d: read cost: %w", pid, err)
	}
	return Cost{Samples: ps.Samples, Filtered: ps.Filtered, Frames: ps.Frames}, true, nil
}

// FileKey names a mapped file as the kernel knows it: its file system's
// device, as /proc/PID/maps shows it (major, minor), and its inode.
type FileKey struct {
	Major, Minor uint32
	Inode        uint64
}

// FileTable says how to unwind in any mapping of a file: rows of Table at
// address - (mapping start - file offset + Delta); frames report File. Table
// 0: frame pointers, but frames still name the file.
type FileTable struct {
	Delta int64
	Table uint32
	Rows  uint32
	File  uint32
}

// kernelDev encodes a device number as the kernel's dev_t (MKDEV).
func kernelDev(major, minor uint32) uint64 { return uint64(major)<<20 | uint64(minor) }

// SetFileTable makes ft the table of the file key names, used where a
// process's own mapping entries do not cover an address yet (kernels with
// CheckedMappings only).
func (t *Tracer) SetFileTable(key FileKey, ft FileTable) error {
	k := support.SondeFileKey{Dev: kernelDev(key.Major, key.Minor), Inode: key.Inode}
	v := support.SondeFileTable{Delta: ft.Delta, TableId: ft.Table, Rows: ft.Rows, File: ft.File}
	if err := t.objs.FileTables.Put(k, v); err != nil {
		return fmt.Errorf("file %d:%d inode %d: set table: %w", key.Major, key.Minor, key.Inode, err)
	}
	return nil
}

// DeleteFileTable removes the table of the file key names.
func (t *Tracer) DeleteFileTable(key FileKey) error {
	k := support.SondeFileKey{Dev: kernelDev(key.Major, key.Minor), Inode: key.Inode}
	if err := t.objs.FileTables.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("file %d:%d inode %d: remove table: %w", key.Major, key.Minor, key.Inode, err)
	}
	return nil
}

// markRuntime records whether pid runs runtime id, in the tracer and in
// pid's known entry if it has one (SetMappings writes it otherwise).
// A stack looks in the maps of its process's runtimes only: a bit left
// unset here would leave that runtime's frames native.
func (t *Tracer) markRuntime(pid uint32, id support.SondeRuntimeId, on bool) error {
	t.runtimesMu.Lock()
	defer t.runtimesMu.Unlock()
	bits := t.runtimes[pid] &^ (1 << id)
	if on {
		bits |= 1 << id
	}
	if bits == 0 {
		delete(t.runtimes, pid)
	} else {
		t.runtimes[pid] = bits
	}
	known, err := t.knownEntry(pid)
	if err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("pid %d: runtimes: %w", pid, err)
	}
	if known.Runtimes == bits {
		return nil
	}
	// The fingerprint written back may be one the eBPF side has replaced
	// since it was read: then the next stack finds it stale and asks for
	// the entries again, which costs a refresh, not a wrong stack.
	known.Runtimes = bits
	if err := t.putKnown(pid, known, true); err != nil {
		return fmt.Errorf("pid %d: runtimes: %w", pid, err)
	}
	return nil
}

// PythonProc is what the eBPF Python walker needs of one CPython process.
type PythonProc = support.SondePythonProc

// PythonNone marks a PythonProc offset the version does not have.
const PythonNone = 0xffff

// SetPython makes the unwinder replace pid's eval-loop frames with the
// Python frames they run.
func (t *Tracer) SetPython(pid uint32, p PythonProc) error {
	if err := t.objs.PythonProcs.Put(pid, p); err != nil {
		return fmt.Errorf("pid %d: set python: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_PYTHON, true)
}

// ForgetPython removes pid's Python entry.
func (t *Tracer) ForgetPython(pid uint32) error {
	if err := t.objs.PythonProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pid %d: forget python: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_PYTHON, false)
}

// JVMProc is what the eBPF HotSpot walker needs of one JVM process.
type JVMProc = support.SondeJvmProc

// JVMHeap is one code heap of a JVMProc.
type JVMHeap = support.SondeJvmHeap

// MaxJVMHeaps is how many code heaps a JVMProc holds.
const MaxJVMHeaps = len(JVMProc{}.Heaps)

// SetJVM makes the unwinder report pid's code cache frames as Java frames
// and step over them by the JVM's own frame layout. It numbers the entry
// (p.Gen): what the CPUs cached of code blobs under an earlier entry, of
// this pid or another, is not used under this one.
func (t *Tracer) SetJVM(pid uint32, p JVMProc) error {
	p.Gen = t.jvmGen.Add(1)
	if err := t.objs.JvmProcs.Put(pid, p); err != nil {
		return fmt.Errorf("pid %d: set jvm: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_JVM, true)
}

// ForgetJVM removes pid's JVM entry.
func (t *Tracer) ForgetJVM(pid uint32) error {
	if err := t.objs.JvmProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pid %d: forget jvm: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_JVM, false)
}

// V8Proc is what the eBPF V8 walker needs of one V8 process.
type V8Proc = support.SondeV8Proc

// MaxV8Builtins is how many builtin ranges a V8Proc holds.
const MaxV8Builtins = len(V8Proc{}.BuiltinStart)

// V8FrameRead is how many bytes of a frame the V8 walker reads, from
// V8Proc.ReadStart below its frame pointer.
const V8FrameRead = len(support.SondeUstackState{}.V8Slots) * 8

// SetV8 makes the unwinder walk pid's V8 code by its frame pointers and
// report its JavaScript frames.
func (t *Tracer) SetV8(pid uint32, p V8Proc) error {
	if err := t.objs.V8Procs.Put(pid, p); err != nil {
		return fmt.Errorf("pid %d: set v8: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_V8, true)
}

// ForgetV8 removes pid's V8 entry.
func (t *Tracer) ForgetV8(pid uint32) error {
	if err := t.objs.V8Procs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pid %d: forget v8: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_V8, false)
}

// PHPProc is what the eBPF PHP walker needs of one PHP process.
type PHPProc = support.SondePhpProc

// PHPExRead and PHPFnRead are how many bytes of a zend_execute_data and of
// a zend_function the PHP walker reads: the offsets of a PHPProc must be
// in them.
const (
	PHPExRead = len(support.SondeUstackState{}.PhpExSlots) * 8
	PHPFnRead = len(support.SondeUstackState{}.PhpFnSlots) * 8
)

// SetPHP makes the unwinder replace pid's execute_ex frames with the PHP
// frames they run.
func (t *Tracer) SetPHP(pid uint32, p PHPProc) error {
	if err := t.objs.PhpProcs.Put(pid, p); err != nil {
		return fmt.Errorf("pid %d: set php: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_PHP, true)
}

// PerlProc is what the eBPF Perl walker needs of one Perl process.
type PerlProc = support.SondePerlProc

// PerlCxRead, PerlSIRead and PerlCopRead are how many bytes of a context,
// a stack info and a statement the Perl walker reads: the offsets of a
// PerlProc must be in them.
const (
	PerlCxRead  = len(support.SondeUstackState{}.PerlCxSlots) * 8
	PerlSIRead  = len(support.SondeUstackState{}.PerlSiSlots) * 8
	PerlCopRead = len(support.SondeUstackState{}.PerlCopSlots) * 8
)

// SetPerl makes the unwinder replace the runops frames of pid's main
// thread with the Perl frames they run.
func (t *Tracer) SetPerl(pid uint32, p PerlProc) error {
	if err := t.objs.PerlProcs.Put(pid, p); err != nil {
		return fmt.Errorf("pid %d: set perl: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_PERL, true)
}

// ForgetPHP removes pid's PHP entry.
func (t *Tracer) ForgetPHP(pid uint32) error {
	if err := t.objs.PhpProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pid %d: forget php: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_PHP, false)
}

// RubyProc is what the eBPF Ruby walker needs of one Ruby process.
type RubyProc = support.SondeRubyProc

// RubyCFPRead is how many bytes of a control frame the Ruby walker reads:
// the frame offsets of a RubyProc must be in them.
const RubyCFPRead = len(support.SondeUstackState{}.RbCfpSlots) * 8

// SetRuby makes the unwinder replace pid's vm_exec_core frames with the
// Ruby frames they run.
func (t *Tracer) SetRuby(pid uint32, p RubyProc) error {
	if err := t.objs.RubyProcs.Put(pid, p); err != nil {
		return fmt.Errorf("pid %d: set ruby: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_RUBY, true)
}

// ForgetRuby removes pid's Ruby entry.
func (t *Tracer) ForgetRuby(pid uint32) error {
	if err := t.objs.RubyProcs.Delete(pid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("pid %d: forget ruby: %w", pid, err)
	}
	return t.markRuntime(pid, support.SondeRuntimeIdRUNTIME_RUBY, false)
}
