package unwind

import (
	"debug/elf"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// expectARM64 is what a readelf row of an aarch64 file means for our Row.
// readelf prints "u" for x30 both before a prologue stores it (the return
// address is in the link register) and where CFI marks it undefined (the
// outermost frame), so either reading is accepted there (raEither).
func expectARM64(f readelfFDE, r readelfRow) (e expectation, raEither bool, err error) {
	if strings.Contains(f.cieAug, "S") {
		return expectation{cfa: CFASignal, fp: FPUnknown}, false, nil
	}
	base, off, ok := strings.Cut(r.cfa, "+")
	if !ok || base != "sp" && base != "x29" {
		if r.ra == "u" {
			return expectation{cfa: CFAEnd}, false, nil
		}
		return expectation{cfa: CFAUnknown}, false, nil
	}
	n, err := strconv.ParseInt(off, 10, 32)
	if err != nil {
		return e, false, fmt.Errorf("cfa %q: %w", r.cfa, err)
	}
	e.cfaOff = int32(n)
	slot := func(cell string) (int32, bool) {
		if !strings.HasPrefix(cell, "c") {
			return 0, false
		}
		v, err := strconv.ParseInt(cell[1:], 10, 32)
		return int32(v), err == nil
	}
	fpSlot, fpSaved := slot(r.rbp)
	if raSlot, ok := slot(r.ra); ok && (raSlot < math.MinInt16 || raSlot > math.MaxInt16) {
		// A Row holds slots within ±32 KiB of the CFA: beyond (a frame
		// of more than 32 KiB) the return address is out of reach.
		return expectation{cfa: CFAUnknown}, false, nil
	}
	fpRule := func() {
		switch r.rbp {
		case "", "s":
			e.fp = FPSame
		case "u":
			e.fp, e.fpEither = FPSame, true
		default:
			e.fp = FPUnknown
		}
	}
	switch raSlot, raSaved := slot(r.ra); {
	case r.ra == "" || r.ra == "u" || r.ra == "s":
		if base != "sp" {
			// The return address back in x30 with the CFA still from
			// x29 (an epilogue): no rule has that.
			return expectation{cfa: CFAUnknown}, r.ra == "u", nil
		}
		e.cfa = CFASPLR
		if fpSaved {
			e.fp, e.fpOff = FPOffset, fpSlot
		} else {
			fpRule()
		}
		return e, r.ra == "u", nil
	case !raSaved:
		return expectation{cfa: CFAUnknown}, false, nil
	case fpSaved && raSlot == fpSlot+8:
		e.cfa, e.fp, e.fpOff = CFASPRecord, FPOffset, fpSlot
		if base == "x29" {
			e.cfa = CFAFPRecord
		}
	case base == "sp":
		e.cfa, e.fpOff = CFASPRA, raSlot
		fpRule()
	default:
		return expectation{cfa: CFAUnknown}, false, nil
	}
	return e, false, nil
}

// matchesARM64 compares r with e as the aarch64 rules use a row's fields.
func (e expectation) matchesARM64(r Row) bool {
	if r.CFA != e.cfa {
		return false
	}
	switch e.cfa {
	case CFASPLR, CFASPRecord, CFAFPRecord, CFASPRA:
	default:
		return true
	}
	if r.CFAOffset != e.cfaOff {
		return false
	}
	if e.cfa == CFASPRA && int32(r.FPOffset) != e.fpOff {
		return false
	}
	if e.fpEither && r.FP == FPUnknown {
		return true
	}
	if r.FP != e.fp {
		return false
	}
	return r.FP != FPOffset || int32(r.FPOffset) == e.fpOff
}

// oracleARM64 compares FromELF's table of the aarch64 file path with
// aarch64-linux-gnu-readelf's interpretation of its .eh_frame, at every
// row readelf prints, and checks that its PLT unwinds from the link
// register. It returns the rows checked, and how many of them the kernel's
// row format holds as they are (kernelRow keeps the rule).
func oracleARM64(t *testing.T, readelf, path string) (checked, kernelExact int) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Machine != elf.EM_AARCH64 {
		t.Fatalf("%s: machine %v, want aarch64", path, f.Machine)
	}
	tab, err := FromELF(f)
	if err != nil {
		t.Fatalf("FromELF(%s): %v", path, err)
	}
	var mismatches int
	kinds := map[CFAType]int{}
	for _, fd := range parseReadelfWith(t, readelf, path) {
		if fd.section != ".eh_frame" || fd.begin == fd.end {
			continue
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
			want, raEither, err := expectARM64(fd, rr)
			if err != nil {
				t.Errorf("%s: fde %#x: %v", path, fd.begin, err)
				continue
			}
			got, ok := tab.Lookup(rr.loc)
			checked++
			kinds[want.cfa]++
			match := ok && want.matchesARM64(got)
			if !match && raEither && ok && got.CFA == CFAEnd {
				match = true
			}
			if !match {
				if mismatches++; mismatches <= 10 {
					t.Errorf("%s: pc %#x (fde %#x..%#x, readelf cfa=%s x29=%q ra=%s): got %+v (found %v), want %+v",
						path, rr.loc, fd.begin, fd.end, rr.cfa, rr.rbp, rr.ra, got, ok, want)
				}
				continue
			}
			cfa, cfaOff, fpRule, fpOff := kernelRowRule(got)
			switch {
			case cfa != got.CFA || fpRule != got.FP:
			case cfa != CFASPLR && cfa != CFASPRecord && cfa != CFAFPRecord && cfa != CFASPRA:
				kernelExact++ // the offsets are unused
			case cfaOff == got.CFAOffset && (fpRule != FPOffset && cfa != CFASPRA || fpOff == int32(got.FPOffset)):
				kernelExact++
			}
		}
	}
	if checked == 0 {
		t.Errorf("%s: no .eh_frame rows checked", path)
	}
	for _, s := range f.Sections {
		if s.Name != ".plt" {
			continue
		}
		for pc := s.Addr; pc < s.Addr+s.Size; pc += 4 {
			if r, ok := tab.Lookup(pc); !ok || r.CFA != CFASPLR || r.CFAOffset != 0 {
				t.Errorf("%s: .plt at %#x: got %+v (found %v), want sp+0 with the return address in x30", path, pc, r, ok)
				break
			}
		}
	}
	t.Logf("%s: %d readelf rows, %d agree, %d held exactly by kernel rows; expected kinds %v; stats %+v",
		filepath.Base(path), checked, checked-mismatches, kernelExact, kinds, tab.Stats)
	return checked, kernelExact
}

// kernelRowRule is what the eBPF side's row made of r says, in Row's terms.
func kernelRowRule(r Row) (CFAType, int32, FPRule, int32) {
	cfa := map[uint8]CFAType{tracer.CFAUnknown: CFAUnknown, tracer.CFASP: CFASP, tracer.CFAFP: CFAFP,
		tracer.CFAPLT: CFAPLT, tracer.CFASignal: CFASignal, tracer.CFAEnd: CFAEnd,
		tracer.CFASPLR: CFASPLR, tracer.CFASPRecord: CFASPRecord, tracer.CFAFPRecord: CFAFPRecord,
		tracer.CFASPRA: CFASPRA, tracer.CFASPGo: CFASPGo, tracer.CFAGoCgo: CFAGoCgo}
	fp := map[uint8]FPRule{tracer.FPSame: FPSame, tracer.FPOffset: FPOffset, tracer.FPUnknown: FPUnknown}
	ct, cfaOff, ft, fpOff := tracer.RowRule(kernelRow(r, 0))
	return cfa[ct], cfaOff, fp[ft], fpOff
}

// TestOracleReadelfARM64 cross-compiles the CFI fixtures for aarch64
// (Debian's gcc-aarch64-linux-gnu) with and without frame pointers, with
// pointer authentication, at -O0, statically and as C++, and checks the
// tables against aarch64-linux-gnu-readelf, as TestOracleReadelf does on
// x86-64; the cross toolchain's own libc and libstdc++ are checked too.
func TestOracleReadelfARM64(t *testing.T) {
	readelf := testutil.RequireTool(t, "aarch64-linux-gnu-readelf")
	c := func(name string, flags ...string) func(t *testing.T) string {
		return func(t *testing.T) string {
			return testutil.BuildCWith(t, "aarch64-linux-gnu-gcc", name, flags, filepath.Join("testdata", "frames.c"))
		}
	}
	system := func(p string) func(t *testing.T) string {
		return func(t *testing.T) string {
			if _, err := os.Stat(p); err != nil {
				// The cross toolchain installs them: without it the
				// compilers above are missing too.
				testutil.RequireTool(t, "aarch64-linux-gnu-gcc")
				t.Fatalf("%s: %v", p, err)
			}
			return p
		}
	}
	fixtures := []struct {
		name string
		path func(t *testing.T) string
		// exact is the least share of rows the kernel's rows must hold
		// as they are.
		exact float64
	}{
		{"c-omit-fp", c("omitfp", "-O2", "-fomit-frame-pointer"), 0.99},
		{"c-fp", c("fp", "-O2", "-fno-omit-frame-pointer"), 0.99},
		{"c-O0", c("o0", "-O0"), 0.99},
		{"c-pac", c("pac", "-O2", "-fomit-frame-pointer", "-mbranch-protection=standard"), 0.99},
		{"c-static", c("static", "-O2", "-static"), 0.99},
		{"cxx-exceptions", func(t *testing.T) string {
			return testutil.BuildCWith(t, "aarch64-linux-gnu-g++", "cxx", []string{"-O2"}, filepath.Join("testdata", "frames.cc"))
		}, 0.99},
		{"libc", system("/usr/aarch64-linux-gnu/lib/libc.so.6"), 0.99},
		{"libstdc++", system("/usr/aarch64-linux-gnu/lib/libstdc++.so.6"), 0.99},
	}
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			checked, exact := oracleARM64(t, readelf, fx.path(t))
			if share := float64(exact) / float64(max(checked, 1)); share < fx.exact {
				t.Errorf("kernel rows hold %d of %d rows exactly (%.2f%%), want at least %.0f%%", exact, checked, 100*share, 100*fx.exact)
			}
		})
	}
}
