package unwind

import (
	"cmp"
	"slices"
	"sort"
)

// CFAType says how the canonical frame address of a row is computed.
type CFAType uint8

const (
	// CFAUnknown means no usable rule (no FDE covers the PC, or an
	// expression we do not know): the unwinder stops cleanly.
	CFAUnknown CFAType = iota
	// CFASP means CFA = RSP + CFAOffset.
	CFASP
	// CFAFP means CFA = RBP + CFAOffset.
	CFAFP
	// CFAPLT is the classic .plt stub expression:
	// CFA = RSP + CFAOffset + ((RIP & 15) >= 11 ? 8 : 0); CFAOffset is 8.
	CFAPLT
	// CFASignal is a signal trampoline (__restore_rt; FDE augmentation
	// 'S'): registers come from the ucontext on the stack.
	CFASignal
	// CFAEnd is the outermost frame: the return address is undefined
	// (_start, clone/thread start): the stack is complete.
	CFAEnd
	// CFASPLR (aarch64) means CFA = SP + CFAOffset with the return
	// address still in the link register x30: a leaf, a prologue before
	// it stores x30, a PLT stub.
	CFASPLR
	// CFASPRecord (aarch64) means CFA = SP + CFAOffset; FP is FPOffset
	// and the return address is saved right above the caller's x29, at
	// CFA + FPOffset + 8 (a frame record).
	CFASPRecord
	// CFAFPRecord (aarch64) is CFASPRecord with CFA = x29 + CFAOffset.
	CFAFPRecord
	// CFASPRA (aarch64) means CFA = SP + CFAOffset with the return address
	// at CFA + FPOffset; FP is FPSame or FPUnknown (x29 is not saved, or
	// not next to it).
	CFASPRA
	// CFASPGo (aarch64 Go) means CFA = SP + CFAOffset with the return
	// address at SP and the caller's x29 right below it, at SP - 8: the
	// frame a Go function's prologue builds.
	CFASPGo
	// CFAGoCgo (aarch64 Go) is runtime.asmcgocall's call of C on the
	// system stack: the goroutine's frame, which CFASPGo then describes
	// with CFAOffset, is at g.stack.hi less the depth asmcgocall saved at
	// SP + 8 beside g at SP; with no g (a call made on the system stack),
	// SP + 8 holds the frame's SP itself.
	CFAGoCgo
)

// String returns a short name for the rule, for test output.
func (c CFAType) String() string {
	switch c {
	case CFAUnknown:
		return "unknown"
	case CFASP:
		return "sp"
	case CFAFP:
		return "fp"
	case CFAPLT:
		return "plt"
	case CFASignal:
		return "signal"
	case CFAEnd:
		return "end"
	case CFASPLR:
		return "sp+lr"
	case CFASPRecord:
		return "sp+record"
	case CFAFPRecord:
		return "fp+record"
	case CFASPRA:
		return "sp+ra"
	case CFASPGo:
		return "sp+go"
	case CFAGoCgo:
		return "go+cgo"
	}
	return "invalid"
}

// FPRule says where the caller's RBP is.
type FPRule uint8

const (
	// FPSame means RBP keeps its value in the caller.
	FPSame FPRule = iota
	// FPOffset means RBP of the caller is saved at CFA + FPOffset.
	FPOffset
	// FPUnknown is any other rule (register, expression): the caller's RBP
	// is unknown.
	FPUnknown
)

// String returns a short name for the rule, for test output.
func (r FPRule) String() string {
	switch r {
	case FPSame:
		return "same"
	case FPOffset:
		return "offset"
	case FPUnknown:
		return "unknown"
	}
	return "invalid"
}

// Row says how to unwind from any PC in [PC, next row's PC). The return
// address is always at CFA-8 on x86-64; a CFI row whose return-address rule
// is anything else becomes CFAUnknown (CFAEnd when undefined). On aarch64
// the CFA type says where it is (CFASPLR and the types after it).
//
// Fields that the CFA type does not use are zero, so equal rules compare
// equal. A Row is 16 bytes: a big Go binary has over a million of them
// while its table is built. FPOffset is an int16 because the kernel's rows
// hold much less (±1 KiB); a CFI offset beyond it is FPUnknown.
type Row struct {
	PC        uint64 // ELF virtual address (as in the symbol table and CFI), not file offset
	CFAOffset int32
	FPOffset  int16
	CFA       CFAType
	FP        FPRule
}

// sameRule reports whether a and b unwind the same way (PC aside).
func (r Row) sameRule(o Row) bool {
	return r.CFA == o.CFA && r.CFAOffset == o.CFAOffset && r.FP == o.FP && r.FPOffset == o.FPOffset
}

// Stats counts what was parsed and what was unusable.
type Stats struct {
	CIEs        int // CIEs parsed successfully
	FDEs        int // FDEs whose program was interpreted successfully
	BadCIEs     int // CIEs that could not be parsed (their FDEs are counted in BadFDEs)
	BadFDEs     int // FDEs dropped: bad encoding, unknown op, or a cap was hit
	EmptyFDEs   int // FDEs covering no address (zero length)
	Overlapping int // FDEs dropped because an earlier one (eh_frame first) covers their start
	Skipped     int // FDEs left out: wholly inside code another source unwinds (a Go binary's pclntab)
	Rows        int // rows in the final table
	Unknown     int // of Rows, those with CFAUnknown (gaps included)
}

// Table is the sorted unwind table of one ELF file. Rows are sorted by PC
// with equal neighbours merged; a gap between FDEs is a CFAUnknown row at the
// gap's start, and the table ends with a CFAUnknown row after the last FDE.
// A Table is not modified after it is returned and is safe for concurrent
// reads.
type Table struct {
	Rows  []Row
	Stats Stats
	// mem: the buffers outside the heap that Rows may live in (see
	// reserve); nil for a table in the heap.
	mem releases
}

// release unmaps the buffers t's rows live in, if any: t's rows are gone.
func (t *Table) release() {
	if t != nil {
		t.mem.run()
	}
}

// onHeap returns t with its rows in the heap, releasing its buffers: what
// the exported builders hand out.
func (t *Table) onHeap() *Table {
	if t == nil || t.mem == nil {
		return t
	}
	h := &Table{Rows: slices.Clone(t.Rows), Stats: t.Stats}
	t.release()
	return h
}

// EndAtEntry returns t with the code from entry to the next FDE unwound as
// the outermost frame (CFAEnd) when no FDE covers entry; t itself when one
// does, or when no FDE follows entry (the gap's end is unknown). entry is a
// program's first instruction, where its first frame starts: glibc's
// dynamic loader has no CFI there (_start, then _dl_start_user), so a
// stack sampled in its start-up code would otherwise end short of it.
func (t *Table) EndAtEntry(entry uint64) *Table {
	if t == nil || entry == 0 {
		return t
	}
	i := sort.Search(len(t.Rows), func(i int) bool { return t.Rows[i].PC > entry })
	if i == len(t.Rows) || i > 0 && t.Rows[i-1].CFA != CFAUnknown {
		return t
	}
	n := len(t.Rows) + 1 + 2*maxCodeSegments // room for fileRows
	var mem releases
	var rows []Row
	if t.mem != nil {
		rows = reserve[Row](&mem, n, n) // outside the heap, as t's rows are
	} else {
		rows = make([]Row, 0, n)
	}
	defer t.release()
	rows = append(rows, t.Rows[:i]...)
	if end := (Row{PC: entry, CFA: CFAEnd}); i > 0 && rows[i-1].PC == entry {
		rows[i-1] = end
	} else {
		rows = append(rows, end)
	}
	rows = append(rows, t.Rows[i:]...)
	st := t.Stats
	st.Rows = len(rows)
	return &Table{Rows: rows, Stats: st, mem: mem}
}

// Lookup returns the row covering pc. ok is false when pc is below the first
// row (no FDE starts at or before it); past the last FDE it returns the
// closing CFAUnknown row.
func (t *Table) Lookup(pc uint64) (Row, bool) {
	if t == nil {
		return Row{}, false
	}
	i := sort.Search(len(t.Rows), func(i int) bool { return t.Rows[i].PC > pc })
	if i == 0 {
		return Row{}, false
	}
	return t.Rows[i-1], true
}

// fdeRows is the interpreted program of one FDE: rows[0].PC == begin, and
// rows apply up to end.
type fdeRows struct {
	begin, end uint64
	first, n   int // rows are all[first:first+n] of the shared row buffer
}

// build sorts the FDEs (earlier ones in fdes win over later ones on overlap)
// and lays their rows out into one table. scratch holds fdes and all: its
// pages, like the table's, are dropped as the build goes.
func build(fdes []fdeRows, all []Row, st *Stats, scratch releases) *Table {
	// Stable: among FDEs with the same start the earlier one in the input
	// wins. An FDE starting inside the previous kept one is dropped
	// (.debug_frame FDEs overlapping .eh_frame were removed before).
	byBegin := func(a, b fdeRows) int { return cmp.Compare(a.begin, b.begin) }
	if !slices.IsSortedFunc(fdes, byBegin) { // a linker mostly writes them in order
		slices.SortStableFunc(fdes, byBegin)
	}
	// At most one gap row per FDE (the padding between functions gives
	// most FDEs one) besides the FDEs' own rows: sized once, the slice of
	// a big library's million rows is never copied to grow.
	var mem releases
	out := reserve[Row](&mem, len(all)+len(fdes)+1+2*maxCodeSegments, len(all)+len(fdes)+1+2*maxCodeSegments)
	add := func(r Row) {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if last.PC == r.PC {
				*last = r
				if n > 1 && out[n-2].sameRule(r) {
					out = out[:n-1]
				}
				return
			}
			if last.sameRule(r) {
				return
			}
		}
		out = append(out, r)
	}
	var prevEnd uint64
	have := false
	read := 0
	for _, f := range fdes {
		if have && f.begin < prevEnd {
			st.Overlapping++
			continue
		}
		if have && f.begin > prevEnd {
			add(Row{PC: prevEnd})
		}
		for _, r := range all[f.first : f.first+f.n] {
			add(r)
		}
		prevEnd, have = f.end, true
		if read += f.n; read >= dropRows {
			read = 0
			scratch.drop()
			mem.drop()
		}
	}
	if have {
		add(Row{PC: prevEnd})
	}
	st.Rows = len(out)
	for i, r := range out {
		if r.CFA == CFAUnknown {
			st.Unknown++
		}
		mem.passed(i)
	}
	// The room left in out lets fileRows re-key the rows in place.
	return &Table{Rows: out, Stats: *st, mem: mem}
}
