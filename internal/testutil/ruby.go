package testutil

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
)

// Ruby is a Ruby interpreter the tests run.
type Ruby struct {
	Version string // major.minor: "3.1"
	Minor   int
	bin     string
	root    *DebianRoot // nil: installed on this machine
	env     []string
}

// Command runs the interpreter with args.
func (r Ruby) Command(args ...string) *exec.Cmd {
	if r.root == nil {
		return exec.Command(r.bin, args...)
	}
	cmd := r.root.Command(r.bin, args...)
	cmd.Env = append(os.Environ(), r.env...)
	return cmd
}

// Ruby31 is Debian 12's ruby3.1 (make deps installs it). The test skips
// without it, or fails under CI=true; and skips off x86-64, where the Ruby
// walker does not run.
func Ruby31(tb testing.TB) Ruby {
	tb.Helper()
	if runtime.GOARCH != "amd64" {
		tb.Skip("the ruby walker runs on x86-64")
	}
	const bin = "/usr/bin/ruby3.1"
	if _, err := os.Stat(bin); err != nil {
		if InCI() {
			tb.Fatalf("%s is missing (CI=true: apt-get install ruby): %v", bin, err)
		}
		tb.Skipf("%s is missing: %v", bin, err)
	}
	return Ruby{Version: "3.1", Minor: 1, bin: bin}
}

// Ruby33 is Debian 13's ruby3.3, stripped like 3.1 but built with hidden
// symbols: unpacked from its packages and run under Debian 13's loader
// (DebianPackages).
func Ruby33(tb testing.TB) Ruby {
	tb.Helper()
	if runtime.GOARCH != "amd64" {
		tb.Skip("the ruby walker runs on x86-64")
	}
	root := DebianPackages(tb, "trixie", "ruby3.3", "libruby3.3", "libc6", "libgmp10", "libcrypt1", "zlib1g")
	lib := root.Path("/usr/lib/ruby/3.3.0") + ":" + root.Path("/usr/lib/x86_64-linux-gnu/ruby/3.3.0")
	return Ruby{Version: "3.3", Minor: 3, bin: "/usr/bin/ruby3.3", root: root, env: []string{"RUBYLIB=" + lib}}
}

// Rubies are the Ruby versions the tests run: Debian 12's 3.1 and Debian
// 13's 3.3.
func Rubies(tb testing.TB) []Ruby {
	tb.Helper()
	return []Ruby{Ruby31(tb), Ruby33(tb)}
}
