package pclntab

import (
	"bufio"
	"bytes"
	"debug/elf"
	"debug/gosym"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// goToolBinary is a large Go binary every test machine with a toolchain has.
func goToolBinary(tb testing.TB) string {
	tb.Helper()
	gotool := testutil.RequireTool(tb, "go")
	out, err := exec.Command(gotool, "env", "GOROOT").Output()
	if err != nil {
		tb.Fatalf("go env GOROOT: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "bin", "go")
}

func openELF(tb testing.TB, path string) *Table {
	tb.Helper()
	f, err := elf.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	tab, err := OpenELF(f)
	if err != nil {
		tb.Fatalf("OpenELF(%s): %v", path, err)
	}
	return tab
}

// runtimeStack is one physical frame as the fixture's runtime reports it.
type runtimeStack struct {
	pc     uint64
	frames []Frame
}

// runFixture runs inlprog and parses what runtime.CallersFrames told it.
func runFixture(t *testing.T, bin string) []runtimeStack {
	t.Helper()
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	var stacks []runtimeStack
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pc "):
			pc, err := strconv.ParseUint(strings.TrimPrefix(line, "pc "), 16, 64)
			if err != nil {
				t.Fatalf("fixture line %q: %v", line, err)
			}
			stacks = append(stacks, runtimeStack{pc: pc})
		case strings.HasPrefix(line, "frame "):
			f := strings.Split(strings.TrimPrefix(line, "frame "), "\t")
			n, err := strconv.ParseInt(f[len(f)-1], 10, 64)
			if len(f) != 3 || err != nil || len(stacks) == 0 {
				t.Fatalf("fixture line %q", line)
			}
			last := &stacks[len(stacks)-1]
			last.frames = append(last.frames, Frame{Function: f[0], File: f[1], Line: n})
		}
	}
	return stacks
}

func TestFramesMatchRuntime(t *testing.T) {
	tests := []struct {
		name  string
		flags []string
	}{
		{"exe", nil},
		// No ELF symbols: the moduledata must be found by its content.
		{"stripped", []string{"-ldflags=-s -w"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := testutil.BuildGo(t, "inlprog", "testdata/inlprog", tt.flags...)
			tab := openELF(t, bin)
			stacks := runFixture(t, bin)
			inlined := 0
			for _, s := range stacks {
				got, err := tab.Frames(s.pc, nil)
				if err != nil {
					t.Fatalf("Frames(%#x): %v", s.pc, err)
				}
				if diff := cmp.Diff(s.frames, got); diff != "" {
					t.Errorf("Frames(%#x) (-want +got):\n%s", s.pc, diff)
				}
				if len(s.frames) > 1 {
					inlined++
				}
				// Every captured PC is a call site inside a function with a
				// frame (goexit's is its entry): the pcsp table says so.
				start, _, ok := tab.FuncRange(s.pc)
				if !ok {
					t.Fatalf("FuncRange(%#x) found nothing", s.pc)
				}
				if d, ok := tab.SPDelta(s.pc); !ok || d < 0 || d%8 != 0 || (s.pc != start) != (d > 0) {
					t.Errorf("SPDelta(%#x) = %d, %v in function at %#x", s.pc, d, ok, start)
				}
			}
			if len(stacks) < 12 || inlined < 4 {
				t.Fatalf("fixture gave %d physical frames, %d with inlined calls; want >= 12 and >= 4", len(stacks), inlined)
			}
		})
	}
}

// TestAgreesWithGosym compares every function of a few binaries with
// debug/gosym: the name at the entry and interior PCs, which gosym reports
// without inline expansion, and the innermost file and line.
func TestAgreesWithGosym(t *testing.T) {
	bins := map[string]func(t *testing.T) string{
		"fixture":     func(t *testing.T) string { return testutil.BuildGo(t, "inlprog", "testdata/inlprog") },
		"fixture-pie": func(t *testing.T) string { return testutil.BuildGo(t, "inlprog", "testdata/inlprog", "-buildmode=pie") },
		"go-tool":     func(t *testing.T) string { return goToolBinary(t) },
	}
	for name, build := range bins {
		t.Run(name, func(t *testing.T) {
			bin := build(t)
			tab := openELF(t, bin)
			ref := gosymTable(t, bin)
			if tab.NumFuncs() != len(ref.Funcs) {
				t.Errorf("NumFuncs = %d, debug/gosym has %d", tab.NumFuncs(), len(ref.Funcs))
			}
			checked, inlined := 0, 0
			var frames []Frame
			for _, fn := range ref.Funcs {
				start, end, ok := tab.FuncRange(fn.Entry)
				if !ok || start != fn.Entry || end != fn.End {
					t.Errorf("%s: FuncRange(%#x) = %#x, %#x, %v; want %#x, %#x", fn.Name, fn.Entry, start, end, ok, fn.Entry, fn.End)
					continue
				}
				if d, ok := tab.SPDelta(fn.Entry); ok && d != 0 {
					t.Errorf("%s: SPDelta at entry = %d", fn.Name, d)
				}
				if strings.HasPrefix(fn.Name, "go:text") {
					// Linker markers (go:textfipsstart) have no line table;
					// gosym decodes one from pctab offset 0 anyway, the
					// runtime (and Frames) says "?", 0.
					continue
				}
				size := fn.End - fn.Entry
				for _, pc := range []uint64{fn.Entry, fn.Entry + size/3, fn.Entry + 2*size/3, fn.End - 1} {
					var err error
					frames, err = tab.Frames(pc, frames[:0])
					if err != nil || len(frames) == 0 {
						t.Fatalf("%s: Frames(%#x) = %v, %v", fn.Name, pc, frames, err)
					}
					file, line, _ := ref.PCToLine(pc)
					if line <= 0 || file == "" {
						// gosym's "no position" is the runtime's "?", 0.
						file, line = "?", 0
					}
					want := Frame{Function: fn.Name, File: file, Line: int64(line)}
					got := Frame{Function: frames[len(frames)-1].Function, File: frames[0].File, Line: frames[0].Line}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("%#x (-want +got):\n%s", pc, diff)
					}
					if len(frames) > 1 {
						inlined++
					}
					checked++
				}
			}
			t.Logf("%d functions, %d PCs checked, %d inside inlined calls", len(ref.Funcs), checked, inlined)
			if inlined == 0 {
				t.Error("no PC inside an inlined call: the inline tree was not read")
			}
		})
	}
}

func gosymTable(tb testing.TB, bin string) *gosym.Table {
	tb.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	data, err := Section(f).Data()
	if err != nil {
		tb.Fatal(err)
	}
	ref, err := gosym.NewTable(nil, gosym.NewLineTable(data, f.Section(".text").Addr))
	if err != nil {
		tb.Fatal(err)
	}
	return ref
}

func TestOpenErrors(t *testing.T) {
	valid := buildTable(t, synthFuncs())
	tests := []struct {
		name    string
		data    []byte
		unsuppd bool
	}{
		{"empty", nil, false},
		{"go1.2", header(0xfffffffb, 8, nil), true},
		{"go1.16", header(0xfffffffa, 8, nil), true},
		{"unknown magic", header(0x12345678, 8, nil), true},
		{"pointer size 3", withByte(valid, 7, 3), false},
		{"quantum 3", withByte(valid, 6, 3), false},
		{"truncated header", valid[:40], false},
		{"too many functions", withByte(valid, 8+7, 0x10), false},
		{"offset beyond data", withByte(valid, 8+3*8+6, 1), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(tt.data, 0x1000, nil)
			if err == nil {
				t.Fatal("Open succeeded")
			}
			if got := errors.Is(err, ErrUnsupported); got != tt.unsuppd {
				t.Errorf("errors.Is(%v, ErrUnsupported) = %v, want %v", err, got, tt.unsuppd)
			}
		})
	}
}

func withByte(b []byte, i int, v byte) []byte {
	b = bytes.Clone(b)
	b[i] = v
	return b
}
