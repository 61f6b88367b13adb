package jvm

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/symbolize"
)

// synthNamer is a Namer over the synthetic image.
func synthNamer(t testing.TB, img []byte, major int) *Namer {
	l, _, _, err := newLayout(synthTables(), major)
	if err != nil {
		t.Fatal(err)
	}
	n := NewNamer("/nonexistent", 1<<20)
	n.addMem(1, &VM{Major: major, l: l}, sliceMem{base: imgBase, b: img}, nil)
	return n
}

func TestNamerSynthetic(t *testing.T) {
	for _, major := range []int{17, 25} {
		t.Run(fmt.Sprint(major), func(t *testing.T) {
			n := synthNamer(t, synthImage(major >= 20), major)
			word := func(id int32, pc uint32) uint64 { return uint64(uint32(id))<<32 | uint64(pc) }
			caller := symbolize.Line{Function: "com.example.JBurn.jGamma", SystemName: "com.example.JBurn.jGamma(I)J", File: "com/example/JBurn.java", Line: 12}
			callee := symbolize.Line{Function: "com.example.JBurn.step", SystemName: "com.example.JBurn.step(I)J", File: "com/example/JBurn.java", Line: 20}
			for _, c := range []struct {
				name   string
				pc     uint32
				ret    bool
				want   []symbolize.Line
				stale  bool
				wantID int32
			}{
				{"leaf before the first pc desc", 0x80 + 0x05, false, []symbolize.Line{callee, caller}, false, imgID},
				{"leaf at the first pc desc", 0x80 + 0x10, false, []symbolize.Line{caller}, false, imgID},
				{"return address at the first pc desc", 0x80 + 0x10, true, []symbolize.Line{callee, caller}, false, imgID},
				{"return address after it", 0x80 + 0x11, true, []symbolize.Line{caller}, false, imgID},
				{"after the last pc desc", 0x80 + 0x30, false, []symbolize.Line{{Function: caller.Function, SystemName: caller.SystemName, File: caller.File}}, false, imgID},
				{"other compile id", 0x80 + 0x05, false, nil, true, imgID + 1},
				{"before the code", 0x10, false, nil, true, imgID},
				{"beyond the blob", 0x300, false, nil, true, imgID},
			} {
				f, err := n.Frame(1, FrameCompiled, imgBlob, word(c.wantID, c.pc), c.ret)
				if c.stale {
					if !errors.Is(err, ErrStale) {
						t.Errorf("%s: %+v %v, want ErrStale", c.name, f, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if f.Tier != TierC2 || fmt.Sprint(f.Lines) != fmt.Sprint(c.want) {
					t.Errorf("%s: %s %+v, want c2 %+v", c.name, f.Tier, f.Lines, c.want)
				}
			}
			codeStart := uint64(imgMethod + 0x100 + 48)
			for bci, line := range map[uint64]int64{0: 10, 1: 10, 2: 12, 7: 12} {
				f, err := n.Frame(1, FrameInterpreted, imgMethod, codeStart+bci, false)
				if err != nil || f.Tier != TierInterpreted || f.Lines[0].Line != line || f.Lines[0].Function != caller.Function {
					t.Errorf("interpreted bci %d: %+v %v, want line %d", bci, f, err, line)
				}
			}
			for _, bcp := range []uint64{codeStart - 1, codeStart + 8} {
				if _, err := n.Frame(1, FrameInterpreted, imgMethod, bcp, false); !errors.Is(err, ErrStale) {
					t.Errorf("bcp %#x: %v, want ErrStale", bcp, err)
				}
			}
			if _, err := n.Frame(1, FrameInterpreted, imgBase+0x5000, codeStart, false); !errors.Is(err, ErrUnreadable) {
				t.Errorf("method outside memory: %v, want ErrUnreadable", err)
			}
			if _, err := n.Frame(2, FrameInterpreted, imgMethod, codeStart, false); !errors.Is(err, ErrUnreadable) {
				t.Errorf("unknown pid: %v, want ErrUnreadable", err)
			}
			s := n.Stats()
			if s.Named != 9 || s.Stale != 5 || s.Unreadable != 2 || s.Entries != 3 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestNamerEvicts fills a small cache: it stays within its bound, counts
// what it dropped and still names right.
func TestNamerEvicts(t *testing.T) {
	img := synthImage(false)
	l, _, _, err := newLayout(synthTables(), 17)
	if err != nil {
		t.Fatal(err)
	}
	n := NewNamer("/nonexistent", 700)
	n.addMem(1, &VM{Major: 17, l: l}, sliceMem{base: imgBase, b: img}, nil)
	codeStart := uint64(imgMethod + 0x100 + 48)
	for i := 0; i < 50; i++ {
		if f, err := n.Frame(1, FrameCompiled, imgBlob, uint64(imgID)<<32|0x85, false); err != nil || len(f.Lines) != 2 {
			t.Fatalf("compiled: %+v %v", f, err)
		}
		if f, err := n.Frame(1, FrameInterpreted, imgMethod, codeStart+2, false); err != nil || f.Lines[0].Line != 12 {
			t.Fatalf("interpreted: %+v %v", f, err)
		}
		if s := n.Stats(); s.Bytes > 700 {
			t.Fatalf("cache holds %d bytes, bound 700", s.Bytes)
		}
	}
	if s := n.Stats(); s.Evictions == 0 {
		t.Errorf("no evictions: %+v", s)
	}
	n.Forget(1)
	if s := n.Stats(); s.Entries != 0 || s.Bytes != 0 {
		t.Errorf("after Forget: %+v", s)
	}
}

// TestNamerConcurrent names, adds and forgets from several goroutines
// (run with -race).
func TestNamerConcurrent(t *testing.T) {
	img := synthImage(false)
	l, _, _, err := newLayout(synthTables(), 17)
	if err != nil {
		t.Fatal(err)
	}
	n := NewNamer("/nonexistent", 600)
	vm := &VM{Major: 17, l: l}
	done := make(chan error)
	for g := 0; g < 4; g++ {
		go func() {
			pid := 1 + g%2
			var err error
			for i := 0; i < 200 && err == nil; i++ {
				if i%50 == 0 {
					n.addMem(pid, vm, sliceMem{base: imgBase, b: img}, nil)
				}
				var f Frame
				f, err = n.Frame(pid, FrameCompiled, imgBlob, uint64(imgID)<<32|0x85, false)
				if err == nil && len(f.Lines) != 2 {
					err = fmt.Errorf("lines %+v", f.Lines)
				}
				if errors.Is(err, ErrUnreadable) && strings.Contains(err.Error(), "not added") {
					err = nil // forgotten by another goroutine
				}
				if i%70 == 0 {
					n.Forget(pid)
				}
			}
			done <- err
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if s := n.Stats(); s.Bytes > 600 {
		t.Errorf("cache %d bytes over 600", s.Bytes)
	}
}
