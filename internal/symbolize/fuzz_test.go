package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// smallELF builds cprog.c with flags and tiny page alignment, so the seed
// stays small enough for the fuzzer to minimize.
func smallELF(f *testing.F, flags ...string) []byte {
	f.Helper()
	flags = append(flags, "-Wl,-z,noseparate-code", "-Wl,-z,max-page-size=16")
	bin := testutil.BuildC(f, "seed", flags, testdata("cprog.c"))
	data, err := os.ReadFile(bin)
	if err != nil {
		f.Fatal(err)
	}
	return data
}

// FuzzLoadSymbols loads symbol data (.symtab/.dynsym, DWARF lines, pclntab)
// from arbitrary bytes and names a few offsets; nothing may panic.
func FuzzLoadSymbols(f *testing.F) {
	f.Add(smallELF(f, "-O0", "-g1"))
	f.Add(smallELF(f, "-Os", "-rdynamic", "-s"))
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		// In place, as from a mapping of the file: data is the image.
		fs, err := loadSymsWith(ef, data, nil, nil, loadLimits{maxDWARF: 1 << 20, inflate: 1 << 20})
		if err != nil {
			return
		}
		defer fs.unmap()
		offs := []uint64{0, uint64(len(data) / 2), ^uint64(0)}
		for _, p := range ef.Progs {
			offs = append(offs, p.Off, p.Off+1, p.Off+p.Filesz/2)
		}
		for _, off := range offs {
			fs.frames(off)
		}
		if native := fs.nativeTab(); native != nil && !slices.IsSortedFunc(native.syms, func(a, b nativeSym) int { return cmpUint(a.addr, b.addr) }) {
			t.Fatal("native symbols are not sorted")
		}
		fs.describe()
		if fs.memSize() <= 0 {
			t.Fatal("non-positive memory estimate")
		}
	})
}

// FuzzGoTable parses arbitrary bytes as a pclntab.
func FuzzGoTable(f *testing.F) {
	hdr := func(magic uint32, ptr byte, nfunc uint64) []byte {
		b := binary.LittleEndian.AppendUint32(nil, magic)
		b = append(b, 0, 0, 1, ptr)
		return binary.LittleEndian.AppendUint64(b, nfunc)
	}
	for _, magic := range []uint32{0xfffffffb, 0xfffffffa, 0xfffffff0, 0xfffffff1} {
		f.Add(append(hdr(magic, 8, 2), make([]byte, 128)...))
	}
	f.Add(hdr(0xfffffff1, 8, 1<<40))
	f.Fuzz(func(_ *testing.T, data []byte) {
		g, err := newGoTable(data, 0x401000, binary.LittleEndian)
		if err != nil {
			return
		}
		for _, pc := range []uint64{0, 0x401000, 0x401001, 0x402000} {
			g.frames(pc)
		}
	})
}

// FuzzParseKallsyms parses arbitrary text as kallsyms.
func FuzzParseKallsyms(f *testing.F) {
	f.Add(sampleKallsyms)
	f.Add("0000000000000000 T _stext\n")
	f.Add("ffffffff81000000 t x\t[\n")
	f.Fuzz(func(t *testing.T, text string) {
		k, err := parseKallsyms(strings.NewReader(text))
		if err != nil {
			return
		}
		for i, s := range k.syms {
			if i > 0 && k.syms[i-1].addr >= s.addr {
				t.Fatalf("symbols %d and %d are not strictly sorted", i-1, i)
			}
			got, ok := k.Lookup(s.addr)
			if !ok || got.Addr != s.addr {
				t.Fatalf("Lookup(%#x) = %+v, %v", s.addr, got, ok)
			}
		}
		k.Lookup(0)
		k.Lookup(^uint64(0))
	})
}
