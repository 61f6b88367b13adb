package perl

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// burnChain is the chain burn.pl runs in mode, innermost first.
func burnChain(t *testing.T, mode string) []want {
	t.Helper()
	burn, err := filepath.Abs("testdata/burn.pl")
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(filepath.Dir(burn), "BurnLib.pm")
	lib2 := filepath.Join(filepath.Dir(burn), "BurnLib2.pm")
	at := func(file, text string) []int64 { return []int64{lineOfText(t, file, text)} }
	top := []want{
		{"main::main", burn, at(burn, "main calls alpha")},
		{"(main)", burn, at(burn, "top-level calls main")},
	}
	switch mode {
	case "eval":
		return append([]want{
			{"Burn::Lib2::epsilon_burn", lib2, append(at(lib2, "epsilon_burn loop"), at(lib2, "main::ready()")...)},
			{"(require)", lib2, at(lib2, "top-level calls epsilon_burn")},
			{"Burn::Lib::delta", lib, at(lib, "delta requires BurnLib2")},
			{"(eval)", burn, at(burn, "alpha evals")},
			{"main::alpha", burn, at(burn, "alpha evals")},
		}, top...)
	}
	leaf := append(at(burn, "gamma_burn loop"), at(burn, "# chain ready")...)
	if mode == "xs" {
		leaf = append(at(burn, "# xs leaf"), at(burn, "# xs ready")...)
	}
	if mode == "sort" {
		return append([]want{
			{"main::gamma_burn", burn, leaf},
			{"main::beta", burn, at(burn, "beta calls gamma_burn")},
			{"main::by_num", burn, at(burn, "by_num calls beta")},
			{"main::alpha", burn, at(burn, "alpha sorts")},
		}, top...)
	}
	return append([]want{
		{"main::gamma_burn", burn, leaf},
		{"main::beta", burn, at(burn, "beta calls gamma_burn")},
		{"main::alpha", burn, at(burn, "alpha calls beta")},
	}, top...)
}

// TestStackLive reads the Perl stack of a running perl, stopped at random
// points of its leaf's loop, and checks every frame's name, file and line.
func TestStackLive(t *testing.T) {
	eachPerl(t, testStackLive)
}

func testStackLive(t *testing.T, pl testutil.Interpreter) {
	for _, mode := range []string{"chain", "eval", "xs", "sort"} {
		t.Run(mode, func(t *testing.T) {
			cmd := startPerl(t, pl, mode)
			pid := cmd.Process.Pid
			in, mem := findInterp(t, pid)
			if !strings.HasPrefix(in.Version, pl.Version+".") || in.Layout.Version != pl.Minor {
				t.Fatalf("version %s, layout 5.%d", in.Version, in.Layout.Version)
			}
			if in.Runops.End <= in.Runops.Start {
				t.Fatalf("runops %#x..%#x", in.Runops.Start, in.Runops.End)
			}
			chain := burnChain(t, mode)
			for i := 0; i < 20; i++ {
				frames, err := snapshot(pid, in, mem)
				if err != nil {
					t.Fatalf("snapshot %d: %v", i, err)
				}
				if err := matchChain(frames, chain); err != nil {
					t.Fatalf("snapshot %d: %v", i, err)
				}
				// One interpreter loop runs them all: only the top-level
				// code is its entry; but sort calls its sub from C, in a
				// loop of its own.
				for j, f := range frames {
					if f.Last != (j == len(frames)-1 || f.Name == "main::by_num") {
						t.Fatalf("snapshot %d: frame %d (%s) last %v", i, j, f.Name, f.Last)
					}
				}
				time.Sleep(time.Millisecond) // spread the snapshots over the loop
			}
		})
	}
}

// TestFindUnknownVersion hides 5.36 from the layouts: the process is
// reported as an unknown version, not as no perl.
func TestFindUnknownVersion(t *testing.T) {
	cmd := startPerl(t, testutil.Perl536(t), "chain")
	p := findProc(t, cmd.Process.Pid)
	_, err := FindWith(p, func(v int) (Layout, error) { return LayoutFor(v + 100) })
	if !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("err %v, want ErrUnknownVersion", err)
	}
}

// TestFindNotPerl: a process without perl matches ErrNotPerl.
func TestFindNotPerl(t *testing.T) {
	p := findProc(t, os.Getpid())
	if _, err := Find(p); !errors.Is(err, ErrNotPerl) {
		t.Fatalf("the test itself: err %v, want ErrNotPerl", err)
	}
}
