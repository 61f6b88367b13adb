package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/sonde-dev/sonde/internal/image"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// goVersionM returns what `go version -m` reports of a binary's modules,
// path@version (a replacement's path@version, or the replaced path for a
// local one): an oracle outside this package.
func goVersionM(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.Command(testutil.RequireTool(t, "go"), "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	var mods []string
	lines := strings.Split(string(out), "\n")
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "dep" {
			continue
		}
		mod := f[1] + "@" + f[2]
		if i+1 < len(lines) {
			if r := strings.Fields(lines[i+1]); len(r) >= 2 && r[0] == "=>" {
				if len(r) >= 3 && !strings.HasPrefix(r[1], ".") && !strings.HasPrefix(r[1], "/") {
					mod = r[1] + "@" + r[2]
				} else {
					mod = "local:" + f[1]
				}
			}
		}
		mods = append(mods, mod)
	}
	slices.Sort(mods)
	return mods
}

// TestSBOM derives an SBOM from a real Go binary, the release command
// built now (test binaries record no modules), and compares its modules
// with what `go version -m` reads from the same file.
func TestSBOM(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "release")
	build := exec.Command(testutil.RequireTool(t, "go"), "build", "-o", bin, "./cmd/release")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	when := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	bom, err := SBOM(bin, "otelcol-profiling", "1.2.3", "Apache-2.0", when)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range bom.Components {
		if c.Name == "stdlib" {
			continue
		}
		if c.PURL == "" {
			got = append(got, c.BOMRef)
			continue
		}
		purl, ok := strings.CutPrefix(c.PURL, "pkg:golang/")
		if !ok {
			t.Errorf("purl %q is not a pkg:golang one", c.PURL)
		}
		got = append(got, purl)
		if c.Version == "" || !strings.HasSuffix(c.PURL, "@"+c.Version) {
			t.Errorf("component %s: version %q does not match purl %s", c.Name, c.Version, c.PURL)
		}
	}
	slices.Sort(got)
	if diff := cmp.Diff(goVersionM(t, bin), got); diff != "" {
		t.Errorf("SBOM modules differ from go version -m (-want +got):\n%s", diff)
	}
	if len(got) < 20 {
		t.Errorf("%d modules: the release command links more (helm among them)", len(got))
	}

	m := bom.Metadata.Component
	sum := sha256File(t, bin)
	if m.Name != "otelcol-profiling" || m.Version != "1.2.3" || len(m.Hashes) != 1 || m.Hashes[0].Content != sum {
		t.Errorf("main component = %+v, want otelcol-profiling 1.2.3 with sha256 %s", m, sum)
	}
	if bom.Metadata.Timestamp != "2026-11-23T12:00:00Z" || bom.BOMFormat != "CycloneDX" || bom.SpecVersion != "1.5" {
		t.Errorf("header = %s %s %s", bom.BOMFormat, bom.SpecVersion, bom.Metadata.Timestamp)
	}
	if !strings.HasPrefix(bom.SerialNumber, "urn:uuid:") || len(bom.SerialNumber) != len("urn:uuid:")+36 {
		t.Errorf("serial number %q", bom.SerialNumber)
	}
	// Every module is a dependency of the main component, by reference.
	if len(bom.Dependencies) != 1 || len(bom.Dependencies[0].DependsOn) != len(bom.Components) {
		t.Errorf("dependencies list %d refs for %d components", len(bom.Dependencies[0].DependsOn), len(bom.Components))
	}
	// Hashes are the go.sum h1 hashes, in hex.
	for _, c := range bom.Components {
		for _, p := range c.Properties {
			if p.Name != "go:sum" {
				continue
			}
			if len(c.Hashes) != 1 || len(c.Hashes[0].Content) != 64 {
				t.Errorf("%s: hashes %v for %s", c.Name, c.Hashes, p.Value)
			}
		}
	}

	// Written and read back, it is the same document, and deterministic.
	path := filepath.Join(t.TempDir(), "sbom.json")
	if err := WriteSBOM(path, bom); err != nil {
		t.Fatal(err)
	}
	var back BOM
	if err := json.Unmarshal(readFile(t, path), &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*bom, back); diff != "" {
		t.Errorf("read back (-want +got):\n%s", diff)
	}
	again, err := SBOM(bin, "otelcol-profiling", "1.2.3", "Apache-2.0", when)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(bom, again); diff != "" {
		t.Errorf("a second SBOM of the same binary differs:\n%s", diff)
	}
}

func TestSBOMRejectsNonGo(t *testing.T) {
	if _, err := SBOM(testutil.RequireTool(t, "sh"), "x", "1.0.0", "", time.Unix(0, 0)); err == nil {
		t.Error("SBOM of a binary without Go build information succeeded")
	}
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	s := sha256.Sum256(readFile(t, path))
	return hex.EncodeToString(s[:])
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTarballAndChecksums(t *testing.T) {
	src := t.TempDir()
	bin := filepath.Join(src, "bin")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(src, "c.yaml")
	if err := os.WriteFile(conf, []byte("receivers: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	mtime := time.Unix(1700000000, 0)
	tgz := filepath.Join(out, "x_1.0.0.tar.gz")
	err := WriteTarball(tgz, "x_1.0.0", mtime, []File{
		{Src: bin, Name: "otelcol-profiling", Mode: 0o755},
		{Src: conf, Name: "config/local.yaml", Mode: 0o644},
	})
	if err != nil {
		t.Fatal(err)
	}
	// GNU tar is the oracle for the archive.
	listing, err := exec.Command(testutil.RequireTool(t, "tar"), "-tvzf", tgz).Output()
	if err != nil {
		t.Fatalf("tar -tvzf: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(listing)), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "-rwxr-xr-x root/root") || !strings.HasSuffix(lines[0], " x_1.0.0/otelcol-profiling") ||
		!strings.HasPrefix(lines[1], "-rw-r--r-- root/root") || !strings.HasSuffix(lines[1], " x_1.0.0/config/local.yaml") {
		t.Errorf("tar -tvzf:\n%s", listing)
	}
	contents := untar(t, tgz)
	if string(contents["x_1.0.0/otelcol-profiling"]) != "\x7fELF not really" {
		t.Errorf("binary content = %q", contents["x_1.0.0/otelcol-profiling"])
	}

	sums, err := WriteChecksums(out)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testutil.RequireTool(t, "sha256sum"), "-c", filepath.Base(sums))
	cmd.Dir = out
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, b)
	}
	// A changed file fails the check.
	if err := os.WriteFile(tgz, []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command("sha256sum", "-c", filepath.Base(sums))
	cmd.Dir = out
	if err := cmd.Run(); err == nil {
		t.Error("sha256sum -c passed over a changed file")
	}
}

func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	out := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if _, err := io.Copy(&b, tr); err != nil {
			t.Fatal(err)
		}
		out[hdr.Name] = b.Bytes()
	}
}

func TestPackageChart(t *testing.T) {
	out := t.TempDir()
	path, err := PackageChart(filepath.Join("..", "..", "deploy", "helm", "sonde"), out, "3.4.5")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != "sonde-3.4.5.tgz" {
		t.Errorf("packaged as %s, want sonde-3.4.5.tgz", filepath.Base(path))
	}
	c, err := loader.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.Version != "3.4.5" || c.Metadata.AppVersion != "3.4.5" {
		t.Errorf("packaged chart version %s, appVersion %s; want 3.4.5 for both", c.Metadata.Version, c.Metadata.AppVersion)
	}
	for _, f := range c.Raw {
		if strings.HasSuffix(f.Name, ".go") {
			t.Errorf("package holds %s", f.Name)
		}
	}
}

// releaseArches are the architectures make release builds, with the ELF
// machine of each one's binary.
var releaseArches = []struct {
	arch    string
	machine elf.Machine
	variant string // the platform variant of the image index
}{
	{"amd64", elf.EM_X86_64, ""},
	{"arm64", elf.EM_AARCH64, "v8"},
}

// TestReleaseDirectory checks what `make release` wrote (make release runs
// it with SONDE_RELEASE_DIR and SONDE_RELEASE_VERSION): every artifact is
// there and the checksums hold; for each architecture, the binary in the
// tarball is static, stripped, of that machine, and prints the version (an
// arm64 one under qemu-aarch64-static), the SBOM describes that binary and
// the image carries it and says its architecture; the OCI archive holds an
// index of both images with their platforms, its digests those of its blobs
// (checked here and read by skopeo); the chart is stamped.
func TestReleaseDirectory(t *testing.T) {
	dir, version := os.Getenv("SONDE_RELEASE_DIR"), os.Getenv("SONDE_RELEASE_VERSION")
	if dir == "" || version == "" {
		t.Skip("SONDE_RELEASE_DIR and SONDE_RELEASE_VERSION are not set: make release sets them")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	index := "otelcol-profiling_" + version + ".oci.tar"
	want := []string{SumsFile, index, "sonde-" + version + ".tgz"}
	for _, a := range releaseArches {
		base := "otelcol-profiling_" + version + "_linux_" + a.arch
		want = append(want, base+".cdx.json", base+".image.tar", base+".tar.gz")
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Fatalf("release files (-want +got):\n%s", diff)
	}
	cmd := exec.Command(testutil.RequireTool(t, "sha256sum"), "-c", SumsFile)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, out)
	}
	if n := strings.Count(string(readFile(t, filepath.Join(dir, SumsFile))), "\n"); n != len(want)-1 {
		t.Errorf("SHA256SUMS has %d lines, want %d", n, len(want)-1)
	}

	c, err := loader.Load(filepath.Join(dir, "sonde-"+version+".tgz"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Metadata.Version != version || c.Metadata.AppVersion != version {
		t.Errorf("chart version %s, appVersion %s; want %s", c.Metadata.Version, c.Metadata.AppVersion, version)
	}
	// The chart's default affinity admits the nodes of the architectures
	// the image index has, no others.
	var aff struct {
		NodeAffinity struct {
			Required struct {
				Terms []struct {
					Expressions []struct {
						Key      string   `json:"key"`
						Operator string   `json:"operator"`
						Values   []string `json:"values"`
					} `json:"matchExpressions"`
				} `json:"nodeSelectorTerms"`
			} `json:"requiredDuringSchedulingIgnoredDuringExecution"`
		} `json:"nodeAffinity"`
	}
	b, err := json.Marshal(c.Values["affinity"])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &aff); err != nil {
		t.Fatalf("chart affinity %s: %v", b, err)
	}
	var wantArches []string
	for _, a := range releaseArches {
		wantArches = append(wantArches, a.arch)
	}
	if terms := aff.NodeAffinity.Required.Terms; len(terms) != 1 || len(terms[0].Expressions) != 1 ||
		terms[0].Expressions[0].Key != "kubernetes.io/arch" || terms[0].Expressions[0].Operator != "In" ||
		!slices.Equal(terms[0].Expressions[0].Values, wantArches) {
		t.Errorf("chart affinity %s, want nodes of kubernetes.io/arch in %v", b, wantArches)
	}

	binaries := map[string][]byte{}
	configs := map[string]string{}
	for _, a := range releaseArches {
		t.Run(a.arch, func(t *testing.T) {
			base := "otelcol-profiling_" + version + "_linux_" + a.arch
			binaries[a.arch], configs[a.arch] = checkArch(t, dir, base, version, a.arch, a.machine)
		})
	}

	// The index, unpacked by GNU tar and read as the image spec lays it out.
	layoutDir := t.TempDir()
	if out, err := exec.Command(testutil.RequireTool(t, "tar"), "-xf", filepath.Join(dir, index), "-C", layoutDir).CombinedOutput(); err != nil {
		t.Fatalf("tar -xf %s: %v\n%s", index, err, out)
	}
	imgs, err := image.CheckLayout(layoutDir, version)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != len(releaseArches) {
		t.Fatalf("the index lists %d images, want %d", len(imgs), len(releaseArches))
	}
	for i, a := range releaseArches {
		img := imgs[i]
		if img.OS != "linux" || img.Architecture != a.arch || img.Variant != a.variant {
			t.Errorf("index image %d is for %s/%s/%s, want linux/%s/%s", i, img.OS, img.Architecture, img.Variant, a.arch, a.variant)
		}
		if img.Config != configs[a.arch] {
			t.Errorf("index image for %s has config %s, its image tarball %s", a.arch, img.Config, configs[a.arch])
		}
		if len(img.Layers) != 1 {
			t.Fatalf("index image for %s: %d layers, want 1", a.arch, len(img.Layers))
		}
		f, err := os.Open(img.Layers[0])
		if err != nil {
			t.Fatal(err)
		}
		gz, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		if b := layerFile(t, gz, "otelcol-profiling"); b == nil || !bytes.Equal(b, binaries[a.arch]) {
			t.Errorf("the index's %s image does not hold the %s tarball's binary", a.arch, a.arch)
		}
		testutil.Close(t, f)
	}

	// skopeo, as a registry client or a runtime would, picks each
	// architecture's image from the archive.
	skopeo := testutil.RequireTool(t, "skopeo")
	src := "oci-archive:" + filepath.Join(dir, index) + ":" + version
	for i, a := range releaseArches {
		// --config --raw: the config of the image picked for the
		// platform, as its bytes, which hash to the config's digest.
		c := testutil.SkopeoConfig(t, skopeo, src, a.arch)
		if c.OS != "linux" || c.Architecture != a.arch || c.Digest != imgs[i].Config || c.Labels["org.opencontainers.image.version"] != version {
			t.Errorf("skopeo picks for %s: %s/%s config %s (version %q), want config %s", a.arch, c.OS, c.Architecture,
				c.Digest, c.Labels["org.opencontainers.image.version"], imgs[i].Config)
		}
	}
}

// checkArch checks one architecture's tarball, SBOM and image, and returns
// the binary and the image's config digest.
func checkArch(t *testing.T, dir, base, version, arch string, machine elf.Machine) ([]byte, string) {
	files := untar(t, filepath.Join(dir, base+".tar.gz"))
	binary := files[base+"/otelcol-profiling"]
	for _, f := range []string{"otelcol-profiling", "LICENSE", "README.md", "config/local.yaml", "config/agent.yaml"} {
		if _, ok := files[base+"/"+f]; !ok {
			t.Errorf("tarball lacks %s", f)
		}
	}
	bin := filepath.Join(t.TempDir(), "otelcol-profiling")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	if ef.Machine != machine {
		t.Errorf("the %s binary is for %v, want %v", arch, ef.Machine, machine)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the release binary has an ELF interpreter: it is not static")
		}
	}
	if ef.Section(".symtab") != nil {
		t.Error("the release binary keeps .symtab: it was not built with -s")
	}
	if ef.Section(".debug_info") != nil || ef.Section(".zdebug_info") != nil {
		t.Error("the release binary keeps DWARF: it was not built with -w")
	}
	testutil.Close(t, ef)
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["GOOS"] != "linux" || settings["GOARCH"] != arch || settings["CGO_ENABLED"] != "0" {
		t.Errorf("build settings GOOS=%s GOARCH=%s CGO_ENABLED=%s; want linux, %s, 0",
			settings["GOOS"], settings["GOARCH"], settings["CGO_ENABLED"], arch)
	}
	run := exec.Command(bin, "--version")
	if arch != runtime.GOARCH {
		emu := map[string]string{"amd64": "qemu-x86_64-static", "arm64": "qemu-aarch64-static"}[arch]
		run = exec.Command(testutil.RequireTool(t, emu), bin, "--version")
	}
	out, err := run.CombinedOutput()
	if err != nil || !strings.Contains(string(out), version) {
		t.Errorf("otelcol-profiling --version = %q, %v; want it to name %s", out, err, version)
	}
	t.Logf("otelcol-profiling %s linux/%s: %d bytes", version, arch, len(binary))

	var bom BOM
	if err := json.Unmarshal(readFile(t, filepath.Join(dir, base+".cdx.json")), &bom); err != nil {
		t.Fatal(err)
	}
	if m := bom.Metadata.Component; m.Version != version || len(m.Hashes) != 1 || m.Hashes[0].Content != sha256File(t, bin) {
		t.Errorf("SBOM main component %+v does not describe the tarball's binary", m)
	}
	var modules []string
	for _, c := range bom.Components {
		if c.Name != "stdlib" {
			if c.PURL != "" {
				modules = append(modules, strings.TrimPrefix(c.PURL, "pkg:golang/"))
			} else {
				modules = append(modules, c.BOMRef)
			}
		}
	}
	slices.Sort(modules)
	if diff := cmp.Diff(goVersionM(t, bin), modules); diff != "" {
		t.Errorf("SBOM modules differ from go version -m of the binary (-want +got):\n%s", diff)
	}

	tag, err := name.NewTag("ghcr.io/sonde-dev/otelcol-profiling:" + version)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(filepath.Join(dir, base+".image.tar"), &tag)
	if err != nil {
		t.Fatalf("image tarball: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != arch {
		t.Errorf("image config says %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
	}
	if got := cf.Config.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("image version label = %q, want %s", got, version)
	}
	configName, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("image layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer testutil.Close(t, rc)
	if b := layerFile(t, rc, "otelcol-profiling"); b == nil || !bytes.Equal(b, binary) {
		t.Error("the image does not hold the tarball's binary at /otelcol-profiling")
	}
	return binary, configName.String()
}

// layerFile returns the content of the file name in the uncompressed layer
// r, or nil if it has none.
func layerFile(t *testing.T, r io.Reader, name string) []byte {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name == name || hdr.Name == "/"+name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
