package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// DebianRoot is the files of a set of packages of another Debian release,
// downloaded from deb.debian.org and unpacked (dpkg-deb -x) into Dir, not
// installed: a runtime this machine's release does not ship (Debian 13's
// Ruby 3.3) runs from there, with its own release's C library and loader.
type DebianRoot struct {
	Dir string
}

// DebianPackages returns the packages of Debian release suite (main),
// unpacked once into a cache directory shared by the tests and their
// packages (a file lock orders concurrent test binaries). The packages
// must include libc6: programs run under that release's loader. Without
// apt-get or the archive, the test skips, or fails under CI=true.
func DebianPackages(tb testing.TB, suite string, pkgs ...string) *DebianRoot {
	tb.Helper()
	root, err := debianPackages(suite, pkgs)
	if err == nil {
		return root
	}
	if InCI() {
		tb.Fatalf("debian %s packages %v (CI=true: apt-get must download them): %v", suite, pkgs, err)
	}
	tb.Skipf("debian %s packages %v: %v", suite, pkgs, err)
	return nil
}

func debianPackages(suite string, pkgs []string) (*DebianRoot, error) {
	cache, err := cacheDir("SONDE_DEB_CACHE", "sonde-deb")
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(suite + " " + strings.Join(pkgs, " ")))
	dir := filepath.Join(cache, suite+"-"+hex.EncodeToString(sum[:6]))
	root := &DebianRoot{Dir: filepath.Join(dir, "root")}
	done := filepath.Join(dir, "done")
	if _, err := os.Stat(done); err == nil {
		return root, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	if _, err := os.Stat(done); err == nil {
		return root, nil // another test binary unpacked it
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return nil, err
	}
	// apt's own state for this release, apart from the machine's.
	state := filepath.Join(dir, "apt")
	debs := filepath.Join(dir, "debs")
	for _, d := range []string{filepath.Join(state, "lists", "partial"), filepath.Join(state, "cache", "archives", "partial"), debs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	list := filepath.Join(state, "sources.list")
	src := fmt.Sprintf("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian %s main\n", suite)
	if err := os.WriteFile(list, []byte(src), 0o644); err != nil {
		return nil, err
	}
	opts := []string{
		"-o", "Dir::Etc::SourceList=" + list, "-o", "Dir::Etc::SourceParts=/dev/null",
		"-o", "Dir::State::Lists=" + filepath.Join(state, "lists"), "-o", "Dir::Cache=" + filepath.Join(state, "cache"),
		"-o", "APT::Sandbox::User=root", "-o", "Dir::State::status=/dev/null", "-q",
	}
	run := func(dir string, args ...string) error {
		cmd := exec.Command("apt-get", append(append([]string{}, opts...), args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := run(dir, "update"); err != nil {
		return nil, err
	}
	if err := run(debs, append([]string{"download"}, pkgs...)...); err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(debs, "*.deb"))
	if err != nil {
		return nil, err
	}
	if len(files) < len(pkgs) {
		return nil, fmt.Errorf("downloaded %d of %d packages", len(files), len(pkgs))
	}
	_ = os.RemoveAll(root.Dir) // a run that stopped half-way
	for _, f := range files {
		if out, err := exec.Command("dpkg-deb", "-x", f, root.Dir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("dpkg-deb -x %s: %w\n%s", f, err, out)
		}
	}
	if _, err := os.Stat(root.loader()); err != nil {
		return nil, fmt.Errorf("no loader in the packages (add libc6): %w", err)
	}
	_ = os.RemoveAll(state) // the release's package lists: tens of MB
	_ = os.RemoveAll(debs)
	// Other users (a workload run as nobody) must reach it.
	for d := dir; d != filepath.Dir(cache); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	return root, os.WriteFile(done, nil, 0o644)
}

// libDirs are where the release keeps its libraries: /usr/lib since the
// merged /usr (Debian 12), /lib too before (Debian 11's libc6).
func (r *DebianRoot) libDirs() string {
	return filepath.Join(r.Dir, "usr/lib/x86_64-linux-gnu") + ":" + filepath.Join(r.Dir, "lib/x86_64-linux-gnu")
}

func (r *DebianRoot) loader() string {
	for _, d := range []string{"usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"} {
		if p := filepath.Join(r.Dir, d, "ld-linux-x86-64.so.2"); fileExists(p) {
			return p
		}
	}
	return filepath.Join(r.Dir, "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Path returns the path of file (absolute in the release, "/usr/bin/ruby3.3")
// in the unpacked packages.
func (r *DebianRoot) Path(file string) string { return filepath.Join(r.Dir, file) }

// Command runs the release's program bin ("/usr/bin/ruby3.3") with args,
// under the release's loader and with its libraries first. The process's
// executable is the loader; bin and its libraries are mapped from Dir.
func (r *DebianRoot) Command(bin string, args ...string) *exec.Cmd {
	return exec.Command(r.loader(), append([]string{"--library-path", r.libDirs(), r.Path(bin)}, args...)...)
}
