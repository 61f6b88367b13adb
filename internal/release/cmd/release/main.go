// Command release assembles a Sonde release directory from a built
// otelcol-profiling (make release runs it; see README):
//
//	release -version 0.2.0 -binary _build/release/otelcol-profiling -out _build/release/0.2.0
//
// It checks that the binary reports the version, then writes
// otelcol-profiling_<version>_linux_<arch>.tar.gz (the binary, LICENSE,
// README.md and the configs), otelcol-profiling_<version>_linux_<arch>.cdx.json
// (a CycloneDX SBOM from the binary's build information), sonde-<version>.tgz
// (the Helm chart, version and appVersion set), and SHA256SUMS over every
// file in the directory, the image tarball that make release put there too.
// SOURCE_DATE_EPOCH, when set, is the time stamped into the archives.
package main

import (
	"debug/buildinfo"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

func run(args []string) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	version := fs.String("version", "", "release version x.y.z (required)")
	binary := fs.String("binary", "", "otelcol-profiling built for this release (required)")
	out := fs.String("out", "", "release directory (required)")
	chartDir := fs.String("chart", "deploy/helm/sonde", "Helm chart directory")
	root := fs.String("root", ".", "repository root (LICENSE, README.md, config/)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" || *binary == "" || *out == "" {
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

	// The binary must say which release it is.
	got, err := exec.Command(*binary, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %w\n%s", *binary, err, got)
	}
	if !strings.Contains(string(got), *version) {
		return fmt.Errorf("%s --version prints %q, not the release version %s", *binary, strings.TrimSpace(string(got)), *version)
	}
	info, err := buildinfo.ReadFile(*binary)
	if err != nil {
		return fmt.Errorf("%s: %w", *binary, err)
	}
	arch, goos := "", ""
	for _, s := range info.Settings {
		switch s.Key {
		case "GOARCH":
			arch = s.Value
		case "GOOS":
			goos = s.Value
		case "CGO_ENABLED":
			if s.Value != "0" {
				return fmt.Errorf("%s was built with CGO_ENABLED=%s; a release binary is static (CGO_ENABLED=0)", *binary, s.Value)
			}
		}
	}
	if arch == "" || goos == "" {
		return fmt.Errorf("%s: build information lacks GOOS or GOARCH", *binary)
	}

	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	base := fmt.Sprintf("otelcol-profiling_%s_%s_%s", *version, goos, arch)
	files := []release.File{
		{Src: *binary, Name: "otelcol-profiling", Mode: 0o755},
		{Src: filepath.Join(*root, "LICENSE"), Name: "LICENSE", Mode: 0o644},
		{Src: filepath.Join(*root, "README.md"), Name: "README.md", Mode: 0o644},
		{Src: filepath.Join(*root, "config", "local.yaml"), Name: "config/local.yaml", Mode: 0o644},
		{Src: filepath.Join(*root, "config", "agent.yaml"), Name: "config/agent.yaml", Mode: 0o644},
	}
	if err := release.WriteTarball(filepath.Join(*out, base+".tar.gz"), base, mtime, files); err != nil {
		return err
	}
	bom, err := release.SBOM(*binary, "otelcol-profiling", *version, "Apache-2.0", mtime)
	if err != nil {
		return err
	}
	if err := release.WriteSBOM(filepath.Join(*out, base+".cdx.json"), bom); err != nil {
		return err
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
