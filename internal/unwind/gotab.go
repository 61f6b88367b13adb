package unwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sonde-dev/sonde/internal/pclntab"
)

// maxGoRows bounds the rows derived from one pclntab.
const maxGoRows = 1 << 22

// FromGo derives rows from a Go binary's stack-pointer delta tables: at a PC
// where the stack pointer is delta bytes below its value at entry, the CFA is
// SP + delta + 8 (SP + delta on arm64, whose rows spRow describes). Once the prologue has pushed the frame pointer (delta >= 8)
// the caller's RBP is at CFA-16; before that, and in frameless leaves, RBP is
// still the caller's. A frameless leaf thus unwinds to its caller from SP,
// which a frame-pointer walk cannot do.
//
// Where a stack ends for the unwinder the rows are CFAEnd: in the
// functions the runtime flags as top frames (runtime.goexit at the bottom of
// every goroutine, runtime.mstart at the bottom of a thread's system stack,
// runtime.rt0_go, runtime.sigtramp), and in the switches to the system stack
// that leave no way back (stackBottoms).
//
// FromGo sees only the table; fromFile also reads the code of the
// assembly functions, whose frames the deltas do not fully describe: only
// those with the frame-pointer prologue save RBP, and in those that also
// switch stacks (runtime.asmcgocall, runtime.cgocallback,
// runtime.systemstack) the CFA is RBP+16 after it, so the unwinder crosses
// between a goroutine's stack and the system stack both ways. Without the
// code runtime.systemstack and runtime.asmcgocall end the stack
// (systemStackCalls), except runtime.systemstack on arm64, whose frame
// record the code need not be read to find (recordSwitches).
func FromGo(t *pclntab.Table) (*Table, error) {
	gt, err := fromGo(t, nil, nil)
	return gt.onHeap(), err
}

// stackBottoms are the runtime's switches to the system stack below which
// the unwinder finds no caller: runtime.mcall clears RBP and never returns
// to its caller, runtime.morestack leaves its caller's state in g.sched,
// out of the unwinder's reach. They are named, not matched by FuncID: the
// linker gives them their FuncID by these very names, but the numbering
// changes between Go releases. Each must also carry FlagSPWrite, the
// linker's finding that it writes SP.
var stackBottoms = map[string]bool{
	"runtime.mcall":     true,
	"runtime.morestack": true,
}

// systemStackCalls are the runtime's calls of a function on the system
// stack. With the frame-pointer prologue they keep RBP on their frame on
// the goroutine's stack, and the unwinder crosses back there; where their
// code is unknown or lacks the prologue they end the stack as stackBottoms
// do. As stackBottoms, they must carry FlagSPWrite.
var systemStackCalls = map[string]bool{
	"runtime.systemstack": true,
	"runtime.asmcgocall":  true,
}

// goFunc is a function whose rows its SP deltas alone do not give: a
// stack end, or an assembly function whose code is known.
type goFunc struct {
	pclntab.Func
	// stackEnd: the stack ends anywhere in it (CFAEnd).
	stackEnd bool
	// switches: it moves SP to another stack (the runtime's cgo calls and
	// callbacks, systemstack, vDSO calls on the system stack). Its SP
	// deltas stop saying where its frame is once it does, but RBP still
	// points at the frame its prologue opened: from there on the CFA is
	// RBP+16.
	switches bool
	// systemCall: one of systemStackCalls, which ends the stack unless it
	// has the frame-pointer prologue.
	systemCall bool
	// recordSwitch: runtime.systemstack on arm64, whose frame record stays
	// where x29 points while it runs a function on the system stack
	// (recordRows).
	recordSwitch bool
	// cgoSwitch: runtime.asmcgocall on arm64 with its code known
	// (cgoRows).
	cgoSwitch bool
	// crossCall: crosscall2 on arm64 with its code known (crossCallRows).
	crossCall bool
}

// recordSwitches are the arm64 switches between stacks that keep x29 on
// their frame record on the stack they came from. The Go assembler opens
// every arm64 frame the same way, whatever the code: "MOVD.W R30,
// -size(RSP); MOVD R29, -8(RSP); SUB $8, RSP, R29", the caller's x29 and
// the return address paired at x29, the caller's SP at x29 + 8 + size.
// runtime.systemstack moves SP to the system stack and leaves x29 alone;
// runtime.cgocallback, called by C through crosscall2 on the system stack,
// moves SP to the goroutine's stack for the Go callback and leaves x29 on
// its record on the system stack, among the C frames (both as Go 1.26's
// runtime does; older releases are not checked). runtime.asmcgocall
// points x29 at the system stack's frame (g0.sched.bp): cgoRows finds its
// way back where its code is known, and without the code it stays an end
// (systemStackCalls).
var recordSwitches = map[string]bool{
	"runtime.systemstack": true,
	"runtime.cgocallback": true,
	// The vDSO calls: walltime and nanotime1 move SP to the system stack
	// (from a goroutine's), vgetrandom1 aligns it down; none writes x29.
	"runtime.walltime":    true,
	"runtime.nanotime1":   true,
	"runtime.vgetrandom1": true,
}

// recordRows appends to add the rows of a recordSwitch function g: the
// return address in x30 at entry, and from the prologue on its frame
// located from x29, on whichever stack SP is. In the prologue's two
// instructions after the store of x30, where x29 is still the caller's,
// the frame is SP's (CFASPGo). In the one instruction of the epilogue
// between the reload of x29 and the pop of the frame, x29 is already the
// caller's: a sample there loses its caller's frame.
func recordRows(ranges []spRange, add func(Row)) {
	for i, r := range ranges {
		row := Row{PC: r.start}
		switch {
		case r.delta == 0:
			row.CFA = CFASPLR
		case r.delta > 0 && r.delta < 1<<15-8:
			if i == 1 && ranges[0].delta == 0 && r.start == ranges[0].start+4 && r.stop > r.start+8 {
				add(Row{PC: r.start, CFA: CFASPGo, CFAOffset: r.delta})
				row.PC = r.start + 8
			}
			off := r.delta + 8
			row.CFA, row.CFAOffset, row.FP, row.FPOffset = CFAFPRecord, off, FPOffset, -int16(off)
		}
		add(row)
	}
}

// funcCode reads the code of an assembly function of the runtime, the
// extent of its SP ranges (none: no code), bounded by maxCgoCallBytes; start
// is its first byte's address.
func funcCode(ranges []spRange, code codeReader) (start uint64, b []byte, err error) {
	if len(ranges) == 0 {
		return 0, nil, nil
	}
	start, stop := ranges[0].start, ranges[len(ranges)-1].stop
	if stop <= start || stop-start > maxCgoCallBytes {
		return 0, nil, fmt.Errorf("%d bytes of code, more than %d", stop-start, maxCgoCallBytes)
	}
	b = make([]byte, stop-start)
	if err := code(start, b); err != nil {
		return 0, nil, err
	}
	return start, b, nil
}

// insnAt returns the arm64 instruction at pc of code b read from start; 0
// (udf) outside it.
func insnAt(b []byte, start, pc uint64) uint32 {
	if pc < start || pc-start > uint64(len(b)) || pc-start+4 > uint64(len(b)) {
		return 0
	}
	return binary.LittleEndian.Uint32(b[pc-start:])
}

// crossCall is the C-callable entry of a callback into Go: cgo's C
// wrappers of exported functions call it, and it calls
// runtime.cgocallback.
const crossCall = "crosscall2"

// The arm64 stores and loads of the frame record crossCallRows reads: stp
// and ldp of x29 and x30 at [sp, #imm] (64-bit, signed offset), imm7 in
// bits 15-21 scaled by 8.
const (
	a64StpRecord = 0xa9007bfd
	a64LdpRecord = 0xa9407bfd
	a64PairImm   = 0xffc07fff // all but imm7
)

// crossCallRows appends to add the rows of crosscall2 on arm64 from its SP
// ranges and its code. It is assembly without the Go prologue: it moves SP
// by a constant (the SP deltas say where the CFA is) and stores the
// caller's x29 and its return address as a pair on its frame, then calls
// Go. Until the store and from the pair's reload on the return address is
// in x30 (CFASPLR); in between, in the pair (CFASPRecord). A crosscall2
// whose store is not found keeps the SP deltas' rows, whose return address
// at SP is not its.
func crossCallRows(ranges []spRange, code codeReader, add func(Row)) error {
	start, b, err := funcCode(ranges, code)
	if err != nil {
		return err
	}
	stored := false
	var at int64 // the pair's offset from SP
	for _, r := range ranges {
		for pc := r.start; pc < r.stop; pc += 4 {
			row := spRow(pc, r.delta, true)
			switch {
			case r.delta > 0 && stored && at+8 < int64(r.delta) && int64(r.delta) < 1<<15:
				row.CFA, row.CFAOffset, row.FP, row.FPOffset = CFASPRecord, r.delta, FPOffset, int16(at-int64(r.delta))
			case r.delta > 0:
				row.CFA, row.CFAOffset = CFASPLR, r.delta
			}
			add(row)
			in := insnAt(b, start, pc)
			imm := int64(int32(in<<10)>>25) * 8
			switch in & a64PairImm {
			case a64StpRecord:
				stored, at = true, imm
			case a64LdpRecord:
				stored = false
			}
		}
	}
	return nil
}

// cgoCall is the runtime's call of a C function on the system stack.
const cgoCall = "runtime.asmcgocall"

// The arm64 instructions cgoRows reads: values, and the masks that leave
// out their register fields.
const (
	a64MovSP  = 0x9100001f // mov sp, xN
	a64BLR    = 0xd63f0000 // blr xN
	a64StrSP  = 0xf90003e0 // str xT, [sp]
	a64StrSP8 = 0xf90007e0 // str xT, [sp, #8]
	a64Ret    = 0xd65f03c0 // ret
	a64RegN   = 0xfffffc1f // all but Rn
	a64RegT   = 0xffffffe0 // all but Rt
)

// maxCgoCallBytes bounds the code cgoRows and crossCallRows read (Go
// 1.26's runtime.asmcgocall is 240 bytes, crosscall2 108).
const maxCgoCallBytes = 4096

// cgoRows appends to add the rows of runtime.asmcgocall on arm64 from
// its SP ranges and its code. It opens its frame as every Go arm64 frame,
// then moves SP to the system stack and x29 to the system stack's frame,
// saves there the goroutine's g and the depth of its frame below
// g.stack.hi (or 0 and the frame's SP, on the system stack already), and
// calls C with blr. From the blr (a return address is looked up in it) to
// the move of SP back to the frame the rows are CFAGoCgo: the frame is
// found from the two saved words. Between the first move of SP and the
// blr, where nothing leads back yet, the stack ends, as it does in the
// whole function without its code. A blr is taken for the call of C only
// right after the two stores: other code keeps the rows of an end.
func cgoRows(ranges []spRange, code codeReader, add func(Row)) error {
	start, b, err := funcCode(ranges, code)
	if err != nil {
		return err
	}
	insn := func(pc uint64) uint32 { return insnAt(b, start, pc) }
	// saved says whether the two words are stored right before pc: the
	// depth (or SP) at SP+8 by the instruction before, g (or 0) at SP
	// within the three before that.
	saved := func(pc uint64) bool {
		if insn(pc-4)&a64RegT != a64StrSP8 {
			return false
		}
		for i := uint64(2); i <= 4; i++ {
			if insn(pc-4*i)&a64RegT == a64StrSP {
				return true
			}
		}
		return false
	}
	const (
		onFrame = iota // SP is the frame's: the SP deltas hold
		away           // SP is on the system stack, nothing saved yet
		inC            // the call of C: the frame from the saved words
	)
	state := onFrame
	for _, r := range ranges {
		for pc := r.start; pc < r.stop; pc += 4 {
			in := insn(pc)
			if state == away && in&a64RegN == a64BLR && saved(pc) {
				state = inC
			}
			row := spRow(pc, r.delta, true)
			switch {
			case state == away:
				row = Row{PC: pc, CFA: CFAEnd}
			case state == inC && row.CFA == CFASPGo:
				row.CFA = CFAGoCgo
			case state == inC:
				row = Row{PC: pc, CFA: CFAEnd}
			}
			add(row)
			switch {
			case in&a64RegN == a64MovSP && state == inC:
				state = onFrame
			case in&a64RegN == a64MovSP:
				state = away
			case in == a64Ret:
				state = onFrame // what follows is reached by a branch from the frame
			}
		}
	}
	return nil
}

// specialRows appends to add the rows of g, a special function other than
// a stack end, from its SP ranges and, where its rows need it, its code.
func specialRows(g *goFunc, ranges []spRange, code codeReader, add func(Row)) error {
	switch {
	case g.recordSwitch:
		recordRows(ranges, add)
		return nil
	case g.crossCall:
		return crossCallRows(ranges, code, add)
	case g.cgoSwitch:
		return cgoRows(ranges, code, add)
	}
	return asmRows(g, ranges, code, add)
}

// spRange is one range of a function's SP-delta table.
type spRange struct {
	start, stop uint64
	delta       int32
}

// fpPrologue is the frame-pointer prologue the Go assembler writes in a
// function with a frame, after the stack-split check if any: push %rbp
// (55); mov %rsp,%rbp (48 89 e5).
var fpPrologue = []byte{0x55, 0x48, 0x89, 0xe5}

// asmRows appends to add the rows of the assembly function g from its SP
// ranges and its code. The push of RBP is the first instruction that moves
// SP, so the prologue, if any, starts one byte before the first range with
// a delta; from its end RBP points at the frame. Without it the function
// never saves RBP: RBP stays the caller's.
func asmRows(g *goFunc, ranges []spRange, code codeReader, add func(Row)) error {
	var push uint64 // the prologue's push %rbp; 0: none
	for _, r := range ranges {
		if r.delta == 0 {
			continue
		}
		if r.delta == 8 && r.start > g.Entry {
			b := make([]byte, len(fpPrologue))
			if err := code(r.start-1, b); err != nil {
				return err
			}
			if bytes.Equal(b, fpPrologue) {
				push = r.start - 1
			}
		}
		break
	}
	if g.systemCall && push == 0 {
		add(Row{PC: ranges[0].start, CFA: CFAEnd})
		return nil
	}
	set := push + uint64(len(fpPrologue)) // RBP points at the frame from here
	row := func(pc uint64, delta int32) Row {
		r := Row{PC: pc}
		switch {
		case delta < 0:
			// CFAUnknown
		case g.switches && push != 0 && delta >= 8 && pc >= set:
			r.CFA, r.CFAOffset, r.FP, r.FPOffset = CFAFP, 16, FPOffset, -16
		default:
			r.CFA, r.CFAOffset = CFASP, delta+8
			if push != 0 && delta >= 8 && pc > push {
				r.FP, r.FPOffset = FPOffset, -16
			}
		}
		return r
	}
	for _, r := range ranges {
		if g.switches && push != 0 && r.start < set && r.stop > set {
			// The range holding the end of the prologue splits there.
			add(row(r.start, r.delta))
			r.start = set
		}
		add(row(r.start, r.delta))
	}
	return nil
}

// goRowsSlack is the room reserved beyond maxGoRows: the last special
// function's rows and fileRows's.
const goRowsSlack = 1 << 16

// goRowsPerFunc is about how many rows a Go function takes (the agent's
// own binary: 6).
const goRowsPerFunc = 6

// maxCodeSegments is the number of executable segments the rows leave
// room for (fileRows adds two rows per segment); a Go binary has one.
const maxCodeSegments = 4

// codeReader reads len(b) bytes of code at virtual address addr.
type codeReader func(addr uint64, b []byte) error

// dropEvery is how many functions, then SP ranges, fromGo reads between two
// calls of its drop function. Where the page cache holds files in large
// folios, one read maps up to 256 KiB of them, so 1024 functions held
// megabytes of a big Go binary's pclntab; at 128 the node-like host's
// start-up, with six big Go binaries to build, peaked 3-5 MB lower, at no
// measurable cost in CPU.
const dropEvery = 1 << 7

// fromGo is FromGo with the code of the binary read by code (nil: unknown).
// drop, if set, is called every dropEvery SP ranges read: a pclntab read in
// place from a mapping lets go of the pages read so far (a big binary's is
// 40 MB, which would otherwise all count in the agent's RSS at once).
func fromGo(t *pclntab.Table, code codeReader, drop func()) (*Table, error) {
	lr := linkRegister(t)
	funcs, err := goFuncs(t, code, drop)
	if err != nil {
		return nil, err
	}
	// The rows are reserved outside the heap at the most a table may have
	// (nothing is committed until written): one pass over the SP deltas, and
	// no regrowth of a million rows. The room beyond lets the special
	// functions' rows, added a function at a time, and fileRows's in-place
	// re-keying fit.
	var mem releases
	rows := reserve[Row](&mem, maxGoRows+goRowsSlack, goRowsPerFunc*t.NumFuncs())
	ok := false
	defer func() {
		if !ok {
			mem.run()
		}
	}()
	ranges := 0
	var end uint64
	var frame int32 // goFrameRow's
	var st Stats
	add := func(r Row) {
		if r.CFA == CFAUnknown {
			st.Unknown++
		}
		if n := len(rows); n > 0 && rows[n-1].sameRule(r) {
			return // equal neighbours merge
		}
		rows = append(rows, r)
		mem.passed(len(rows) - 1)
	}
	// The ranges of the special function funcs[0], held until it ends.
	var held []spRange
	var codeErr error
	flush := func() bool {
		if len(held) == 0 {
			return true
		}
		g := &funcs[0]
		if g.stackEnd {
			add(Row{PC: held[0].start, CFA: CFAEnd})
		} else if err := specialRows(g, held, code, add); err != nil {
			codeErr = fmt.Errorf("go tables: code of %s: %w", t.FuncName(g.Func), err)
			return false
		}
		held = held[:0]
		return true
	}
	err = t.SPDeltas(func(start, stop uint64, delta int32) bool {
		if ranges++; drop != nil && ranges%dropEvery == 0 {
			drop()
		}
		if delta == pclntab.Padding {
			// No instruction runs in the fill after a function, and a
			// return address there (after a call that never returns) is
			// looked up one byte before it, in the function: the row
			// before covers it. One row fewer per function, and the next
			// function's entry often merges with its predecessor's end.
			end = stop
			return true
		}
		for len(funcs) > 0 && funcs[0].End <= start {
			if !flush() {
				return false
			}
			funcs = funcs[1:]
		}
		end = stop
		if len(funcs) > 0 && funcs[0].Entry <= start {
			held = append(held, spRange{start, stop, delta})
			return true
		}
		row := spRow(start, delta, lr)
		if lr {
			row = goFrameRow(row, delta, &frame)
		}
		add(row)
		return len(rows) < maxGoRows
	})
	if err == nil && len(funcs) > 0 {
		flush()
	}
	switch {
	case err != nil:
		return nil, err
	case codeErr != nil:
		return nil, codeErr
	case len(rows) == 0:
		return nil, ErrNoCFI
	case len(rows) >= maxGoRows:
		return nil, fmt.Errorf("go tables: more than %d rows", maxGoRows)
	}
	rows = append(rows, Row{PC: end})
	st.Rows = len(rows)
	ok = true
	return &Table{Rows: rows, Stats: st, mem: mem}, nil
}

// spRow is the row of compiled Go code at pc whose SP sits delta bytes
// below its value at the function's entry; a negative delta is unknown.
// The return address is at SP+delta, and the caller's RBP below it once the
// prologue pushed it. With lr (arm64) the return address is in the link
// register at entry (delta 0); a prologue that moves SP stores it at the
// new SP, the caller's x29 right below (CFASPGo).
func spRow(pc uint64, delta int32, lr bool) Row {
	r := Row{PC: pc}
	if lr {
		switch {
		case delta == 0:
			r.CFA = CFASPLR
		case delta > 0:
			r.CFA, r.CFAOffset = CFASPGo, delta
		}
		return r
	}
	if delta >= 0 {
		r.CFA, r.CFAOffset = CFASP, delta+8
		if delta >= 8 {
			r.FP, r.FPOffset = FPOffset, -16
		}
	}
	return r
}

// goFrameRow adjusts r, the arm64 row spRow gives at an SP delta of delta,
// for code that moves SP below the frame its prologue opened: the runtime's
// calls of C on the current stack (runtime.callCgoMmap and its like)
// reserve 16 bytes more for the C function. The return address stays where
// the prologue stored it, at the frame's SP, with the caller's x29 below:
// a pair at CFA - frame - 8 (CFASPRecord), not at SP. frame holds the
// frame's size across the calls, for one function's ranges in order: the
// first positive delta after a delta of 0 (an entry, or the end of an
// epilogue).
func goFrameRow(r Row, delta int32, frame *int32) Row {
	switch {
	case delta <= 0:
		*frame = 0
	case *frame == 0:
		*frame = delta
	case delta > *frame && r.CFA == CFASPGo && *frame < 1<<15-8:
		r.CFA, r.FP, r.FPOffset = CFASPRecord, FPOffset, -int16(*frame+8)
	}
	return r
}

// linkRegister reports whether t's architecture calls through a link
// register (arm64, where instructions are 4 bytes) rather than pushing the
// return address (x86, 1-byte quantum).
func linkRegister(t *pclntab.Table) bool { return t.PCQuantum() != 1 }

// goFuncs returns, in address order, the functions of t whose rows their
// SP deltas alone do not give: the stack ends, and when code is known the
// assembly functions.
func goFuncs(t *pclntab.Table, code codeReader, drop func()) ([]goFunc, error) {
	lr := linkRegister(t)
	var out []goFunc
	n := 0
	err := t.Funcs(func(f pclntab.Func) bool {
		if n++; drop != nil && n%dropEvery == 0 {
			drop() // each function's record is read once: the pages can go
		}
		if g, special := classifyGo(t, f, code != nil, lr); special {
			out = append(out, g)
		}
		return true
	})
	return out, err
}

// classifyGo says whether f is a function whose rows its SP deltas alone do
// not give (special), and how it is special; haveCode: its code can be
// read; lr: the architecture calls through a link register (arm64).
func classifyGo(t *pclntab.Table, f pclntab.Func, haveCode, lr bool) (g goFunc, special bool) {
	spWrite := f.Flag&pclntab.FlagSPWrite != 0
	asm := f.Flag&pclntab.FlagAsm != 0
	var name string
	if spWrite || lr && asm && haveCode {
		name = t.FuncName(f)
	}
	g = goFunc{Func: f, switches: spWrite, systemCall: systemStackCalls[name]}
	switch {
	case f.Flag&pclntab.FlagTopFrame != 0 || stackBottoms[name]:
		g.stackEnd = true
	case lr && recordSwitches[name]:
		g.recordSwitch = true
	case lr && name == cgoCall && haveCode:
		g.cgoSwitch = true
	case lr && name == crossCall && haveCode:
		g.crossCall = true
	case asm && haveCode && !lr:
	case g.systemCall:
		g.stackEnd = true // without the code, its prologue is unknown
	default:
		return g, false
	}
	return g, true
}

// elfCode returns the reader of f's loaded code; nil where this package
// reads no code of the architecture (x86-64's assembly functions, arm64's
// runtime.asmcgocall).
func elfCode(f *elf.File) codeReader {
	if f.Machine != elf.EM_X86_64 && f.Machine != elf.EM_AARCH64 {
		return nil
	}
	return func(addr uint64, b []byte) error { return readCode(f, addr, b) }
}

// readCode reads len(b) bytes at virtual address addr of f's loaded code.
func readCode(f *elf.File, addr uint64, b []byte) error {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || addr < p.Vaddr || addr-p.Vaddr+uint64(len(b)) > p.Filesz {
			continue
		}
		_, err := p.ReadAt(b, int64(addr-p.Vaddr))
		return err
	}
	return fmt.Errorf("address %#x is outside the file's code", addr)
}

// fromFile builds the table of an ELF file: from the pclntab for Go code
// and from CFI for the rest (C code in cgo binaries, every other file). img
// holds f's bytes (a read-only mapping; nil: read f's sections into the
// heap): the pclntab and the code are then read in place. debug is f's
// separate debug file or nil; its .debug_frame adds to f's CFI as
// FromSeparateDebug does. drop, if set, lets go of img's pages read so
// far; the pclntab and CFI parses call it as they go.
func fromFile(f *elf.File, img []byte, debug *elf.File, drop func()) (*Table, error) {
	if pclntab.Section(f) == nil {
		return fromSeparateDebug(f, img, debug, pcRange{}, drop)
	}
	pt, err := pclntab.OpenELFImage(f, img)
	if err != nil {
		return fromSeparateDebug(f, img, debug, pcRange{}, drop)
	}
	gt, err := fromGo(pt, elfCode(f), drop)
	if err != nil {
		return fromSeparateDebug(f, img, debug, pcRange{}, drop)
	}
	// The CFI matters only outside the Go code, which mergeOutside takes
	// from gt: an unstripped Go binary's .debug_frame describes every Go
	// function again, as many rows as gt's, built for nothing.
	cfi, cfiErr := fromSeparateDebug(f, img, debug, pcRange{gt.Rows[0].PC, gt.Rows[len(gt.Rows)-1].PC}, drop)
	if cfiErr != nil {
		if !errors.Is(cfiErr, ErrNoCFI) {
			gt.release()
			return nil, cfiErr
		}
		return gt, nil
	}
	defer gt.release()
	defer cfi.release()
	return mergeOutside(gt, cfi), nil
}

// mergeOutside returns inner's rows, with outer's rows before and after
// inner's range; at the end of inner's range outer's rule there resumes.
// The result lives outside the heap, as its inputs do (a cgo binary's
// merge is a big Go binary's rows again), with fileRows's room after it.
func mergeOutside(inner, outer *Table) *Table {
	lo, hi := inner.Rows[0].PC, inner.Rows[len(inner.Rows)-1].PC
	var mem releases
	n := len(inner.Rows) + len(outer.Rows) + 2*maxCodeSegments
	out := reserve[Row](&mem, n, n)
	add := func(r Row) {
		if n := len(out); n > 0 && out[n-1].sameRule(r) {
			return // equal neighbours merge
		}
		out = append(out, r)
		mem.passed(len(out) - 1)
		inner.mem.passed(len(out) - 1)
	}
	for _, r := range outer.Rows {
		if r.PC < lo {
			add(r)
		}
	}
	for _, r := range inner.Rows[:len(inner.Rows)-1] {
		add(r)
	}
	resume := Row{PC: hi}
	if r, ok := outer.Lookup(hi); ok {
		resume = r
		resume.PC = hi
	}
	add(resume)
	for _, r := range outer.Rows {
		if r.PC > hi {
			add(r)
		}
	}
	return &Table{Rows: out, Stats: Stats{Rows: len(out)}, mem: mem}
}
