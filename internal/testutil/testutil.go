// Package testutil gates privileged tests and builds test workloads from source.
//
// Tests that need eBPF, perf events or other processes' memory call
// RequirePrivileges. Outside CI they skip with a reason; under CI=true a missing
// capability fails the test, because CI runs as root and a skip there would hide
// a regression.
package testutil

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/sonde-dev/sonde/internal/caps"
)

// InCI reports whether the tests run under CI (CI=true), where skips for
// missing privileges are failures.
func InCI() bool { return os.Getenv("CI") == "true" }

// unitOnly reports whether privileged tests are to be skipped even under CI:
// make compat sets SONDE_TEST_UNIT_ONLY=1 to run only the unit tests against
// another Collector release (the eBPF tests do not depend on it and run in
// the main test run).
func unitOnly() bool { return os.Getenv("SONDE_TEST_UNIT_ONLY") == "1" }

// SkipUnitOnly skips tb where SONDE_TEST_UNIT_ONLY=1 asks for unit tests
// only, for tests that need no privileges but exercise nothing another
// Collector release changes and cost minutes: the kernel checks that boot
// kernels under QEMU. They run in the main test run.
func SkipUnitOnly(tb testing.TB, feature string) {
	tb.Helper()
	if unitOnly() {
		tb.Skipf("%s: SONDE_TEST_UNIT_ONLY=1 runs unit tests only", feature)
	}
}

// MissingCapabilities returns the names of the capabilities Sonde needs that
// the calling thread does not have in its effective set.
func MissingCapabilities() []string {
	missing, err := caps.Missing(caps.Profiler()...)
	if err != nil {
		return []string{err.Error()}
	}
	return missing
}

// RequirePrivileges skips tb when the process lacks the capabilities to load
// eBPF programs and read other processes; under CI=true it fails instead.
// feature names what the test exercises, for the skip message.
func RequirePrivileges(tb testing.TB, feature string) {
	tb.Helper()
	if unitOnly() {
		tb.Skipf("%s: SONDE_TEST_UNIT_ONLY=1 runs unit tests only", feature)
	}
	missing := MissingCapabilities()
	if len(missing) == 0 {
		return
	}
	if InCI() {
		tb.Fatalf("%s needs %v, which this CI run lacks (CI=true: a missing capability is a failure)", feature, missing)
	}
	tb.Skipf("%s needs %v; run as root to exercise it", feature, missing)
}

// RequireTool skips tb when an external program (a compiler, an oracle) is not
// on PATH; under CI=true it fails, since .ci/run installs every tool tests use.
func RequireTool(tb testing.TB, name string) string {
	tb.Helper()
	p, err := lookPath(name)
	if err == nil {
		return p
	}
	if InCI() {
		tb.Fatalf("%s is not installed (CI=true: .ci/run must install it): %v", name, err)
	}
	tb.Skipf("%s is not installed: %v", name, err)
	return ""
}

// RequireRoot skips tb unless it runs as root, for tests that create
// namespaces or cgroups; under CI=true it fails instead. feature names what
// the test exercises, for the skip message.
func RequireRoot(tb testing.TB, feature string) {
	tb.Helper()
	if unitOnly() {
		tb.Skipf("%s: SONDE_TEST_UNIT_ONLY=1 runs unit tests only", feature)
	}
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		tb.Fatalf("%s needs root, which this CI run lacks (CI=true: a missing privilege is a failure)", feature)
	}
	tb.Skipf("%s needs root; run as root to exercise it", feature)
}

// CopyForNobody copies the running test binary where any user can execute
// it (the original sits in a private temporary directory) and returns the
// copy's path, for tests that run a child as an unprivileged user.
func CopyForNobody(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), filepath.Base(os.Args[0]))
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		tb.Fatal(err)
	}
	for dir := filepath.Dir(bin); dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	return bin
}

// Close closes c and fails tb if that fails: `defer testutil.Close(t, p)`
// checks the error a bare `defer p.Close()` drops.
func Close(tb testing.TB, c io.Closer) {
	tb.Helper()
	if err := c.Close(); err != nil {
		tb.Errorf("close %T: %v", c, err)
	}
}
