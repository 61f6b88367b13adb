package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
)

// Interpreter is a version of a language runtime the tests run: this
// machine's (Debian 12's) package, or another Debian release's unpacked by
// DebianPackages and run under that release's loader.
type Interpreter struct {
	Version string // major.minor: "3.1", "5.40"
	Minor   int
	bin     string
	root    *DebianRoot // nil: installed on this machine
	env     []string
	args    []string // before the caller's
}

// Command runs the interpreter with args.
func (in Interpreter) Command(args ...string) *exec.Cmd {
	args = append(append([]string{}, in.args...), args...)
	if in.root == nil {
		return exec.Command(in.bin, args...)
	}
	cmd := in.root.Command(in.bin, args...)
	cmd.Env = append(os.Environ(), in.env...)
	return cmd
}

// Root is where another release's packages are unpacked; nil for this
// machine's interpreter.
func (in Interpreter) Root() *DebianRoot { return in.root }

// Ruby is a Ruby interpreter the tests run.
type Ruby = Interpreter

// installed returns this machine's interpreter at bin: the test skips
// without it, or fails under CI=true, naming the package.
func installed(tb testing.TB, bin, pkg, version string, minor int) Interpreter {
	tb.Helper()
	if _, err := os.Stat(bin); err != nil {
		if InCI() {
			tb.Fatalf("%s is missing (CI=true: apt-get install %s): %v", bin, pkg, err)
		}
		tb.Skipf("%s is missing: %v", bin, err)
	}
	return Interpreter{Version: version, Minor: minor, bin: bin}
}

// Ruby31 is Debian 12's ruby3.1 (make deps installs it). The test skips
// without it, or fails under CI=true; and skips off x86-64, where the Ruby
// walker does not run.
func Ruby31(tb testing.TB) Ruby {
	tb.Helper()
	if runtime.GOARCH != "amd64" {
		tb.Skip("the ruby walker runs on x86-64")
	}
	return installed(tb, "/usr/bin/ruby3.1", "ruby", "3.1", 1)
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

// Perl536 is Debian 12's perl (make deps installs it). The test skips
// without it, or fails under CI=true.
func Perl536(tb testing.TB) Interpreter {
	tb.Helper()
	return installed(tb, "/usr/bin/perl", "perl", "5.36", 36)
}

// Perl540 is Debian 13's perl 5.40, with its headers (libperl5.40's CORE),
// unpacked from its packages and run under Debian 13's loader with its own
// library directories first on @INC. Off x86-64 the test skips: the
// packages are amd64's.
func Perl540(tb testing.TB) Interpreter {
	tb.Helper()
	return debianPerl(tb, "trixie", 40)
}

// Perl532 is Debian 11's perl 5.32, as Perl540.
func Perl532(tb testing.TB) Interpreter {
	tb.Helper()
	return debianPerl(tb, "bullseye", 32)
}

// Perl542 is Debian 14's (forky, testing today) perl 5.42, as Perl540.
func Perl542(tb testing.TB) Interpreter {
	tb.Helper()
	return debianPerl(tb, "forky", 42)
}

func debianPerl(tb testing.TB, suite string, minor int) Interpreter {
	tb.Helper()
	if runtime.GOARCH != "amd64" {
		tb.Skipf("Debian %s's perl is unpacked for x86-64 only", suite)
	}
	v := fmt.Sprintf("5.%d", minor)
	root := DebianPackages(tb, suite, "perl-base", "libperl"+v, "perl-modules-"+v, "libc6", "libcrypt1")
	lib := root.Path("/usr/lib/x86_64-linux-gnu/perl-base") + ":" + root.Path("/usr/lib/x86_64-linux-gnu/perl/"+v) +
		":" + root.Path("/usr/share/perl/"+v)
	return Interpreter{Version: v, Minor: minor, bin: "/usr/bin/perl", root: root, env: []string{"PERL5LIB=" + lib}}
}

// Perls are the Perl versions the tests run: Debian 12's 5.36, Debian
// 11's 5.32, Debian 13's 5.40 and Debian 14's 5.42.
func Perls(tb testing.TB) []Interpreter {
	tb.Helper()
	return []Interpreter{Perl536(tb), Perl532(tb), Perl540(tb), Perl542(tb)}
}

// PHP82 is Debian 12's PHP 8.2 CLI (make deps installs it). The test skips
// without it, or fails under CI=true.
func PHP82(tb testing.TB) Interpreter {
	tb.Helper()
	return installed(tb, "/usr/bin/php8.2", "php-cli", "8.2", 2)
}

// phpAPI84 is PHP 8.4's module API number: its extensions' directory.
const phpAPI84 = "20240924"

// PHP84 is Debian 13's PHP 8.4 CLI with opcache and the headers
// (php8.4-dev), unpacked and run under Debian 13's loader. It loads opcache
// (disabled for the CLI unless asked) as Debian's own configuration does;
// no php.ini is read. Off x86-64 the test skips.
func PHP84(tb testing.TB) Interpreter {
	tb.Helper()
	root := php84(tb)
	ext := root.Path("/usr/lib/php/" + phpAPI84)
	return Interpreter{Version: "8.4", Minor: 4, bin: "/usr/bin/php8.4", root: root,
		args: []string{"-n", "-d", "extension_dir=" + ext, "-d", "zend_extension=opcache"}}
}

// PHPFPM84 is Debian 13's PHP-FPM 8.4, as PHP84, with the extension
// directory set and nothing else: the caller gives its options.
func PHPFPM84(tb testing.TB) Interpreter {
	tb.Helper()
	root := php84(tb)
	return Interpreter{Version: "8.4", Minor: 4, bin: "/usr/sbin/php-fpm8.4", root: root,
		args: []string{"-d", "extension_dir=" + root.Path("/usr/lib/php/"+phpAPI84)}}
}

// PHPFPM82 is Debian 12's PHP-FPM 8.2 (make deps installs it).
func PHPFPM82(tb testing.TB) Interpreter {
	tb.Helper()
	return installed(tb, "/usr/sbin/php-fpm8.2", "php-fpm", "8.2", 2)
}

// php84 unpacks Debian 13's PHP 8.4: CLI, FPM, opcache, headers and the
// libraries they need.
func php84(tb testing.TB) *DebianRoot {
	tb.Helper()
	if runtime.GOARCH != "amd64" {
		tb.Skip("Debian 13's php is unpacked for x86-64 only")
	}
	return DebianPackages(tb, "trixie", "php8.4-cli", "php8.4-fpm", "php8.4-common", "php8.4-opcache", "php8.4-dev",
		"libc6", "libedit2", "libargon2-1", "libpcre2-8-0", "libsodium23", "libssl3t64", "libxml2", "zlib1g",
		"libffi8", "libgcc-s1", "libbsd0", "libmd0", "libtinfo6", "libicu76", "liblzma5",
		"libacl1", "libapparmor1", "libsystemd0", "libcap2")
}

// PHPs are the PHP versions the tests run: Debian 12's 8.2 and Debian
// 13's 8.4.
func PHPs(tb testing.TB) []Interpreter {
	tb.Helper()
	return []Interpreter{PHP82(tb), PHP84(tb)}
}
