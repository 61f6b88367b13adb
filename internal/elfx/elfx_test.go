package elfx

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// fixture is a binary built from testdata for one test.
type fixture struct {
	name string
	path string
	isGo bool
}

func buildFixtures(t *testing.T) []fixture {
	t.Helper()
	src := filepath.Join("testdata", "hello.c")
	return []fixture{
		{name: "c-pie", path: testutil.BuildC(t, "hello-pie", []string{"-O0", "-g", "-fPIE", "-pie", "-Wl,--build-id"}, src)},
		{name: "c-nopie", path: testutil.BuildC(t, "hello-nopie", []string{"-O2", "-fno-PIE", "-no-pie", "-Wl,--build-id=sha1"}, src)},
		{name: "c-no-build-id", path: testutil.BuildC(t, "hello-nobid", []string{"-O0", "-Wl,--build-id=none"}, src)},
		{name: "go", path: testutil.BuildGo(t, "gohello", filepath.Join("testdata", "gohello")), isGo: true},
		{name: "go-pie", path: testutil.BuildGo(t, "gohello-pie", filepath.Join("testdata", "gohello"), "-buildmode=pie"), isGo: true},
	}
}

func openELF(t *testing.T, path string) *elf.File {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(testutil.RequireTool(t, name), args...).Output()
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return string(out)
}

var readelfBuildID = regexp.MustCompile(`Build ID: ([0-9a-f]+)`)

func TestGNUBuildID(t *testing.T) {
	fixtures := append(buildFixtures(t), fixture{name: "libc", path: "/lib/x86_64-linux-gnu/libc.so.6"})
	for _, fx := range fixtures {
		t.Run(fx.name, func(t *testing.T) {
			if _, err := os.Stat(fx.path); err != nil {
				t.Skipf("no %s: %v", fx.path, err)
			}
			want := ""
			if m := readelfBuildID.FindStringSubmatch(output(t, "readelf", "-nW", fx.path)); m != nil {
				want = m[1]
			}
			if fx.name == "c-pie" && want == "" {
				t.Fatal("oracle: readelf shows no build id for a binary linked with --build-id")
			}
			got, err := GNUBuildID(openELF(t, fx.path))
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("GNUBuildID = %q, readelf says %q", got, want)
			}
		})
	}
}

func TestGoBuildID(t *testing.T) {
	for _, fx := range buildFixtures(t) {
		t.Run(fx.name, func(t *testing.T) {
			want := ""
			if fx.isGo {
				want = strings.TrimSpace(output(t, "go", "tool", "buildid", fx.path))
				if want == "" {
					t.Fatal("oracle: go tool buildid printed nothing")
				}
			}
			got, err := GoBuildID(openELF(t, fx.path))
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("GoBuildID = %q, want %q", got, want)
			}
		})
	}
}

var objdumpOffset = regexp.MustCompile(`(?m)^([0-9a-f]+) <[^>]*> \(File Offset: 0x([0-9a-f]+)\):$`)

// TestOffsetToVaddrObjdump checks every function objdump disassembles: the
// file offset objdump prints must translate to the address it prints.
func TestOffsetToVaddrObjdump(t *testing.T) {
	for _, fx := range buildFixtures(t) {
		t.Run(fx.name, func(t *testing.T) {
			matches := objdumpOffset.FindAllStringSubmatch(output(t, "objdump", "-d", "-F", fx.path), -1)
			if len(matches) < 3 {
				t.Fatalf("oracle: objdump listed %d functions", len(matches))
			}
			f := openELF(t, fx.path)
			differ := 0
			for _, m := range matches {
				vaddr, _ := strconv.ParseUint(m[1], 16, 64)
				off, _ := strconv.ParseUint(m[2], 16, 64)
				if vaddr != off {
					differ++
				}
				got, ok := OffsetToVaddr(f, off)
				if !ok || got != vaddr {
					t.Errorf("OffsetToVaddr(%#x) = %#x, %v; objdump says %#x", off, got, ok, vaddr)
				}
			}
			if fx.name == "c-nopie" || fx.name == "go" {
				if differ == 0 {
					t.Errorf("fixture does not exercise translation: every offset equals its address")
				}
			}
		})
	}
}

func TestOffsetToVaddrSegments(t *testing.T) {
	load := func(off, vaddr, filesz uint64, flags elf.ProgFlag) *elf.Prog {
		return &elf.Prog{ProgHeader: elf.ProgHeader{Type: elf.PT_LOAD, Off: off, Vaddr: vaddr, Filesz: filesz, Memsz: filesz, Flags: flags}}
	}
	f := &elf.File{Progs: []*elf.Prog{
		{ProgHeader: elf.ProgHeader{Type: elf.PT_NOTE, Off: 0x100, Vaddr: 0x9100, Filesz: 0x40}},
		load(0, 0x400000, 0x1000, elf.PF_R),
		load(0x1000, 0x401000, 0x2000, elf.PF_R|elf.PF_X),
		load(0x2800, 0x700000, 0x1000, elf.PF_R|elf.PF_W), // overlaps the text segment's file range
		load(0x5000, 0x900000, 0, elf.PF_R|elf.PF_W),      // bss only: no file bytes
		load(^uint64(0)-4, 0x10, 0x100, elf.PF_R),         // range wraps around
	}}
	tests := []struct {
		name   string
		off    uint64
		want   uint64
		wantOK bool
	}{
		{"first byte", 0, 0x400000, true},
		{"note offset uses its load segment", 0x120, 0x400120, true},
		{"last byte of first segment", 0xfff, 0x400fff, true},
		{"first byte of text", 0x1000, 0x401000, true},
		{"overlap prefers executable", 0x2900, 0x402900, true},
		{"overlap past text end", 0x3000, 0x700800, true},
		{"one past data end", 0x3800, 0, false},
		{"bss-only segment", 0x5000, 0, false},
		{"near the top of the range", ^uint64(0) - 2, 0x12, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := OffsetToVaddr(f, tt.off)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("OffsetToVaddr(%#x) = %#x, %v; want %#x, %v", tt.off, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestScanNotes(t *testing.T) {
	type order interface {
		binary.ByteOrder
		binary.AppendByteOrder
	}
	note := func(bo order, pad int, name string, typ uint32, desc []byte) []byte {
		var b []byte
		b = bo.AppendUint32(b, uint32(len(name)+1))
		b = bo.AppendUint32(b, uint32(len(desc)))
		b = bo.AppendUint32(b, typ)
		b = append(b, name...)
		b = append(b, 0)
		for len(b)%pad != 0 {
			b = append(b, 0)
		}
		b = append(b, desc...)
		for len(b)%pad != 0 {
			b = append(b, 0)
		}
		return b
	}
	id := []byte{0xde, 0xad, 0xbe, 0xef, 1}
	le, be := binary.LittleEndian, binary.BigEndian
	tests := []struct {
		name  string
		data  []byte
		bo    order
		align uint64
		want  []byte
	}{
		{"only note", note(le, 4, "GNU", 3, id), le, 4, id},
		{"after another note", append(note(le, 4, "GNU", 1, []byte{1, 2, 3, 4}), note(le, 4, "GNU", 3, id)...), le, 4, id},
		{"big endian", note(be, 4, "GNU", 3, id), be, 4, id},
		{"8-byte aligned area", append(note(le, 8, "GNU", 5, []byte{1, 2, 3}), note(le, 8, "GNU", 3, id)...), le, 8, id},
		{"wrong owner", note(le, 4, "Go", 3, id), le, 4, nil},
		{"wrong type", note(le, 4, "GNU", 4, id), le, 4, nil},
		{"unpadded last descriptor", note(le, 4, "GNU", 3, id)[:12+4+len(id)], le, 4, id},
		{"truncated descriptor", note(le, 4, "GNU", 3, id)[:12+4+2], le, 4, nil},
		{"huge sizes", le.AppendUint32(le.AppendUint32(le.AppendUint32(nil, 0xffffffff), 0xffffffff), 3), le, 4, nil},
		{"oversized descriptor", note(le, 4, "GNU", 3, make([]byte, maxNoteDesc+4)), le, 4, nil},
		{"empty", nil, le, 4, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scanNotes(tt.data, tt.bo, tt.align, "GNU", 3)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("scanNotes (-want +got):\n%s", diff)
			}
		})
	}
}

// referenceFileID restates the documented definition of a FileID.
func referenceFileID(data []byte) FileID {
	n := min(len(data), fileIDChunk)
	var in []byte
	in = binary.LittleEndian.AppendUint64(in, uint64(len(data)))
	in = append(in, data[:n]...)
	in = append(in, data[len(data)-n:]...)
	sum := sha256.Sum256(in)
	var id FileID
	copy(id[:], sum[:])
	return id
}

func TestComputeFileID(t *testing.T) {
	content := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + i/251)
		}
		return b
	}
	for _, size := range []int{0, 1, 100, fileIDChunk - 1, fileIDChunk, fileIDChunk + 1, 2 * fileIDChunk, 3*fileIDChunk + 5, 1 << 20} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			data := content(size)
			got, err := ComputeFileID(bytes.NewReader(data), int64(size))
			if err != nil {
				t.Fatal(err)
			}
			if want := referenceFileID(data); got != want {
				t.Errorf("ComputeFileID = %s, want %s", got, want)
			}
			s := got.String()
			if raw, err := hex.DecodeString(s); err != nil || len(s) != 32 || s != strings.ToLower(s) || !bytes.Equal(raw, got[:]) {
				t.Errorf("String() = %q: want 32 lower-case hex characters of the id", s)
			}
		})
	}

	t.Run("content sensitivity", func(t *testing.T) {
		base := content(1 << 16)
		id := func(b []byte) FileID {
			got, err := ComputeFileID(bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		orig := id(base)
		edit := func(i int) []byte {
			b := bytes.Clone(base)
			b[i] ^= 0xff
			return b
		}
		if id(edit(0)) == orig || id(edit(len(base)-1)) == orig || id(append(bytes.Clone(base), 0)) == orig {
			t.Error("changing the head, the tail or the size kept the id")
		}
		if id(edit(len(base)/2)) != orig {
			t.Error("changing a middle byte changed the id; it should only hash the ends")
		}
	})

	t.Run("short reader", func(t *testing.T) {
		if _, err := ComputeFileID(bytes.NewReader(content(100)), 200); err == nil {
			t.Error("no error for a size past the end of the data")
		}
		if _, err := ComputeFileID(bytes.NewReader(nil), -1); err == nil {
			t.Error("no error for a negative size")
		}
	})
}

func TestOpenInRoot(t *testing.T) {
	root := t.TempDir()
	mustWrite := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustLink := func(target, rel string) {
		if err := os.Symlink(target, filepath.Join(root, rel)); err != nil {
			t.Fatal(err)
		}
	}
	const inside = "root:x:0:0:inside the test root\n"
	mustWrite("etc/passwd", inside)
	mustWrite("usr/lib/libfoo.so", "foo")
	mustLink("/etc/passwd", "abs-link")
	mustLink("../../../../../../etc/passwd", "rel-link")
	mustLink("/usr/lib/libfoo.so", "usr/lib/libfoo.so.1")
	mustLink("/nonexistent/file", "dangling")
	if err := os.MkdirAll(filepath.Join(root, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		path     string
		want     string
		notExist bool
	}{
		{name: "plain file", path: "/etc/passwd", want: inside},
		{name: "absolute symlink stays inside", path: "/abs-link", want: inside},
		{name: "relative symlink with .. stays inside", path: "/rel-link", want: inside},
		{name: "dot-dot path stays inside", path: "/../../etc/passwd", want: inside},
		{name: "dot-dot from a subdirectory", path: "/a/b/../../../../../etc/passwd", want: inside},
		{name: "relative path", path: "etc/passwd", want: inside},
		{name: "library symlink", path: "/usr/lib/libfoo.so.1", want: "foo"},
		{name: "dangling symlink", path: "/dangling", notExist: true},
		{name: "missing file", path: "/etc/shadow", notExist: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := OpenInRoot(root, tt.path)
			if tt.notExist {
				if !errors.Is(err, fs.ErrNotExist) {
					f.Close()
					t.Fatalf("OpenInRoot(%q) error = %v, want not-exist", tt.path, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, 4096)
			n, _ := f.ReadAt(buf, 0)
			got := buf[:n]
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("content (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("magic links refused", func(t *testing.T) {
		for _, p := range []string{"/proc/self/root/etc/hostname", "/proc/self/exe"} {
			f, err := OpenInRoot("/", p)
			if err == nil {
				f.Close()
				t.Errorf("OpenInRoot(/, %q) succeeded through a magic link", p)
			} else if !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.EXDEV) {
				t.Errorf("OpenInRoot(/, %q) error = %v, want ELOOP", p, err)
			}
		}
	})

	t.Run("missing root", func(t *testing.T) {
		if f, err := OpenInRoot(filepath.Join(root, "no-such-dir"), "/etc/passwd"); err == nil {
			f.Close()
			t.Error("no error for a missing root")
		}
	})
}
