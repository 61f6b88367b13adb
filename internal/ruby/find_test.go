package ruby

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		name         string
		in           string
		major, minor int
		wantErr      error
	}{
		{"debian 3.1", "3.1.2\x00", 3, 1, nil},
		{"3.3", "3.3.10", 3, 3, nil},
		{"ruby 2", "2.7.8\x00", 0, 0, ErrUnknownVersion},
		{"two parts", "3.1\x00", 0, 0, ErrNotRuby},
		{"letters", "3.x.1", 0, 0, ErrNotRuby},
		{"empty part", "3..1", 0, 0, ErrNotRuby},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			major, minor, _, err := ParseVersion([]byte(tt.in))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || major != tt.major || minor != tt.minor {
				t.Fatalf("got %d.%d, %v; want %d.%d", major, minor, err, tt.major, tt.minor)
			}
		})
	}
}

func TestTLSMatch(t *testing.T) {
	buf := make([]byte, 64)
	const tp, ec = 0x10000, 0xabc0
	put := func(at int, v uint64) {
		for i := range 8 {
			buf[at+i] = byte(v >> (8 * i))
		}
	}
	put(56, ec) // at tp-8: libruby's block of 16 bytes right below tp, the variable at 8
	off, err := tlsMatch(buf, tp, ec, 8, 8)
	if err != nil || off != 8 {
		t.Fatalf("offset %d, %v; want 8", off, err)
	}
	if _, err := tlsMatch(buf, tp, ec, 8, 32); err == nil {
		t.Error("found at a place the block's alignment rules out")
	}
	put(8, ec)
	if _, err := tlsMatch(buf, tp, ec, 8, 8); err == nil {
		t.Error("two candidates accepted")
	}
}

func TestFind(t *testing.T) {
	eachRuby(t, func(t *testing.T, rb testutil.Ruby) {
		cmd := startRuby(t, rb, "ruby")
		in, mem := findInterp(t, cmd.Process.Pid)
		if !strings.HasPrefix(in.Version, rb.Version+".") || in.Minor != rb.Minor || in.Layout.Untested {
			t.Errorf("version %s (minor %d, untested %v), want %s.x tested", in.Version, in.Minor, in.Layout.Untested, rb.Version)
		}
		if in.Core.End-in.Core.Start < 4096 || in.Exec.End <= in.Exec.Start || in.Core.Start == in.Exec.Start {
			t.Errorf("vm_exec_core %#x..%#x, exec %#x..%#x", in.Core.Start, in.Core.End, in.Exec.Start, in.Exec.End)
		}
		tp, err := in.MainThread(mem)
		if err != nil {
			t.Fatal(err)
		}
		if ec, err := in.EC(mem, tp); err != nil || ec == 0 {
			t.Errorf("main thread's context %#x, %v", ec, err)
		}
	})
}

func TestFindHidesUnknownVersion(t *testing.T) {
	cmd := startRuby(t, testutil.Ruby31(t), "ruby")
	p := findProc(t, cmd.Process.Pid)
	_, err := FindWith(p, nil, func(major, minor int) (Layout, error) {
		return Layout{}, fmt.Errorf("ruby %d.%d: %w", major, minor, ErrUnknownVersion)
	})
	if !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("err %v, want ErrUnknownVersion", err)
	}
}

// chainFrame is a frame a sample of the leaf holds: its name and the text
// on its line in burn.rb, or the file of a method Ruby itself defines in
// Ruby (any line).
type chainFrame struct{ name, text, file string }

type chainCase struct {
	mode  string
	chain []chainFrame // innermost first, after the leaf gamma_burn
}

func chainCases(minor int) []chainCase {
	top := []chainFrame{
		{"Object#alpha", "beta(mode) + 1 # alpha's call", ""},
		{"block in main", "alpha(mode) # main's call", ""},
		{"Object#main", "loop do", ""},
	}
	if minor >= 3 { // Kernel#loop is written in Ruby (kernel.rb)
		top = slices.Insert(top, 2, chainFrame{"Kernel#loop", "", "<internal:kernel>"})
	}
	script := chainFrame{"<main>", "main(mode) # the script's call", ""}
	return []chainCase{
		{mode: "ruby", chain: append(append([]chainFrame{{"Object#beta", "gamma_burn(200_000) # beta's call", ""}}, top...), script)},
		{mode: "block", chain: append(append([]chainFrame{
			{"block in beta", "with_block { gamma_burn(200_000) } # beta's block", ""},
			{"Object#with_block", "yield + 1", ""},
			{"Object#beta", "with_block { gamma_burn(200_000) } # beta's block", ""}}, top...), script)},
		{mode: "class", chain: append(append([]chainFrame{
			{"Burner#run", "gamma_burn(n) # Burner#run's call", ""},
			{"Burner.start", "new.run(n) # Burner.start's call", ""},
			{"Object#beta", "Burner.start(200_000) # beta's class call", ""}}, top...), script)},
		{mode: "thread", chain: append(append([]chainFrame{{"Object#beta", "gamma_burn(200_000) # beta's call", ""}}, top...),
			chainFrame{"block in <main>", "Thread.new { main(mode) }.join # the thread's start", ""})},
	}
}

// checkChain says what is wrong with frames as a sample of burn.rb's leaf
// in case c, or "" if nothing; src is burn.rb's path.
func checkChain(t *testing.T, src string, c chainCase, frames []StackFrame) string {
	if len(frames) == 0 || frames[0].Name != "Object#gamma_burn" {
		return "not in the leaf"
	}
	lo, hi := lineOfText(t, src, "while i < n"), lineOfText(t, src, "i += 1")
	if l := frames[0].Line; l < lo || l > hi || frames[0].File != src {
		return fmt.Sprintf("leaf at %s:%d, want %s:%d..%d", frames[0].File, l, src, lo, hi)
	}
	rest := frames[1:]
	if len(rest) != len(c.chain) {
		return fmt.Sprintf("%d frames above the leaf, want %d: %+v", len(rest), len(c.chain), rest)
	}
	for i, w := range c.chain {
		got := rest[i]
		if w.file != "" {
			if got.Name != w.name || got.File != w.file || got.Line <= 0 {
				return fmt.Sprintf("frame %d: %s at %s:%d, want %s at %s", i+1, got.Name, got.File, got.Line, w.name, w.file)
			}
			continue
		}
		if want := lineOfText(t, src, w.text); got.Name != w.name || got.File != src || got.Line != want {
			return fmt.Sprintf("frame %d: %s at %s:%d, want %s at %s:%d", i+1, got.Name, got.File, got.Line, w.name, src, want)
		}
	}
	return ""
}

// TestStack reads the leaf's stack of each mode from a live process and
// checks its whole chain: names, files and lines.
func TestStack(t *testing.T) {
	src, err := filepath.Abs("testdata/burn.rb")
	if err != nil {
		t.Fatal(err)
	}
	eachRuby(t, func(t *testing.T, rb testutil.Ruby) {
		for _, c := range chainCases(rb.Minor) {
			t.Run(c.mode, func(t *testing.T) {
				cmd := startRuby(t, rb, c.mode)
				in, mem := findInterp(t, cmd.Process.Pid)
				good, last := 0, ""
				deadline := time.Now().Add(20 * time.Second)
				for good < 5 && time.Now().Before(deadline) {
					for _, tid := range threads(t, cmd.Process.Pid) {
						frames, err := snapshot(tid, in, mem)
						if err != nil {
							last = err.Error()
							continue
						}
						if why := checkChain(t, src, c, frames); why != "" {
							last = why
							continue
						}
						good++
					}
				}
				if good < 5 {
					t.Fatalf("%d good samples of the leaf; last: %s", good, last)
				}
			})
		}
	})
}

// TestFindBeforeDataMapped: a process caught while the loader has mapped
// libruby's code but not yet its data (ruby_current_vm_ptr does not read)
// is not started, to be looked at again, not a failure.
func TestFindBeforeDataMapped(t *testing.T) {
	cmd := startRuby(t, testutil.Ruby31(t), "ruby")
	in, mem := findInterp(t, cmd.Process.Pid)
	p := findProc(t, cmd.Process.Pid)
	if _, err := Find(p, holeMem{mem, in.VMPtr}); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("err %v, want ErrNotStarted", err)
	}
}

// holeMem is a process's memory where the word at hole does not read.
type holeMem struct {
	Memory
	hole uint64
}

func (m holeMem) ReadAt(p []byte, addr uint64) error {
	if addr <= m.hole && m.hole < addr+uint64(len(p)) {
		return fmt.Errorf("read %d at %#x: input/output error", len(p), addr)
	}
	return m.Memory.ReadAt(p, addr)
}
