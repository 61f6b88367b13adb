package process

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// maxCommandLineLen bounds Process.CommandLine: a few arguments of a JVM or a
// Python service fit, a class path of megabytes does not. The read of
// /proc/PID/cmdline stops there, and a longer command line is cut at a
// character boundary.
const maxCommandLineLen = 4096

// parseCmdline turns the contents of /proc/PID/cmdline into one line: the
// arguments, NUL-terminated by the kernel, joined by spaces. truncated says
// data was cut at the read bound, so its last character may be incomplete.
// A process that rewrote its argument area (setproctitle) may leave no NULs
// between words, or pad the area with NULs; the padding is
// dropped. Invalid UTF-8 becomes U+FFFD, since the result is an OTLP string.
// Kernel threads and zombies have an empty cmdline, and get "".
func parseCmdline(data []byte, truncated bool) string {
	if truncated {
		data = cutIncompleteRune(data)
	}
	data = bytes.TrimRight(data, "\x00")
	if len(data) == 0 {
		return ""
	}
	b := make([]byte, len(data))
	for i, c := range data {
		if c == 0 {
			c = ' '
		}
		b[i] = c
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// cutIncompleteRune drops a UTF-8 sequence cut short at the end of b.
func cutIncompleteRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}
