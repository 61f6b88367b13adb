package unwind

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// checkTable asserts the invariants every table keeps, whatever its input.
func checkTable(t *testing.T, tab *Table, inputLen int) {
	t.Helper()
	for i := 1; i < len(tab.Rows); i++ {
		if tab.Rows[i].PC <= tab.Rows[i-1].PC {
			t.Fatalf("rows %d and %d not sorted: %#x, %#x", i-1, i, tab.Rows[i-1].PC, tab.Rows[i].PC)
		}
		if tab.Rows[i].sameRule(tab.Rows[i-1]) {
			t.Fatalf("rows %d and %d not merged: %+v", i-1, i, tab.Rows[i])
		}
	}
	// Each row needs at least one byte of CFI, and each FDE adds at most a
	// gap row; an FDE is at least 8 bytes.
	if len(tab.Rows) > 2*inputLen+2 {
		t.Fatalf("%d rows from %d bytes", len(tab.Rows), inputLen)
	}
}

// FuzzEHFrame parses arbitrary bytes as .eh_frame and as .debug_frame at an
// arbitrary address; neither may panic, and the tables keep their invariants.
func FuzzEHFrame(f *testing.F) {
	f.Add(ehFrame(cieBody("zR", []byte{peUdata4}, defaultInitial), fde(peUdata4, ptrCtx{}, true, []byte{0x41, 0x0e, 16, 0x86, 2})), uint64(secAddr))
	f.Add(ehFrame(cieBody("zPLR", cat([]byte{0x9b}, u32(0x1234), []byte{0x1b, 0x1b}), defaultInitial), fde(0x1b, ptrCtx{}, true, []byte{0x0a, 0x41, 0x0b})), uint64(secAddr))
	f.Add(ehFrame(cieBody("zRS", []byte{0x1b}, nil), fde(0x1b, ptrCtx{}, true, cat([]byte{0x0f, byte(len(pltExpr))}, pltExpr))), uint64(secAddr))
	f.Add(debugFrame([][2]uint64{{0x1000, 0x1100}, {0x2000, 0x2010}}, []byte{0x0e, 32}), uint64(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0}, uint64(0))
	f.Add([]byte{}, uint64(0))
	if bin := fuzzSeedBinary(f); bin != nil {
		f.Add(bin, uint64(secAddr))
	}
	f.Fuzz(func(t *testing.T, data []byte, addr uint64) {
		deref := func(uint64) (uint64, error) { return addr, nil }
		for i := range 4 {
			debug, arm64 := i&1 != 0, i&2 != 0
			s := &section{data: data, addr: addr, debug: debug, arm64: arm64, ctx: ptrCtx{secAddr: addr, deref: deref}}
			if arm64 && addr+64 > addr {
				s.plt = []pcRange{{addr, addr + 64}}
			}
			tab, err := fromSections(s, nil, pcRange{}, nil)
			if err != nil {
				continue
			}
			checkTable(t, tab, len(data)+len(s.plt))
			tab.Lookup(addr)
		}
	})
}

// fuzzSeedBinary returns the .eh_frame of a small C program, or nil when no
// compiler is around (the fuzz target then runs on the hand-made seeds).
func fuzzSeedBinary(f *testing.F) []byte {
	if _, err := os.Stat("/usr/bin/cc"); err != nil {
		return nil
	}
	bin := testutil.BuildC(f, "seed", []string{"-O2", "-nostartfiles", "-Wl,-e,main"}, filepath.Join("testdata", "frames.c"))
	ef, err := elf.Open(bin)
	if err != nil {
		f.Fatal(err)
	}
	defer ef.Close()
	s := ef.Section(".eh_frame")
	if s == nil {
		return nil
	}
	data, err := s.Data()
	if err != nil {
		f.Fatal(err)
	}
	return data
}

// FuzzCFIProgram runs the interpreter on arbitrary instruction bytes after
// GCC's usual CIE program.
func FuzzCFIProgram(f *testing.F) {
	f.Add([]byte{0x41, 0x0e, 16, 0x86, 2, 0x0a, 0x42, 0x0c, 6, 16, 0x0b})
	f.Add(cat([]byte{0x0f, byte(len(pltExpr))}, pltExpr))
	f.Add([]byte{0x01, 0x10, 0x10, 0, 0, 0x07, 16, 0x2e, 8, 0x2f, 6, 1})
	f.Add([]byte{0x04, 0xff, 0xff, 0xff, 0xff, 0x02, 1, 0x03, 1, 0})
	f.Add([]byte{0x0a, 0x0a, 0x0a, 0x0b, 0x0b, 0x0b, 0x0b})
	f.Add([]byte{0x10, 6, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0x44, 0x0e, 32, 0x9d, 4, 0x9e, 3, 0x2d, 0x41, 0x0d, 29})
	f.Fuzz(func(t *testing.T, prog []byte) {
		x86 := &cie{codeAlign: 1, dataAlign: -8, raReg: regRA, fdeEnc: peUdata4, addrSize: 8, initial: defaultInitial}
		arm := &cie{codeAlign: 4, dataAlign: -8, raReg: regX30, fdeEnc: peUdata4, addrSize: 8, initial: []byte{0x0c, regARMSP, 0}, arm64: true}
		for _, c := range []*cie{x86, arm} {
			fuzzProgram(t, c, prog)
		}
	})
}

// fuzzProgram runs prog as the body of an FDE of c and checks the rows.
func fuzzProgram(t *testing.T, c *cie, prog []byte) {
	{
		var m machine
		rows, err := m.run(nil, program{cie: c, initial: c.initial, body: prog, begin: 0x1000, end: 0x2000, ctx: &ptrCtx{}})
		if err != nil {
			return
		}
		if len(rows) == 0 || len(rows) > len(prog)+1 {
			t.Fatalf("%d rows from %d bytes", len(rows), len(prog))
		}
		for i, r := range rows {
			if r.PC < 0x1000 || r.PC >= 0x2000 || i > 0 && r.PC <= rows[i-1].PC {
				t.Fatalf("row %d at %#x out of order or range", i, r.PC)
			}
		}
		if len(m.stack) > maxStateDepth {
			t.Fatalf("state stack %d deep", len(m.stack))
		}
	}
}

// FuzzFinder opens arbitrary bytes as an ELF file with a Finder and looks
// rows up across it: a hostile file (bad .eh_frame_hdr, FDEs out of their
// section, a broken pclntab) is refused or gives rows, never a panic.
func FuzzFinder(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	if _, err := os.Stat("/usr/bin/cc"); err == nil {
		bin := testutil.BuildC(f, "seed", []string{"-O2"}, filepath.Join("testdata", "frames.c"))
		if b, err := os.ReadFile(bin); err == nil {
			f.Add(b)
		}
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "elf")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		fd, err := NewFinder(path, []string{}, nil)
		if err != nil {
			return
		}
		defer fd.Close()
		for off := uint64(0); off < uint64(len(data))+64; off += 13 {
			if r, ok := fd.Row(off); ok && r.Rule&0x0f > 5 {
				t.Fatalf("offset %#x: row %+v with an unknown CFA type", off, r)
			}
		}
	})
}
