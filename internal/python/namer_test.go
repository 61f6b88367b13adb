package python

import (
	"errors"
	"testing"
)

func TestNamer(t *testing.T) {
	in := installedInterpreters(t)[0]
	cmd := startWorkload(t, in.bin, "wait")
	pid := cmd.Process.Pid
	waitInRead(t, pid)
	interp, mem := findInterp(t, pid)
	threads, err := interp.Threads(mem)
	if err != nil || len(threads) != 1 || len(threads[0].Frames) != 4 {
		t.Fatalf("walk: %+v, %v", threads, err)
	}
	frames := threads[0].Frames
	c, err := NewReader(mem, interp.Layout).Code(frames[0].Code)
	if err != nil {
		t.Fatal(err)
	}
	// Room for about two code objects: naming four must empty the cache.
	n := NewNamer("/proc", 2*c.size+1)
	if err := n.Add(pid, interp); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, f := range frames {
			if _, _, _, err := n.Name(pid, f.Code, f.Instr); err != nil {
				t.Fatal(err)
			}
		}
	}
	name, _, line, err := n.Name(pid, frames[0].Code, frames[0].Instr)
	if err != nil || name != "gamma_wait" || line != markLine(t, "wait") {
		t.Errorf("leaf: %q line %d, %v", name, line, err)
	}
	st := n.Stats()
	if st.Resets == 0 || st.Bytes > 2*c.size+1 || st.Named != 9 {
		t.Errorf("stats %+v: want resets, at most %d bytes, 9 named", st, 2*c.size+1)
	}
	if _, _, _, err := n.Name(pid, frames[0].Code+8, 0); !errors.Is(err, ErrNotCode) {
		t.Errorf("a non-code address: %v, want ErrNotCode", err)
	}
	n.Forget(pid)
	if st := n.Stats(); st.Codes != 0 || st.Bytes != 0 || n.Known(pid) {
		t.Errorf("after Forget: %+v", st)
	}
	if _, _, _, err := n.Name(pid, frames[0].Code, 0); err == nil {
		t.Error("a forgotten process was named")
	}
}
