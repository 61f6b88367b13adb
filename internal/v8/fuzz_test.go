package v8

import (
	"encoding/binary"
	"errors"
	"testing"
)

func FuzzDecodePositions(f *testing.F) {
	f.Add([]byte{0x01, 0x04, 0x03, 0x00, 0x38, 0xa4, 0x10, 0x08, 0x1c}, false)
	f.Add([]byte{0x02, 0xc0, 0x0c, 0x07, 0x44, 0x0b, 0x14, 0x12, 0x20}, true)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x01}, false)
	f.Fuzz(func(t *testing.T, b []byte, flagged bool) {
		es, err := decodePositions(b, flagged)
		if err != nil {
			return
		}
		if len(es) > len(b) {
			t.Fatalf("%d entries from %d bytes", len(es), len(b))
		}
		for i := 1; i < len(es); i++ {
			if es[i].codeOffset < es[i-1].codeOffset {
				t.Fatalf("code offsets go back: %+v", es)
			}
		}
		positionAt(es, 7)
		for _, e := range es {
			if sp := splitPosition(e.pos); sp.scriptOffset < -1 || sp.inliningID < -1 {
				t.Fatalf("position %+v", sp)
			}
		}
	})
}

func FuzzLineEnds(f *testing.F) {
	f.Add([]byte("a\nb\r\nc\rd"), int32(3))
	f.Fuzz(func(t *testing.T, src []byte, off int32) {
		u := make([]uint16, len(src))
		for i, c := range src {
			u[i] = uint16(c)
		}
		ends := lineEnds(u)
		if len(ends) > len(u)+1 {
			t.Fatalf("%d line ends for %d characters", len(ends), len(u))
		}
		l, c := lineOf(ends, off)
		if l < 1 {
			t.Fatalf("line %d", l)
		}
		if tl, tc := newLineTable(ends).lineOf(off); tl != l || tc != c {
			t.Fatalf("offset %d: the line table says line %d col %d, the ends %d %d", off, tl, tc, l, c)
		}
	})
}

// FuzzFrame names frames of a mutated synthetic heap: no panic, no
// endless loop, errors that match ErrStale or ErrUnreadable.
func FuzzFrame(f *testing.F) {
	sy := buildSynth()
	f.Add(uint16(0), uint64(0), uint8(0), uint32(0))
	f.Add(uint16(sy.istream-1+8-imgBase), uint64(0x10000001), uint8(2), uint32(sy.offInner))
	f.Add(uint16(sy.sfiF-1+16-imgBase), uint64(0x10000001), uint8(1), uint32(0))
	f.Add(uint16(sy.bytecodeF-1+8-imgBase), uint64(0xFFFFFFFF00000000), uint8(1), uint32(3))
	f.Fuzz(func(t *testing.T, at uint16, v uint64, kind uint8, pcOff uint32) {
		img := append([]byte(nil), sy.img...)
		if int(at)+8 <= len(img) {
			binary.LittleEndian.PutUint64(img[at:], v)
		}
		n := synthNamer(t, img)
		for _, ret := range []bool{false, true} {
			var err error
			switch kind % 4 {
			case 0:
				_, err = n.Frame(1, FrameInterpreted, sy.sfiF, uint64(pcOff)<<32|uint64(uint32(sy.bytecodeF)), ret)
			case 1:
				_, err = n.Frame(1, FrameBuiltin, sy.sfiG, uint64(pcOff), ret)
			case 2:
				_, err = n.Frame(1, FrameCompiled, sy.sfiF, sy.instrs+uint64(pcOff%0x200), ret)
			case 3:
				_, err = n.Frame(1, FrameStub, uint64(pcOff), v, ret)
			}
			if err != nil && !errors.Is(err, ErrStale) && !errors.Is(err, ErrUnreadable) {
				t.Fatalf("error %v matches neither ErrStale nor ErrUnreadable", err)
			}
		}
	})
}

// FuzzWalk walks arbitrary stack bytes: no panic, at most MaxFrames
// frames, at most the reads the contract allows.
func FuzzWalk(f *testing.F) {
	f.Add(make([]byte, 256), []byte{}, uint64(0x7ff0040), uint64(0x400100))
	f.Add(make([]byte, 256), []byte{0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x55, 0x48, 0x89, 0xe5, 0x56, 0x57, 0x50, 0x90}, uint64(0x7ff0040), uint64(0x600009))
	f.Fuzz(func(t *testing.T, stack, code []byte, fp, pc uint64) {
		k := synthKernel(t)
		// The stack, and code at 0x600000 for the leaf's prologue.
		mem := &countMem{m: multiMem{sliceMem{base: 0x7ff0000, b: stack}, sliceMem{base: 0x600000, b: code}}}
		jit := func(pc uint64) bool { return pc >= 0x600000 && pc < 0x700000 }
		frames, _, _ := k.Walk(mem, jit, pc, fp-64, fp)
		if len(frames) > MaxFrames+1 {
			t.Fatalf("%d frames", len(frames))
		}
		if mem.n > 2*(len(frames)+1)+1 {
			t.Fatalf("%d reads for %d frames", mem.n, len(frames))
		}
	})
}

// countMem counts reads.
type countMem struct {
	m Memory
	n int
}

func (c *countMem) ReadAt(p []byte, a uint64) error {
	c.n++
	return c.m.ReadAt(p, a)
}

func FuzzBaselineBytecodeOffset(f *testing.F) {
	sizes := make([]byte, 3*0x20)
	for i := range sizes {
		sizes[i] = byte(1 + i%4)
	}
	f.Add([]byte{16, 8, 8, 8}, []byte{0x10, 0xaa, 0, 0x11, 0xbb, 0xbb, 0x12}, uint64(30))
	f.Fuzz(func(t *testing.T, table, bytecodes []byte, pc uint64) {
		got, err := baselineBytecodeOffset(table, bytecodes, sizes, pc)
		if err == nil && (got < -1 || got >= len(bytecodes)) {
			t.Fatalf("bytecode offset %d of %d bytes", got, len(bytecodes))
		}
	})
}
