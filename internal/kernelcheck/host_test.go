package kernelcheck

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// kernel is a kernel image to boot; release is what uname reports in it.
type kernel struct {
	release string
	path    string
}

// TestVerifierOnOlderKernels boots each kernel under QEMU with this test
// binary as init and fails on every program that kernel's verifier rejects,
// and if a Tracer with off-CPU profiling on does not produce every kind of
// record there.
func TestVerifierOnOlderKernels(t *testing.T) {
	testutil.SkipUnitOnly(t, "the x86-64 kernel check")
	qemu := testutil.RequireTool(t, "qemu-system-x86_64")
	kernels := kernelImages(t)
	initrd := buildInitramfs(t)

	spec, err := support.LoadSonde()
	if err != nil {
		t.Fatal(err)
	}
	var wantPrograms []string
	for name := range spec.Programs {
		wantPrograms = append(wantPrograms, name)
	}
	slices.Sort(wantPrograms)

	for _, k := range kernels {
		t.Run(k.release, func(t *testing.T) {
			checkGuest(t, k, wantPrograms, boot(t, qemu, k, initrd))
		})
	}
}

// checkGuest fails t on every program of wantPrograms the guest's verifier
// rejected and if its Tracer did not produce every kind of record.
func checkGuest(t *testing.T, k kernel, wantPrograms []string, r report) {
	t.Helper()
	if r.Setup != "" {
		t.Fatalf("guest setup on %s: %s", r.Kernel, r.Setup)
	}
	if r.Kernel != k.release {
		t.Errorf("guest runs kernel %q, want %q", r.Kernel, k.release)
	}
	var got []string
	for _, p := range r.Programs {
		got = append(got, p.Name)
		switch {
		case p.Loaded:
			t.Logf("%-30s %-10s verified: %d instructions processed in %d ms", p.Name, p.Type, p.VerifiedInsns, p.LoadMillis)
		case p.Unsupported != "" && !r.FindVMA:
			t.Logf("%-30s %-10s not loaded: %s", p.Name, p.Type, p.Unsupported)
		default:
			t.Errorf("%s (%s) rejected by Linux %s: %s\nverifier log:\n%s",
				p.Name, p.Type, r.Kernel, p.Error, strings.Join(p.VerifierLog, "\n"))
		}
	}
	if !slices.Equal(got, wantPrograms) {
		t.Errorf("guest checked programs %v, want %v", got, wantPrograms)
	}

	tr := r.Tracer
	t.Logf("tracer on %s (%d CPUs, bpf_find_vma %v): checked mappings %v, off-CPU %v, records %v, counters %v",
		r.Kernel, r.CPUs, r.FindVMA, tr.CheckedMappings, tr.OffCPU, tr.Records, tr.Counters)
	if tr.Error != "" {
		t.Fatalf("tracer on Linux %s: %s", r.Kernel, tr.Error)
	}
	if !tr.OffCPU {
		t.Error("tracer started without off-CPU profiling")
	}
	if tr.CheckedMappings != r.FindVMA {
		t.Errorf("tracer checks mappings: %v; kernel has bpf_find_vma: %v", tr.CheckedMappings, r.FindVMA)
	}
	for _, w := range wantRecords {
		if tr.Records[w] == 0 {
			t.Errorf("no %s record arrived from the tracer on Linux %s", w, r.Kernel)
		}
	}
	if tr.DecodeErrors != 0 {
		t.Errorf("%d records failed to decode", tr.DecodeErrors)
	}
	if !tr.TableLoaded || tr.TableError != "" {
		t.Errorf("unwind table on Linux %s: loaded %v: %s", r.Kernel, tr.TableLoaded, tr.TableError)
	}
}

// unavailable skips the test when something it needs from the host cannot
// be had; under CI=true, where .ci/run provides it, that fails instead.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	if testutil.InCI() {
		t.Fatalf(format+" (CI=true: .ci/run must provide it)", args...)
	}
	t.Skipf(format, args...)
}

// kernelImages returns the kernels to boot: SONDE_KERNELCHECK_VMLINUZ, else
// the Debian packages in SONDE_KERNELCHECK_PACKAGES, else the one the
// linux-image-amd64 meta-package depends on, fetched into the cache.
func kernelImages(t *testing.T) []kernel {
	t.Helper()
	if p := os.Getenv("SONDE_KERNELCHECK_VMLINUZ"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SONDE_KERNELCHECK_VMLINUZ: %v", err)
		}
		return []kernel{{release: strings.TrimPrefix(filepath.Base(p), "vmlinuz-"), path: p}}
	}
	pkgs := strings.Fields(os.Getenv("SONDE_KERNELCHECK_PACKAGES"))
	if len(pkgs) == 0 {
		pkg, err := defaultKernelPackage()
		if err != nil {
			unavailable(t, "no Debian kernel package to boot: %v", err)
		}
		pkgs = []string{pkg}
	}
	cache, err := cacheDir()
	if err != nil {
		unavailable(t, "no kernel cache directory: %v", err)
	}
	var out []kernel
	for _, pkg := range pkgs {
		k, err := fetchKernel(cache, pkg)
		if err != nil {
			unavailable(t, "kernel package %s: %v", pkg, err)
		}
		out = append(out, k)
	}
	return out
}

// defaultKernelPackage is the kernel image linux-image-amd64 depends on:
// on Debian 12 the current build of Linux 6.1, which the archive keeps
// while older ABI builds come and go.
func defaultKernelPackage() (string, error) {
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends linux-image-amd64: %w", err)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: ")
		if ok && strings.HasPrefix(dep, "linux-image-") {
			return dep, nil
		}
	}
	return "", fmt.Errorf("linux-image-amd64 depends on no kernel image:\n%s", out)
}

func cacheDir() (string, error) {
	if d := os.Getenv("SONDE_KERNEL_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "sonde-kernels"), nil
}

// fetchKernel returns the cached kernel image of a Debian package, first
// downloading the package (apt-get download) and taking /boot/vmlinuz-* out
// of it (dpkg-deb --fsys-tarfile).
func fetchKernel(cache, pkg string) (kernel, error) {
	return fetchKernelWith(cache, pkg, aptDownload)
}

// fetchKernelWith is fetchKernel with the package downloaded by download.
func fetchKernelWith(cache, pkg string, download func(dir, pkg string) error) (kernel, error) {
	dir := filepath.Join(cache, pkg)
	if ms, _ := filepath.Glob(filepath.Join(dir, "vmlinuz-*")); len(ms) == 1 {
		return kernel{release: strings.TrimPrefix(filepath.Base(ms[0]), "vmlinuz-"), path: ms[0]}, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return kernel{}, err
	}
	tmp, err := os.MkdirTemp(cache, pkg+".tmp-")
	if err != nil {
		return kernel{}, err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // a leftover in the cache is harmless
	if err := download(tmp, pkg); err != nil && testutil.InCI() && os.Geteuid() == 0 {
		// A CI machine that had every package of .ci/run may have no
		// package lists yet.
		if out, uerr := exec.Command("apt-get", "update", "-q").CombinedOutput(); uerr != nil {
			return kernel{}, fmt.Errorf("%w; apt-get update: %w\n%s", err, uerr, out)
		}
		if err := download(tmp, pkg); err != nil {
			return kernel{}, err
		}
	} else if err != nil {
		return kernel{}, err
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return kernel{}, fmt.Errorf("apt-get download left %d packages, want 1", len(debs))
	}
	name, err := extractVmlinuz(debs[0], tmp)
	if err != nil {
		return kernel{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return kernel{}, err
	}
	dst := filepath.Join(dir, name)
	if err := os.Rename(filepath.Join(tmp, name), dst); err != nil {
		return kernel{}, err
	}
	return kernel{release: strings.TrimPrefix(name, "vmlinuz-"), path: dst}, nil
}

func aptDownload(dir, pkg string) error {
	cmd := exec.Command("apt-get", "download", "-q", pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %w\n%s", pkg, err, out)
	}
	return nil
}

// extractVmlinuz writes the package's ./boot/vmlinuz-* into dir and returns
// its base name.
func extractVmlinuz(deb, dir string) (string, error) {
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("dpkg-deb: %w", err)
	}
	name, xerr := copyVmlinuz(tar.NewReader(stdout), dir)
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	return name, xerr
}

func copyVmlinuz(tr *tar.Reader, dir string) (string, error) {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", errors.New("package holds no ./boot/vmlinuz-*")
		}
		if err != nil {
			return "", fmt.Errorf("read package contents: %w", err)
		}
		name := filepath.Base(h.Name)
		if h.Typeflag != tar.TypeReg || filepath.Dir(filepath.Clean(h.Name)) != "boot" || !strings.HasPrefix(name, "vmlinuz-") {
			continue
		}
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return "", err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return "", fmt.Errorf("extract %s: %w", h.Name, err)
		}
		return name, f.Close()
	}
}

// buildInitramfs builds this package's test binary statically and packs it
// as /init of an initramfs, with the /dev/console the kernel opens for init.
func buildInitramfs(t *testing.T) string {
	t.Helper()
	return buildInitramfsFor(t, "", nil)
}

// buildInitramfsFor is buildInitramfs for GOARCH goarch ("": this
// machine's), with the files in extra (name in the archive: path here)
// added under workloadDir.
func buildInitramfsFor(t *testing.T, goarch string, extra map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "init")
	goTool := testutil.RequireTool(t, "go")
	cmd := exec.Command(goTool, "test", "-c", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if goarch != "" {
		cmd.Env = append(cmd.Env, "GOOS=linux", "GOARCH="+goarch)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the guest: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	entries := []cpioEntry{
		{name: "dev", mode: modeDir | 0o755},
		{name: "dev/console", mode: modeCharDev | 0o600, rdevMajor: 5, rdevMinor: 1},
		{name: "init", mode: modeRegular | 0o755, data: data},
	}
	if len(extra) > 0 {
		entries = append(entries, cpioEntry{name: strings.TrimPrefix(workloadDir, "/"), mode: modeDir | 0o755})
		names := slices.Sorted(maps.Keys(extra))
		for _, name := range names {
			b, err := os.ReadFile(extra[name])
			if err != nil {
				t.Fatal(err)
			}
			entries = append(entries, cpioEntry{name: strings.TrimPrefix(workloadDir, "/") + "/" + name, mode: modeRegular | 0o755, data: b})
		}
	}
	path := filepath.Join(dir, "initramfs.cpio")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	err = writeCpio(w, entries)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("write initramfs: %v", err)
	}
	return path
}

// kvmUsable reports whether QEMU can run a stock kernel with KVM here:
// /dev/kvm opens and the CPU has hardware virtualization (vmx or svm). A
// /dev/kvm without it (kvm-pvm, in some cloud VMs) runs only guests built
// for it; a Debian kernel hangs there without a word on the console.
func kvmUsable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(cpuinfo), "\n") {
		key, flags, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		f := strings.Fields(flags)
		return slices.Contains(f, "vmx") || slices.Contains(f, "svm")
	}
	return false
}

// boot runs the guest on kernel k and returns its report.
func boot(t *testing.T, qemu string, k kernel, initrd string) report {
	t.Helper()
	args := []string{
		"-kernel", k.path,
		"-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 loglevel=4",
		"-m", "1G",
		"-smp", "2",
		"-nodefaults",
		"-display", "none",
		"-serial", "stdio",
		"-no-reboot",
	}
	// With KVM the guest boots and loads everything in seconds; emulated,
	// the verifier's work takes far longer.
	timeout := 3 * time.Minute
	accel := "KVM"
	if kvmUsable() {
		args = append(args, "-enable-kvm", "-cpu", "host")
	} else {
		// One host thread runs both vCPUs. With a thread each
		// (multi-threaded TCG) about one boot in eight hung: the guest's
		// CPU 0 stopped answering IPIs (its clock stood still, in
		// __schedule), and CPU 1, patching a static call as the test
		// closed a tracepoint link, waited for it forever (soft lockup
		// in smp_call_function_many_cond); the same with the code of
		// 2026-11-24. Single-threaded: 15 boots of 15, 18-28 s each.
		args = append(args, "-cpu", "max", "-accel", "tcg,thread=single")
		timeout = 20 * time.Minute
		accel = "TCG"
	}
	return runGuest(t, qemu, args, timeout, accel, k.release)
}

// runGuest runs QEMU with args until the guest powers off, within timeout,
// and returns the report it printed on its console.
func runGuest(t *testing.T, qemu string, args []string, timeout time.Duration, accel, release string) report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	console := filepath.Join(t.TempDir(), "console.log")
	out, err := os.Create(console)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, qemu, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	// A test binary killed before its timeout must not leave a virtual
	// machine burning a CPU (one did, for 24 minutes).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	runErr := cmd.Run()
	elapsed := time.Since(start)
	log, err := os.ReadFile(console)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("booted %s under QEMU (%s) in %v", release, accel, elapsed.Round(time.Millisecond))
	if ctx.Err() != nil {
		t.Fatalf("QEMU did not power off within %v; console:\n%s", timeout, tail(log, 60))
	}
	r, ok, perr := parseReport(log)
	if !ok {
		t.Fatalf("no report on the console (qemu: %v); console:\n%s", runErr, tail(log, 60))
	}
	if perr != nil {
		t.Fatalf("report: %v", perr)
	}
	if runErr != nil {
		t.Errorf("qemu: %v", runErr)
	}
	return r
}

// parseReport finds the guest's report line on the serial console.
func parseReport(console []byte) (report, bool, error) {
	var r report
	for line := range strings.SplitSeq(string(console), "\n") {
		js, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), resultPrefix)
		if !ok {
			continue
		}
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			return r, true, fmt.Errorf("decode %q: %w", js, err)
		}
		return r, true, nil
	}
	return r, false, nil
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
