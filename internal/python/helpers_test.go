package python

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var dumpLayouts = flag.Bool("dump-layouts", false, "print the installed interpreters' struct layouts from their DWARF")

// interpreter is one CPython this host has, for tests.
type interpreter struct {
	version string // "3.11.7"
	minor   int    // 11
	bin     string // the executable
	lib     string // its libpython, "" when linked statically
}

// pyenvVersions are the interpreters the project's tests require.
var pyenvVersions = []struct {
	version string
	minor   int
	lib     string
}{
	{"3.6.15", 6, "libpython3.6m.so.1.0"},
	{"3.7.16", 7, "libpython3.7m.so.1.0"},
	{"3.8.18", 8, "libpython3.8.so.1.0"},
	{"3.9.18", 9, "libpython3.9.so.1.0"},
	{"3.10.13", 10, "libpython3.10.so.1.0"},
	{"3.11.7", 11, "libpython3.11.so.1.0"},
	{"3.12.1", 12, "libpython3.12.so.1.0"},
	{"3.13.0", 13, "libpython3.13.so.1.0"},
}

// installedInterpreters lists every required interpreter; one missing
// fails the test under CI=true and skips it elsewhere.
func installedInterpreters(t testing.TB) []interpreter {
	t.Helper()
	home, _ := os.UserHomeDir()
	var out []interpreter
	for _, v := range pyenvVersions {
		dir := filepath.Join(home, ".pyenv", "versions", v.version)
		in := interpreter{version: v.version, minor: v.minor, bin: filepath.Join(dir, "bin", "python3"),
			lib: filepath.Join(dir, "lib", v.lib)}
		if _, err := os.Stat(in.lib); err != nil {
			missing(t, in.lib)
			continue
		}
		out = append(out, in)
	}
	if _, err := os.Stat("/usr/bin/python3.11"); err != nil {
		missing(t, "/usr/bin/python3.11")
	} else {
		out = append(out, interpreter{version: "3.11-debian", minor: 11, bin: "/usr/bin/python3.11"})
	}
	return out
}

func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Errorf("interpreter %s is missing", what)
		return
	}
	t.Logf("interpreter %s is missing; not tested", what)
}
