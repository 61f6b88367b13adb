package elfx

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sonde-dev/sonde/internal/testutil"
)

func TestParseDebuglink(t *testing.T) {
	le := func(name string, pad int, crc uint32) []byte {
		b := append([]byte(name), make([]byte, pad)...)
		return binary.LittleEndian.AppendUint32(b, crc)
	}
	tests := []struct {
		name     string
		data     []byte
		wantName string
		wantCRC  uint32
		wantOK   bool
	}{
		{"aligned", le("libx.debug", 2, 0xdeadbeef), "libx.debug", 0xdeadbeef, true},
		{"name of 3", le("abc", 1, 7), "abc", 7, true},
		{"name of 4", le("abcd", 4, 9), "abcd", 9, true},
		{"no NUL", []byte("abcdefgh"), "", 0, false},
		{"truncated CRC", le("abc", 1, 7)[:6], "", 0, false},
		{"path refused", le("../../etc/x", 1, 1), "", 0, false},
		{"empty name", le("", 4, 1), "", 0, false},
		{"dot-dot", le("..", 2, 1), "", 0, false},
		{"empty", nil, "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, crc, ok := parseDebuglink(tt.data, binary.LittleEndian)
			if diff := cmp.Diff([]any{tt.wantName, tt.wantCRC, tt.wantOK}, []any{name, crc, ok}); diff != "" {
				t.Errorf("parseDebuglink (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSplitProcRoot(t *testing.T) {
	tests := []struct {
		path, root, rel string
		ok              bool
	}{
		{"/proc/1234/root/usr/lib/libc.so.6", "/proc/1234/root", "/usr/lib/libc.so.6", true},
		{"/proc/self/root/bin/true", "/proc/self/root", "/bin/true", true},
		{"/proc/1234/map_files/400000-401000", "", "", false},
		{"/proc/12a4/root/x", "", "", false},
		{"/proc/1234/rootx/y", "", "", false},
		{"/usr/lib/libc.so.6", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			root, rel, ok := SplitProcRoot(tt.path)
			if root != tt.root || rel != tt.rel || ok != tt.ok {
				t.Errorf("SplitProcRoot = %q, %q, %v; want %q, %q, %v", root, rel, ok, tt.root, tt.rel, tt.ok)
			}
		})
	}
}

// splitDebug builds hello.c with -g and extra flags, and returns a
// stripped copy (in its own directory) and the debug file objcopy
// --only-keep-debug extracts, in another.
func splitDebug(t *testing.T, flags ...string) (stripped, debug string) {
	t.Helper()
	objcopy := testutil.RequireTool(t, "objcopy")
	full := testutil.BuildC(t, "hello", append([]string{"-O2", "-g"}, flags...), filepath.Join("testdata", "hello.c"))
	stripped, debug = filepath.Join(t.TempDir(), "hello"), filepath.Join(t.TempDir(), "hello.debug")
	runTool(t, objcopy, "--only-keep-debug", full, debug)
	runTool(t, testutil.RequireTool(t, "strip"), "--strip-debug", "-o", stripped, full)
	return stripped, debug
}

func runTool(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func copyTo(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// findDebug runs FindDebugFile on the file at path seen through v and
// returns where it found the debug file ("" for none) and how.
func findDebug(t *testing.T, path string, v View, dirs []string) (where, how string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	df, err := FindDebugFile(f, v, dirs)
	if err != nil {
		t.Fatalf("FindDebugFile: %v", err)
	}
	if df == nil {
		return "", ""
	}
	defer testutil.Close(t, df)
	if df.ELF.Section(".debug_info") == nil {
		t.Errorf("%s: the debug file found has no .debug_info", df.Path)
	}
	return df.Path, df.How
}

func TestFindDebugFile(t *testing.T) {
	t.Run("build id", func(t *testing.T) {
		stripped, debug := splitDebug(t, "-Wl,--build-id")
		f, err := elf.Open(stripped)
		if err != nil {
			t.Fatal(err)
		}
		id, err := GNUBuildID(f)
		f.Close()
		if err != nil || len(id) < 4 {
			t.Fatalf("build id %q, %v", id, err)
		}
		rel := filepath.Join(".build-id", id[:2], id[2:]+".debug")
		dir := t.TempDir()
		copyTo(t, debug, filepath.Join(dir, rel))
		if where, how := findDebug(t, stripped, ViewOf(stripped), []string{t.TempDir(), dir}); where != filepath.Join(dir, rel) || how != "build-id" {
			t.Errorf("in a debug dir: found %q by %q, want %s by build-id", where, how, filepath.Join(dir, rel))
		}
		if where, _ := findDebug(t, stripped, ViewOf(stripped), nil); where != "" {
			t.Errorf("no debug dir: found %s", where)
		}
		// A file in another root finds the debug file under that root's
		// /usr/lib/debug, with no host directory searched.
		root := t.TempDir()
		copyTo(t, stripped, filepath.Join(root, "bin", "hello"))
		copyTo(t, debug, filepath.Join(root, DefaultDebugDir, rel))
		want := root + filepath.Join(DefaultDebugDir, rel)
		if where, how := findDebug(t, stripped, View{Root: root, Path: "/bin/hello"}, nil); where != want || how != "build-id" {
			t.Errorf("inside a root: found %q by %q, want %s by build-id", where, how, want)
		}
		// Another build's debug file under the same build id is refused.
		_, other := splitDebug(t, "-Wl,--build-id", "-O0")
		wrong := t.TempDir()
		copyTo(t, other, filepath.Join(wrong, rel))
		if where, _ := findDebug(t, stripped, ViewOf(stripped), []string{wrong}); where != "" {
			t.Errorf("a debug file with another build id was used: %s", where)
		}
	})
	t.Run("debuglink", func(t *testing.T) {
		stripped, debug := splitDebug(t, "-Wl,--build-id=none")
		runTool(t, testutil.RequireTool(t, "objcopy"), "--add-gnu-debuglink="+debug, stripped)
		f, err := elf.Open(stripped)
		if err != nil {
			t.Fatal(err)
		}
		name, _, ok := Debuglink(f)
		f.Close()
		if !ok || name != filepath.Base(debug) {
			t.Fatalf("Debuglink = %q, %v; want %q", name, ok, filepath.Base(debug))
		}
		next := filepath.Join(filepath.Dir(stripped), name)
		copyTo(t, debug, next)
		if where, how := findDebug(t, stripped, ViewOf(stripped), nil); where != next || how != "debuglink" {
			t.Errorf("next to the file: found %q by %q, want %s by debuglink", where, how, next)
		}
		// The same name with other content fails the CRC check.
		f2, err := os.OpenFile(next, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f2.Write([]byte{0}); err != nil {
			t.Fatal(err)
		}
		if err := f2.Close(); err != nil {
			t.Fatal(err)
		}
		if where, _ := findDebug(t, stripped, ViewOf(stripped), nil); where != "" {
			t.Errorf("a debug file with the wrong CRC was used: %s", where)
		}
		under := t.TempDir()
		copyTo(t, debug, filepath.Join(under, filepath.Dir(stripped), name))
		if where, how := findDebug(t, stripped, ViewOf(stripped), []string{under}); where != filepath.Join(under, filepath.Dir(stripped), name) || how != "debuglink" {
			t.Errorf("under a debug dir: found %q by %q", where, how)
		}
	})
}
