package php

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

// FuzzParseVersion parses arbitrary read-only data as a binary's.
func FuzzParseVersion(f *testing.F) {
	f.Add([]byte("X-Powered-By: PHP/8.2.36\x00API20220829,NTS\x00"))
	f.Add([]byte("X-Powered-By: PHP/8.99999.1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParseVersion(b)
		if err == nil && v.Major != 8 {
			t.Fatalf("accepted %v", v)
		}
	})
}

// seedImage is a memory image at 0x1000 holding a user function (at
// 0x1000) named "f" in class "C", file "/x.php", with two opcodes.
func seedImage() []byte {
	l := layouts[2]
	img := make([]byte, 2048)
	put := func(at int64, v uint64) { binary.LittleEndian.PutUint64(img[at:], v) }
	str := func(at int64, s string) {
		put(at+l.StrLen, uint64(len(s)))
		copy(img[at+l.StrVal:], s)
	}
	img[l.FnType] = userFunction
	put(l.FnName, 0x1000+512)
	str(512, "f")
	put(l.FnScope, 0x1000+600)
	put(600+l.ClassName, 0x1000+704)
	str(704, "C")
	put(l.OpOpcodes, 0x1000+1024)
	binary.LittleEndian.PutUint32(img[l.OpLast:], 2)
	put(l.OpFilename, 0x1000+800)
	str(800, "/x.php")
	binary.LittleEndian.PutUint32(img[1024+l.OpSize+l.OpLineno:], 7)
	// A frame at 0x1000+1536 running it, the current one.
	put(1536+l.ExFunc, 0x1000)
	put(1536+l.ExOpline, 0x1000+1024+uint64(l.OpSize))
	put(1800, 0x1000+1536)
	return img
}

// FuzzFunction reads a zend_function, its strings and a line out of an
// arbitrary memory image with every version's layout.
func FuzzFunction(f *testing.F) {
	f.Add(make([]byte, 1024), uint16(0), uint8(KindFunction))
	f.Add(seedImage(), uint16(0), uint8(KindMain))
	f.Fuzz(func(t *testing.T, img []byte, at uint16, kind uint8) {
		mem := sliceMem{base: 0x1000, b: img}
		for _, l := range layouts {
			r := NewReader(mem, l)
			addr := 0x1000 + uint64(at&^7)
			fn, err := r.Function(addr, kind)
			if err == nil {
				if len(fn.Name) > 2*maxNameBytes+2 || len(fn.File) > maxPathBytes || fn.Name == "" {
					t.Fatalf("8.%d: name of %d bytes, file of %d", l.Minor, len(fn.Name), len(fn.File))
				}
				_, _ = r.Same(fn, addr)
			}
			r.Line(addr, 0x1000+uint64(at))
			if c, err := r.Code(addr, kind); err == nil && (len(c.File) > maxPathBytes || c.Name == "") {
				t.Fatalf("8.%d: code of file %q named %q", l.Minor, c.File, c.Name)
			}
		}
	})
}

// FuzzStack walks the frame chain of an arbitrary memory image: bounded,
// no panic.
func FuzzStack(f *testing.F) {
	f.Add(seedImage(), uint64(0x1000+1536), uint64(0x1000+1024))
	f.Fuzz(func(t *testing.T, img []byte, r14, r15 uint64) {
		mem := sliceMem{base: 0x1000, b: img}
		for _, l := range layouts {
			in := &Interp{Minor: l.Minor, Layout: l, CurrentEx: 0x1000 + 1800}
			frames, _ := in.Stack(mem, VMRegs{Ex: r14, Opline: r15})
			if len(frames) > maxStack {
				t.Fatalf("%d frames", len(frames))
			}
		}
	})
}

func TestSeedImage(t *testing.T) {
	mem := sliceMem{base: 0x1000, b: seedImage()}
	in := &Interp{Minor: 2, Layout: layouts[2], CurrentEx: 0x1000 + 1800}
	frames, err := in.Stack(mem, VMRegs{})
	if err != nil || len(frames) != 1 {
		t.Fatalf("%v, %v", frames, err)
	}
	if f := frames[0]; f.Name != "C::f" || f.File != "/x.php" || f.Line != 7 || f.Kind != KindFunction {
		t.Errorf("frame %+v", f)
	}
}
