package testutil

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Layout is one way to link the layout workload (workloads/layout.c, or
// layout.rs for Rust): main -> a -> b -> c, where c burns CPU, without frame
// pointers. Linkers lay out segments differently: lld and mold start the
// executable segment mid-page at an address a page above its file offset,
// BOLT adds a segment with yet another offset-to-address shift.
type Layout struct {
	Name string
	// Rust: the Rust twin, whose functions are layout_a, layout_b and
	// layout_c.
	Rust bool
	// Flags for clang-19 or rustc.
	Flags []string
	// BOLT: the linked binary is rewritten by llvm-bolt-19 (linked with
	// --emit-relocs), which moves every function into a new segment.
	BOLT bool
}

// Layouts are the linker layouts tests cover: GNU ld, gold, lld and mold,
// with and without -z separate-code, PIE and not; BOLT-rewritten files; and
// Rust linked by its default linker (rust-lld) and by GNU ld.
func Layouts() []Layout {
	var out []Layout
	for _, ld := range []string{"bfd", "gold", "lld", "mold"} {
		zs := []string{"", "separate-code", "noseparate-code"}
		if ld == "gold" {
			zs = []string{""} // gold has no -z separate-code
		}
		for _, z := range zs {
			for _, pie := range []bool{true, false} {
				name := "c-" + ld
				flags := []string{"-fuse-ld=" + ld}
				if z != "" {
					name += "-" + z
					flags = append(flags, "-Wl,-z,"+z)
				}
				if pie {
					name += "-pie"
					flags = append(flags, "-fPIE", "-pie")
				} else {
					name += "-nopie"
					flags = append(flags, "-fno-PIE", "-no-pie")
				}
				out = append(out, Layout{Name: name, Flags: flags})
			}
		}
	}
	out = append(out,
		Layout{Name: "c-lld-bolt", Flags: []string{"-fuse-ld=lld", "-Wl,--emit-relocs"}, BOLT: true},
		Layout{Name: "c-bfd-bolt", Flags: []string{"-fuse-ld=bfd", "-Wl,--emit-relocs"}, BOLT: true},
		Layout{Name: "rust", Rust: true},
		Layout{Name: "rust-bfd", Rust: true, Flags: []string{"-C", "linker-features=-lld"}},
		Layout{Name: "rust-lld-bolt", Rust: true, Flags: []string{"-C", "link-arg=-Wl,--emit-relocs"}, BOLT: true},
	)
	return out
}

// Functions are the names of the layout workload's chain, leaf first.
func (l Layout) Functions() []string {
	if l.Rust {
		return []string{"layout_c", "layout_b", "layout_a"}
	}
	return []string{"c", "b", "a", "main"}
}

// BuildLayout builds the layout workload as l says and returns its path.
func BuildLayout(tb testing.TB, l Layout) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), l.Name)
	linked := out
	if l.BOLT {
		linked = out + ".prebolt"
	}
	var cmd *exec.Cmd
	if l.Rust {
		rustc := RequireTool(tb, "rustc")
		args := append([]string{"-O", "-C", "force-frame-pointers=no", "-C", "debuginfo=0"}, l.Flags...)
		args = append(args, "-o", linked, filepath.Join(workloadDir(tb), "layout.rs"))
		cmd = exec.Command(rustc, args...)
	} else {
		clang := RequireTool(tb, "clang-19")
		args := append([]string{"-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-fno-inline"}, l.Flags...)
		args = append(args, "-o", linked, filepath.Join(workloadDir(tb), "layout.c"))
		cmd = exec.Command(clang, args...)
	}
	run(tb, cmd)
	if l.BOLT {
		bolt := RequireTool(tb, "llvm-bolt-19")
		// Without a profile BOLT still moves every function it can into
		// its new text segment; -split-functions leaves cold blocks
		// apart from their function.
		run(tb, exec.Command(bolt, linked, "-o", out, "-split-functions", "-split-all-cold", "-split-eh"))
	}
	return out
}

// ReadAddresses reads the "name 0x..." lines the layout workload prints
// until it has one per function of l.
func (l Layout) ReadAddresses(r io.Reader) (map[string]uint64, error) {
	want := l.Functions()
	got := map[string]uint64{}
	sc := bufio.NewScanner(r)
	for len(got) < len(want) && sc.Scan() {
		name, addr, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			return nil, fmt.Errorf("layout workload printed %q", sc.Text())
		}
		v, err := strconv.ParseUint(strings.TrimPrefix(addr, "0x"), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("layout workload printed %q: %w", sc.Text(), err)
		}
		got[name] = v
	}
	if len(got) < len(want) {
		//nolint:errorlint // sc.Err() is nil when the workload just printed too little
		return nil, fmt.Errorf("layout workload printed %d of %d addresses: %v", len(got), len(want), sc.Err())
	}
	return got, nil
}
