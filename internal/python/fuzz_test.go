package python

import (
	"encoding/binary"
	"fmt"
	"testing"
)

// FuzzLineTables runs every line-table decoder on arbitrary bytes: no
// panic, no endless loop, and a line only where the table has entries.
func FuzzLineTables(f *testing.F) {
	f.Add([]byte{0x06, 0x01, 0x08, 0x02}, int64(10), uint64(8))
	f.Add([]byte{0x80 | 14<<3, 0x03, 0x00, 0x01, 0x02}, int64(1), uint64(0))
	f.Add([]byte{0x80 | 13<<3 | 2, 0x41, 0x01}, int64(5), uint64(2))
	f.Fuzz(func(t *testing.T, tab []byte, first int64, off uint64) {
		lineLnotab(tab, first, off)
		if len(tab) == 0 && line310(tab, first, off) != 0 {
			t.Fatal("3.10 table without entries gave a line")
		}
		if len(tab) == 0 && lineLocation(tab, first, off) != 0 {
			t.Fatal("location table without entries gave a line")
		}
		line310(tab, first, off)
		lineLocation(tab, first, off)
	})
}

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

// FuzzCode reads a code object, its strings and line table out of an
// arbitrary memory image with every version's layout.
func FuzzCode(f *testing.F) {
	f.Add(make([]byte, 1024), uint16(0))
	seed := make([]byte, 2048)
	binary.LittleEndian.PutUint64(seed[8:], 0x1000+512) // ob_type
	binary.LittleEndian.PutUint64(seed[512+24:], 0x1000+600)
	copy(seed[600:], "code\x00")
	f.Add(seed, uint16(0))
	f.Fuzz(func(t *testing.T, img []byte, at uint16) {
		mem := sliceMem{base: 0x1000, b: img}
		for minor := 6; minor <= 13; minor++ {
			l, _ := LayoutFor(minor)
			r := NewReader(mem, l)
			c, err := r.Code(0x1000 + uint64(at&^7))
			if err != nil {
				continue
			}
			if len(c.Name) > 4*maxStringChars || len(c.File) > 4*maxStringChars {
				t.Fatalf("3.%d: name of %d bytes", minor, len(c.Name))
			}
			c.Line(0x1000 + uint64(at))
		}
	})
}

// FuzzDecodeString decodes arbitrary str headers and bodies.
func FuzzDecodeString(f *testing.F) {
	h := make([]byte, 40)
	binary.LittleEndian.PutUint64(h[16:], 3)
	binary.LittleEndian.PutUint32(h[32:], 1<<2|1<<5|1<<6)
	f.Add(h, []byte("abc"))
	f.Fuzz(func(t *testing.T, h, body []byte) {
		if len(h) < 40 {
			return
		}
		for _, minor := range []int{11, 12} {
			l, _ := LayoutFor(minor)
			read := func(_ int64, p []byte) error {
				if int64(len(p)) > int64(len(body)) {
					return fmt.Errorf("short")
				}
				copy(p, body)
				return nil
			}
			s, err := decodeString(h, read, &l)
			if err == nil && len(s) > 4*maxStringChars {
				t.Fatalf("string of %d bytes", len(s))
			}
		}
	})
}

// FuzzParseDebugOffsets parses arbitrary _PyRuntime prefixes.
func FuzzParseDebugOffsets(f *testing.F) {
	b := make([]byte, debugOffsetsSize)
	copy(b, debugCookie)
	b[10], b[11] = 13, 3
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, minor := range []int{13, 14} {
			base, _ := LayoutFor(minor)
			l, err := parseDebugOffsets(b, base)
			if err != nil {
				continue
			}
			if l.ThreadFrame < 0 || l.ThreadFrame > 1<<20 || l.CodeAdaptive > 1<<20 {
				t.Fatalf("accepted offsets out of range: %+v", l)
			}
		}
	})
}
