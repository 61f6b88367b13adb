package profiler

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sonde-dev/sonde/internal/symbolize"
)

// The holds keep each process's files open until the resolver releases
// the process, or, for a process whose exit record was lost, until a sweep
// finds it gone and holdGrace intervals have passed.
func TestFileHolds(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	procfs := t.TempDir()
	for _, pid := range []string{"100", "200"} {
		if err := os.Mkdir(filepath.Join(procfs, pid), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	syms := symbolize.New(nil, symbolize.Options{})
	open := func() *symbolize.Handle {
		h, err := syms.Open(self)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	openFiles := func() int { return syms.Stats().OpenFiles }
	fh := newFileHolds(procfs)

	fh.add(100, open())
	fh.add(100, open()) // the same file again: released at once
	fh.add(200, open())
	fh.add(300, open()) // no /proc entry: gone at the first sweep
	if n := fh.len(); n != 3 || openFiles() != 1 {
		t.Fatalf("%d processes hold, %d files open; want 3 and 1", n, openFiles())
	}

	fh.exited(100) // the reader saw it exit: only the resolver releases it
	for range holdSweep - 1 {
		fh.tick()
	}
	if fh.len() != 3 {
		t.Fatalf("%d processes hold before the first sweep, want 3", fh.len())
	}
	fh.tick() // the sweep finds 300 gone
	for range holdGrace {
		fh.tick()
	}
	if fh.len() != 3 {
		t.Fatalf("%d processes hold within the grace, want 3", fh.len())
	}
	if gone := fh.tick(); len(gone) != 1 || gone[0] != 300 {
		t.Fatalf("the tick after the grace released %v, want [300]", gone)
	}
	if fh.len() != 2 {
		t.Fatalf("%d processes hold after the grace, want 2 (100 exited, 200 alive)", fh.len())
	}

	// A pid found gone that is prepared again (reused) is not released.
	fh.add(400, open())
	for range holdSweep {
		fh.tick() // the sweep finds 400 gone
	}
	fh.add(400, open()) // prepared again: it runs
	for range holdGrace + 1 {
		if gone := fh.tick(); len(gone) != 0 {
			t.Fatalf("released %v, want nothing", gone)
		}
	}
	if fh.len() != 3 {
		t.Fatalf("%d processes hold, want 3: 400, prepared again after a sweep found it gone, released", fh.len())
	}
	fh.release(400)

	fh.release(100)
	fh.release(100) // twice: nothing more
	if fh.len() != 1 || openFiles() != 1 {
		t.Fatalf("%d processes hold, %d files open; want 1 and 1", fh.len(), openFiles())
	}
	fh.close()
	if fh.len() != 0 || openFiles() != 0 {
		t.Fatalf("after close %d processes hold, %d files open; want none", fh.len(), openFiles())
	}

	var none *fileHolds // a nil fileHolds holds nothing and releases what it is given
	none.add(1, open())
	none.exited(1)
	none.release(1)
	none.tick()
	none.close()
	if openFiles() != 0 {
		t.Errorf("a nil fileHolds kept %d files open", openFiles())
	}
}
