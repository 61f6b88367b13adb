package symbolize

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/internal/elfx"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// splitDebug builds inline.c with flags, and returns the unstripped build,
// a stripped copy and the debug file objcopy --only-keep-debug extracts.
func splitDebug(t *testing.T, flags ...string) (full, stripped, debug string) {
	t.Helper()
	objcopy := testutil.RequireTool(t, "objcopy")
	full = testutil.BuildC(t, "inline", append([]string{"-O2", "-g"}, flags...), testdata("inline.c"))
	dir := t.TempDir()
	stripped, debug = filepath.Join(dir, "inline"), filepath.Join(dir, "inline.debug")
	run(t, nil, objcopy, "--only-keep-debug", full, debug)
	run(t, nil, testutil.RequireTool(t, "strip"), "--strip-all", "-o", stripped, full)
	if syms := nmFunctions(t, stripped, false); len(syms) != 0 {
		t.Fatalf("oracle: strip left symbols %v", syms)
	}
	return full, stripped, debug
}

func ourAddrs(t *testing.T, bin string) []uint64 {
	t.Helper()
	var syms []funcSym
	for _, s := range nmFunctions(t, bin, false) {
		if s.name == "walk" || s.name == "twice" || s.name == "main" {
			syms = append(syms, s)
		}
	}
	return strideAddrs(syms, 3)
}

// requireAgreement checks every address of stripped, symbolized through s,
// against addr2line on the unstripped build.
func requireAgreement(t *testing.T, s *Symbolizer, stripped, full string) {
	t.Helper()
	addrs := ourAddrs(t, full)
	agree, _, diffs := agreement(t, s, stripped, full, addrs)
	if agree != len(addrs) {
		t.Errorf("%d of %d addresses disagree with addr2line on the unstripped build:\n%s", len(addrs)-agree, len(addrs), strings.Join(diffs, "\n"))
	}
}

func requireUnnamed(t *testing.T, s *Symbolizer, stripped, full string) {
	t.Helper()
	info, err := s.Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range ourAddrs(t, full)[:5] {
		if got, err := s.Symbolize(info.ID, vaddrToOffset(t, stripped, a)); err != nil || got != nil {
			t.Errorf("Symbolize(%#x) = %v, %v; want nil, nil without a debug file", a, got, err)
		}
	}
}

func TestDebugFileByBuildID(t *testing.T) {
	full, stripped, debug := splitDebug(t, "-Wl,--build-id")
	f, err := elf.Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	id, err := elfx.GNUBuildID(f)
	f.Close()
	if err != nil || len(id) < 4 {
		t.Fatalf("build id %q, %v", id, err)
	}
	dir := t.TempDir()
	target := filepath.Join(dir, ".build-id", id[:2], id[2:]+".debug")
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, debug, target)

	t.Run("found in DebugDirs", func(t *testing.T) {
		requireAgreement(t, New(zaptest.NewLogger(t), Options{DebugDirs: []string{t.TempDir(), dir}}), stripped, full)
	})
	t.Run("not searched", func(t *testing.T) {
		requireUnnamed(t, New(zaptest.NewLogger(t), Options{DebugDirs: []string{}}), stripped, full)
	})
	t.Run("wrong build id", func(t *testing.T) {
		// Another build's debug file under this build id is not used.
		_, _, other := splitDebug(t, "-Wl,--build-id", "-DOTHER=1", "-O1")
		wrong := t.TempDir()
		p := filepath.Join(wrong, ".build-id", id[:2], id[2:]+".debug")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		copyFile(t, other, p)
		requireUnnamed(t, New(zaptest.NewLogger(t), Options{DebugDirs: []string{wrong}}), stripped, full)
	})
}

func TestDebugFileByDebuglink(t *testing.T) {
	objcopy := testutil.RequireTool(t, "objcopy")
	full, stripped, debug := splitDebug(t, "-Wl,--build-id=none")
	// objcopy computes the CRC from the debug file named by path.
	run(t, nil, objcopy, "--add-gnu-debuglink="+debug, stripped)
	if err := os.Remove(debug); err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(debug)
	// place extracts the same debug file again (objcopy is deterministic)
	// into dir.
	place := func(t *testing.T, dir string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		run(t, nil, objcopy, "--only-keep-debug", full, filepath.Join(dir, name))
	}
	t.Run("next to the file", func(t *testing.T) {
		place(t, filepath.Dir(stripped))
		defer remove(t, filepath.Join(filepath.Dir(stripped), name))
		requireAgreement(t, New(zaptest.NewLogger(t), Options{DebugDirs: []string{}}), stripped, full)
	})
	t.Run(".debug subdirectory", func(t *testing.T) {
		sub := filepath.Join(filepath.Dir(stripped), ".debug")
		place(t, sub)
		defer remove(t, sub)
		requireAgreement(t, New(zaptest.NewLogger(t), Options{DebugDirs: []string{}}), stripped, full)
	})
	t.Run("under a debug dir", func(t *testing.T) {
		root := t.TempDir()
		place(t, filepath.Join(root, filepath.Dir(stripped)))
		requireAgreement(t, New(zaptest.NewLogger(t), Options{DebugDirs: []string{root}}), stripped, full)
	})
	t.Run("CRC mismatch", func(t *testing.T) {
		p := filepath.Join(filepath.Dir(stripped), name)
		place(t, filepath.Dir(stripped))
		defer remove(t, p)
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte{0}); err != nil { // same ELF content, different checksum
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		requireUnnamed(t, New(zaptest.NewLogger(t), Options{DebugDirs: []string{}}), stripped, full)
	})
}

// TestMiniDebugInfo builds a MiniDebugInfo section the way Fedora does: the
// function symbols .dynsym lacks, in an xz-compressed ELF file.
func TestMiniDebugInfo(t *testing.T) {
	objcopy := testutil.RequireTool(t, "objcopy")
	xz := testutil.RequireTool(t, "xz")
	full := testutil.BuildC(t, "cprog", []string{"-O2", "-g"}, testdata("cprog.c"))
	dir := t.TempDir()
	dyn := map[string]bool{}
	for _, s := range nmFunctions(t, full, true) {
		dyn[s.name] = true
	}
	var keep []string
	for _, s := range nmFunctions(t, full, false) {
		if !dyn[s.name] {
			keep = append(keep, s.name)
		}
	}
	keepFile := filepath.Join(dir, "keep_symbols")
	if err := os.WriteFile(keepFile, []byte(strings.Join(keep, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	debug, mini := filepath.Join(dir, "debug"), filepath.Join(dir, "mini_debuginfo")
	run(t, nil, objcopy, "--only-keep-debug", full, debug)
	run(t, nil, objcopy, "-S", "--remove-section", ".gdb_index", "--remove-section", ".comment", "--keep-symbols="+keepFile, debug, mini)
	run(t, nil, xz, "--keep", mini)
	stripped := filepath.Join(dir, "cprog")
	run(t, nil, testutil.RequireTool(t, "strip"), "--strip-all", "-R", ".comment", "-o", stripped, full)
	run(t, nil, objcopy, "--add-section", ".gnu_debugdata="+mini+".xz", stripped)

	// a, b, c and main are not exported: only MiniDebugInfo names them.
	all := nmFunctions(t, full, false)
	var local []funcSym
	for _, s := range all {
		if !dyn[s.name] && s.size > 0 {
			local = append(local, s)
		}
	}
	if len(local) == 0 || len(keep) == 0 {
		t.Fatalf("oracle: no function is missing from .dynsym: %v", all)
	}
	s := New(zaptest.NewLogger(t), Options{DebugDirs: []string{}})
	info, err := s.Open(stripped)
	if err != nil {
		t.Fatal(err)
	}
	pick(t, local, "a", "b", "c", "main")
	for _, sym := range local {
		got, err := s.Symbolize(info.ID, vaddrToOffset(t, stripped, sym.addr+sym.size/2))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]Line{{Function: sym.name}}, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", sym.name, diff)
		}
	}

	t.Run("without the section", func(t *testing.T) {
		plain := filepath.Join(dir, "cprog-plain")
		run(t, nil, testutil.RequireTool(t, "strip"), "--strip-all", "-o", plain, full)
		s := New(zaptest.NewLogger(t), Options{DebugDirs: []string{}})
		info, err := s.Open(plain)
		if err != nil {
			t.Fatal(err)
		}
		sym := pick(t, local, "c")[0]
		got, err := s.Symbolize(info.ID, vaddrToOffset(t, plain, sym.addr+sym.size/2))
		if err != nil || got != nil {
			t.Errorf("Symbolize(c) without MiniDebugInfo = %v, %v; want nil, nil", got, err)
		}
	})
}

// TestReplacedFile symbolizes a running binary whose file was replaced on
// disk after it started, through /proc/PID/map_files.
func TestReplacedFile(t *testing.T) {
	testutil.RequirePrivileges(t, "reading /proc/PID/map_files")
	orig := testutil.BuildWorkload(t, testutil.CChain)
	dir := t.TempDir()
	bin := filepath.Join(dir, "cchain")
	copyFile(t, orig, bin)
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := testutil.StartWorkload(t, bin)
	pid := cmd.Process.Pid

	// Wait until the binary is mapped: exec has replaced the child's image
	// once its maps name the file.
	var mapping string
	for try := 0; mapping == "" && try < 1000; try++ {
		mapping = execMapping(t, pid, bin)
	}
	if mapping == "" {
		t.Fatalf("pid %d never mapped %s executable", pid, bin)
	}
	// Replace the file: new content under the same name.
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("not the program any more\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, bin); err != nil {
		t.Fatal(err)
	}
	if _, err := elf.Open(bin); err == nil {
		t.Fatal("the replacement is still an ELF file")
	}
	path := fmt.Sprintf("/proc/%d/map_files/%s", pid, mapping)
	s := New(zaptest.NewLogger(t), Options{})
	info, err := s.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sym := pick(t, nmFunctions(t, orig, false), "c")[0]
	want := addr2lineChains(t, orig, []uint64{sym.addr + 4})[0]
	got, err := s.Symbolize(info.ID, vaddrToOffset(t, orig, sym.addr+4))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, chainOf(t, got)); diff != "" {
		t.Errorf("c+4 through %s (-addr2line +ours):\n%s", path, diff)
	}
	if v := elfx.ViewOf(path); v.Root != fmt.Sprintf("/proc/%d/root", pid) || v.Path != bin {
		t.Errorf("elfx.ViewOf(%s) = %+v, want root /proc/%d/root and path %s", path, v, pid, bin)
	}
}

// execMapping returns the "start-end" of the executable mapping of file in
// pid's maps; "" when there is none yet.
func execMapping(t *testing.T, pid int, file string) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 6 && strings.Contains(fields[1], "x") && fields[5] == file {
			return fields[0]
		}
	}
	return ""
}

// remove removes path and what it holds, for the next subtest; it fails t
// if that fails.
func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Error(err)
	}
}
