package process

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseCmdline(t *testing.T) {
	long := strings.Repeat("x", maxCommandLineLen)
	tests := []struct {
		name      string
		in        string
		truncated bool
		want      string
	}{
		{"arguments", "/usr/bin/python3\x00-m\x00http.server\x008080\x00", false, "/usr/bin/python3 -m http.server 8080"},
		{"empty argument kept", "prog\x00\x00last\x00", false, "prog  last"},
		{"argument with spaces", "sh\x00-c\x00echo a b\x00", false, "sh -c echo a b"},
		{"trailing space of an argument kept", "echo\x00a \x00", false, "echo a "},
		{"rewritten by setproctitle, NUL padding", "nginx: worker process\x00\x00\x00\x00", false, "nginx: worker process"},
		{"rewritten without terminator", "postgres: checkpointer", false, "postgres: checkpointer"},
		{"kernel thread or zombie", "", false, ""},
		{"only NULs", "\x00\x00", false, ""},
		{"invalid UTF-8", "a\xffb\x00", false, "a\uFFFDb"},
		{"truncated ASCII", long, true, long},
		{"truncated inside a 2-byte character", long[:maxCommandLineLen-1] + "\xc3", true, long[:maxCommandLineLen-1]},
		{"truncated inside a 3-byte character", long[:maxCommandLineLen-2] + "\xe2\x82", true, long[:maxCommandLineLen-2]},
		{"truncated after a whole character", long[:maxCommandLineLen-2] + "é", true, long[:maxCommandLineLen-2] + "é"},
		{"not truncated: a stray byte is invalid, not cut", "a\xc3", false, "a\uFFFD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseCmdline([]byte(tt.in), tt.truncated); got != tt.want {
				t.Errorf("parseCmdline(%q, %v) = %q, want %q", tt.in, tt.truncated, got, tt.want)
			}
		})
	}
}

func TestParseCmdlineSelf(t *testing.T) {
	b, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		t.Skipf("no procfs: %v", err)
	}
	if got, want := parseCmdline(b, false), strings.Join(os.Args, " "); got != want {
		t.Errorf("parseCmdline(/proc/self/cmdline) = %q, want os.Args joined: %q", got, want)
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add([]byte("/usr/bin/python3\x00-m\x00http.server\x00"), false)
	f.Add([]byte("nginx: worker process\x00\x00\x00"), false)
	f.Add([]byte("abc\xe2\x82"), true)
	if b, err := os.ReadFile("/proc/self/cmdline"); err == nil {
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, data []byte, truncated bool) {
		got := parseCmdline(data, truncated)
		if !utf8.ValidString(got) || strings.ContainsRune(got, 0) {
			t.Fatalf("parseCmdline(%q) = %q: invalid UTF-8 or a NUL", data, got)
		}
		if len(got) > 3*len(data) {
			t.Fatalf("parseCmdline(%q) = %q, longer than any replacement allows", data, got)
		}
		// Valid UTF-8 input comes out with NULs as spaces and nothing else
		// changed but trailing NULs (and a cut rune when truncated).
		if utf8.Valid(data) {
			want := strings.ReplaceAll(string(bytes.TrimRight(data, "\x00")), "\x00", " ")
			if got != want {
				t.Fatalf("parseCmdline(%q) = %q, want %q", data, got, want)
			}
		}
	})
}
