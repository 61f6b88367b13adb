package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// dwarfSeed packs a binary's .debug_abbrev, .debug_info, .debug_line and
// .debug_str as the fuzz input of FuzzDWARF: four little-endian uint32
// lengths, then the sections back to back.
func dwarfSeed(f *testing.F, bin string) []byte {
	f.Helper()
	ef, err := elf.Open(bin)
	if err != nil {
		f.Fatal(err)
	}
	defer ef.Close()
	var out []byte
	var secs [][]byte
	for _, name := range []string{"abbrev", "info", "line", "str"} {
		inflate := int64(1 << 24)
		b, m, _, err := debugSectionData(ef, nil, name, 1<<24, &inflate)
		if err != nil {
			f.Fatal(err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		secs = append(secs, bytes.Clone(b))
		m.Unmap()
	}
	for _, b := range secs {
		out = append(out, b...)
	}
	return out
}

// FuzzDWARF indexes arbitrary DWARF (DWARF 4 sections, where the fuzzer can
// reach the entry and line parsers directly) and expands inline chains at
// unit boundaries; nothing may panic and chains stay bounded.
func FuzzDWARF(f *testing.F) {
	f.Add(dwarfSeed(f, testutil.BuildC(f, "seed", []string{"-O2", "-gdwarf-4"}, testdata("inline.c"))))
	f.Add(dwarfSeed(f, testutil.BuildC(f, "seed5", []string{"-O1", "-g"}, testdata("inline.c"))))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var secs [4][]byte
		if len(data) < 16 {
			return
		}
		rest := data[16:]
		for i := range secs {
			n := int(binary.LittleEndian.Uint32(data[4*i:]))
			if n > len(rest) {
				return
			}
			secs[i], rest = rest[:n], rest[n:]
		}
		lt, err := indexUnits(map[string][]byte{"abbrev": secs[0], "info": secs[1], "line": secs[2], "str": secs[3]}, nil, nil)
		if err != nil {
			return
		}
		for _, u := range lt.units[:min(len(lt.units), 16)] {
			for _, pc := range []uint64{u.lo, u.lo + 1, (u.lo + u.hi) / 2, u.hi - 1} {
				if chain := lt.lookup(pc); len(chain) > maxInlineDepth {
					t.Fatalf("chain of %d levels", len(chain))
				}
			}
		}
		if _, evicted := lt.unitStats(); evicted > 0 && lt.parsedBytes > unitCacheBytes {
			t.Fatalf("parsed units hold %d bytes past the bound", lt.parsedBytes)
		}
	})
}

// FuzzDWARFAranges indexes a real unit's DWARF with arbitrary
// .debug_info headers and .debug_aranges (the input is a little-endian
// uint32 length, .debug_info, then .debug_aranges): ranges must name
// units that exist, and lookups must not panic.
func FuzzDWARFAranges(f *testing.F) {
	bin := testutil.BuildC(f, "seed", []string{"-O2", "-g"}, testdata("inline.c"))
	ef, err := elf.Open(bin)
	if err != nil {
		f.Fatal(err)
	}
	sec := map[string][]byte{}
	for _, name := range []string{"abbrev", "info", "line", "str", "line_str", "aranges"} {
		inflate := int64(1 << 24)
		b, m, _, err := debugSectionData(ef, nil, name, 1<<24, &inflate)
		if err != nil {
			f.Fatal(err)
		}
		sec[name] = bytes.Clone(b)
		m.Unmap()
	}
	ef.Close()
	seed := binary.LittleEndian.AppendUint32(nil, uint32(len(sec["info"])))
	f.Add(append(append(seed, sec["info"]...), sec["aranges"]...))
	f.Add(append(binary.LittleEndian.AppendUint32(nil, uint32(len(sec["info"]))), sec["info"]...))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		n := int(binary.LittleEndian.Uint32(data))
		if n > len(data)-4 {
			return
		}
		in := map[string][]byte{"abbrev": sec["abbrev"], "line": sec["line"], "str": sec["str"], "line_str": sec["line_str"], "info": data[4 : 4+n]}
		lt, err := indexUnits(in, data[4+n:], nil)
		if err != nil {
			return
		}
		for _, u := range lt.units {
			if u.unit < 0 || int(u.unit) >= len(lt.heads) || u.lo >= u.hi {
				t.Fatalf("unit range %+v of %d units", u, len(lt.heads))
			}
		}
		for _, u := range lt.units[:min(len(lt.units), 16)] {
			for _, pc := range []uint64{u.lo, (u.lo + u.hi) / 2, u.hi - 1} {
				if chain := lt.lookup(pc); len(chain) > maxInlineDepth {
					t.Fatalf("chain of %d levels", len(chain))
				}
			}
		}
	})
}

// FuzzMiniDebugInfo parses arbitrary bytes as a .gnu_debugdata payload.
func FuzzMiniDebugInfo(f *testing.F) {
	xz := testutil.RequireTool(f, "xz")
	bin := testutil.BuildC(f, "seed", []string{"-O0", "-Wl,-z,noseparate-code", "-Wl,-z,max-page-size=16"}, testdata("cprog.c"))
	run(f, nil, xz, "--keep", bin)
	seed, err := os.ReadFile(bin + ".xz")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Add(append(append([]byte(nil), xzMagic...), 0, 1, 0, 0, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := parseMiniDebug(data, 1<<20)
		if err != nil || tab == nil {
			return
		}
		for _, s := range tab.syms {
			if uint64(s.name) >= uint64(len(tab.names)) || tab.name(s.name) == "" {
				t.Fatalf("symbol name at %d out of range or empty", s.name)
			}
		}
	})
}

func TestUnxzBounds(t *testing.T) {
	xz := testutil.RequireTool(t, "xz")
	dir := t.TempDir()
	p := filepath.Join(dir, "big")
	if err := os.WriteFile(p, bytes.Repeat([]byte("sonde "), 1<<18), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, nil, xz, "--keep", p)
	data, err := os.ReadFile(p + ".xz")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := unxz(data, 6<<18); err != nil || len(out) != 6<<18 {
		t.Errorf("unxz = %d bytes, %v; want %d", len(out), err, 6<<18)
	}
	if _, err := unxz(data, 1<<10); err == nil {
		t.Error("no error past the output limit")
	}
	run(t, nil, xz, "--keep", "--force", "--lzma2=dict=1GiB", p)
	if data, err = os.ReadFile(p + ".xz"); err != nil {
		t.Fatal(err)
	}
	if _, err := unxz(data, 6<<18); err == nil {
		t.Error("no error for a 1 GiB dictionary")
	}
}
