package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func lookPath(name string) (string, error) { return exec.LookPath(name) }

// BuildC compiles C source files with the system C compiler (cc) into a binary in
// a temporary directory and returns its path. flags are passed before the
// sources, for example "-O2", "-fno-omit-frame-pointer".
func BuildC(tb testing.TB, name string, flags []string, sources ...string) string {
	tb.Helper()
	cc := RequireTool(tb, "cc")
	out := filepath.Join(tb.TempDir(), name)
	args := append(append([]string{}, flags...), "-o", out)
	args = append(args, sources...)
	run(tb, exec.Command(cc, args...))
	return out
}

// BuildCWith compiles sources with the compiler tool (found as RequireTool
// finds it: a cross compiler such as aarch64-linux-gnu-gcc), as BuildC does
// with the system's.
func BuildCWith(tb testing.TB, tool, name string, flags []string, sources ...string) string {
	tb.Helper()
	cc := RequireTool(tb, tool)
	out := filepath.Join(tb.TempDir(), name)
	args := append(append([]string{}, flags...), "-o", out)
	args = append(args, sources...)
	run(tb, exec.Command(cc, args...))
	return out
}

// BuildCXX compiles C++ sources with the system C++ compiler (c++), as
// BuildC does for C.
func BuildCXX(tb testing.TB, name string, flags []string, sources ...string) string {
	tb.Helper()
	cxx := RequireTool(tb, "c++")
	out := filepath.Join(tb.TempDir(), name)
	args := append(append([]string{}, flags...), "-o", out)
	args = append(args, sources...)
	run(tb, exec.Command(cxx, args...))
	return out
}

// BuildGo builds the Go main package in dir into a binary in a temporary
// directory and returns its path. flags are extra `go build` flags.
func BuildGo(tb testing.TB, name, dir string, flags ...string) string {
	tb.Helper()
	// Fixtures are pure Go so the binary does not depend on the host's cgo setup.
	return buildGo(tb, name, dir, []string{"CGO_ENABLED=0"}, flags)
}

// BuildCgo builds the Go main package in dir, which uses cgo, with the
// system C compiler; cflags replace cgo's default C flags (CGO_CFLAGS),
// so they decide how the C half is compiled.
func BuildCgo(tb testing.TB, name, dir string, cflags []string, flags ...string) string {
	tb.Helper()
	RequireTool(tb, "cc")
	return buildGo(tb, name, dir, []string{"CGO_ENABLED=1", "CC=cc", "CGO_CFLAGS=" + strings.Join(cflags, " ")}, flags)
}

// BuildCgoFor builds the Go main package in dir, which uses cgo, for
// linux/goarch with the C cross compiler cc (a cross build); cflags replace
// cgo's default C flags, as BuildCgo's do.
func BuildCgoFor(tb testing.TB, cc, name, dir, goarch string, cflags []string, flags ...string) string {
	tb.Helper()
	RequireTool(tb, cc)
	return buildGo(tb, name, dir, []string{"GOOS=linux", "GOARCH=" + goarch, "CGO_ENABLED=1", "CC=" + cc,
		"CGO_CFLAGS=" + strings.Join(cflags, " ")}, flags)
}

// BuildGoFor builds the Go main package in dir for linux/goarch, without
// cgo (a cross build), as BuildGo does for this machine.
func BuildGoFor(tb testing.TB, name, dir, goarch string, flags ...string) string {
	tb.Helper()
	return buildGo(tb, name, dir, []string{"GOOS=linux", "GOARCH=" + goarch, "CGO_ENABLED=0"}, flags)
}

func buildGo(tb testing.TB, name, dir string, env, flags []string) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), name)
	args := append([]string{"build", "-o", out}, flags...)
	args = append(args, ".")
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	run(tb, cmd)
	return out
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(os.Getenv("GOROOT"), "bin", "go")
}

func run(tb testing.TB, cmd *exec.Cmd) {
	tb.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}
