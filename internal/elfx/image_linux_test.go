package elfx

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/sonde-dev/sonde/internal/testutil"
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

// mapBytes writes b to a file and maps it (MapImage), until the test ends.
func mapBytes(t *testing.T, b []byte) *Image {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := MapImage(f, int64(len(b)))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(img.Unmap)
	return img
}

// Pages read through an Image count in the process's RSS until DropPages;
// afterwards they read the same again.
func TestImageDropPages(t *testing.T) {
	const size = 4 << 20
	want := bytes.Repeat([]byte("sonde image "), size/12)
	img := mapBytes(t, want)
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

// DropRange lets go of the whole pages a slice of the mapping covers, and
// of nothing else: the partial pages at its ends stay, as does a slice of
// other memory.
func TestImageDropRange(t *testing.T) {
	page := os.Getpagesize()
	want := bytes.Repeat([]byte("sonde range "), 64*page/12)
	img := mapBytes(t, want)
	b := img.Bytes()
	addr := uintptr(unsafe.Pointer(&b[0]))
	touch := func() {
		if !bytes.Equal(b, want) {
			t.Fatal("mapped bytes differ from the file")
		}
	}
	touch()
	before := mappingRSS(t, addr)
	// Pages 8..39 whole, and a part of pages 7 and 40, which stay.
	img.DropRange(b[8*page-100 : 40*page+100])
	if got, want := before-mappingRSS(t, addr), 32*page/1024; got != want {
		t.Errorf("DropRange let go of %d KiB, want %d (32 whole pages)", got, want)
	}
	touch()
	img.DropRange(bytes.Clone(b)) // not the mapping's memory
	if got := mappingRSS(t, addr); got != before {
		t.Errorf("DropRange of other memory changed the mapping's RSS: %d KiB, want %d", got, before)
	}
	img.DropRange(b[page+1 : 2*page-1]) // no whole page
	if got := mappingRSS(t, addr); got != before {
		t.Errorf("DropRange within one page changed the mapping's RSS: %d KiB, want %d", got, before)
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

// A spill holds what was written without counting it in the process's
// RSS, neither while it is written nor once mapped: it reads back the same
// after DropPages, and its file is unlinked from the start. A directory
// held in memory (tmpfs) or one that cannot take the file gets no spill.
func TestSpill(t *testing.T) {
	want := bytes.Repeat([]byte("inflated section "), 1<<18) // 4.25 MiB
	dir := t.TempDir()
	s, err := newSpill(dir, int64(len(want)))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Spilled() {
		t.Skipf("%s cannot hold a spill file here (tmpfs?)", dir)
	}
	before := testutil.StatusKiB(t, "RssFile")
	for rest := want; len(rest) > 0; {
		n := min(len(rest), 1000) // small writes, as the kernel's names are
		if _, err := s.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	if grew := testutil.StatusKiB(t, "RssFile") - before; grew > 1024 {
		t.Errorf("writing %d KiB to a spill added %d KiB of file RSS, want next to none", len(want)>>10, grew)
	}
	img, err := s.Map()
	if err != nil {
		t.Fatal(err)
	}
	defer img.Unmap()
	addr := uintptr(unsafe.Pointer(&img.Bytes()[0]))
	if rss := mappingRSS(t, addr); rss > 64 {
		t.Errorf("a spilled mapping holds %d KiB of RSS once mapped, want next to none", rss)
	}
	if !bytes.Equal(img.Bytes(), want) {
		t.Fatal("spilled bytes differ from what was written")
	}
	img.DropPages()
	if !bytes.Equal(img.Bytes(), want) {
		t.Fatal("spilled bytes lost to DropPages")
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("spill directory holds %d entries (%v), want the file unlinked", len(left), err)
	}
	if _, err := s.Write([]byte("late")); err == nil {
		t.Error("a spill took a write after Map")
	}
	for _, d := range []string{"/dev/shm", filepath.Join(dir, "missing")} {
		s, err := newSpill(d, 4096)
		if err != nil {
			t.Fatal(err)
		}
		if s.Spilled() {
			t.Errorf("a spill went to %s", d)
		}
		s.Discard()
	}
}

// A spill takes exactly the bytes promised: more fails at the write that
// would pass them, fewer fails at Map. Where the temporary directory is in
// memory, it falls back to anonymous memory, of a known size or not.
func TestSpillSizes(t *testing.T) {
	for _, dir := range []string{t.TempDir(), "/dev/shm"} {
		s, err := newSpill(dir, 8)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("123456789")); err == nil {
			t.Errorf("%s: a spill of 8 bytes took 9", dir)
		}
		s.Discard()

		s, err = newSpill(dir, 8)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("1234")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Map(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: Map of 4 of 8 bytes: %v, want io.ErrUnexpectedEOF", dir, err)
		}

		s, err = newSpill(dir, 0) // any size
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(s, "kernel %s", "names"); err != nil {
			t.Fatal(err)
		}
		img, err := s.Map()
		if err != nil {
			t.Fatal(err)
		}
		if got := string(img.Bytes()); got != "kernel names" {
			t.Errorf("%s: spill of any size read back %q", dir, got)
		}
		img.Unmap()
		s.Discard() // after Map: does nothing
	}
	// MapSpill falls back to anonymous memory where it cannot spill.
	t.Setenv("TMPDIR", "/dev/shm")
	anon, err := MapSpill(4096, bytes.NewReader(make([]byte, 4096)))
	if err != nil || len(anon.Bytes()) != 4096 || !anon.anon {
		t.Fatalf("MapSpill into tmpfs: %v", err)
	}
	anon.Unmap()
}
