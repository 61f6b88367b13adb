package kernelcheck

import (
	"fmt"
	"io"
)

// File types of a cpio entry's mode.
const (
	modeDir     = 0o040000
	modeCharDev = 0o020000
	modeRegular = 0o100000
)

// cpioEntry is one file of an archive in the "new ASCII" (newc) cpio format,
// the one the kernel unpacks an initramfs from.
type cpioEntry struct {
	name                 string
	mode                 uint32
	rdevMajor, rdevMinor uint32
	data                 []byte
}

// writeCpio writes the entries and the trailer. Each entry is a 110-byte
// header of the magic and thirteen 8-digit hex fields, the name with its NUL,
// padding to 4 bytes, the data, padding to 4 bytes.
func writeCpio(w io.Writer, entries []cpioEntry) error {
	entries = append(entries, cpioEntry{name: "TRAILER!!!"})
	for i, e := range entries {
		nlink := 1
		if e.mode&0o170000 == modeDir {
			nlink = 2
		}
		hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
			i+1, e.mode, 0, 0, nlink, 0, len(e.data), 0, 0, e.rdevMajor, e.rdevMinor, len(e.name)+1, 0)
		rec := append([]byte(hdr), e.name...)
		rec = append(rec, 0)
		rec = append(rec, make([]byte, pad4(len(rec)))...)
		if _, err := w.Write(rec); err != nil {
			return err
		}
		if _, err := w.Write(e.data); err != nil {
			return err
		}
		if _, err := w.Write(make([]byte, pad4(len(e.data)))); err != nil {
			return err
		}
	}
	return nil
}

func pad4(n int) int { return (4 - n%4) % 4 }
