package ruby

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

const imgBase = 0x10000

// putString writes an embedded String s at img[at:] as l lays it out.
func putString(img []byte, l Layout, at int64, s string) {
	if l.StrLen != 0 {
		binary.LittleEndian.PutUint64(img[at:], tString)
		binary.LittleEndian.PutUint64(img[at+l.StrLen:], uint64(len(s)))
	} else {
		binary.LittleEndian.PutUint64(img[at:], tString|uint64(len(s))<<l.StrEmbedShift)
	}
	copy(img[at+l.StrEmbedAry:], s)
}

// seedImage is a memory image at imgBase holding an execution context (at
// 0) whose one frame runs an iseq labelled "f" of file "/x.rb", its pc on
// the second of two line entries (line 7), and a dummy frame above it, as
// l lays them out.
func seedImage(l Layout) []byte {
	img := make([]byte, 4096)
	put := func(at int64, v uint64) { binary.LittleEndian.PutUint64(img[at:], v) }
	str := func(at int64, s string) { putString(img, l, at, s) }
	// Context: a VM stack at 1024 of 128 words, the frames at its top.
	put(l.ECVMStack, imgBase+1024)
	put(l.ECVMStackSize, 128)
	end := int64(1024 + 128*8)
	cfp := end - 2*l.CFPSize
	put(l.ECCFP, imgBase+uint64(cfp))
	// The frame: iseq at 2304, pc at its third word, ep at 1100.
	put(cfp+l.CFPIseq, imgBase+2304)
	put(cfp+l.CFPPC, imgBase+2560+3*8)
	put(cfp+l.CFPEP, imgBase+1104)
	put(1104, 0x11110003) // a method frame
	dummy := cfp + l.CFPSize
	put(dummy+l.CFPEP, imgBase+1112)
	put(1112, magicDummy)
	// The iseq and its body at 2400.
	put(2304, tImemo|imemoIseq<<l.ImemoTypeShift)
	put(2304+l.IseqBody, imgBase+2400)
	binary.LittleEndian.PutUint32(img[2400+l.BodyIseqSize:], 4)
	put(2400+l.BodyEncoded, imgBase+2560)
	put(2400+l.BodyPath, imgBase+2704)
	put(2400+l.BodyLabel, imgBase+2800)
	if l.FirstLineInt {
		binary.LittleEndian.PutUint32(img[2400+l.BodyFirstLine:], 5)
	} else {
		put(2400+l.BodyFirstLine, 5<<1|1)
	}
	put(2400+l.BodyInsns, imgBase+2904)
	binary.LittleEndian.PutUint32(img[2400+l.BodyInsnsSize:], 2)
	put(2400+l.BodySuccTable, imgBase+3000)
	str(2704, "/x.rb")
	str(2800, "f")
	binary.LittleEndian.PutUint32(img[2904:], 5)
	binary.LittleEndian.PutUint32(img[2904+l.InsnInfoSize:], 7)
	// Entries start at positions 0 and 2: counts 1, 1, 2, 2, ...
	var imm uint64
	for pos, n := range []uint64{1, 1, 2, 2, 2, 2, 2, 2, 2} {
		imm |= n << (pos * 7)
	}
	put(3000, imm)
	return img
}

// TestSeedImage walks the seed image of every version's layout: its
// frame, iseq, Strings and line table as that version keeps them.
func TestSeedImage(t *testing.T) {
	for v, l := range layouts {
		mem := sliceMem{base: imgBase, b: seedImage(l)}
		in := &Interp{Major: l.Major, Minor: l.Minor, Layout: l}
		frames, err := in.Stack(mem, imgBase)
		if err != nil || len(frames) != 1 {
			t.Errorf("%d: %+v, %v", v, frames, err)
			continue
		}
		if f := frames[0]; f.Name != "f" || f.File != "/x.rb" || f.Line != 7 || f.Iseq != imgBase+2304 {
			t.Errorf("%d: frame %+v", v, f)
		}
		s, err := NewReader(mem, l).Iseq(imgBase + 2304)
		if err != nil || s.FirstLine != 5 {
			t.Errorf("%d: iseq %+v, %v", v, s, err)
		}
	}
}

// TestIseqLabelBytes: a label that starts with a NUL is no name, and one
// of bytes that are not UTF-8 keeps within the bound it was read with (the
// fuzzer found both).
func TestIseqLabelBytes(t *testing.T) {
	l := layouts[301]
	label := func(s string) []byte {
		img := seedImage(l)
		putString(img, l, 2800, s)
		return img
	}
	r := NewReader(sliceMem{base: imgBase, b: label("\x00f\x00\x00")}, l)
	if s, err := r.Iseq(imgBase + 2304); err == nil {
		t.Errorf("label %q of a NUL accepted", s.Label)
	}
	bad := string([]byte{0xff, 'a', 0xfe, 'b', 0xc3, 'c', 0x80, 'd', 0xff, 'e', 0xfe, 'f'})
	r = NewReader(sliceMem{base: imgBase, b: label(bad)}, l)
	s, err := r.Iseq(imgBase + 2304)
	if err != nil || s.Label != "?a?b?c?d?e?f" {
		t.Errorf("label of bytes not UTF-8: %+v, %v", s, err)
	}
}

// FuzzStack walks the frames of an arbitrary memory image: bounded, no
// panic, every name within its bound.
func FuzzStack(f *testing.F) {
	for _, l := range layouts {
		f.Add(seedImage(l), uint16(0))
	}
	f.Add(make([]byte, 512), uint16(8))
	f.Fuzz(func(t *testing.T, img []byte, at uint16) {
		mem := sliceMem{base: imgBase, b: img}
		for _, l := range layouts {
			in := &Interp{Major: l.Major, Minor: l.Minor, Layout: l}
			frames, _ := in.Stack(mem, imgBase+uint64(at&^7))
			if len(frames) > maxStack {
				t.Fatalf("%d frames", len(frames))
			}
			for _, fr := range frames {
				if len(fr.Name) > maxNameBytes || len(fr.File) > maxPathBytes || fr.Line < 0 {
					t.Fatalf("frame %q %q %d", fr.Name, fr.File, fr.Line)
				}
			}
		}
	})
}

// FuzzIseq reads an iseq, its strings and a line out of an arbitrary
// memory image.
func FuzzIseq(f *testing.F) {
	for _, l := range layouts {
		f.Add(seedImage(l), uint16(2304), uint16(2560+24))
	}
	f.Fuzz(func(t *testing.T, img []byte, at, pc uint16) {
		mem := sliceMem{base: imgBase, b: img}
		for _, l := range layouts {
			r := NewReader(mem, l)
			addr := imgBase + uint64(at)
			s, err := r.Iseq(addr)
			if err != nil {
				continue
			}
			if len(s.Label) > maxNameBytes || len(s.File) > maxPathBytes || s.Label == "" {
				t.Fatalf("label of %d bytes, file of %d", len(s.Label), len(s.File))
			}
			r.Same(s, addr)
			if line := r.Line(s, imgBase+uint64(pc)); line < 0 {
				t.Fatalf("line %d", line)
			}
		}
	})
}

// FuzzSuccRank looks positions up in an arbitrary succinct line index.
func FuzzSuccRank(f *testing.F) {
	f.Add(make([]byte, 48+80), uint16(60))
	f.Fuzz(func(t *testing.T, img []byte, pos uint16) {
		r := NewReader(sliceMem{base: imgBase, b: img}, layouts[301])
		if n, err := r.succRank(imgBase, uint64(pos)); err == nil && n > uint64(pos)+1 {
			t.Fatalf("rank %d at %d", n, pos)
		}
	})
}

// FuzzParseVersion parses arbitrary bytes as ruby_version's.
func FuzzParseVersion(f *testing.F) {
	f.Add([]byte("3.1.2\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		major, _, v, err := ParseVersion(b)
		if err == nil && (major != 3 || len(v) > 16) {
			t.Fatalf("accepted %q", v)
		}
	})
}

// FuzzEhFrameHdr parses an arbitrary .eh_frame_hdr and looks for the VM
// loop in arbitrary code with its table.
func FuzzEhFrameHdr(f *testing.F) {
	hdr := []byte{1, 0x1b, 0x03, 0x3b, 0, 0, 0, 0, 2, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x10, 0x20, 0, 0, 0, 0, 0, 0}
	f.Add(hdr, []byte{0xe8, 0x0b, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b, code []byte) {
		starts, err := ParseEhFrameHdr(b, 0x1000)
		if err != nil {
			return
		}
		for i := 1; i < len(starts); i++ {
			if starts[i] < starts[i-1] {
				t.Fatal("not sorted")
			}
		}
		if s, e, err := VMLoop(code, 0x1000, starts); err == nil && e-s < 4096 {
			t.Fatalf("loop %#x..%#x", s, e)
		}
	})
}

// FuzzOwner names a method entry's owner, and looks for the class name
// IDs, out of an arbitrary memory image.
func FuzzOwner(f *testing.F) {
	f.Add(make([]byte, 1024), uint16(0), uint16(0xf01), uint16(0xc11))
	f.Fuzz(func(t *testing.T, img []byte, at, cp, att uint16) {
		mem := sliceMem{base: imgBase, b: img}
		for _, l := range layouts {
			r := NewReader(mem, l)
			addr := imgBase + uint64(at&^7)
			if o, err := r.Owner(addr, ClassIDs{ClassPath: uint64(cp), Attached: uint64(att)}); err == nil {
				if len(o.Prefix) > maxNameBytes+1 || len(o.Prefix) < 2 {
					t.Fatalf("prefix %q", o.Prefix)
				}
				r.sameOwner(o, addr)
			}
			_, _ = r.FindClassIDs(addr)
		}
	})
}

func TestWord(t *testing.T) {
	const iseq = 0x7fe5ca2e47f0
	for _, tc := range []struct{ pos, body, me, wantPos, wantME uint64 }{
		{0, 0x5573_11dc_b590, 0, 0, 0},
		{17, 0x5573_11dc_b590, 0x7fe5ca2ebf78, 17, 0x7fe5ca2ebf78},
		{PosUnknown + 5, 0x10, iseq - 8, PosUnknown, iseq - 8},
		{3, 0x20, 0x1001, 3, 0},                          // unaligned: no method entry
		{3, 0x20, iseq + 1<<40, 3, 0},                    // too far from the iseq
		{3, 0x20, iseq - (1<<31)*8, 3, iseq - (1<<31)*8}, // the farthest below
	} {
		pos, check, me := SplitWord(Word(tc.pos, tc.body, tc.me, iseq), iseq)
		if pos != tc.wantPos || me != tc.wantME || check != bodyCheck(tc.body) {
			t.Errorf("Word(%d, %#x, %#x): %d, %#x, %#x; want %d, %#x, %#x", tc.pos, tc.body, tc.me, pos, check, me, tc.wantPos, bodyCheck(tc.body), tc.wantME)
		}
	}
}

// ownerImage is a memory image at imgBase with two method entries: at 0x100
// an instance method of class Foo (at 0x200), at 0x180 a singleton method
// of Foo (its metaclass at 0x300), as l lays them out; Foo's name and its
// metaclass's object are instance variables ids (up to 3.1) or fields of
// the classes' exts.
func ownerImage(l Layout, ids ClassIDs) []byte {
	img := make([]byte, 4096)
	put := func(at int64, v uint64) { binary.LittleEndian.PutUint64(img[at:], v) }
	me := func(at, owner int64) {
		put(at, tImemo|imemoMent<<l.ImemoTypeShift)
		put(at+l.MEOwner, imgBase+uint64(owner))
	}
	me(0x100, 0x200)
	me(0x180, 0x300)
	put(0x200, tClass)
	put(0x300, tClass|l.Singleton)
	putString(img, l, 0x800, "Foo")
	// ext returns where class cls's ext is, pointing to it from the class
	// at 0x400 past the class where it is not inline.
	ext := func(cls int64) int64 {
		if l.ClassExtInline {
			return cls + l.ClassExt
		}
		put(cls+l.ClassExt, imgBase+uint64(cls+0x400))
		return cls + 0x400
	}
	set := func(cls, off int64, id, v uint64, tbl int64) {
		e := ext(cls)
		if off != 0 {
			put(e+off, v)
			return
		}
		// An st_table at tbl with one entry (hash, key, record).
		put(e+l.ExtIVTbl, imgBase+uint64(tbl))
		put(tbl+l.StNum, 1)
		put(tbl+l.StStart, 0)
		put(tbl+l.StBound, 1)
		put(tbl+l.StEntries, imgBase+uint64(tbl+0x40))
		put(tbl+0x40+8, id)
		put(tbl+0x40+16, v)
	}
	set(0x200, l.ExtClassPath, ids.ClassPath, imgBase+0x800, 0xa00)
	set(0x300, l.ExtAttached, ids.Attached, imgBase+0x200, 0xb00)
	return img
}

// TestOwnerLayouts names an instance and a singleton method's owner as
// every version keeps classes: 3.2's, kept by object shapes, are not read.
func TestOwnerLayouts(t *testing.T) {
	ids := ClassIDs{ClassPath: 0x3f1, Attached: 0x3e1}
	for v, l := range layouts {
		r := NewReader(sliceMem{base: imgBase, b: ownerImage(l, ids)}, l)
		inst, err1 := r.Owner(imgBase+0x100, ids)
		single, err2 := r.Owner(imgBase+0x180, ids)
		if v == 302 {
			if err1 == nil || err2 == nil {
				t.Errorf("3.2: owners named %+v %+v", inst, single)
			}
			continue
		}
		if err1 != nil || err2 != nil || inst.Prefix != "Foo#" || single.Prefix != "Foo." {
			t.Errorf("%d: %+v %v; %+v %v", v, inst, err1, single, err2)
		}
	}
}

// TestThreadPointer reads a thread's pthread_self() where each version
// keeps it: in the rb_thread_t, or from 3.2 in its native thread.
func TestThreadPointer(t *testing.T) {
	const tp = 0x7f12_3456_7640
	for v, l := range layouts {
		img := make([]byte, 1024)
		at := int64(0x100)
		if l.ThreadNT != 0 {
			binary.LittleEndian.PutUint64(img[at+l.ThreadNT:], imgBase+0x200)
			at = 0x200
		}
		binary.LittleEndian.PutUint64(img[at+l.ThreadID:], tp)
		got, err := NewReader(sliceMem{base: imgBase, b: img}, l).threadPointer(imgBase + 0x100)
		if err != nil || got != tp {
			t.Errorf("%d: %#x, %v", v, got, err)
		}
	}
}
