package jvm

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.uber.org/zap"

	"flag"
	"github.com/sonde-dev/sonde/internal/process"
	"sort"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

var dumpTables = flag.Bool("dump-tables", false, "print the vmStructs tables of each installed JDK")

func TestDumpTables(t *testing.T) {
	if !*dumpTables {
		t.Skip("-dump-tables not set")
	}
	testutil.RequireRoot(t, "reading a JVM's memory")
	for _, j := range installedJDKs(t) {
		dir := compile(t, j, "JBurn")
		cmd := startJava(t, j, dir, "JBurn", nil, "5")
		vm, _ := findVM(t, cmd.Process.Pid)
		tb := vm.l.t
		var names []string
		for n, f := range tb.fields {
			names = append(names, n+" "+f.typ)
		}
		sort.Strings(names)
		for _, n := range names {
			t.Logf("%s field %s", j.name, n)
		}
		names = names[:0]
		for n := range tb.sizes {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			t.Logf("%s type %s %d", j.name, n, tb.sizes[n])
		}
		for n, v := range tb.ints {
			t.Logf("%s int %s %d", j.name, n, v)
		}
		for n, v := range tb.longs {
			t.Logf("%s long %s %d", j.name, n, v)
		}
	}
}

// TestFind finds the JVM of a live process of each installed JDK and
// checks its layout against the process's own maps and `java -version`.
func TestFind(t *testing.T) {
	testutil.RequireRoot(t, "reading a JVM's memory")
	for _, j := range installedJDKs(t) {
		t.Run(j.name, func(t *testing.T) {
			dir := compile(t, j, "JBurn")
			cmd := startJava(t, j, dir, "JBurn", nil, "20")
			vm, _ := findVM(t, cmd.Process.Pid)
			if want := javaRelease(t, j); vm.Release != want {
				t.Errorf("release %q, want %q (java -version)", vm.Release, want)
			}
			if vm.Major != j.major || vm.Untested {
				t.Errorf("major %d untested %v, want %d tested", vm.Major, vm.Untested, j.major)
			}
			k := vm.Kernel
			t.Logf("%s: %+v", vm.Release, k)
			if k.CodeLow == 0 || k.CodeLow >= k.CodeHigh {
				t.Fatalf("code cache [%#x, %#x)", k.CodeLow, k.CodeHigh)
			}
			if len(k.Heaps) == 0 || len(k.Heaps) > MaxHeaps {
				t.Fatalf("%d code heaps", len(k.Heaps))
			}
			for i, h := range k.Heaps {
				if h.Low < k.CodeLow || h.High > k.CodeHigh || h.Low >= h.High {
					t.Errorf("heap %d [%#x, %#x) outside [%#x, %#x)", i, h.Low, h.High, k.CodeLow, k.CodeHigh)
				}
				if h.SegShift < 5 || h.SegShift > 10 {
					t.Errorf("heap %d segment shift %d", i, h.SegShift)
				}
				if h.Segmap >= k.CodeLow && h.Segmap < k.CodeHigh {
					t.Errorf("heap %d segmap %#x inside the code cache", i, h.Segmap)
				}
			}
			if k.InterpStart < k.CodeLow || k.InterpEnd > k.CodeHigh || k.InterpStart >= k.InterpEnd {
				t.Errorf("interpreter [%#x, %#x) outside the code cache [%#x, %#x)", k.InterpStart, k.InterpEnd, k.CodeLow, k.CodeHigh)
			}
			if k.HeapBlockSize == 0 || k.BlobFrameSize == 0 || k.BlobFrameComplete == 0 || k.BlobCodeBegin == 0 || k.NmethodCompileID == 0 {
				t.Errorf("offsets missing: %+v", k)
			}
			if k.InterpMethod != -24 || k.InterpSenderSP != -8 || k.InterpBCP != -64 {
				t.Errorf("interpreter slots method %d bcp %d sender sp %d", k.InterpMethod, k.InterpBCP, k.InterpSenderSP)
			}
			// The code cache is one reserved mapping of the process.
			maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", cmd.Process.Pid))
			if err != nil {
				t.Fatal(err)
			}
			if !mapped(string(maps), k.InterpStart) {
				t.Errorf("interpreter %#x not mapped", k.InterpStart)
			}
		})
	}
}

// mapped says whether addr is inside an executable mapping of maps.
func mapped(maps string, addr uint64) bool {
	for _, l := range strings.Split(maps, "\n") {
		var lo, hi uint64
		var perms string
		if _, err := fmt.Sscanf(l, "%x-%x %s", &lo, &hi, &perms); err != nil {
			continue
		}
		if addr >= lo && addr < hi && strings.Contains(perms, "x") {
			return true
		}
	}
	return false
}

func TestFindNotJVM(t *testing.T) {
	procs := process.NewTable("/proc", zap.NewNop(), process.Options{})
	p, err := procs.Get(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Find(p, nil); !errors.Is(err, ErrNotJVM) {
		t.Fatalf("find in the test itself: %v, want ErrNotJVM", err)
	}
}

func (t *tables) clone() *tables {
	c := &tables{fields: maps.Clone(t.fields), sizes: maps.Clone(t.sizes), ints: maps.Clone(t.ints), longs: maps.Clone(t.longs)}
	return c
}

// TestUnknownLayout takes a live JVM's tables, breaks one entry at a time
// and expects ErrUnknownVersion naming what is wrong, never a VM.
func TestUnknownLayout(t *testing.T) {
	testutil.RequireRoot(t, "reading a JVM's memory")
	for _, j := range installedJDKs(t) {
		t.Run(j.name, func(t *testing.T) {
			dir := compile(t, j, "JBurn")
			cmd := startJava(t, j, dir, "JBurn", nil, "20")
			vm, mem := findVM(t, cmd.Process.Pid)
			if _, err := newVM(vm.l.t.clone(), mem); err != nil {
				t.Fatalf("unchanged tables: %v", err)
			}
			for _, c := range []struct {
				name   string
				change func(*tables)
				says   string
			}{
				{"no compile id", func(t *tables) { delete(t.fields, "nmethod::_compile_id") }, "nmethod::_compile_id"},
				{"compile id of 2 bytes", func(t *tables) {
					f := t.fields["nmethod::_compile_id"]
					f.typ = "u2"
					t.fields["nmethod::_compile_id"] = f
				}, "nmethod::_compile_id of 2 bytes"},
				{"no code heaps", func(t *tables) { delete(t.fields, "CodeCache::_heaps") }, "CodeCache::_heap"},
				{"no PcDesc size", func(t *tables) { delete(t.sizes, "PcDesc") }, "sizeof PcDesc"},
				{"no line table flag", func(t *tables) {
					delete(t.ints, "ConstMethodFlags::_misc_has_linenumber_table")
					delete(t.ints, "ConstMethod::_has_linenumber_table")
				}, "_has_linenumber_table"},
				{"other interpreter frame", func(t *tables) { t.ints["frame::interpreter_frame_sender_sp_offset"] = -2 }, "sender sp slot -2"},
				{"no release", func(t *tables) {
					delete(t.fields, "Abstract_VM_Version::_s_vm_release")
				}, "Abstract_VM_Version::_s_vm_release"},
			} {
				tb := vm.l.t.clone()
				c.change(tb)
				got, err := newVM(tb, mem)
				if !errors.Is(err, ErrUnknownVersion) || !strings.Contains(err.Error(), c.says) || got != nil {
					t.Errorf("%s: %v %v, want ErrUnknownVersion saying %q", c.name, got, err, c.says)
				}
			}
		})
	}
}

// TestFindWhileMapping checks that the tables of a libjvm.so that ld.so
// has not finished mapping are not read: in its window the code is
// mapped, and the data's addresses still show the first segment's
// reservation of the whole span, read only. Once every segment is
// mapped, the gHotSpot* variables are in writable memory. The mappings
// are laid out from each installed JDK's program headers as ld.so does.
func TestFindWhileMapping(t *testing.T) {
	for _, j := range installedJDKs(t) {
		t.Run(j.name, func(t *testing.T) {
			f, err := elf.Open(filepath.Join(j.home, "lib", "server", "libjvm.so"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const base = 0x7f0000000000
			syms := symbols(f, tableSymbols...)
			if len(syms) != len(tableSymbols) {
				t.Fatalf("%d of %d table symbols", len(syms), len(tableSymbols))
			}
			for n, v := range syms {
				syms[n] = base + v
			}
			var loads []*elf.Prog
			for _, p := range f.Progs {
				if p.Type == elf.PT_LOAD {
					loads = append(loads, p)
				}
			}
			page := func(v uint64) uint64 { return v &^ 0xfff }
			pageUp := func(v uint64) uint64 { return (v + 0xfff) &^ 0xfff }
			last := loads[len(loads)-1]
			span := pageUp(last.Vaddr + last.Memsz)
			perms := func(p *elf.Prog) string {
				b := []byte("---p")
				if p.Flags&elf.PF_R != 0 {
					b[0] = 'r'
				}
				if p.Flags&elf.PF_W != 0 {
					b[1] = 'w'
				}
				if p.Flags&elf.PF_X != 0 {
					b[2] = 'x'
				}
				return string(b)
			}
			// The window: the reservation, then the code over it.
			window := []process.Mapping{{Start: base, End: base + span, Perms: perms(loads[0]), Path: "/libjvm.so"}}
			for _, p := range loads[1:] {
				if p.Flags&elf.PF_X != 0 {
					window = splitMap(window, process.Mapping{Start: base + page(p.Vaddr), End: base + pageUp(p.Vaddr+p.Filesz),
						Offset: page(p.Off), Perms: perms(p), Path: "/libjvm.so"})
				}
			}
			if n, ok := unwritable(window, syms); !ok {
				t.Errorf("in ld.so's window every table symbol reads as writable")
			} else {
				t.Logf("in ld.so's window: %s is not writable yet", n)
			}
			// Done: every segment, the bss past the file anonymous.
			done := window
			for _, p := range loads[1:] {
				done = splitMap(done, process.Mapping{Start: base + page(p.Vaddr), End: base + pageUp(p.Vaddr+p.Filesz),
					Offset: page(p.Off), Perms: perms(p), Path: "/libjvm.so"})
				if end := base + pageUp(p.Vaddr+p.Memsz); end > base+pageUp(p.Vaddr+p.Filesz) {
					done = splitMap(done, process.Mapping{Start: base + pageUp(p.Vaddr+p.Filesz), End: end, Perms: perms(p)})
				}
			}
			if n, ok := unwritable(done, syms); ok {
				t.Errorf("mapped: %s at %#x is not writable: %+v", n, syms[n], done)
			}
		})
	}
}

// splitMap maps m over maps, as mmap with MAP_FIXED does.
func splitMap(maps []process.Mapping, m process.Mapping) []process.Mapping {
	var out []process.Mapping
	for _, o := range maps {
		if o.End <= m.Start || o.Start >= m.End {
			out = append(out, o)
			continue
		}
		if o.Start < m.Start {
			l := o
			l.End = m.Start
			out = append(out, l)
		}
		if o.End > m.End {
			r := o
			r.Offset += m.End - o.Start
			r.Start = m.End
			out = append(out, r)
		}
	}
	out = append(out, m)
	slices.SortFunc(out, func(a, b process.Mapping) int { return cmp.Compare(a.Start, b.Start) })
	return out
}
