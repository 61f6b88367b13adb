package unwind

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/pclntab"
	"github.com/sonde-dev/sonde/internal/testutil"
)

var (
	reObjdumpText = regexp.MustCompile(`^TEXT (\S+)\(SB\)`)
	reObjdumpInsn = regexp.MustCompile(`^\s+\S+\s+0x([0-9a-f]+)\s+[0-9a-f]+\s+(.*\S)\s*$`)
	// The two prologues the Go assembler writes on arm64: a small frame's
	// pre-indexed store of x30, and a big one's store of the pair below a
	// new SP set up in R20 (see cmd/internal/obj/arm64).
	reStoreLR  = regexp.MustCompile(`^MOVD\.W R30, -(\d+)\(RSP\)$`)
	reSubToR20 = regexp.MustCompile(`^SUB \$(\d+), RSP, R20$`)
)

// TestFromGoARM64Prologues builds a Go workload for arm64 and checks the
// table FromGo derives against the code, as `go tool objdump` prints it:
// at every function's entry the return address is in x30 (CFASPLR, or the
// stack's end), and right after every frame-building prologue the CFA is
// SP plus the frame size, the return address at SP (CFASPGo); in
// runtime.systemstack, which moves SP to the system stack, the frame is
// found from x29 instead (CFAFPRecord) once the prologue has set x29, and
// at its call on the system stack.
func TestFromGoARM64Prologues(t *testing.T) {
	bin := testutil.BuildWorkloadARM64(t, testutil.GoLeaf)
	f := openELF(t, bin)
	pt, err := pclntab.OpenELF(f)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := FromGo(pt)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(testutil.RequireTool(t, "go"), "tool", "objdump", bin).Output()
	if err != nil {
		t.Fatalf("go tool objdump: %v", err)
	}
	var (
		fn                 string
		entries, prologues int
		bad                int
		prev               [2]string // the two instructions before
		pendingSize        int64     // a prologue ends before the next instruction
		sawEntry           bool
		frame              int64 // runtime.systemstack's frame size
		switchCalls        int
		recordChecked      bool
	)
	const systemstack = "runtime.systemstack.abi0"
	isRecord := func(r Row, size int64) bool {
		return r.CFA == CFAFPRecord && int64(r.CFAOffset) == size+8 && r.FP == FPOffset && int64(r.FPOffset) == -(size+8)
	}
	check := func(pc uint64, what string, ok bool, r Row) {
		if !ok && bad < 10 {
			t.Errorf("%s at %#x (%s): row %+v", fn, pc, what, r)
		}
		if !ok {
			bad++
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := reObjdumpText.FindStringSubmatch(line); m != nil {
			fn, sawEntry, pendingSize, prev = m[1], false, 0, [2]string{}
			continue
		}
		m := reObjdumpInsn.FindStringSubmatch(line)
		// go:textfipsstart and its like mark places, not functions:
		// the pclntab has none of them.
		if m == nil || fn == "" || strings.HasPrefix(fn, "go:") {
			continue
		}
		pc, _ := strconv.ParseUint(m[1], 16, 64)
		insn := m[2]
		r, found := tab.Lookup(pc)
		if !sawEntry {
			sawEntry = true
			entries++
			check(pc, "entry: return address in x30", found && (r.CFA == CFASPLR && r.CFAOffset == 0 || r.CFA == CFAEnd), r)
		}
		if fn == systemstack && frame > 0 && prev[1] == "SUB $8, RSP, R29" {
			// Once x29 is set its frame is found from x29, whichever
			// stack SP is on.
			recordChecked = true
			check(pc, "after the prologue: cfa x29+"+strconv.FormatInt(frame+8, 10)+", the frame record at x29",
				found && isRecord(r, frame), r)
		}
		if pendingSize > 0 && fn == systemstack {
			frame = pendingSize
		}
		if pendingSize > 0 {
			prologues++
			check(pc, "after the prologue: cfa sp+"+strconv.FormatInt(pendingSize, 10)+", return address at sp",
				found && (r.CFA == CFASPGo && int64(r.CFAOffset) == pendingSize || r.CFA == CFAEnd), r)
			pendingSize = 0
		}
		// The call of the function systemstack runs on the system stack,
		// once SP is there: its return address, looked up in the call,
		// finds the frame record on the goroutine's stack.
		if fn == systemstack && strings.HasPrefix(insn, "CALL (R") && slices.Contains(prev[:], "MOVD R3, RSP") {
			switchCalls++
			check(pc, "the call on the system stack: the frame record at x29", found && isRecord(r, frame), r)
		}
		if mm := reStoreLR.FindStringSubmatch(insn); mm != nil {
			pendingSize, _ = strconv.ParseInt(mm[1], 10, 64)
		}
		if insn == "MOVD R20, RSP" && strings.HasPrefix(prev[1], "STP (R29, R30), -8(R20)") {
			if mm := reSubToR20.FindStringSubmatch(prev[0]); mm != nil {
				pendingSize, _ = strconv.ParseInt(mm[1], 10, 64)
			}
		}
		prev = [2]string{prev[1], insn}
	}
	if entries < 1000 || prologues < 500 || switchCalls != 1 || !recordChecked {
		t.Errorf("checked %d entries, %d prologues and %d calls of runtime.systemstack on the system stack: the objdump parse found too few (want 1 call)", entries, prologues, switchCalls)
	}
	t.Logf("%d functions' entries and %d prologues checked, %d disagree; %d rows", entries, prologues, bad, len(tab.Rows))
}

// TestCgoCallARM64Rows builds a static cgo program for arm64 and checks the
// rows fromFile derives for runtime.asmcgocall from its code, against
// `go tool objdump`: at each of its two calls of C (the goroutine's, and
// the one made on the system stack already) the frame is found from the
// words saved at SP (CFAGoCgo, at the frame's size), from the instruction
// after the move of SP back on the frame's rows hold again (CFASPGo), and
// between the first move of SP and the call the stack ends.
func TestCgoCallARM64Rows(t *testing.T) {
	bin := testutil.BuildWorkloadARM64(t, testutil.GoCall)
	tab, err := fromFile(openELF(t, bin), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(testutil.RequireTool(t, "go"), "tool", "objdump", "-s", `^runtime\.asmcgocall\.abi0$`, bin).Output()
	if err != nil {
		t.Fatalf("go tool objdump: %v", err)
	}
	var (
		frame              int64
		moved, inC, popped bool
		calls, returns     int
		checked            int
	)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := reObjdumpInsn.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		pc, _ := strconv.ParseUint(m[1], 16, 64)
		insn := m[2]
		if insn == "?" {
			continue // the fill after the function
		}
		r, found := tab.Lookup(pc)
		want := func(what string, ok bool) {
			checked++
			if !found || !ok {
				t.Errorf("%#x %q: want %s, row %+v (found %v)", pc, insn, what, r, found)
			}
		}
		// The call's own row is the one its return address finds.
		if strings.HasPrefix(insn, "CALL (R") && moved {
			calls++
			inC, moved = true, false
		}
		switch {
		case popped:
			want("sp+lr", r.CFA == CFASPLR)
		case inC:
			want(fmt.Sprintf("go+cgo %d", frame), r.CFA == CFAGoCgo && int64(r.CFAOffset) == frame)
		case moved:
			want("end", r.CFA == CFAEnd)
		case frame > 0:
			want(fmt.Sprintf("sp+go %d", frame), r.CFA == CFASPGo && int64(r.CFAOffset) == frame)
		}
		switch {
		case frame == 0 && reStoreLR.MatchString(insn):
			frame, _ = strconv.ParseInt(reStoreLR.FindStringSubmatch(insn)[1], 10, 64)
		case strings.HasPrefix(insn, "MOVD R") && strings.HasSuffix(insn, ", RSP") && inC:
			returns++
			inC = false
		case strings.HasPrefix(insn, "MOVD R") && strings.HasSuffix(insn, ", RSP"):
			moved = true
		case strings.HasPrefix(insn, "MOVD.P ") && strings.HasSuffix(insn, ", R30"):
			popped = true // the frame is gone: the return address is in x30
		case insn == "RET":
			moved, inC, popped = false, false, false
		}
	}
	if frame := CFAGoCgo.String(); calls != 2 || returns != 2 || checked < 40 {
		t.Errorf("%s: %d calls of C and %d moves back, %d instructions checked: want 2, 2 and the whole function", frame, calls, returns, checked)
	}
	t.Logf("%d instructions of runtime.asmcgocall checked, %d calls of C", checked, calls)
}

// TestCgoCallbackARM64Rows builds a static cgo program whose C calls back
// into Go, for arm64, and checks the rows fromFile derives for the two
// functions of the callback that the SP deltas do not describe, against
// `go tool objdump`. In crosscall2 the return address is in x30 until the
// store of the pair x29, x30 and from its reload on, and in the pair in
// between, at the CFA the SP deltas give. In runtime.cgocallback, which
// calls Go on the goroutine's stack, the frame is found from x29 once the
// prologue has set it (CFAFPRecord), and from SP in the prologue. And in
// runtime.callCgoMmap and its like, which call C below their frame, the
// return address is where the prologue stored it.
func TestCgoCallbackARM64Rows(t *testing.T) {
	bin := testutil.BuildWorkloadARM64(t, testutil.GoCgo)
	tab, err := fromFile(openELF(t, bin), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	objdump := func(fn string) []objdumpInsn { return objdumpFunc(t, bin, fn) }
	check := func(fn string, in objdumpInsn, what string, ok func(Row) bool) {
		r, found := tab.Lookup(in.pc)
		if !found || !ok(r) {
			t.Errorf("%s %#x %q: want %s, row %+v (found %v)", fn, in.pc, in.text, what, r, found)
		}
	}

	reSub := regexp.MustCompile(`^SUB \$(\d+), RSP, RSP$`)
	reStp := regexp.MustCompile(`^STP \(R29, R30\), (\d+)\(RSP\)$`)
	var frame, pair int64
	stored, calls := false, 0
	for _, in := range objdump(`^crosscall2$`) {
		switch {
		case stored:
			check("crosscall2", in, fmt.Sprintf("sp+%d, the pair at sp+%d", frame, pair), func(r Row) bool {
				return r.CFA == CFASPRecord && int64(r.CFAOffset) == frame && r.FP == FPOffset && int64(r.FPOffset) == pair-frame
			})
		default:
			check("crosscall2", in, fmt.Sprintf("x30, sp+%d", frame), func(r Row) bool {
				return r.CFA == CFASPLR && int64(r.CFAOffset) == frame
			})
		}
		if strings.HasPrefix(in.text, "CALL ") && stored {
			calls++
		}
		if m := reSub.FindStringSubmatch(in.text); m != nil {
			frame, _ = strconv.ParseInt(m[1], 10, 64)
		}
		if m := reStp.FindStringSubmatch(in.text); m != nil {
			pair, _ = strconv.ParseInt(m[1], 10, 64)
			stored = true
		}
		switch {
		case strings.HasPrefix(in.text, "LDP ") && strings.HasSuffix(in.text, "(R29, R30)"):
			stored = false
		case strings.HasPrefix(in.text, "ADD ") && strings.HasSuffix(in.text, ", RSP, RSP"):
			frame = 0
		}
	}
	if calls != 2 || frame != 0 {
		t.Errorf("crosscall2: %d calls with the pair stored, want 2 (runtime.load_g, runtime.cgocallback); frame %d at the end", calls, frame)
	}

	insns := objdump(`^runtime\.cgocallback\.abi0$`)
	m := reStoreLR.FindStringSubmatch(insns[0].text)
	if m == nil {
		t.Fatalf("runtime.cgocallback opens with %q", insns[0].text)
	}
	size, _ := strconv.ParseInt(m[1], 10, 64)
	record := 0
	for i, in := range insns {
		switch {
		case i == 0:
			check("runtime.cgocallback", in, "x30 at entry", func(r Row) bool { return r.CFA == CFASPLR && r.CFAOffset == 0 })
		case i <= 2:
			check("runtime.cgocallback", in, fmt.Sprintf("sp+go %d in the prologue", size), func(r Row) bool {
				return r.CFA == CFASPGo && int64(r.CFAOffset) == size
			})
		case strings.HasPrefix(in.text, "MOVD.P ") || in.text == "RET":
			i = len(insns) // the epilogue and what follows, reached by branches, are not checked
		default:
			record++
			check("runtime.cgocallback", in, fmt.Sprintf("the frame record at x29, cfa x29+%d", size+8), func(r Row) bool {
				return r.CFA == CFAFPRecord && int64(r.CFAOffset) == size+8 && r.FP == FPOffset && int64(r.FPOffset) == -(size+8)
			})
		}
		if i >= len(insns) {
			break
		}
	}
	if record < 40 {
		t.Errorf("runtime.cgocallback: %d instructions checked with the record's rows, want its body", record)
	}
	t.Logf("crosscall2: frame %d, pair at sp+%d; runtime.cgocallback: frame %d, %d instructions on the record", frame, pair, size, record)

	// The runtime's calls of C on the current stack open a Go frame, then
	// move SP 16 bytes further for the C function: the return address
	// stays at the frame's SP, the pair x29, x30 at CFA - frame - 8.
	for _, fn := range []string{"runtime.callCgoMmap", "runtime.callCgoMunmap", "runtime.callCgoSigaction"} {
		insns := objdump(`^` + regexp.QuoteMeta(fn) + `\.abi0$`)
		m := reStoreLR.FindStringSubmatch(insns[0].text)
		if m == nil {
			t.Fatalf("%s opens with %q", fn, insns[0].text)
		}
		size, _ := strconv.ParseInt(m[1], 10, 64)
		var more int64
		calls := 0
		for _, in := range insns[3:] {
			if strings.HasPrefix(in.text, "MOVD.P ") {
				break // the epilogue
			}
			if strings.HasPrefix(in.text, "CALL ") && more > 0 {
				calls++
			}
			if more > 0 {
				check(fn, in, fmt.Sprintf("sp+%d, the pair at cfa-%d", size+more, size+8), func(r Row) bool {
					return r.CFA == CFASPRecord && int64(r.CFAOffset) == size+more && r.FP == FPOffset && int64(r.FPOffset) == -(size+8)
				})
			} else {
				check(fn, in, fmt.Sprintf("sp+go %d", size), func(r Row) bool { return r.CFA == CFASPGo && int64(r.CFAOffset) == size })
			}
			if m := reSub.FindStringSubmatch(in.text); m != nil {
				more, _ = strconv.ParseInt(m[1], 10, 64)
			}
			if strings.HasPrefix(in.text, "ADD ") && strings.HasSuffix(in.text, ", RSP, RSP") {
				more = 0
			}
		}
		if calls != 1 {
			t.Errorf("%s: %d calls with SP moved below the frame, want 1", fn, calls)
		}
	}
}

// objdumpInsn is one instruction `go tool objdump` printed.
type objdumpInsn struct {
	pc   uint64
	text string
}

// objdumpFunc returns the instructions `go tool objdump -s fn` prints of
// bin (the fill after a function left out), at least ten.
func objdumpFunc(t *testing.T, bin, fn string) []objdumpInsn {
	t.Helper()
	out, err := exec.Command(testutil.RequireTool(t, "go"), "tool", "objdump", "-s", fn, bin).Output()
	if err != nil {
		t.Fatalf("go tool objdump -s %s: %v", fn, err)
	}
	var insns []objdumpInsn
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := reObjdumpInsn.FindStringSubmatch(sc.Text()); m != nil && m[2] != "?" {
			pc, _ := strconv.ParseUint(m[1], 16, 64)
			insns = append(insns, objdumpInsn{pc, m[2]})
		}
	}
	if len(insns) < 10 {
		t.Fatalf("go tool objdump -s %s: %d instructions", fn, len(insns))
	}
	return insns
}

// TestVDSOCallARM64Rows checks, against `go tool objdump` of a GOARCH=arm64
// binary, the rows of the runtime's calls of the vDSO's clock_gettime
// (runtime.walltime, runtime.nanotime1), which move SP to the system stack
// and keep x29 on their frame record: from the prologue's end to the
// epilogue's reload of x29, the calls of the vDSO included, the frame is
// found from x29 (CFAFPRecord).
func TestVDSOCallARM64Rows(t *testing.T) {
	bin := testutil.BuildWorkloadARM64(t, testutil.GoLeaf)
	f := openELF(t, bin)
	tab, err := fromFile(f, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{"runtime.walltime", "runtime.nanotime1"} {
		insns := objdumpFunc(t, bin, `^`+regexp.QuoteMeta(fn)+`\.abi0$`)
		m := reStoreLR.FindStringSubmatch(insns[0].text)
		if m == nil {
			t.Fatalf("%s opens with %q", fn, insns[0].text)
		}
		size, _ := strconv.ParseInt(m[1], 10, 64)
		checked, calls, moved := 0, 0, false
		for _, in := range insns[3:] {
			if in.text == "MOVD -8(RSP), R29" {
				break // the epilogue
			}
			r, found := tab.Lookup(in.pc)
			if !found || r.CFA != CFAFPRecord || int64(r.CFAOffset) != size+8 || r.FP != FPOffset || int64(r.FPOffset) != -(size+8) {
				t.Errorf("%s %#x %q: want the frame record at x29, cfa x29+%d; row %+v (found %v)", fn, in.pc, in.text, size+8, r, found)
			}
			checked++
			if strings.HasPrefix(in.text, "CALL (R") && moved {
				calls++
			}
			if strings.HasPrefix(in.text, "MOVD R") && strings.HasSuffix(in.text, ", RSP") {
				moved = true
			}
		}
		if calls < 1 || checked < 20 {
			t.Errorf("%s: %d calls after SP moved, %d instructions checked", fn, calls, checked)
		}
	}
}
