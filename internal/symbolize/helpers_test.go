package symbolize

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ianlancetaylor/demangle"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// funcSym is a function symbol as an external tool (nm) lists it.
type funcSym struct {
	name       string
	addr, size uint64
}

// nmFunctions lists the defined text symbols of bin with `nm -S`, raw
// (mangled) names without version suffixes. dynamic selects .dynsym.
func nmFunctions(t testing.TB, bin string, dynamic bool) []funcSym {
	t.Helper()
	args := []string{"-S", "--defined-only"}
	if dynamic {
		args = append(args, "-D")
	}
	out := run(t, nil, testutil.RequireTool(t, "nm"), append(args, bin)...)
	var syms []funcSym
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		var addrS, sizeS, typ, name string
		switch len(f) {
		case 4:
			addrS, sizeS, typ, name = f[0], f[1], f[2], f[3]
		case 3:
			addrS, typ, name = f[0], f[1], f[2]
		default:
			continue
		}
		if !strings.ContainsAny(typ, "TtWwi") {
			continue
		}
		addr, err := strconv.ParseUint(addrS, 16, 64)
		if err != nil {
			t.Fatalf("nm line %q: %v", line, err)
		}
		var size uint64
		if sizeS != "" {
			size, _ = strconv.ParseUint(sizeS, 16, 64)
		}
		name, _, _ = strings.Cut(name, "@")
		syms = append(syms, funcSym{name: name, addr: addr, size: size})
	}
	return syms
}

// goNMFunctions lists the text symbols of a Go binary with `go tool nm`.
func goNMFunctions(t testing.TB, bin string) []funcSym {
	t.Helper()
	out := run(t, nil, goTool(t), "tool", "nm", "-size", "-sort", "address", bin)
	var syms []funcSym
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || (f[2] != "T" && f[2] != "t") {
			continue
		}
		addr, err1 := strconv.ParseUint(f[0], 16, 64)
		size, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("go tool nm line %q", line)
		}
		syms = append(syms, funcSym{name: strings.Join(f[3:], " "), addr: addr, size: size})
	}
	return syms
}

func goTool(t testing.TB) string {
	t.Helper()
	return testutil.RequireTool(t, "go")
}

func run(t testing.TB, stdin *string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(*stdin)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return string(out)
}

// sourcePos is what an addr2line prints for one address.
type sourcePos struct {
	Function string
	File     string
	Line     int64
}

// parseAddr2line reads addr2line output: a function line, then "file:line"
// (with an optional " (discriminator N)"), per address.
func parseAddr2line(t testing.TB, out string, n int) []sourcePos {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(out))
	var pos []sourcePos
	for sc.Scan() {
		fn := sc.Text()
		if !sc.Scan() {
			t.Fatalf("addr2line output ends after %q", fn)
		}
		loc, _, _ := strings.Cut(sc.Text(), " (discriminator")
		file, lineS, _ := strings.Cut(loc, ":")
		if i := strings.LastIndexByte(loc, ':'); i >= 0 {
			file, lineS = loc[:i], loc[i+1:]
		}
		line, _ := strconv.ParseInt(lineS, 10, 64)
		if file == "??" {
			file = ""
		}
		pos = append(pos, sourcePos{Function: fn, File: file, Line: line})
	}
	if len(pos) != n {
		t.Fatalf("addr2line gave %d answers for %d addresses:\n%s", len(pos), n, out)
	}
	return pos
}

// addr2line runs binutils addr2line -a -f -i -C on addrs. Until inline
// levels are expanded a frame carries the function of the symbol (the
// outermost level) and the innermost source position, so that is what this
// returns: the last function addr2line prints for an address with the first
// file and line.
func addr2line(t testing.TB, bin string, addrs []uint64) []sourcePos {
	t.Helper()
	args := []string{"-a", "-f", "-i", "-C", "-e", bin}
	for _, a := range addrs {
		args = append(args, fmt.Sprintf("%#x", a))
	}
	out := run(t, nil, testutil.RequireTool(t, "addr2line"), args...)
	groups := addr2lineGroups(t, out, len(addrs))
	pos := make([]sourcePos, len(groups))
	for i, g := range groups {
		levels := parseAddr2line(t, g, strings.Count(g, "\n")/2)
		innermost, outermost := levels[0], levels[len(levels)-1]
		pos[i] = sourcePos{Function: outermost.Function, File: innermost.File, Line: innermost.Line}
	}
	return pos
}

// goAddr2line runs `go tool addr2line` on addrs.
func goAddr2line(t testing.TB, bin string, addrs []uint64) []sourcePos {
	t.Helper()
	var in strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&in, "%#x\n", a)
	}
	s := in.String()
	return parseAddr2line(t, run(t, &s, goTool(t), "tool", "addr2line", bin), len(addrs))
}

// vaddrToOffset is the inverse of the translation under test: the file
// offset of vaddr by the PT_LOAD segment holding it.
func vaddrToOffset(t testing.TB, bin string, vaddr uint64) uint64 {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr-p.Vaddr < p.Filesz {
			return p.Off + (vaddr - p.Vaddr)
		}
	}
	t.Fatalf("%#x is in no PT_LOAD segment of %s", vaddr, bin)
	return 0
}

// probes returns addresses inside a function: its first byte, the next,
// its middle and its last byte.
func probes(s funcSym) []uint64 {
	if s.size <= 1 {
		return []uint64{s.addr}
	}
	return []uint64{s.addr, s.addr + 1, s.addr + s.size/2, s.addr + s.size - 1}
}

func testdata(name string) string { return filepath.Join("testdata", name) }

// addr2lineGroups splits the output of addr2line -a into one group of lines
// per address (the lines after each "0x..." line), expecting n of them.
func addr2lineGroups(t testing.TB, out string, n int) []string {
	t.Helper()
	var groups []string
	for _, line := range strings.SplitAfter(out, "\n") {
		if strings.HasPrefix(line, "0x") {
			groups = append(groups, "")
			continue
		}
		if len(groups) == 0 {
			t.Fatalf("addr2line output does not start with an address:\n%s", out)
		}
		groups[len(groups)-1] += line
	}
	if len(groups) != n {
		t.Fatalf("addr2line gave %d answers for %d addresses", len(groups), n)
	}
	return groups
}

// fullNames returns lines with each Function replaced by the full
// demangled form of its raw name, as addr2line -C prints it, after checking
// that Function is that name simplified with pprof's default options (no
// parameters, no template arguments, no return type).
func fullNames(t testing.TB, lines []Line) []Line {
	t.Helper()
	out := slices.Clone(lines)
	for i, l := range out {
		if l.SystemName == "" {
			continue
		}
		pprofName := demangle.Filter(l.SystemName, demangle.NoParams, demangle.NoEnclosingParams, demangle.NoTemplateParams)
		if l.Function != pprofName {
			t.Errorf("%s is named %q, want %q as pprof simplifies it", l.SystemName, l.Function, pprofName)
		}
		out[i].Function = demangle.Filter(l.SystemName)
	}
	return out
}
