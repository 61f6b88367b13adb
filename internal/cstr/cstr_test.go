package cstr

import (
	"testing"
	"unicode/utf8"
)

func TestClean(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"main", "main"},
		{"block in run", "block in run"},
		{"\x00after", ""},
		{"{closure}\x00/x.php:3$0", "{closure}"},
		{"caf\xc3\xa9", "café"},
		{"a\xff\xfeb", "a?b"},
		{"\xc3", "?"},
	} {
		if got := Clean([]byte(c.in)); got != c.want {
			t.Errorf("Clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func FuzzClean(f *testing.F) {
	f.Add([]byte("Foo::bar"))
	f.Add([]byte{0xff, 0, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := Clean(b)
		if len(s) > len(b) || !utf8.ValidString(s) {
			t.Fatalf("Clean(%q) = %q", b, s)
		}
		for i := 0; i < len(s); i++ {
			if s[i] == 0 {
				t.Fatalf("Clean(%q) = %q holds a NUL", b, s)
			}
		}
	})
}
