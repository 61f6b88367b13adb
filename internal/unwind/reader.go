package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var errShort = errors.New("truncated")

// buf is a bounds-checked little-endian reader over CFI bytes. Reads past the
// end set err and return zero; callers check err once per entry.
type buf struct {
	data []byte
	off  int
	err  error
}

func (b *buf) fail(err error) {
	if b.err == nil {
		b.err = err
	}
	b.off = len(b.data)
}

func (b *buf) left() int { return len(b.data) - b.off }

func (b *buf) bytes(n uint64) []byte {
	if b.err != nil || n > uint64(b.left()) {
		b.fail(errShort)
		return nil
	}
	p := b.data[b.off : b.off+int(n)]
	b.off += int(n)
	return p
}

func (b *buf) u8() uint8 {
	p := b.bytes(1)
	if p == nil {
		return 0
	}
	return p[0]
}

func (b *buf) u16() uint16 {
	p := b.bytes(2)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(p)
}

func (b *buf) u32() uint32 {
	p := b.bytes(4)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(p)
}

func (b *buf) u64() uint64 {
	p := b.bytes(8)
	if p == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(p)
}

// uleb reads an unsigned LEB128; more than 10 bytes or bits beyond 64 are an
// error.
func (b *buf) uleb() uint64 {
	var v uint64
	for i := 0; ; i++ {
		if b.err != nil {
			return 0
		}
		c := b.u8()
		if i == 9 && c > 1 || i > 9 {
			b.fail(fmt.Errorf("leb128 overflows 64 bits"))
			return 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v
		}
	}
}

// sleb reads a signed LEB128.
func (b *buf) sleb() int64 {
	var v int64
	var shift uint
	for i := 0; ; i++ {
		if b.err != nil {
			return 0
		}
		c := b.u8()
		if i > 9 {
			b.fail(fmt.Errorf("leb128 overflows 64 bits"))
			return 0
		}
		v |= int64(c&0x7f) << shift
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
}

// cstring reads a NUL-terminated string of at most limit bytes.
func (b *buf) cstring(limit int) string {
	for i := b.off; i < len(b.data) && i-b.off <= limit; i++ {
		if b.data[i] == 0 {
			s := string(b.data[b.off:i])
			b.off = i + 1
			return s
		}
	}
	b.fail(fmt.Errorf("string longer than %d bytes or unterminated", limit))
	return ""
}

// Pointer encodings (DW_EH_PE_*), as used by .eh_frame.
const (
	peAbsptr  = 0x00
	peULEB128 = 0x01
	peUdata2  = 0x02
	peUdata4  = 0x03
	peUdata8  = 0x04
	peSLEB128 = 0x09
	peSdata2  = 0x0a
	peSdata4  = 0x0b
	peSdata8  = 0x0c

	pePCRel    = 0x10
	peTextRel  = 0x20
	peDataRel  = 0x30
	peFuncRel  = 0x40
	peAligned  = 0x50
	peIndirect = 0x80
	peOmit     = 0xff
)

// ptrCtx gives the bases that relative pointer encodings refer to.
type ptrCtx struct {
	secAddr  uint64 // virtual address of the section's first byte (pcrel)
	textBase uint64 // .text address (textrel)
	dataBase uint64 // .got address (datarel)
	funcBase uint64 // start of the current FDE's function (funcrel)
	// deref reads the 8-byte pointer at a virtual address (indirect); nil
	// makes indirect pointers an error.
	deref func(addr uint64) (uint64, error)
}

// pointer reads a value in encoding enc. applyRel false reads only the
// value format (for FDE address ranges, which are never relative).
func (b *buf) pointer(enc uint8, c *ptrCtx, applyRel bool) uint64 {
	if enc == peOmit {
		return 0
	}
	fieldAddr := c.secAddr + uint64(b.off)
	if enc&0x70 == peAligned {
		pad := (8 - b.off%8) % 8
		b.bytes(uint64(pad))
		fieldAddr = c.secAddr + uint64(b.off)
	}
	var v uint64
	switch enc & 0x0f {
	case peAbsptr, peUdata8, peSdata8:
		v = b.u64()
	case peULEB128:
		v = b.uleb()
	case peUdata2:
		v = uint64(b.u16())
	case peUdata4:
		v = uint64(b.u32())
	case peSLEB128:
		v = uint64(b.sleb())
	case peSdata2:
		v = uint64(int64(int16(b.u16())))
	case peSdata4:
		v = uint64(int64(int32(b.u32())))
	default:
		b.fail(fmt.Errorf("pointer encoding %#x: unknown format", enc))
		return 0
	}
	if !applyRel || b.err != nil {
		return v
	}
	switch enc & 0x70 {
	case 0, peAligned:
	case pePCRel:
		v += fieldAddr
	case peTextRel:
		v += c.textBase
	case peDataRel:
		v += c.dataBase
	case peFuncRel:
		v += c.funcBase
	default:
		b.fail(fmt.Errorf("pointer encoding %#x: unknown application", enc))
		return 0
	}
	if enc&peIndirect != 0 {
		if c.deref == nil {
			b.fail(fmt.Errorf("pointer encoding %#x: indirect pointer without memory", enc))
			return 0
		}
		p, err := c.deref(v)
		if err != nil {
			b.fail(fmt.Errorf("indirect pointer at %#x: %w", v, err))
			return 0
		}
		v = p
	}
	return v
}
