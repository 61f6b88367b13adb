package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/ulikunitz/xz/lzma"

	"github.com/sonde-dev/sonde/internal/elfx"
)

const (
	// maxMiniDebugBytes bounds the compressed .gnu_debugdata read.
	maxMiniDebugBytes = 64 << 20
	// maxXZDict bounds the LZMA2 dictionary a stream may ask for; xz -9
	// uses 64 MiB, MiniDebugInfo tools use the default 8 MiB. The window
	// actually allocated is also bounded by the output limit.
	maxXZDict = 64 << 20
)

// errInflateCap marks a compressed section whose contents would exceed what
// one file may inflate (Options.MaxInflateBytes).
var errInflateCap = errors.New("inflated size exceeds the per-file cap")

// loadMiniDebug reads the function symbols of the ELF file compressed with
// xz in f's .gnu_debugdata section (MiniDebugInfo, as Fedora and others ship
// it), inflating at most limit bytes; nil without error when f has none.
// img holds f's bytes (nil: read the section from f).
func loadMiniDebug(f *elf.File, img []byte, limit int) (*nativeTable, error) {
	s := f.Section(".gnu_debugdata")
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, nil
	}
	if s.Size > maxMiniDebugBytes {
		return nil, fmt.Errorf(".gnu_debugdata: %d bytes exceed the %d limit", s.Size, maxMiniDebugBytes)
	}
	if s.Flags&elf.SHF_COMPRESSED != 0 {
		img = nil
	}
	data, err := elfx.SectionBytes(img, s)
	if err != nil {
		return nil, fmt.Errorf(".gnu_debugdata: %w", err)
	}
	t, err := parseMiniDebug(data, limit)
	if err != nil {
		return nil, fmt.Errorf(".gnu_debugdata: %w", err)
	}
	return t, nil
}

// parseMiniDebug decompresses an xz stream holding an ELF file of at most
// limit bytes and reads that file's .symtab. The names it keeps are copied:
// the inflated file is garbage once it returns.
func parseMiniDebug(data []byte, limit int) (*nativeTable, error) {
	raw, err := unxz(data, limit)
	if err != nil {
		return nil, err
	}
	ef, err := elf.NewFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("embedded elf: %w", err)
	}
	for _, s := range ef.Sections {
		if s.Type == elf.SHT_SYMTAB {
			t, err := readSymbols(ef, raw, s, false)
			if err != nil {
				return nil, fmt.Errorf("embedded %s: %w", s.Name, err)
			}
			if len(t.syms) == 0 {
				return nil, nil
			}
			t.source = ".gnu_debugdata"
			return t, nil
		}
	}
	return nil, nil
}

var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0}

// unxz decompresses the first block of an xz stream, at most limit bytes.
// It reads the container itself so that the dictionary the stream asks for
// is checked against maxXZDict before anything is allocated; the integrity
// check is not verified (the ELF parser that follows checks structure).
// Tools that write MiniDebugInfo produce a single block.
//
// It inflates twice: first counting the output without keeping it, then
// into a buffer of exactly that size. A stream that would exceed limit (a
// decompression bomb) is refused after limit bytes, having cost only its
// window; one that fits costs its size once, not a doubling buffer's.
func unxz(data []byte, limit int) ([]byte, error) {
	n, err := unxzTo(data, limit, io.Discard)
	if err != nil {
		return nil, err
	}
	out := bytes.NewBuffer(make([]byte, 0, n))
	if _, err := unxzTo(data, int(n), out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// unxzTo writes at most limit inflated bytes of the xz stream data to w and
// returns how many there were; more than limit is errInflateCap.
func unxzTo(data []byte, limit int, w io.Writer) (int64, error) {
	if len(data) < 12 || !bytes.Equal(data[:6], xzMagic) {
		return 0, errors.New("xz: not an xz stream")
	}
	if crc32.ChecksumIEEE(data[6:8]) != binary.LittleEndian.Uint32(data[8:12]) {
		return 0, errors.New("xz: stream header checksum mismatch")
	}
	rest := data[12:]
	if len(rest) < 1 || rest[0] == 0 {
		return 0, errors.New("xz: no block")
	}
	hdrLen := (int(rest[0]) + 1) * 4
	if hdrLen > len(rest) {
		return 0, errors.New("xz: truncated block header")
	}
	hdr := rest[:hdrLen]
	if crc32.ChecksumIEEE(hdr[:hdrLen-4]) != binary.LittleEndian.Uint32(hdr[hdrLen-4:]) {
		return 0, errors.New("xz: block header checksum mismatch")
	}
	flags := hdr[1]
	if flags&0x3c != 0 {
		return 0, errors.New("xz: reserved block flags set")
	}
	p := hdr[2 : hdrLen-4]
	for _, present := range []bool{flags&0x40 != 0, flags&0x80 != 0} { // compressed, uncompressed size
		if present {
			_, n := binary.Uvarint(p)
			if n <= 0 {
				return 0, errors.New("xz: bad block size field")
			}
			p = p[n:]
		}
	}
	if flags&0x03 != 0 {
		return 0, errors.New("xz: filter chains other than LZMA2 alone are not supported")
	}
	id, n := binary.Uvarint(p)
	if n <= 0 || id != 0x21 {
		return 0, fmt.Errorf("xz: filter %#x is not LZMA2", id)
	}
	p = p[n:]
	propLen, n := binary.Uvarint(p)
	if n <= 0 || propLen != 1 || len(p) < n+1 {
		return 0, errors.New("xz: bad LZMA2 properties")
	}
	prop := p[n]
	if prop > 40 {
		return 0, errors.New("xz: bad LZMA2 dictionary size")
	}
	dict := uint64(2|prop&1) << (prop/2 + 11)
	if dict > maxXZDict {
		return 0, fmt.Errorf("xz: dictionary of %d bytes exceeds the %d limit", dict, maxXZDict)
	}
	// No match can reach further back than the output is long: a window
	// beyond limit is never needed, whatever the stream asks for.
	cfg := lzma.Reader2Config{DictCap: max(min(int(dict), limit), lzma.MinDictCap)}
	r, err := cfg.NewReader2(bytes.NewReader(rest[hdrLen:]))
	if err != nil {
		return 0, fmt.Errorf("xz: %w", err)
	}
	got, err := io.Copy(w, io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return 0, fmt.Errorf("xz: %w", err)
	}
	if got > int64(limit) {
		return 0, fmt.Errorf("xz: more than %d bytes: %w", limit, errInflateCap)
	}
	return got, nil
}
