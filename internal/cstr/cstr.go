// Package cstr turns bytes read from another process's memory into names
// fit to show: the text before the first NUL, valid UTF-8, never longer
// than the bytes it came from, so a caller's bound on what it read is a
// bound on what it keeps.
package cstr

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// Clean returns b up to its first NUL with each run of bytes that is not
// UTF-8 replaced by one '?'. The result is empty where b is or starts
// with a NUL; callers that need a name treat that as an error.
func Clean(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "?")
}
