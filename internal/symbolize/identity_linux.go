package symbolize

import (
	"os"
	"syscall"
)

// identityOf returns what identifies an open file without reading it:
// device, inode, size and modification time.
func identityOf(fi os.FileInfo) fileIdentity {
	id := fileIdentity{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = st.Dev, st.Ino
	}
	return id
}
