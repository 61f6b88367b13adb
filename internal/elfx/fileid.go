package elfx

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// fileIDChunk is how many bytes from each end of a file feed its FileID.
const fileIDChunk = 4096

// FileID identifies a file by content: the first 16 bytes of the SHA-256 of
// its size (8 bytes, little endian), its first 4096 bytes and its last 4096
// bytes. Reading only the two ends keeps it cheap for large binaries; the ends
// hold the ELF header, program headers and (usually) section headers and the
// build-id note, so two different builds practically never collide.
type FileID [16]byte

// String returns the id as 32 lower-case hex characters.
func (id FileID) String() string { return hex.EncodeToString(id[:]) }

// ComputeFileID computes the FileID of the size bytes readable from r. A file
// shorter than 4096 bytes contributes its whole content twice.
func ComputeFileID(r io.ReaderAt, size int64) (FileID, error) {
	if size < 0 {
		return FileID{}, fmt.Errorf("file id: negative size %d", size)
	}
	h := sha256.New()
	var sz [8]byte
	binary.LittleEndian.PutUint64(sz[:], uint64(size))
	h.Write(sz[:])

	buf := make([]byte, min(size, fileIDChunk))
	if err := readFullAt(r, buf, 0); err != nil {
		return FileID{}, fmt.Errorf("file id: read head: %w", err)
	}
	h.Write(buf)
	if err := readFullAt(r, buf, size-int64(len(buf))); err != nil {
		return FileID{}, fmt.Errorf("file id: read tail: %w", err)
	}
	h.Write(buf)

	var id FileID
	copy(id[:], h.Sum(nil))
	return id, nil
}

// readFullAt fills buf from r at off; a short read is io.ErrUnexpectedEOF.
func readFullAt(r io.ReaderAt, buf []byte, off int64) error {
	n, err := r.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
