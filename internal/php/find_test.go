package php

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/internal/unwind"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		name    string
		rodata  string
		want    Version
		wantErr error
	}{
		{"debian 8.2", "x\x00X-Powered-By: PHP/8.2.36\x00API20220829,NTS\x00", Version{8, 2, 36, 20220829, false}, nil},
		{"zts", "X-Powered-By: PHP/8.3.1\x00API20230831,TS,debug\x00", Version{8, 3, 1, 20230831, true}, nil},
		{"no api", "X-Powered-By: PHP/8.1.0\x00", Version{8, 1, 0, 0, false}, nil},
		{"php 7", "X-Powered-By: PHP/7.4.33\x00", Version{}, ErrUnknownVersion},
		{"no header", "PHP/8.2.1", Version{}, ErrNotPHP},
		{"cut", "X-Powered-By: PHP/8.2", Version{}, ErrNotPHP},
		{"no digits", "X-Powered-By: PHP/x.2.1", Version{}, ErrNotPHP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseVersion([]byte(tt.rodata))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestCheckVMStack(t *testing.T) {
	word := func(vs ...uint64) []byte {
		b := make([]byte, 0, 32)
		for _, v := range vs {
			b = fmt.Appendf(b, "%s", string([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24), byte(v >> 32), byte(v >> 40), byte(v >> 48), byte(v >> 56)}))
		}
		return b
	}
	if err := checkVMStack(word(0, 0, 0, 0)); err != nil {
		t.Errorf("no request yet: %v", err)
	}
	if err := checkVMStack(word(0x1100, 0x41000, 0x1000, vmStackPageSize)); err != nil {
		t.Errorf("a stack: %v", err)
	}
	for _, bad := range [][]byte{word(0x1100, 0x41000, 0x1000, 4096), word(0x900, 0x41000, 0x1000, vmStackPageSize), word(1, 2, 3, 4)} {
		if err := checkVMStack(bad); !errors.Is(err, ErrUnknownVersion) {
			t.Errorf("%x: %v, want ErrUnknownVersion", bad, err)
		}
	}
}

func TestFind(t *testing.T) {
	eachPHP(t, func(t *testing.T, php testutil.Interpreter) {
		cmd := startPHP(t, php, "php")
		in, _ := findInterp(t, cmd.Process.Pid)
		if !strings.HasPrefix(in.Version, php.Version+".") || in.Minor != php.Minor || in.Layout.Untested {
			t.Errorf("version %s (minor %d, untested %v), want %s.x tested", in.Version, in.Minor, in.Layout.Untested, php.Version)
		}
		if in.Exec.End-in.Exec.Start < 4096 || in.CurrentEx == 0 {
			t.Errorf("execute_ex %#x..%#x, current frame at %#x", in.Exec.Start, in.Exec.End, in.CurrentEx)
		}
	})
}

func TestFindHidesUnknownVersion(t *testing.T) {
	cmd := startPHP(t, testutil.PHP82(t), "php")
	procs := findProc(t, cmd.Process.Pid)
	_, err := FindWith(procs, nil, func(minor int) (Layout, error) {
		return Layout{}, fmt.Errorf("php 8.%d: %w", minor, ErrUnknownVersion)
	})
	if !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("err %v, want ErrUnknownVersion", err)
	}
}

// chainCase is a mode of burn.php and the PHP frames a sample of its leaf
// holds, innermost first, each with its file and the text on its line (the
// leaf: on its function's first line, its line in the next eight).
type chainCase struct {
	mode  string
	leaf  []string // frames that may precede the chain (internal functions)
	chain []chainFrame
}

type chainFrame struct {
	name, file, text string
}

func chainCases(t *testing.T, minor int) []chainCase {
	// A closure is {closure}; from 8.4 PHP names it by where it is
	// defined: the enclosing function ("Burner::run()"), else the file, and
	// the line.
	closure := func(file, text, in string) string {
		if minor < 4 {
			return "{closure}"
		}
		path, err := filepath.Abs(filepath.Join("testdata", file))
		if err != nil {
			t.Fatal(err)
		}
		if in == "" {
			in = path
		}
		return fmt.Sprintf("{closure:%s:%d}", in, lineOfText(t, path, text))
	}
	common := []chainFrame{
		{"alpha", "burn.php", "return beta($mode, $n, $data) + 1;"},
		{"main", "burn.php", "$sum = ($sum + alpha($mode, 200000, $data)) % 1000003;"},
		{"{main}", "burn.php", "main($argv);"},
	}
	return []chainCase{
		{mode: "php", chain: append([]chainFrame{
			{"gamma_burn", "burn.php", "function gamma_burn(int $n): int"},
			{"beta", "burn.php", "return gamma_burn($n) + 1;"}}, common...)},
		{mode: "ext", leaf: []string{"hash"}, chain: append([]chainFrame{
			{"gamma_hash", "burn.php", "return strlen(hash('sha256', $data));"},
			{"beta", "burn.php", "return gamma_hash($data) + 1;"}}, common...)},
		{mode: "closure", chain: append([]chainFrame{
			{"Burner::" + closure("burner.php", "$burn = function (int $n): int {", "Burner::run()"), "burner.php", "$burn = function (int $n): int {"},
			{"Burner::run", "burner.php", "return $burn($n);"},
			{"beta", "burn.php", "return (new Burner())->run($n) + 1;"}}, common...)},
		{mode: "include", chain: append([]chainFrame{
			{"gamma_burn", "burn.php", "function gamma_burn(int $n): int"},
			{closure("inc_burn.php", "$f = fn (int $k): int => gamma_burn($k);", ""), "inc_burn.php", "$f = fn (int $k): int => gamma_burn($k);"},
			{"{include}", "inc_burn.php", "return $f($n);"},
			{"beta", "burn.php", "return (include __DIR__ . '/inc_burn.php') + 1;"}}, common...)},
	}
}

// inLeaf says whether frames are in c's leaf function: its first frame
// after the leaf's internal ones.
func inLeaf(c chainCase, frames []StackFrame) bool {
	i := 0
	for i < len(frames) && i < len(c.leaf) && frames[i].Name == c.leaf[i] {
		i++
	}
	return i < len(frames) && frames[i].Name == c.chain[0].name
}

// matchChain checks frames (innermost first) against c: its leaf frames,
// then the chain, each frame's file and line.
func matchChain(c chainCase, frames []StackFrame, lines func(file, text string) int64) error {
	i := 0
	for i < len(frames) && i < len(c.leaf) && frames[i].Name == c.leaf[i] {
		i++
	}
	if len(frames)-i != len(c.chain) {
		return fmt.Errorf("%d frames after the leaf's, want %d", len(frames)-i, len(c.chain))
	}
	for k, w := range c.chain {
		f := frames[i+k]
		if f.Name != w.name || filepath.Base(f.File) != w.file {
			return fmt.Errorf("frame %d: %s in %s, want %s in %s", i+k, f.Name, f.File, w.name, w.file)
		}
		if k == 0 && len(c.leaf) == 0 {
			if start := lines(w.file, w.text); f.Line <= start || f.Line > start+8 {
				return fmt.Errorf("leaf %s at line %d, not in its body from line %d", f.Name, f.Line, start)
			}
			continue
		}
		if want := lines(w.file, w.text); f.Line != want {
			return fmt.Errorf("%s at line %d, want %d", f.Name, f.Line, want)
		}
	}
	return nil
}

// TestStackLive stops each mode of burn.php with ptrace again and again and
// reads its PHP stack as the eBPF walker would: the whole chain, named,
// with the call's line in each caller and a line in the leaf (taken from
// the VM's registers).
func TestStackLive(t *testing.T) {
	eachPHP(t, testStackLive)
}

func testStackLive(t *testing.T, php testutil.Interpreter) {
	lines := func(file, text string) int64 { return lineOfText(t, filepath.Join("testdata", file), text) }
	for _, c := range chainCases(t, php.Minor) {
		t.Run(c.mode, func(t *testing.T) {
			cmd := startPHP(t, php, c.mode)
			pid := cmd.Process.Pid
			in, mem := findInterp(t, pid)
			const want = 50
			whole, seen := 0, 0
			var bad []string
			deadline := time.Now().Add(30 * time.Second)
			for seen < want && time.Now().Before(deadline) {
				frames, err := snapshot(pid, in, mem)
				if err != nil {
					bad = append(bad, err.Error())
					continue
				}
				if !inLeaf(c, frames) {
					continue // between calls of the chain
				}
				seen++
				if err := matchChain(c, frames, lines); err != nil {
					if len(bad) < 5 {
						bad = append(bad, fmt.Sprintf("%v: %v", err, frames))
					}
					continue
				}
				whole++
				time.Sleep(3 * time.Millisecond) // spread the stops over the loop
			}
			t.Logf("%s: %d of %d stops whole", c.mode, whole, seen)
			for _, b := range bad {
				t.Logf("  %s", b)
			}
			if seen < want || whole*100 < seen*95 {
				t.Errorf("%d of %d stops whole (want %d stops in the leaf, 95 %% whole)", whole, seen, want)
			}
		})
	}
}

// TestFindJIT finds opcache's JIT buffer and a pc of execute_ex's body in
// a PHP run with the tracing JIT.
func TestFindJIT(t *testing.T) {
	eachPHP(t, testFindJIT)
}

func testFindJIT(t *testing.T, php testutil.Interpreter) {
	cmd := startPHP(t, php, "php", "-d", "opcache.enable_cli=1", "-d", "opcache.jit=tracing", "-d", "opcache.jit_buffer_size=64M")
	in, _ := findInterp(t, cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); in.JIT.End == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // mapped by opcache as PHP starts
		in, _ = findInterp(t, cmd.Process.Pid)
	}
	if in.JIT.End <= in.JIT.Start || in.ExecBody <= in.Exec.Start || in.ExecBody >= in.Exec.End {
		t.Errorf("jit %#x..%#x, execute_ex %#x..%#x, body at %#x", in.JIT.Start, in.JIT.End, in.Exec.Start, in.Exec.End, in.ExecBody)
	}
	t.Logf("jit %#x..%#x, execute_ex %#x..%#x, body at +%#x", in.JIT.Start, in.JIT.End, in.Exec.Start, in.Exec.End, in.ExecBody-in.Exec.Start)
}

// TestBodyOf picks execute_ex's body row from the CFI rows of Debian's
// builds (readelf --debug-dump=frames-interp): 8.2 keeps rsp+160 over the
// body without a frame pointer, 8.4 sets up rbp and keeps rbp+16.
func TestBodyOf(t *testing.T) {
	sp := func(pc uint64, off int32) unwind.Row { return unwind.Row{PC: pc, CFA: unwind.CFASP, CFAOffset: off} }
	fp := func(pc uint64) unwind.Row { return unwind.Row{PC: pc, CFA: unwind.CFAFP, CFAOffset: 16} }
	for _, tt := range []struct {
		name       string
		rows       []unwind.Row
		start, end uint64
		want       uint64
	}{
		{"8.2", []unwind.Row{sp(0x36cbe0, 8), sp(0x36cbe2, 16), sp(0x36cbe4, 24), sp(0x36cbe5, 32), sp(0x36cbe6, 40),
			sp(0x36cbea, 160), sp(0x36cca1, 40), sp(0x36cca2, 32), sp(0x36cca3, 24), sp(0x36cca5, 16), sp(0x36cca7, 8),
			sp(0x36cca8, 160), sp(0x375f00, 8)}, 0x36cbe0, 0x375efe, 0x36cca8},
		{"8.4", []unwind.Row{sp(0x3cf110, 8), sp(0x3cf115, 16), fp(0x3cf118), sp(0x3cf1fc, 8), fp(0x3cf1fd),
			sp(0x3d96f0, 8)}, 0x3cf110, 0x3d96e6, 0x3cf1fd},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := bodyOf(tt.rows, tt.start, tt.end)
			if err != nil || got != tt.want {
				t.Errorf("body at %#x, %v; want %#x", got, err, tt.want)
			}
		})
	}
	if _, err := bodyOf([]unwind.Row{{PC: 0x1000}}, 0x1000, 0x2000); err == nil {
		t.Error("a function without a usable row has a body")
	}
}
