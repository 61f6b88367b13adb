package perl

import (
	"errors"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// TestNamerLive names the frames of a live burn.pl the way the walker
// reports them, and refuses a check word that is not the frame's.
func TestNamerLive(t *testing.T) {
	eachPerl(t, testNamerLive)
}

func testNamerLive(t *testing.T, pl testutil.Interpreter) {
	cmd := startPerl(t, pl, "eval")
	pid := cmd.Process.Pid
	in, mem := findInterp(t, pid)
	n := NewNamer("/proc", 0)
	if err := n.Add(pid, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Forget(pid) })
	frames, err := snapshot(pid, in, mem)
	if err != nil || len(frames) < 5 {
		t.Fatalf("stack %v: %v", frames, err)
	}
	for round := 0; round < 2; round++ { // read, then from the cache
		for _, sf := range frames {
			got, err := n.Name(pid, sf.Kind, sf.Addr, sf.Word)
			if err != nil {
				t.Fatalf("%s: %v", sf.Name, err)
			}
			if got.Name != sf.Name || got.File != sf.File || got.Line != sf.Line {
				t.Errorf("named %+v, want %+v", got, sf)
			}
			if _, err := n.Name(pid, sf.Kind, sf.Addr, sf.Word^1); !errors.Is(err, ErrStale) {
				t.Errorf("%s with another check word: %v, want ErrStale", sf.Name, err)
			}
		}
	}
	s := n.Stats()
	if s.Named != uint64(2*len(frames)) || s.Stale != uint64(2*len(frames)) || s.Entries == 0 || s.Bytes <= 0 {
		t.Errorf("stats %+v after %d frames twice", s, len(frames))
	}
	if _, err := n.Name(pid, 9, frames[0].Addr, frames[0].Word); !errors.Is(err, ErrNotSub) {
		t.Errorf("kind 9: %v, want ErrNotSub", err)
	}
}

// TestNamerBound keeps the cache within its bound, evicting the least
// recently used entries.
func TestNamerBound(t *testing.T) {
	img := seedImage()
	n := NewNamer("/proc", 400)
	r := NewReader(sliceMem{base: imgBase, b: img}, layouts[36])
	p := &namerProc{in: &Interp{Layout: layouts[36]}, r: r}
	fn, err := r.Sub(imgCV)
	if err != nil {
		t.Fatal(err)
	}
	if fn.Name != "Pkg::f" || fn.File != "/x.pl" {
		t.Fatalf("seed sub named %q in %q", fn.Name, fn.File)
	}
	for i := 0; i < 10; i++ {
		n.mu.Lock()
		_, err := n.funcLocked(p, entryKey{pid: i, addr: imgCV, kind: KindSub}, fn.Check)
		n.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	s := n.Stats()
	if s.Bytes > 400 || s.Evictions == 0 || s.Entries != int(s.Bytes/fn.memSize()) {
		t.Errorf("stats %+v, entry of %d bytes, bound 400", s, fn.memSize())
	}
}

// TestNamerGone names a sub from the cache once its process's memory
// cannot be read any more (the process exited after the sample), only
// with the sample's check word.
func TestNamerGone(t *testing.T) {
	n := NewNamer("/proc", 0)
	r := NewReader(sliceMem{base: imgBase, b: seedImage()}, layouts[36])
	p := &namerProc{in: &Interp{Layout: layouts[36]}, r: r}
	fn, err := r.Sub(imgCV)
	if err != nil {
		t.Fatal(err)
	}
	k := entryKey{pid: 1, addr: imgCV, kind: KindSub}
	name := func(check uint32) (*Func, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.funcLocked(p, k, check)
	}
	if _, err := name(fn.Check); err != nil {
		t.Fatal(err)
	}
	p.r = NewReader(sliceMem{base: imgBase}, layouts[36]) // the process is gone
	got, err := name(fn.Check)
	if err != nil || got.Name != "Pkg::f" {
		t.Fatalf("after the exit: %v, %v", got, err)
	}
	if _, err := name(fn.Check ^ 1); !errors.Is(err, ErrStale) {
		t.Fatalf("after the exit, another check word: %v, want ErrStale", err)
	}
	if s := n.Stats(); s.Gone != 1 {
		t.Errorf("stats %+v, want 1 gone", s)
	}
	// Memory that reads but holds another object is read again: here
	// none, so the frame is not named.
	img := seedImage()
	img[layouts[36].SvFlags] = svtPVGV // the CV is a glob now
	p.r = NewReader(sliceMem{base: imgBase, b: img}, layouts[36])
	if _, err := name(fn.Check); err == nil {
		t.Fatal("a CV that is no CV any more was named")
	}
}

// TestNamerMainFreed names the program's top-level code from the cache
// once its statement was freed and its memory reused (perl_destruct frees
// the main op tree while the process runs), only with the sample's check
// word; an eval's statement whose memory changed is read again.
func TestNamerMainFreed(t *testing.T) {
	n := NewNamer("/proc", 0)
	img := seedImage()
	p := &namerProc{in: &Interp{Layout: layouts[36]}, r: NewReader(sliceMem{base: imgBase, b: img}, layouts[36])}
	name := func(kind uint8, check uint32) (*Func, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.funcLocked(p, entryKey{pid: 1, addr: imgCop, kind: kind}, check)
	}
	main, err := p.r.Code(imgCop, KindMain)
	if err != nil {
		t.Fatal(err)
	}
	if main.File != "/x.pl" {
		t.Fatalf("seed statement in %q, want /x.pl", main.File)
	}
	for _, kind := range []uint8{KindMain, KindEval} {
		if _, err := name(kind, main.Check); err != nil {
			t.Fatalf("kind %d: %v", kind, err)
		}
	}
	// The statement is freed and its bytes reused: its file pointer
	// now points elsewhere.
	freed := seedImage()
	for i := range 8 {
		freed[imgCop-imgBase+uint64(layouts[36].CopFile)+uint64(i)] ^= 0x5a
	}
	p.r = NewReader(sliceMem{base: imgBase, b: freed}, layouts[36])
	got, err := name(KindMain, main.Check)
	if err != nil || got.File != "/x.pl" {
		t.Fatalf("the freed main statement: %+v, %v; want it named from the cache", got, err)
	}
	if got, err := name(KindMain, main.Check^1); err == nil {
		t.Errorf("the freed main statement was named %+v with another check word", got)
	}
	if got, err := name(KindEval, main.Check); err == nil {
		t.Errorf("an eval statement whose memory changed was named %+v from the cache", got)
	}
}
