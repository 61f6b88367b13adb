package symbolize

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// BenchmarkLoadKernel reads and parses /proc/kallsyms: the kernel's
// generation of the text plus our parsing.
func BenchmarkLoadKernel(b *testing.B) {
	if _, err := LoadKernel("/proc/kallsyms"); err != nil {
		if errors.Is(err, ErrKernelAddressesHidden) {
			b.Skip("kernel addresses are hidden from this user")
		}
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadKernel("/proc/kallsyms"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseKallsyms parses an in-memory copy of /proc/kallsyms: our
// share of BenchmarkLoadKernel.
func BenchmarkParseKallsyms(b *testing.B) {
	data, err := os.ReadFile("/proc/kallsyms")
	if err != nil {
		b.Skip(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	var k *Kernel
	for b.Loop() {
		if k, err = parseKallsyms(bytes.NewReader(data)); err != nil {
			b.Skip(err)
		}
	}
	b.ReportMetric(float64(k.Len()), "symbols")
	b.ReportMetric(float64(len(k.syms)*16+len(k.names)), "table-bytes")
}

// libcOffsets returns the file offsets of libc's exported functions.
func libcOffsets(b *testing.B) (string, []uint64) {
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	if _, err := os.Stat(libc); err != nil {
		b.Skip(err)
	}
	var offs []uint64
	for _, s := range nmFunctions(b, libc, true) {
		offs = append(offs, vaddrToOffset(b, libc, s.addr+s.size/2))
	}
	return libc, offs
}

func benchSymbolize(b *testing.B, s *Symbolizer, id elfx.FileID, offs []uint64) {
	b.Helper()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.Symbolize(id, offs[i%len(offs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	st := s.Stats()
	b.ReportMetric(float64(st.Hits)/float64(st.Lookups), "hit-ratio")
}

// BenchmarkSymbolizeCached looks up offsets that are all in the cache
// (libc, named from libc6-dbg where it is installed).
func BenchmarkSymbolizeCached(b *testing.B) {
	libc, offs := libcOffsets(b)
	s := New(nil, Options{})
	info, err := s.Open(libc)
	if err != nil {
		b.Fatal(err)
	}
	offs = offs[:min(len(offs), 1024)]
	for _, off := range offs {
		if _, err := s.Symbolize(info.ID, off); err != nil {
			b.Fatal(err)
		}
	}
	benchSymbolize(b, s, info.ID, offs)
}

// BenchmarkSymbolizeUncached looks up offsets that are never in the address
// cache (one entry), with the file's symbol data loaded: the cost of a
// first sighting of a PC.
func BenchmarkSymbolizeUncached(b *testing.B) {
	b.Run("libc-dynsym", func(b *testing.B) {
		libc, offs := libcOffsets(b)
		s := New(nil, Options{MaxCachedAddrs: 1, DebugDirs: []string{}})
		info, err := s.Open(libc)
		if err != nil {
			b.Fatal(err)
		}
		benchSymbolize(b, s, info.ID, offs)
	})
	// With libc6-dbg: .symtab, DWARF lines and inline chains from the
	// separate debug file; units are parsed on first use and kept.
	b.Run("libc-debuginfo", func(b *testing.B) {
		libc, offs := libcOffsets(b)
		s := New(nil, Options{MaxCachedAddrs: 1})
		info, err := s.Open(libc)
		if err != nil {
			b.Fatal(err)
		}
		benchSymbolize(b, s, info.ID, offs)
	})
	b.Run("go-pclntab", func(b *testing.B) {
		bin := testutil.BuildGo(b, "goprog", testdata("goprog"))
		var offs []uint64
		for _, sym := range goNMFunctions(b, bin) {
			offs = append(offs, vaddrToOffset(b, bin, sym.addr+sym.size/2))
		}
		s := New(nil, Options{MaxCachedAddrs: 1})
		info, err := s.Open(bin)
		if err != nil {
			b.Fatal(err)
		}
		benchSymbolize(b, s, info.ID, offs)
	})
	b.Run("c-dwarf-lines", func(b *testing.B) {
		bin := testutil.BuildC(b, "cprog", []string{"-O0", "-g"}, testdata("cprog.c"))
		var offs []uint64
		for _, sym := range pickB(b, nmFunctions(b, bin, false), "a", "b", "c", "main") {
			for _, a := range probes(sym) {
				offs = append(offs, vaddrToOffset(b, bin, a))
			}
		}
		s := New(nil, Options{MaxCachedAddrs: 1})
		info, err := s.Open(bin)
		if err != nil {
			b.Fatal(err)
		}
		benchSymbolize(b, s, info.ID, offs)
	})
}

// BenchmarkLoadSymbols measures a cold start for one file: Open and the
// first Symbolize, which loads the symbol data.
func BenchmarkLoadSymbols(b *testing.B) {
	libc, offs := libcOffsets(b)
	goBin := testutil.BuildGo(b, "goprog", testdata("goprog"))
	goOff := vaddrToOffset(b, goBin, pickB(b, goNMFunctions(b, goBin), "main.a")[0].addr)
	for _, bc := range []struct {
		name, path string
		off        uint64
	}{{"libc", libc, offs[0]}, {"go", goBin, goOff}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var bytes int64
			for b.Loop() {
				s := New(nil, Options{})
				info, err := s.Open(bc.path)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Symbolize(info.ID, bc.off); err != nil {
					b.Fatal(err)
				}
				bytes = s.Stats().LoadedBytes
			}
			b.ReportMetric(float64(bytes), "loaded-bytes")
		})
	}
}

func pickB(b *testing.B, syms []funcSym, names ...string) []funcSym {
	b.Helper()
	var out []funcSym
	for _, n := range names {
		found := false
		for _, s := range syms {
			if s.name == n {
				out = append(out, s)
				found = true
				break
			}
		}
		if !found {
			b.Fatalf("no symbol %q", n)
		}
	}
	return out
}
