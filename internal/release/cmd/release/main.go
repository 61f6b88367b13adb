// Command release assembles a Sonde release directory from otelcol-profiling
// built for each architecture (make release runs it; see README):
//
//	release -version 0.2.0 -out _build/release/0.2.0 \
//	  -binary _build/release-build/linux-amd64/otelcol-profiling \
//	  -binary _build/release-build/linux-arm64/otelcol-profiling
//
// It checks that every binary is static (CGO_ENABLED=0), that a module two
// of them link is the same in both, and that each prints the version with --version (one of
// another architecture run under QEMU's user-mode emulator,
// qemu-user-static). Then it writes, per
// binary, otelcol-profiling_<version>_linux_<arch>.tar.gz (the binary,
// LICENSE, README.md and the configs) and
// otelcol-profiling_<version>_linux_<arch>.cdx.json (a CycloneDX SBOM from
// the binary's build information); sonde-<version>.tgz (the Helm chart,
// version and appVersion set); and SHA256SUMS over every file in the
// directory, the images mkimage put there before included.
// SOURCE_DATE_EPOCH, when set, is the time stamped into the archives.
package main

import (
	"debug/buildinfo"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sonde-dev/sonde/internal/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// binaries is a flag given once per binary.
type binaries []string

func (b *binaries) String() string     { return strings.Join(*b, ",") }
func (b *binaries) Set(s string) error { *b = append(*b, s); return nil }

func run(args []string) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	version := fs.String("version", "", "release version x.y.z (required)")
	var bins binaries
	fs.Var(&bins, "binary", "otelcol-profiling built for this release, once per architecture (required)")
	out := fs.String("out", "", "release directory (required)")
	chartDir := fs.String("chart", "deploy/helm/sonde", "Helm chart directory")
	root := fs.String("root", ".", "repository root (LICENSE, README.md, config/)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" || len(bins) == 0 || *out == "" {
		return fmt.Errorf("-version, -binary and -out are required")
	}
	mtime := time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		mtime = time.Unix(sec, 0)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}

	seen := map[string]string{}
	// A module linked into two binaries is the same in both (an
	// architecture may link a module the others do not).
	modules := map[string]string{}
	for _, bin := range bins {
		goos, arch, mods, err := check(bin, *version)
		if err != nil {
			return err
		}
		if prev, ok := seen[goos+"/"+arch]; ok {
			return fmt.Errorf("%s and %s are both built for %s/%s", prev, bin, goos, arch)
		}
		seen[goos+"/"+arch] = bin
		for path, m := range mods {
			if prev, ok := modules[path]; ok && prev != m {
				return fmt.Errorf("%s links %s, another binary of the release %s: a release builds every architecture from the same sources", bin, m, prev)
			}
			modules[path] = m
		}
		if err := write(bin, *out, *root, *version, goos, arch, mtime); err != nil {
			return err
		}
	}
	if _, err := release.PackageChart(*chartDir, *out, *version); err != nil {
		return err
	}
	sums, err := release.WriteChecksums(*out)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(sums)
	if err != nil {
		return err
	}
	fmt.Print(string(b))
	return nil
}

// check reads the build information of binary, which must be static, and
// runs it, under QEMU's user-mode emulator when it is of another
// architecture (qemu-user-static): `--version` must print version. It
// returns the binary's GOOS, GOARCH and modules (by path, what it is
// replaced with, version and go.sum hash).
func check(binary, version string) (goos, arch string, modules map[string]string, err error) {
	info, err := buildinfo.ReadFile(binary)
	if err != nil {
		return "", "", nil, fmt.Errorf("%s: %w", binary, err)
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "GOARCH":
			arch = s.Value
		case "GOOS":
			goos = s.Value
		case "CGO_ENABLED":
			if s.Value != "0" {
				return "", "", nil, fmt.Errorf("%s was built with CGO_ENABLED=%s; a release binary is static (CGO_ENABLED=0)", binary, s.Value)
			}
		}
	}
	if arch == "" || goos == "" {
		return "", "", nil, fmt.Errorf("%s: build information lacks GOOS or GOARCH", binary)
	}
	modules = map[string]string{}
	for _, d := range info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		modules[d.Path] = d.Path + "@" + d.Version + " => " + m.Path + "@" + m.Version + " " + m.Sum
	}

	// The binary must say which release it is.
	if goos != runtime.GOOS {
		return "", "", nil, fmt.Errorf("%s is built for %s, not %s", binary, goos, runtime.GOOS)
	}
	cmd := exec.Command(binary, "--version")
	if arch != runtime.GOARCH {
		emu, ok := qemuUser[arch]
		if !ok {
			return "", "", nil, fmt.Errorf("%s: no emulator known for %s", binary, arch)
		}
		p, err := exec.LookPath(emu)
		if err != nil {
			return "", "", nil, fmt.Errorf("%s is built for %s, run under %s, which is not installed (Debian's qemu-user-static, make deps): %w", binary, arch, emu, err)
		}
		cmd = exec.Command(p, binary, "--version")
	}
	got, err := cmd.CombinedOutput()
	if err != nil {
		return "", "", nil, fmt.Errorf("%s --version: %w\n%s", binary, err, got)
	}
	if !strings.Contains(string(got), version) {
		return "", "", nil, fmt.Errorf("%s --version prints %q, not the release version %s", binary, strings.TrimSpace(string(got)), version)
	}
	return goos, arch, modules, nil
}

// qemuUser names QEMU's user-mode emulator of a GOARCH, as Debian's
// qemu-user-static installs it.
var qemuUser = map[string]string{"amd64": "qemu-x86_64-static", "arm64": "qemu-aarch64-static"}

// write puts binary's tarball and SBOM into out.
func write(binary, out, root, version, goos, arch string, mtime time.Time) error {
	base := fmt.Sprintf("otelcol-profiling_%s_%s_%s", version, goos, arch)
	files := []release.File{
		{Src: binary, Name: "otelcol-profiling", Mode: 0o755},
		{Src: filepath.Join(root, "LICENSE"), Name: "LICENSE", Mode: 0o644},
		{Src: filepath.Join(root, "README.md"), Name: "README.md", Mode: 0o644},
		{Src: filepath.Join(root, "config", "local.yaml"), Name: "config/local.yaml", Mode: 0o644},
		{Src: filepath.Join(root, "config", "agent.yaml"), Name: "config/agent.yaml", Mode: 0o644},
	}
	if err := release.WriteTarball(filepath.Join(out, base+".tar.gz"), base, mtime, files); err != nil {
		return err
	}
	bom, err := release.SBOM(binary, "otelcol-profiling", version, "Apache-2.0", mtime)
	if err != nil {
		return err
	}
	return release.WriteSBOM(filepath.Join(out, base+".cdx.json"), bom)
}
