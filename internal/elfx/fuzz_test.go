package elfx

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// addELFSeeds seeds f with a small real binary and a few broken headers. The
// binary is linked with tiny page alignment so it stays under 5 KiB: the
// fuzzer minimizes every interesting input, and a 16 KiB seed stalls it.
func addELFSeeds(f *testing.F) {
	f.Helper()
	flags := []string{"-Os", "-s", "-Wl,--build-id", "-Wl,-z,noseparate-code", "-Wl,-z,max-page-size=16"}
	bin := testutil.BuildC(f, "seed", flags, filepath.Join("testdata", "hello.c"))
	data, err := os.ReadFile(bin)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(data[:64])
	f.Add(data[:len(data)/2])
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Add([]byte{})
}

// FuzzELF feeds arbitrary bytes as an ELF file to the build-id and
// debuglink readers, OffsetToVaddr and ComputeFileID; none may panic.
func FuzzELF(f *testing.F) {
	addELFSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		if _, err := ComputeFileID(r, int64(len(data))); err != nil {
			t.Fatalf("ComputeFileID on in-memory data: %v", err)
		}
		ef, err := elf.NewFile(r)
		if err != nil {
			return
		}
		// Any answer will do for garbage, as long as there is one.
		_, _ = GNUBuildID(ef)
		_, _ = GoBuildID(ef)
		if name, _, ok := Debuglink(ef); ok && (name == "" || strings.Contains(name, "/")) {
			t.Fatalf("Debuglink accepted the name %q", name)
		}
		for _, off := range []uint64{0, 1, uint64(len(data)) / 2, ^uint64(0)} {
			OffsetToVaddr(ef, off)
		}
		for _, p := range ef.Progs {
			OffsetToVaddr(ef, p.Off)
			OffsetToVaddr(ef, p.Off+p.Filesz-1)
		}
	})
}

// FuzzScanNotes parses arbitrary bytes as a note area.
func FuzzScanNotes(f *testing.F) {
	f.Add([]byte("\x04\x00\x00\x00\x04\x00\x00\x00\x03\x00\x00\x00GNU\x00\xde\xad\xbe\xef"), uint64(4))
	f.Add([]byte("\x04\x00\x00\x00\x10\x00\x00\x00\x05\x00\x00\x00GNU\x00\x02\x00\x00\xc0\x04\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00"), uint64(8))
	f.Add([]byte("\xff\xff\xff\xff\xff\xff\xff\xff\x03\x00\x00\x00"), uint64(4))
	f.Fuzz(func(t *testing.T, data []byte, align uint64) {
		for _, bo := range []byteOrder{binary.LittleEndian, binary.BigEndian} {
			if desc := scanNotes(data, bo, align, "GNU", ntGNUBuildID); len(desc) > maxNoteDesc {
				t.Fatalf("descriptor of %d bytes, above the %d bound", len(desc), maxNoteDesc)
			}
		}
	})
}
