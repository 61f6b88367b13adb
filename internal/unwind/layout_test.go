package unwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// readelfSegments returns path's PT_LOAD segments as `readelf -lW` prints
// them.
func readelfSegments(t *testing.T, path string) []segment {
	t.Helper()
	out, err := exec.Command(testutil.RequireTool(t, "readelf"), "-lW", path).Output()
	if err != nil {
		t.Fatalf("readelf -lW %s: %v", path, err)
	}
	var segs []segment
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[0] != "LOAD" {
			continue
		}
		var v [3]uint64
		for i, col := range []int{1, 2, 4} {
			if v[i], err = strconv.ParseUint(strings.TrimPrefix(f[col], "0x"), 16, 64); err != nil {
				t.Fatalf("readelf -lW %s: %q: %v", path, sc.Text(), err)
			}
		}
		flags := strings.Join(f[6:len(f)-1], "")
		segs = append(segs, segment{off: v[0], vaddr: v[1], filesz: v[2], exec: strings.Contains(flags, "E")})
	}
	if len(segs) == 0 {
		t.Fatalf("readelf -lW %s: no LOAD segment", path)
	}
	return segs
}

// readelfFunction returns the address of function name in path's symbol
// tables, as `readelf -sW` prints it.
func readelfFunction(t *testing.T, path, name string) uint64 {
	t.Helper()
	out, err := exec.Command(testutil.RequireTool(t, "readelf"), "-sW", path).Output()
	if err != nil {
		t.Fatalf("readelf -sW %s: %v", path, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 8 && f[3] == "FUNC" && f[7] == name {
			v, err := strconv.ParseUint(f[1], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("readelf -sW %s: no function %s", path, name)
	return 0
}

// fileOffset is where the byte at ELF address vaddr lies in the file.
func fileOffset(segs []segment, vaddr uint64) (uint64, bool) {
	for _, s := range segs {
		if vaddr >= s.vaddr && vaddr < s.vaddr+s.filesz {
			return vaddr - s.vaddr + s.off, true
		}
	}
	return 0, false
}

// vaddrAt is the ELF address of the code byte at file offset off.
func vaddrAt(segs []segment, off uint64) (uint64, bool) {
	for _, s := range segs {
		if s.exec && off >= s.off && off < s.off+s.filesz {
			return off - s.off + s.vaddr, true
		}
	}
	return 0, false
}

// byVaddr looks rows of a table keyed by file offset up by ELF address.
func byVaddr(tab *Table, segs []segment) func(uint64) (Row, bool) {
	return func(vaddr uint64) (Row, bool) {
		off, ok := fileOffset(segs, vaddr)
		if !ok {
			return Row{}, false
		}
		return tab.Lookup(off)
	}
}

// Every linker layout gets the rows readelf reads from its CFI, and a
// process running it gets biases that take each function's run-time
// address to its file offset as `readelf -lW` and `readelf -sW` place it,
// where its row is the function's entry rule.
func TestLayouts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a fixture per linker layout")
	}
	procs := process.NewTable("/proc", nil, process.Options{})
	for _, l := range testutil.Layouts() {
		t.Run(l.Name, func(t *testing.T) {
			bin := testutil.BuildLayout(t, l)
			segs := readelfSegments(t, bin)

			lf, rows, mem := buildFile(bin, []string{}, zaptest.NewLogger(t))
			t.Cleanup(mem.run)
			if lf.err != nil {
				t.Fatalf("building the table: %v", lf.err)
			}
			tab := tableOfKernelRows(t, rows, lf.base)
			oracleLookup(t, byVaddr(tab, segs), Stats{Rows: len(rows)}, bin, ".eh_frame")

			cmd := exec.Command(bin, "wait")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			testutil.StartCmd(t, cmd)
			addrs, err := l.ReadAddresses(stdout)
			if err != nil {
				t.Fatal(err)
			}
			p, err := procs.Refresh(cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			k := newMapsKernel(t)
			loader := NewLoader(k, identifyFile, zaptest.NewLogger(t), LoaderOptions{DebugDirs: []string{}})
			if err := loader.Prepare(p); err != nil {
				t.Fatal(err)
			}
			for _, name := range l.Functions() {
				addr := addrs[name]
				var m tracer.Mapping
				found := false
				for km := range k.mappings[uint32(p.PID)] {
					if addr >= km.Start && addr < km.End {
						m, found = km, true
					}
				}
				if !found || m.Table == 0 {
					t.Errorf("%s at %#x: no mapping with a table (mapping %+v, found %v)", name, addr, m, found)
					continue
				}
				want, ok := fileOffset(segs, readelfFunction(t, bin, name))
				if !ok {
					t.Fatalf("%s: readelf places it in no segment", name)
				}
				if got := addr - m.FileBias; got != want {
					t.Errorf("%s at %#x: file offset %#x by the mapping, readelf says %#x", name, addr, got, want)
				}
				rel := addr - m.Bias
				if got := rel + lf.base; got != want {
					t.Errorf("%s at %#x: the bias %#x finds file offset %#x, readelf says %#x", name, addr, m.Bias, got, want)
				}
				// The unwinder on kernels with bpf_find_vma finds the same
				// row through the file's table.
				if m.Bias != m.FileBias+uint64(lf.delta()) {
					t.Errorf("%s: mapping bias %#x, file bias %#x + file table delta %#x differ", name, m.Bias, m.FileBias, lf.delta())
				}
				row, ok := tableOfKernelRows(t, k.rows[m.Table], 0).Lookup(rel)
				if entry := (Row{PC: row.PC, CFA: CFASP, CFAOffset: 8, FP: FPSame}); !ok || row != entry {
					t.Errorf("%s at %#x: row %+v (found %v), want the entry rule %+v", name, addr, row, ok, entry)
				}
			}
		})
	}
}

// Re-keying by file offset keeps every row's rule: at each row's address
// in code, and just before the next row, the offset table says what the
// address table says.
func TestFileRowsKeepRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		path func(t *testing.T) string
	}{
		{"libc", func(*testing.T) string { return "/lib/x86_64-linux-gnu/libc.so.6" }},
		{"go-cgo", func(t *testing.T) string { return testutil.BuildWorkload(t, testutil.GoCgo) }},
		{"go", func(t *testing.T) string { return testutil.BuildWorkload(t, testutil.GoChain) }},
		{"c-lld-bolt", func(t *testing.T) string {
			return testutil.BuildLayout(t, testutil.Layout{Name: "bolt", Flags: []string{"-fuse-ld=lld", "-Wl,--emit-relocs"}, BOLT: true})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t)
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			vt, err := fromFile(f, nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			segs := loadSegments(f)
			// fileRows consumes its input: given room it writes over it,
			// otherwise it copies. Both must give the same rows.
			roomy := append(make([]Row, 0, len(vt.Rows)+2*len(segs)), vt.Rows...)
			rows, err := fileRows(roomy, segs, nil)
			if err != nil {
				t.Fatal(err)
			}
			copied, err := fileRows(slices.Clone(vt.Rows), segs, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rows, copied) {
				t.Fatalf("re-keyed in place: %d rows; copied: %d rows, not the same", len(rows), len(copied))
			}
			ot := &Table{Rows: rows}
			checked := 0
			for i, r := range vt.Rows {
				pcs := []uint64{r.PC}
				if i+1 < len(vt.Rows) && vt.Rows[i+1].PC > r.PC+1 {
					pcs = append(pcs, vt.Rows[i+1].PC-1)
				}
				for _, pc := range pcs {
					off, ok := fileOffset(segs, pc)
					if !ok {
						continue
					}
					if _, code := vaddrAt(segs, off); !code {
						continue
					}
					want, _ := vt.Lookup(pc)
					got, ok := ot.Lookup(off)
					checked++
					if !ok || !got.sameRule(want) {
						t.Fatalf("address %#x (offset %#x): by offset %+v (found %v), by address %+v", pc, off, got, ok, want)
					}
				}
			}
			if checked < len(vt.Rows)/2 {
				t.Errorf("checked %d of %d rows", checked, len(vt.Rows))
			}
		})
	}
}
