package elfx

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// mappingRSS is the Rss /proc/self/smaps shows for the mapping that starts
// at addr, in KiB.
func mappingRSS(t *testing.T, addr uintptr) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	start := fmt.Sprintf("%x-", addr)
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = strings.HasPrefix(line, start)
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			kb, err := strconv.Atoi(strings.Fields(line)[1])
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("no mapping at %#x in /proc/self/smaps", addr)
	return 0
}

// Pages read through an Image count in the process's RSS until DropPages;
// afterwards they read the same again.
func TestImageDropPages(t *testing.T) {
	const size = 4 << 20
	want := bytes.Repeat([]byte("sonde image "), size/12)
	path := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := MapImage(f, int64(len(want)))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer img.Unmap()
	addr := uintptr(unsafe.Pointer(&img.Bytes()[0]))

	if !bytes.Equal(img.Bytes(), want) {
		t.Fatal("mapped bytes differ from the file")
	}
	if rss := mappingRSS(t, addr); rss < len(want)/1024*9/10 {
		t.Fatalf("after reading every page the mapping holds %d KiB of RSS, want about %d", rss, len(want)/1024)
	}
	img.DropPages()
	if rss := mappingRSS(t, addr); rss != 0 {
		t.Errorf("after DropPages the mapping holds %d KiB of RSS, want 0", rss)
	}
	if !bytes.Equal(img.Bytes(), want) {
		t.Error("bytes read after DropPages differ from the file")
	}
}

// DropPages leaves an anonymous mapping's bytes alone: they are its only copy.
func TestImageDropPagesKeepsAnonymous(t *testing.T) {
	want := bytes.Repeat([]byte("inflated "), 1<<16)
	img, err := MapAnon(int64(len(want)), func(b []byte) error { copy(b, want); return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer img.Unmap()
	img.DropPages()
	if !bytes.Equal(img.Bytes(), want) {
		t.Fatal("an anonymous mapping lost its bytes to DropPages")
	}
}

// A spilled mapping holds what fill wrote without counting it in the
// process's RSS once filled: it reads back the same after DropPages, and
// its file is unlinked from the start. A directory held in memory (tmpfs)
// or one that cannot take the file gets no spill.
func TestMapSpill(t *testing.T) {
	want := bytes.Repeat([]byte("inflated section "), 1<<18) // 4.25 MiB
	dir := t.TempDir()
	img, ok, err := mapSpill(dir, int64(len(want)), func(b []byte) error { copy(b, want); return nil })
	if !ok {
		t.Skipf("%s cannot hold a spill file here (tmpfs?)", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer img.Unmap()
	addr := uintptr(unsafe.Pointer(&img.Bytes()[0]))
	if rss := mappingRSS(t, addr); rss > 64 {
		t.Errorf("a spilled mapping holds %d KiB of RSS once filled, want next to none", rss)
	}
	if !bytes.Equal(img.Bytes(), want) {
		t.Fatal("spilled bytes differ from what fill wrote")
	}
	img.DropPages()
	if !bytes.Equal(img.Bytes(), want) {
		t.Fatal("spilled bytes lost to DropPages")
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("spill directory holds %d entries (%v), want the file unlinked", len(left), err)
	}
	if _, ok, _ := mapSpill("/dev/shm", 4096, func([]byte) error { return nil }); ok {
		t.Error("a spill went to /dev/shm, a tmpfs")
	}
	if _, ok, _ := mapSpill(filepath.Join(dir, "missing"), 4096, func([]byte) error { return nil }); ok {
		t.Error("a spill went to a directory that does not exist")
	}
	// MapSpill falls back to anonymous memory where it cannot spill.
	t.Setenv("TMPDIR", "/dev/shm")
	anon, err := MapSpill(4096, func(b []byte) error { b[0] = 7; return nil })
	if err != nil || anon.Bytes()[0] != 7 {
		t.Fatalf("MapSpill into tmpfs: %v", err)
	}
	anon.Unmap()
}
