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
)

const (
	// maxMiniDebugBytes bounds the compressed .gnu_debugdata read.
	maxMiniDebugBytes = 64 << 20
	// maxMiniDebugELF bounds the decompressed ELF file it holds.
	maxMiniDebugELF = 256 << 20
	// maxXZDict bounds the LZMA2 dictionary a stream may ask for; xz -9
	// uses 64 MiB, MiniDebugInfo tools use the default 8 MiB.
	maxXZDict = 64 << 20
)

// loadMiniDebug reads the function symbols of the ELF file compressed with
// xz in f's .gnu_debugdata section (MiniDebugInfo, as Fedora and others ship
// it); nil without error when f has none.
func loadMiniDebug(f *elf.File) (*nativeTable, error) {
	s := f.Section(".gnu_debugdata")
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil, nil
	}
	if s.Size > maxMiniDebugBytes {
		return nil, fmt.Errorf(".gnu_debugdata: %d bytes exceed the %d limit", s.Size, maxMiniDebugBytes)
	}
	data, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf(".gnu_debugdata: %w", err)
	}
	t, err := parseMiniDebug(data, maxMiniDebugELF)
	if err != nil {
		return nil, fmt.Errorf(".gnu_debugdata: %w", err)
	}
	return t, nil
}

// parseMiniDebug decompresses an xz stream holding an ELF file of at most
// limit bytes and reads that file's .symtab.
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
			t, err := readSymbols(ef, s)
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
func unxz(data []byte, limit int) ([]byte, error) {
	if len(data) < 12 || !bytes.Equal(data[:6], xzMagic) {
		return nil, errors.New("xz: not an xz stream")
	}
	if crc32.ChecksumIEEE(data[6:8]) != binary.LittleEndian.Uint32(data[8:12]) {
		return nil, errors.New("xz: stream header checksum mismatch")
	}
	rest := data[12:]
	if len(rest) < 1 || rest[0] == 0 {
		return nil, errors.New("xz: no block")
	}
	hdrLen := (int(rest[0]) + 1) * 4
	if hdrLen > len(rest) {
		return nil, errors.New("xz: truncated block header")
	}
	hdr := rest[:hdrLen]
	if crc32.ChecksumIEEE(hdr[:hdrLen-4]) != binary.LittleEndian.Uint32(hdr[hdrLen-4:]) {
		return nil, errors.New("xz: block header checksum mismatch")
	}
	flags := hdr[1]
	if flags&0x3c != 0 {
		return nil, errors.New("xz: reserved block flags set")
	}
	p := hdr[2 : hdrLen-4]
	for _, present := range []bool{flags&0x40 != 0, flags&0x80 != 0} { // compressed, uncompressed size
		if present {
			if _, n := binary.Uvarint(p); n <= 0 {
				return nil, errors.New("xz: bad block size field")
			} else {
				p = p[n:]
			}
		}
	}
	if flags&0x03 != 0 {
		return nil, errors.New("xz: filter chains other than LZMA2 alone are not supported")
	}
	id, n := binary.Uvarint(p)
	if n <= 0 || id != 0x21 {
		return nil, fmt.Errorf("xz: filter %#x is not LZMA2", id)
	}
	p = p[n:]
	propLen, n := binary.Uvarint(p)
	if n <= 0 || propLen != 1 || len(p) < n+1 {
		return nil, errors.New("xz: bad LZMA2 properties")
	}
	prop := p[n]
	if prop > 40 {
		return nil, errors.New("xz: bad LZMA2 dictionary size")
	}
	dict := uint64(2|prop&1) << (prop/2 + 11)
	if dict > maxXZDict {
		return nil, fmt.Errorf("xz: dictionary of %d bytes exceeds the %d limit", dict, maxXZDict)
	}
	cfg := lzma.Reader2Config{DictCap: max(int(dict), lzma.MinDictCap)}
	r, err := cfg.NewReader2(bytes.NewReader(rest[hdrLen:]))
	if err != nil {
		return nil, fmt.Errorf("xz: %w", err)
	}
	var out bytes.Buffer
	if _, err := io.Copy(&out, io.LimitReader(r, int64(limit)+1)); err != nil {
		return nil, fmt.Errorf("xz: %w", err)
	}
	if out.Len() > limit {
		return nil, fmt.Errorf("xz: more than %d bytes", limit)
	}
	return out.Bytes(), nil
}
