package unwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// readelfRow is one row of `readelf --debug-dump=frames-interp`: the CFA
// rule and the frame pointer's (rbp, or x29 on aarch64) and return-address
// cells ("" when the column is absent).
type readelfRow struct {
	loc     uint64
	cfa     string
	rbp, ra string
}

// readelfFDE is one FDE as readelf interprets it.
type readelfFDE struct {
	section    string // ".eh_frame" or ".debug_frame"
	cieAug     string
	begin, end uint64
	rows       []readelfRow // empty when the FDE only has nops: its CIE's row applies
	cieRow     *readelfRow
}

var (
	reSection = regexp.MustCompile(`^Contents of the (\S+) section`)
	reCIE     = regexp.MustCompile(`^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE "([^"]*)"`)
	reFDE     = regexp.MustCompile(`^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) pc=([0-9a-f]+)\.\.([0-9a-f]+)`)
	reRow     = regexp.MustCompile(`^[0-9a-f]{16} `)
)

// parseReadelf runs readelf on path and returns every FDE it interprets.
func parseReadelf(t *testing.T, path string) []readelfFDE {
	t.Helper()
	return parseReadelfWith(t, testutil.RequireTool(t, "readelf"), path)
}

// parseReadelfWith is parseReadelf with the given readelf.
func parseReadelfWith(t *testing.T, readelf, path string) []readelfFDE {
	t.Helper()
	// readelf exits 1 after warnings about sections it does not need here
	// (for example unknown notes); the frame dump is still complete.
	var stderr bytes.Buffer
	cmd := exec.Command(readelf, "--debug-dump=frames-interp", "-W", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil && len(out) == 0 {
		t.Fatalf("readelf %s: %v\n%s", path, err, stderr.Bytes())
	}
	type cieInfo struct {
		aug string
		row *readelfRow
	}
	cies := map[string]*cieInfo{} // by section + offset
	var (
		fdes    []readelfFDE
		section string
		cols    []string
		cur     *readelfFDE
		curCIE  *cieInfo
	)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := reSection.FindStringSubmatch(line); m != nil {
			section, cur, curCIE = m[1], nil, nil
			continue
		}
		if m := reCIE.FindStringSubmatch(line); m != nil {
			curCIE = &cieInfo{aug: m[2]}
			cies[section+m[1]] = curCIE
			cur = nil
			continue
		}
		if m := reFDE.FindStringSubmatch(line); m != nil {
			ci := cies[section+m[1]]
			if ci == nil {
				t.Fatalf("readelf: fde refers to unseen cie %s: %q", m[1], line)
			}
			b, _ := strconv.ParseUint(m[2], 16, 64)
			e, _ := strconv.ParseUint(m[3], 16, 64)
			fdes = append(fdes, readelfFDE{section: section, cieAug: ci.aug, begin: b, end: e, cieRow: ci.row})
			cur, curCIE = &fdes[len(fdes)-1], nil
			continue
		}
		fields := readelfFields(line)
		if len(fields) >= 2 && fields[0] == "LOC" && fields[1] == "CFA" {
			cols = fields
			continue
		}
		if !reRow.MatchString(line) || (cur == nil && curCIE == nil) {
			continue
		}
		if len(fields) != len(cols) {
			t.Fatalf("readelf row %q does not match columns %q", line, cols)
		}
		r := readelfRow{cfa: fields[1]}
		r.loc, _ = strconv.ParseUint(fields[0], 16, 64)
		for i, c := range cols {
			switch c {
			case "rbp", "x29":
				r.rbp = fields[i]
			case "ra":
				r.ra = fields[i]
			}
		}
		if cur != nil {
			cur.rows = append(cur.rows, r)
		} else {
			curCIE.row = &r
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return fdes
}

// expectation is what a readelf row means for our Row; fpEither accepts
// FPSame or FPUnknown, because readelf prints "u" both for a register the
// program never mentions and for DW_CFA_undefined.
type expectation struct {
	cfa      CFAType
	cfaOff   int32
	fp       FPRule
	fpOff    int32
	fpEither bool
}

func expect(f readelfFDE, r readelfRow, inPLT bool) (expectation, error) {
	var e expectation
	if strings.Contains(f.cieAug, "S") {
		return expectation{cfa: CFASignal, fp: FPUnknown}, nil
	}
	switch r.ra {
	case "u":
		return expectation{cfa: CFAEnd}, nil
	case "c-8":
	default:
		return expectation{cfa: CFAUnknown}, nil
	}
	switch {
	case r.cfa == "exp":
		if !inPLT {
			return expectation{cfa: CFAUnknown}, nil
		}
		e.cfa, e.cfaOff = CFAPLT, 8
	case strings.HasPrefix(r.cfa, "rsp+"), strings.HasPrefix(r.cfa, "rbp+"):
		n, err := strconv.ParseInt(r.cfa[4:], 10, 32)
		if err != nil {
			return e, fmt.Errorf("cfa %q: %w", r.cfa, err)
		}
		e.cfa, e.cfaOff = CFASP, int32(n)
		if r.cfa[:3] == "rbp" {
			e.cfa = CFAFP
		}
	default:
		return expectation{cfa: CFAUnknown}, nil
	}
	switch {
	case r.rbp == "" || r.rbp == "s":
		e.fp = FPSame
	case r.rbp == "u":
		e.fp, e.fpEither = FPSame, true
	case strings.HasPrefix(r.rbp, "c"):
		n, err := strconv.ParseInt(r.rbp[1:], 10, 32)
		if err != nil {
			return e, fmt.Errorf("rbp %q: %w", r.rbp, err)
		}
		e.fp, e.fpOff = FPOffset, int32(n)
	default:
		e.fp = FPUnknown
	}
	return e, nil
}

func (e expectation) matches(r Row) bool {
	if r.CFA != e.cfa {
		return false
	}
	switch e.cfa {
	case CFASP, CFAFP, CFAPLT:
	default:
		return true
	}
	if r.CFAOffset != e.cfaOff {
		return false
	}
	if e.fpEither && r.FP == FPUnknown {
		return true
	}
	return r.FP == e.fp && int32(r.FPOffset) == e.fpOff
}

// oracleFile compares FromELF's table of path with readelf's
// interpretation of it (see oracleTable).
func oracleFile(t *testing.T, path, section string) (checked int) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tab, err := FromELF(f)
	if err != nil {
		t.Fatalf("FromELF(%s): %v", path, err)
	}
	return oracleTable(t, tab, path, section)
}

// oracleTable compares tab with readelf's interpretation of path at every
// readelf row of the FDEs of section (FDEs of .debug_frame that overlap an
// .eh_frame FDE are skipped: .eh_frame wins).
func oracleTable(t *testing.T, tab *Table, path, section string) (checked int) {
	t.Helper()
	return oracleLookup(t, tab.Lookup, tab.Stats, path, section)
}

// oracleLookup is oracleTable with rows found by lookup, at the addresses
// readelf names (ELF virtual addresses).
func oracleLookup(t *testing.T, lookup func(pc uint64) (Row, bool), stats Stats, path, section string) (checked int) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var plts [][2]uint64
	for _, s := range f.Sections {
		if strings.HasPrefix(s.Name, ".plt") {
			plts = append(plts, [2]uint64{s.Addr, s.Addr + s.Size})
		}
	}
	all := parseReadelf(t, path)
	var eh [][2]uint64
	for _, fd := range all {
		if fd.section == ".eh_frame" {
			eh = append(eh, [2]uint64{fd.begin, fd.end})
		}
	}
	overlapsEH := func(b, e uint64) bool {
		for _, r := range eh {
			if r[0] < e && b < r[1] {
				return true
			}
		}
		return false
	}
	var fdes, mismatches, fpEither int
	kinds := map[CFAType]int{}
	for _, fd := range all {
		if fd.section != section || fd.begin == fd.end {
			continue
		}
		if section != ".eh_frame" && overlapsEH(fd.begin, fd.end) {
			continue
		}
		fdes++
		inPLT := false
		for _, p := range plts {
			inPLT = inPLT || fd.begin >= p[0] && fd.end <= p[1]
		}
		rows := fd.rows
		if len(rows) == 0 {
			if fd.cieRow == nil {
				t.Errorf("%s: fde %#x..%#x has neither rows nor a cie row", path, fd.begin, fd.end)
				continue
			}
			r := *fd.cieRow
			r.loc = fd.begin
			rows = []readelfRow{r}
		}
		for _, rr := range rows {
			want, err := expect(fd, rr, inPLT)
			if err != nil {
				t.Errorf("%s: fde %#x: %v", path, fd.begin, err)
				continue
			}
			got, ok := lookup(rr.loc)
			checked++
			kinds[want.cfa]++
			if want.fpEither && got.FP == FPUnknown {
				fpEither++
			}
			if !ok || !want.matches(got) {
				mismatches++
				if mismatches <= 10 {
					t.Errorf("%s: pc %#x (fde %#x..%#x, readelf cfa=%s rbp=%q ra=%s): got %+v (found %v), want %+v",
						path, rr.loc, fd.begin, fd.end, rr.cfa, rr.rbp, rr.ra, got, ok, want)
				}
			}
		}
	}
	if checked == 0 {
		t.Errorf("%s: no %s rows checked", path, section)
	}
	t.Logf("%s %s: %d FDEs, %d readelf rows, %d agree (%.2f%%); expected kinds %v; rbp \"u\" read as undefined %d; stats %+v",
		filepath.Base(path), section, fdes, checked, checked-mismatches,
		100*float64(checked-mismatches)/float64(max(checked, 1)), kinds, fpEither, stats)
	return checked
}

func TestOracleReadelf(t *testing.T) {
	testutil.RequireTool(t, "readelf")
	type fixture struct {
		name    string
		path    func(t *testing.T) string
		section string
	}
	system := func(p string) func(t *testing.T) string {
		return func(t *testing.T) string {
			if _, err := os.Stat(p); err != nil {
				t.Skipf("%s: %v", p, err)
			}
			return p
		}
	}
	c := func(name string, flags ...string) func(t *testing.T) string {
		return func(t *testing.T) string {
			return testutil.BuildC(t, name, flags, filepath.Join("testdata", "frames.c"))
		}
	}
	fixtures := []fixture{
		{"libc", system("/lib/x86_64-linux-gnu/libc.so.6"), ".eh_frame"},
		{"libstdc++", system("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"), ".eh_frame"},
		{"ld.so", system("/lib64/ld-linux-x86-64.so.2"), ".eh_frame"},
		{"c-omit-fp", c("omitfp", "-O2", "-fomit-frame-pointer"), ".eh_frame"},
		{"c-fp", c("fp", "-O2", "-fno-omit-frame-pointer"), ".eh_frame"},
		{"c-O0", c("o0", "-O0"), ".eh_frame"},
		{"c-debug-frame", c("debugframe", "-O2", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"), ".debug_frame"},
		{"c-static", c("static", "-O2", "-static"), ".eh_frame"},
		{"cxx-exceptions", func(t *testing.T) string {
			gxx := testutil.RequireTool(t, "g++")
			out := filepath.Join(t.TempDir(), "cxx")
			cmd := exec.Command(gxx, "-O2", "-o", out, filepath.Join("testdata", "frames.cc"))
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, b)
			}
			return out
		}, ".eh_frame"},
	}
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			oracleFile(t, fx.path(t), fx.section)
		})
	}
}

// readelfFields splits a readelf row into cells; a register rule printed as
// "r9 (r9)" is one cell.
func readelfFields(line string) []string {
	var out []string
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, "(") && len(out) > 0 {
			out[len(out)-1] += " " + f
			continue
		}
		out = append(out, f)
	}
	return out
}

// TestFromSeparateDebug splits a binary whose functions have only
// .debug_frame into a stripped file and its debug file (objcopy
// --only-keep-debug), and checks that the two together give the table of the
// unstripped binary.
func TestFromSeparateDebug(t *testing.T) {
	objcopy := testutil.RequireTool(t, "objcopy")
	full := testutil.BuildC(t, "full", []string{"-O2", "-g", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables"}, filepath.Join("testdata", "frames.c"))
	dir := t.TempDir()
	debugPath, stripped := filepath.Join(dir, "full.debug"), filepath.Join(dir, "stripped")
	for _, args := range [][]string{{"--only-keep-debug", full, debugPath}, {"--strip-debug", full, stripped}} {
		if out, err := exec.Command(objcopy, args...).CombinedOutput(); err != nil {
			t.Fatalf("objcopy %v: %v\n%s", args, err, out)
		}
	}
	open := func(p string) *elf.File {
		f, err := elf.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	want, err := FromELF(open(full))
	if err != nil {
		t.Fatal(err)
	}
	alone, err := FromELF(open(stripped))
	if err != nil {
		t.Fatal(err)
	}
	got, err := FromSeparateDebug(open(stripped), open(debugPath))
	if err != nil {
		t.Fatal(err)
	}
	if alone.Stats.FDEs >= want.Stats.FDEs {
		t.Fatalf("stripped file alone has %d FDEs, full file %d: the fixture lost nothing", alone.Stats.FDEs, want.Stats.FDEs)
	}
	if diff := cmp.Diff(want.Rows, got.Rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}
