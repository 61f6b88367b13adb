package pprofexporter

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// cxxNames is a C++ program whose functions have the names that pprof's
// flame graph cut into fragments while they carried parameter lists.
const cxxNames = `#include <utility>
#include <vector>
namespace clang {
struct Module { int id; };
class Sema {
public:
	__attribute__((noinline)) bool ActOnComment(Module& m, Sema& s, bool a, bool b) { return m.id > 0 && &s == this && a != b; }
};
}
template <typename T>
__attribute__((noinline)) T twice(std::vector<std::pair<T, int>>& v, const T& x) {
	clang::Sema s;
	clang::Module m{static_cast<int>(v.size())};
	return s.ActOnComment(m, s, true, false) ? x + x : x;
}
int main() {
	std::vector<std::pair<long, int>> v{{1, 2}};
	return static_cast<int>(twice(v, 21L)) - 42;
}
`

// flameSep is where pprof's flame graph splits a name into the shorter
// forms it displays when a box is narrow (internal/report/shortnames.go).
var flameSep = regexp.MustCompile(`::|\.`)

// Real C++ names, as the symbolizer gives them for a real g++ binary, go
// through the exporter into a pprof file that go tool pprof reads: its
// stacks show the simplified names (namespaces and class, no parameters or
// template arguments), every shorter form the flame graph may display is a
// whole name part (no "Module&, clang::Sema&, bool, bool)"), the mangled
// name is kept as the system name, and pprof has nothing to complain about.
func TestCxxNamesThroughPprof(t *testing.T) {
	gxx := testutil.RequireTool(t, "g++")
	dir := t.TempDir()
	src := filepath.Join(dir, "names.cc")
	if err := os.WriteFile(src, []byte(cxxNames), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "names")
	if out, err := exec.Command(gxx, "-O1", "-g", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	addrOf := map[string]uint64{} // by mangled-name prefix
	for _, s := range syms {
		for _, p := range []string{"_ZN5clang4Sema12ActOnComment", "_Z5twiceIlET_", "main"} {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && strings.HasPrefix(s.Name, p) && (p != "main" || s.Name == "main") {
				addrOf[p] = s.Value + 1
			}
		}
	}
	if len(addrOf) != 3 {
		t.Fatalf("symbols found: %v", addrOf)
	}
	var text *elf.Prog
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			text = p
		}
	}
	if text == nil {
		t.Fatal("no executable segment")
	}

	s := symbolize.New(nil, symbolize.Options{DebugDirs: []string{}})
	h, err := s.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	// Mapped as a PIE is: the text segment at a page-aligned base.
	const base = 0x555555554000
	m := &profile.Mapping{Start: base + text.Vaddr&^0xfff, Limit: base + (text.Vaddr+text.Memsz+0xfff)&^0xfff, Offset: text.Off &^ 0xfff, File: bin, FileID: h.ID.String()}
	var frames []profile.Frame
	for _, p := range []string{"_ZN5clang4Sema12ActOnComment", "_Z5twiceIlET_", "main"} {
		vaddr := addrOf[p]
		lines, err := s.Symbolize(h.ID, vaddr-text.Vaddr+text.Off)
		if err != nil || len(lines) == 0 {
			t.Fatalf("Symbolize(%s) = %v, %v", p, lines, err)
		}
		frames = append(frames, profile.Frame{Type: profile.FrameNative, Address: base + vaddr, Mapping: m, Lines: lines})
	}
	res := &profile.Resource{PID: 7, ExecutableName: "names", ExecutablePath: bin}
	samples := []profile.Sample{{Kind: profile.OnCPU, Resource: res, TID: 7, Time: flushStart.Add(time.Second), Frames: frames}}

	e, _ := newTestExporter(t, nil)
	if err := e.consumeProfiles(t.Context(), build(samples)); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(e.cfg.Directory, "*"+pprofSuffix))
	if err != nil || len(files) != 1 {
		t.Fatalf("pprof files %v, %v", files, err)
	}
	goBin := testutil.RequireTool(t, "go")
	cmd := exec.Command(goBin, "tool", "pprof", "-traces", files[0])
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go tool pprof -traces: %v\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "symbolization failed") || strings.Contains(stderr.String(), "rror") {
		t.Errorf("go tool pprof complained:\n%s", stderr.String())
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(line, "-") || strings.Contains(line, ":") && !strings.Contains(line, "::") {
			continue // headers, separators, labels
		}
		if _, err := strconv.ParseInt(strings.TrimSuffix(f[0], "ms"), 10, 64); err == nil {
			f = f[1:] // the sample's value starts its first line
		}
		if len(f) > 0 {
			names = append(names, strings.Join(f, " "))
		}
	}
	want := []string{"clang::Sema::ActOnComment", "twice", "main"}
	if !slices.Equal(names, want) {
		t.Fatalf("go tool pprof -traces shows %q, want %q\n%s", names, want, out)
	}
	for _, n := range names {
		for _, loc := range flameSep.FindAllStringIndex(n, -1) {
			part := n[loc[1]:]
			if strings.ContainsAny(part, "()<>&,") {
				t.Errorf("the flame graph may show %q for %q", part, n)
			}
		}
	}
	// The mangled names stay beside the simplified ones.
	p := readProfiles(t, e.cfg.Directory)
	_, prof := only(t, p)
	var system []string
	for _, fn := range prof.Function {
		system = append(system, fn.SystemName)
	}
	for _, pre := range []string{"_ZN5clang4Sema12ActOnComment", "_Z5twiceIlET_"} {
		if !slices.ContainsFunc(system, func(s string) bool { return strings.HasPrefix(s, pre) }) {
			t.Errorf("no function keeps the system name %s...: %q", pre, system)
		}
	}
}
