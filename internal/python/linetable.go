package python

// Line tables map a bytecode offset to a source line. Each version's
// format is decoded here; all take the table as untrusted bytes and stop
// at its end.

// maxLineTable bounds the line table read for one code object.
const maxLineTable = 1 << 20

// lineLnotab decodes co_lnotab (3.6–3.9): pairs of (bytecode increment,
// signed line increment); off is a byte offset.
func lineLnotab(tab []byte, first int64, off uint64) int64 {
	line, addr := first, uint64(0)
	for i := 0; i+1 < len(tab); i += 2 {
		addr += uint64(tab[i])
		if addr > off {
			break
		}
		line += int64(int8(tab[i+1]))
	}
	return line
}

// line310 decodes the 3.10 co_linetable: pairs of (bytecode length,
// signed line delta), -128 meaning no line; off is a byte offset. It
// returns 0 where the instruction has no line.
func line310(tab []byte, first int64, off uint64) int64 {
	line := first
	var end uint64
	for i := 0; i+1 < len(tab); i += 2 {
		start := end
		end += uint64(tab[i])
		d := int8(tab[i+1])
		cur := int64(-1)
		if d != -128 {
			line += int64(d)
			cur = line
		}
		if start <= off && off < end {
			if cur < 0 {
				return 0
			}
			return cur
		}
	}
	return 0
}

// lineLocation decodes the 3.11+ location table; unit is an offset in
// code units (two bytes). It returns 0 where the instruction has no line
// or the table ends first.
func lineLocation(tab []byte, first int64, unit uint64) int64 {
	r := varReader{b: tab}
	line := first
	var addr uint64
	for r.i < len(r.b) {
		h := r.b[r.i]
		r.i++
		if h&0x80 == 0 {
			return 0 // not at an entry's first byte: corrupt
		}
		code := (h >> 3) & 15
		n := uint64(h&7) + 1
		cur := line
		switch {
		case code == 15: // no location
			cur = -1
		case code == 14: // long form
			line += r.svarint()
			cur = line
			r.varint() // end line delta
			r.varint() // column
			r.varint() // end column
		case code == 13: // no column
			line += r.svarint()
			cur = line
		case code >= 10: // one line, two column bytes
			line += int64(code - 10)
			cur = line
			r.i += 2
		default: // short form: same line, one column byte
			r.i++
		}
		if r.bad {
			return 0
		}
		if addr <= unit && unit < addr+n {
			if cur < 0 {
				return 0
			}
			return cur
		}
		addr += n
	}
	return 0
}

// varReader reads the location table's 6-bit varints.
type varReader struct {
	b   []byte
	i   int
	bad bool
}

func (r *varReader) varint() uint64 {
	var v uint64
	for shift := 0; ; shift += 6 {
		if r.i >= len(r.b) || shift > 60 {
			r.bad = true
			return 0
		}
		c := r.b[r.i]
		r.i++
		v |= uint64(c&63) << shift
		if c&64 == 0 {
			return v
		}
	}
}

func (r *varReader) svarint() int64 {
	v := r.varint()
	if v&1 != 0 {
		return -int64(v >> 1)
	}
	return int64(v >> 1)
}
