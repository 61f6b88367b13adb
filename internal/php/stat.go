package php

import (
	"os"
	"syscall"
)

// statIDs returns a file's device and inode.
func statIDs(st os.FileInfo) ([2]uint64, bool) {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return [2]uint64{}, false
	}
	return [2]uint64{s.Dev, s.Ino}, true
}
