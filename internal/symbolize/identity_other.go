//go:build !linux

package symbolize

import "os"

// identityOf returns what identifies an open file without reading it. Off
// Linux only size and modification time are used.
func identityOf(fi os.FileInfo) fileIdentity {
	return fileIdentity{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
}
