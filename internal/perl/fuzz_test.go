package perl

import (
	"encoding/binary"
	"fmt"
	"testing"
)

// sliceMem is a process image for the fuzzers: bytes at base.
type sliceMem struct {
	base uint64
	b    []byte
}

func (m sliceMem) ReadAt(p []byte, addr uint64) error {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return fmt.Errorf("read %d at %#x: outside the image", len(p), addr)
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

// The seed image's base and the objects in it.
const (
	imgBase   = 0x10000
	imgCV     = imgBase + 0x000 // a CV whose body is at 0x100
	imgCop    = imgBase + 0x500 // a COP at line 7 of /x.pl
	imgInterp = imgBase + 0x800 // an interpreter running imgCV
	imgCurInt = imgBase + 0xff8 // PL_curinterp
)

// seedImage is a memory image at imgBase holding a sub Pkg::f (a CV, its
// GV and its stash) defined in /x.pl, a COP, and an interpreter whose
// main stack info has one sub context running it: 5.36's layout.
func seedImage() []byte { return seedImageOf(layouts[36]) }

// seedImageOf is seedImage laid out as l says.
func seedImageOf(l Layout) []byte {
	img := make([]byte, 0x1000)
	put := func(at int64, v uint64) { binary.LittleEndian.PutUint64(img[at:], v) }
	put32 := func(at int64, v uint32) { binary.LittleEndian.PutUint32(img[at:], v) }
	hek := func(at int64, s string) {
		put32(at+l.HekLen, uint32(len(s)))
		copy(img[at+l.HekKey:], s)
	}
	sv := func(at, body int64, typ uint32) {
		put(at, imgBase+uint64(body))
		put32(at+l.SvFlags, typ)
	}
	sv(0, 0x100, svtPVCV) // the CV
	put(0x100+l.XcvGV, imgBase+0x200)
	put(0x100+l.XcvFile, imgBase+0x480)
	copy(img[0x480:], "/x.pl\x00")
	sv(0x200, 0x240, svtPVGV) // its GV
	put(0x240+l.XgvNameHek, imgBase+0x2c0)
	hek(0x2c0, "f")
	put(0x240+l.XgvStash, imgBase+0x300)
	sv(0x300, 0x340, svtPVHV|svfOOK) // the stash
	aux := int64(0x340 + l.XhvAux)
	if l.XhvAux < 0 { // after its bucket array of one, at 0x3c0
		put(0x300+l.SvU, imgBase+0x3c0)
		put(0x340+l.XhvMax, 0)
		aux = 0x3c8
	}
	put(aux+l.AuxName, imgBase+0x400)
	hek(0x400, "Pkg")
	put32(0x500+l.CopLine, 7) // the COP
	put(0x500+l.CopFile, imgBase+0x480)
	// The interpreter: curcop, a main stack info with one sub context.
	put(0x800+l.InterpCurcop, imgCop)
	put(0x800+l.InterpCurstackinfo, imgBase+0x900)
	put(0x900+l.SICxstack, imgBase+0xa00)
	put32(0x900+l.SICxix, 0)
	put32(0x900+l.SIType, perlsiMain)
	img[0xa00+l.CxType] = cxtSub
	put(0xa00+l.CxSubCV, imgCV)
	put(0xa00+l.CxOldcop, imgCop)
	put(0xa00+l.CxRetop, 1)
	put(0xff8, imgInterp)
	return img
}

// TestSeedImage reads the seed image's stack: the fuzzers' seed is a
// stack that reads.
func TestSeedImage(t *testing.T) {
	for v, l := range layouts {
		in := &Interp{Layout: l, CurInterp: imgCurInt}
		frames, err := in.Stack(sliceMem{base: imgBase, b: seedImageOf(l)})
		if err != nil {
			t.Fatalf("5.%d: %v", v, err)
		}
		if len(frames) != 2 || frames[0].Name != "Pkg::f" || frames[0].Line != 7 || frames[0].File != "/x.pl" ||
			frames[1].Name != "(main)" || frames[1].Line != 7 || !frames[1].Last || frames[0].Last {
			t.Fatalf("5.%d: frames %s", v, describe(frames))
		}
	}
	// 5.32's stash with a bucket count that is no power of two is refused.
	img := seedImageOf(layouts[32])
	binary.LittleEndian.PutUint64(img[0x340+layouts[32].XhvMax:], 2)
	if _, err := NewReader(sliceMem{base: imgBase, b: img}, layouts[32]).StashName(imgBase + 0x300); err == nil {
		t.Error("a stash of 3 buckets was read")
	}
}

// FuzzStack walks an arbitrary memory image as an interpreter's, naming
// every frame, with every version's layout.
func FuzzStack(f *testing.F) {
	f.Add(make([]byte, 0x1000))
	f.Add(seedImage())
	f.Add(seedImageOf(layouts[32]))
	f.Fuzz(func(t *testing.T, img []byte) {
		mem := sliceMem{base: imgBase, b: img}
		for _, l := range layouts {
			in := &Interp{Layout: l, CurInterp: imgCurInt}
			frames, _ := in.Stack(mem)
			if len(frames) > maxStack {
				t.Fatalf("5.%d: %d frames", l.Version, len(frames))
			}
			for _, fr := range frames {
				if len(fr.Name) > 2*maxNameBytes+2 || len(fr.File) > maxPathBytes || fr.Name == "" {
					t.Fatalf("5.%d: name of %d bytes, file of %d", l.Version, len(fr.Name), len(fr.File))
				}
			}
		}
	})
}

// FuzzSub reads a CV, its name and package, and a COP out of an arbitrary
// memory image with every version's layout.
func FuzzSub(f *testing.F) {
	f.Add(make([]byte, 1024), uint16(0))
	f.Add(seedImage(), uint16(0))
	f.Add(seedImage(), uint16(0x500))
	f.Fuzz(func(t *testing.T, img []byte, at uint16) {
		mem := sliceMem{base: imgBase, b: img}
		for _, l := range layouts {
			r := NewReader(mem, l)
			addr := imgBase + uint64(at)
			if fn, err := r.Sub(addr); err == nil {
				if len(fn.Name) > 2*maxNameBytes+2 || len(fn.File) > maxPathBytes || fn.Name == "" {
					t.Fatalf("5.%d: name of %d bytes, file of %d", l.Version, len(fn.Name), len(fn.File))
				}
				if same, _ := r.same(fn, addr, KindSub); !same {
					t.Fatalf("5.%d: sub not the same as itself", l.Version)
				}
			}
			if fn, err := r.Code(addr, KindEval); err == nil && len(fn.File) > maxPathBytes {
				t.Fatalf("5.%d: file of %d bytes", l.Version, len(fn.File))
			}
		}
	})
}
