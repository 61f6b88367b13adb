package kernelcheck

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// armWorkloads are the workloads the arm64 guest profiles (guestWorkloads
// says what their stacks must be), by name in the initramfs: C without
// frame pointers, the same with return addresses signed (PAC), C++ that
// throws, Go with a frameless leaf, and C whose leaf is a signal handler
// (returning through the vDSO's signal trampoline), Go whose collector
// runs on the system stack, Go calling C through cgo, and Go and C calling
// each other (cgo and a callback); with them, Rust (rchain, built by
// armRustStd's library). All static: the guest has no libraries.
var armWorkloads = map[string]string{
	"cchain-nofp": testutil.CChainNoFP,
	"cpac":        testutil.CPAC,
	"throw":       testutil.Throw,
	"goleaf":      testutil.GoLeaf,
	"signal":      testutil.Signal,
	"gosys":       testutil.GoSys,
	"gocall":      testutil.GoCall,
	"gocgo":       testutil.GoCgo,
	"gotime":      testutil.GoTime,
}

// minLeaf is the least leaf samples a workload must have for its share of
// whole stacks to say anything.
const minLeaf = 100

// TestARM64UnderQEMU boots Debian's arm64 kernel (Linux 6.1) under
// qemu-system-aarch64, emulated (TCG, -cpu max: pointer authentication on),
// with this package's test binary built for arm64 as init and the
// cross-built workloads beside it. The guest verifies every program of the
// arm64 object, runs a Tracer as the x86-64 check does, then the profiler
// over the workloads: at least 99 % of each one's samples in its leaf
// (after its warm-up) must be whole, every frame named, down to the
// outermost frame. Emulation takes minutes: it runs under CI=true only.
func TestARM64UnderQEMU(t *testing.T) {
	testutil.SkipUnitOnly(t, "the arm64 kernel check")
	if !testutil.InCI() {
		t.Skip("boots an arm64 kernel under emulation (minutes of CPU): runs under CI=true")
	}
	qemu := testutil.RequireTool(t, "qemu-system-aarch64")
	k := armKernel(t)
	extra := map[string]string{}
	for name, w := range armWorkloads {
		extra[name] = testutil.BuildWorkloadARM64(t, w)
	}
	extra["rchain"] = testutil.BuildRustARM64(t, armRustStd(t))
	initrd := buildInitramfsFor(t, "arm64", extra)

	spec, err := support.LoadSonde()
	if err != nil {
		t.Fatal(err)
	}
	var wantPrograms []string
	for name := range spec.Programs {
		wantPrograms = append(wantPrograms, name)
	}
	slices.Sort(wantPrograms)

	args := []string{
		"-machine", "virt",
		// pauth-impdef: QEMU's own cheap signing algorithm rather than
		// QARMA's, which emulation makes slow; PAC behaves the same.
		"-cpu", "max,pauth-impdef=on",
		// One host thread for both vCPUs, as the x86-64 check runs.
		"-accel", "tcg,thread=single",
		"-kernel", k.path,
		"-initrd", initrd,
		"-append", "console=ttyAMA0 panic=-1 loglevel=4",
		"-m", "1G",
		"-smp", "2",
		"-nodefaults",
		"-display", "none",
		"-serial", "stdio",
		"-no-reboot",
	}
	r := runGuest(t, qemu, args, 15*time.Minute, "TCG", k.release)
	checkGuest(t, k, wantPrograms, r)
	if r.Sampling == nil {
		t.Fatal("the guest reported no sampling run")
	}
	if s, ok := r.Sampling["setup"]; ok {
		t.Fatalf("sampling run: %s", s.Error)
	}
	if ps, err := json.Marshal(r.Profiler); err == nil {
		t.Logf("profiler: %s", ps)
	}
	for _, name := range slices.Sorted(maps.Keys(extra)) {
		s, ok := r.Sampling[name]
		switch {
		case !ok:
			t.Errorf("%s: no result", name)
			continue
		case s.Error != "":
			t.Errorf("%s: %s", name, s.Error)
			continue
		}
		t.Logf("%s: %v", name, s)
		for _, b := range s.Broken {
			t.Logf("  %s: not whole: %s", name, b)
		}
		for _, b := range s.Examples {
			t.Logf("  %s: whole: %s", name, b)
		}
		for _, b := range s.Seen {
			t.Logf("  %s: seen: %s", name, b)
		}
		share := float64(s.Whole) / float64(max(s.Leaf, 1))
		if s.Leaf < minLeaf || share < 0.99 {
			t.Errorf("%s: %d of %d leaf samples whole (%.2f %%), want at least 99 %% of at least %d", name, s.Whole, s.Leaf, 100*share, minLeaf)
		}
		// The handler's samples must be unwound through the signal
		// frame, not past it by frame pointers, which find the
		// interrupted code's caller (x30) and skip its leaf.
		if guestWorkloads[name].interrupted != nil && s.Direct < s.Whole/10 {
			t.Errorf("%s: %d of %d whole stacks have the interrupted leaf right below the signal frame, want at least a tenth", name, s.Direct, s.Whole)
		}
	}
}

// armKernel returns the arm64 kernel to boot: SONDE_KERNELCHECK_ARM64_VMLINUZ,
// else the one Debian's linux-image-arm64 depends on, fetched into the
// cache with an apt state of its own (the host's apt lists only its own
// architecture, and is left alone).
func armKernel(t *testing.T) kernel {
	t.Helper()
	if p := os.Getenv("SONDE_KERNELCHECK_ARM64_VMLINUZ"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SONDE_KERNELCHECK_ARM64_VMLINUZ: %v", err)
		}
		return kernel{release: strings.TrimPrefix(filepath.Base(p), "vmlinuz-"), path: p}
	}
	cache, err := cacheDir()
	if err != nil {
		unavailable(t, "no kernel cache directory: %v", err)
	}
	apt := armApt{dir: filepath.Join(cache, "apt-arm64")}
	// The package resolved last time, while its image is in the cache:
	// no need for the archive.
	pkgFile := filepath.Join(cache, "linux-image-arm64.package")
	if b, err := os.ReadFile(pkgFile); err == nil {
		pkg := strings.TrimSpace(string(b))
		if ms, _ := filepath.Glob(filepath.Join(cache, pkg, "vmlinuz-*")); len(ms) == 1 {
			return kernel{release: strings.TrimPrefix(filepath.Base(ms[0]), "vmlinuz-"), path: ms[0]}
		}
	}
	if err := apt.update(); err != nil {
		unavailable(t, "arm64 package lists: %v", err)
	}
	pkg, err := apt.kernelPackage()
	if err != nil {
		unavailable(t, "no Debian arm64 kernel package: %v", err)
	}
	k, err := fetchKernelWith(cache, pkg, apt.download)
	if err != nil {
		unavailable(t, "kernel package %s: %v", pkg, err)
	}
	if err := os.WriteFile(pkgFile, []byte(pkg+"\n"), 0o644); err != nil {
		t.Logf("remember the kernel package: %v", err)
	}
	return k
}

// armApt runs apt for arm64 packages with its own lists and cache in dir.
type armApt struct{ dir string }

func (a armApt) options() []string {
	return []string{
		"-o", "APT::Architecture=arm64",
		"-o", "APT::Architectures::=arm64",
		"-o", "Dir::State::Lists=" + filepath.Join(a.dir, "lists"),
		"-o", "Dir::Cache=" + filepath.Join(a.dir, "cache"),
		"-o", "Dir::State::status=/dev/null",
	}
}

func (a armApt) run(dir, tool string, args ...string) ([]byte, error) {
	cmd := exec.Command(tool, append(a.options(), args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s", tool, strings.Join(args, " "), err, out)
	}
	return out, nil
}

// update fetches the arm64 package lists (as root).
func (a armApt) update() error {
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(a.dir, d), 0o755); err != nil {
			return err
		}
	}
	_, err := a.run(a.dir, "apt-get", "update", "-q")
	return err
}

// armRustStd returns the sysroot of Debian's Rust standard library for
// aarch64 at the version of Debian's rustc (libstd-rust-dev:arm64, fetched
// as the kernel is and cached beside it).
func armRustStd(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", "rustc").Output()
	if err != nil || len(out) == 0 {
		unavailable(t, "Debian's rustc is not installed (make deps): %v", err)
	}
	ver := string(out)
	cache, err := cacheDir()
	if err != nil {
		unavailable(t, "no cache directory: %v", err)
	}
	dir := filepath.Join(cache, "libstd-rust-dev_arm64_"+ver)
	sysroot := filepath.Join(dir, "usr")
	if _, err := os.Stat(filepath.Join(sysroot, "lib", "rustlib", "aarch64-unknown-linux-gnu", "lib")); err == nil {
		return sysroot
	}
	apt := armApt{dir: filepath.Join(cache, "apt-arm64")}
	tmp, err := os.MkdirTemp(cache, "libstd-rust-dev.tmp-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	pkg := "libstd-rust-dev:arm64=" + ver
	if _, err := apt.run(tmp, "apt-get", "download", "-q", pkg); err != nil {
		// No arm64 lists yet, or old ones.
		if uerr := apt.update(); uerr != nil {
			unavailable(t, "arm64 package lists: %v", uerr)
		}
		if _, err := apt.run(tmp, "apt-get", "download", "-q", pkg); err != nil {
			unavailable(t, "%s: %v", pkg, err)
		}
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		t.Fatalf("apt-get download %s left %d packages, want 1", pkg, len(debs))
	}
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], filepath.Join(tmp, "x")).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
	}
	if err := os.Rename(filepath.Join(tmp, "x"), dir); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	return sysroot
}

// kernelPackage is the kernel image linux-image-arm64 depends on.
func (a armApt) kernelPackage() (string, error) {
	out, err := a.run(a.dir, "apt-cache", "depends", "linux-image-arm64")
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: ")
		if ok && strings.HasPrefix(dep, "linux-image-") {
			return dep, nil
		}
	}
	return "", fmt.Errorf("linux-image-arm64 depends on no kernel image:\n%s", out)
}

// download fetches pkg's .deb into dir.
func (a armApt) download(dir, pkg string) error {
	_, err := a.run(dir, "apt-get", "download", "-q", pkg+":arm64")
	return err
}
