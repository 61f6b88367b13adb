// Package image builds the container images of otelcol-profiling without a
// container engine: one layer on an empty base that holds the binary, the
// host's CA bundle and the default configuration, written as a tarball that
// `docker load`, `podman load` and `crane push` accept; and an OCI image
// index of one such image per architecture, written as an OCI image layout
// in a tar (the `oci-archive:` of skopeo), which CheckLayout verifies.
//
// The image is reproducible: every file and the image config carry the same
// fixed time, so the same inputs give the same digest. Build holds the layer
// in memory (the binary is tens of MiB); nothing here is shared or global, so
// concurrent builds are safe.
package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths inside the image.
const (
	BinaryPath = "/otelcol-profiling"
	ConfigPath = "/etc/otelcol/config.yaml"
	CACertPath = "/etc/ssl/certs/ca-certificates.crt"
)

// FeatureGate is the Collector feature gate the profiles pipeline needs.
const FeatureGate = "service.profilesSupport"

// maxFileBytes bounds each file put in the layer: the build reads them into
// memory, and no legitimate input comes near it.
const maxFileBytes = 1 << 30

// Options say what goes into the image.
type Options struct {
	// Binary is the otelcol-profiling executable. Required.
	Binary string
	// CACerts is a PEM bundle installed at CACertPath so TLS exports work;
	// empty leaves it out.
	CACerts string
	// Config is a Collector configuration installed at ConfigPath, used
	// when the container runs without other arguments; empty leaves it out.
	Config string
	// Version is the image version label (org.opencontainers.image.version).
	Version string
	// Source is the repository URL label (org.opencontainers.image.source).
	Source string
	// Arch is the GOARCH the binary runs on; empty means the ELF binary's
	// machine (runtime.GOARCH for a file that is not ELF). An ELF binary of
	// another machine is refused (ErrArch).
	Arch string
	// Created is the time of every file and of the image; zero means the
	// Unix epoch, which keeps the digest reproducible.
	Created time.Time
}

// Entrypoint returns the image's entrypoint. With Cmd the command line is
// `/otelcol-profiling --config=/etc/otelcol/config.yaml --feature-gates=...`;
// the flags are Cmd, not Entrypoint, so that a Kubernetes `args:` replaces
// them rather than adding a second --config that the Collector would merge.
func Entrypoint() []string { return []string{BinaryPath} }

// Cmd returns the image's default arguments.
func Cmd() []string {
	return []string{"--config=" + ConfigPath, "--feature-gates=" + FeatureGate}
}

// Build assembles the image described by o.
func Build(o Options) (v1.Image, error) {
	if o.Binary == "" {
		return nil, errors.New("image: no binary given")
	}
	created := o.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	arch, err := checkBinary(o.Binary, o.Arch)
	if err != nil {
		return nil, err
	}

	files := []file{{path: BinaryPath, src: o.Binary, mode: 0o755}}
	if o.CACerts != "" {
		files = append(files, file{path: CACertPath, src: o.CACerts, mode: 0o644})
	}
	if o.Config != "" {
		files = append(files, file{path: ConfigPath, src: o.Config, mode: 0o644})
	}
	layerTar, err := buildLayer(files, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}

	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "sonde internal/image: otelcol-profiling, CA certificates, default config",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("image append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = arch
	cf.Variant = variantOf(arch)
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = Entrypoint()
	cf.Config.Cmd = Cmd()
	// Root: loading eBPF and reading every process needs capabilities that
	// a non-root user would lose at exec.
	cf.Config.User = "0"
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = Labels(o.Version, o.Source)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image set config: %w", err)
	}
	return img, nil
}

// Labels returns the OCI annotations the image config carries.
func Labels(version, source string) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "otelcol-profiling",
		"org.opencontainers.image.description": "OpenTelemetry Collector with the Sonde eBPF profiler",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if version != "" {
		l["org.opencontainers.image.version"] = version
	}
	if source != "" {
		l["org.opencontainers.image.source"] = source
	}
	return l
}

// WriteTarball writes img to path as an image tarball tagged ref
// (for example ghcr.io/sonde-dev/otelcol-profiling:0.1.0).
func WriteTarball(path, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image tag %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		return fmt.Errorf("write image %s: %w", path, err)
	}
	return nil
}

type file struct {
	path string // absolute path in the image
	src  string // file on the build host
	mode int64
}

// buildLayer writes the files and their parent directories as an
// uncompressed tar, owned by root, all stamped with mtime.
func buildLayer(files []file, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		if err := writeParents(tw, dirs, path.Dir(f.path), mtime); err != nil {
			return nil, err
		}
		data, err := readBounded(f.src)
		if err != nil {
			return nil, err
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     f.path[1:],
			Mode:     f.mode,
			Size:     int64(len(data)),
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.path, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// writeParents adds dir and its ancestors that are not yet in the layer.
func writeParents(tw *tar.Writer, done map[string]bool, dir string, mtime time.Time) error {
	if dir == "/" || done[dir] {
		return nil
	}
	if err := writeParents(tw, done, path.Dir(dir), mtime); err != nil {
		return err
	}
	done[dir] = true
	hdr := &tar.Header{
		Typeflag: tar.TypeDir,
		Name:     dir[1:] + "/",
		Mode:     0o755,
		ModTime:  mtime,
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("layer %s: %w", dir, err)
	}
	return nil
}

func readBounded(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("layer read %s: %w", p, err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("layer %s: larger than %d bytes", p, maxFileBytes)
	}
	return data, nil
}

// ErrDynamic is wrapped by Build's error when the binary needs a dynamic
// loader: the image has no libc, so it could not start.
var ErrDynamic = errors.New("binary is dynamically linked; build it with CGO_ENABLED=0")

// ErrArch is wrapped by Build's error when the binary is built for another
// architecture than the image says.
var ErrArch = errors.New("binary is built for another architecture")

// checkBinary refuses an ELF binary with a program interpreter, or of
// another machine than arch (when given), and returns the binary's GOARCH.
// Files that are not ELF (test stand-ins) pass as arch, or runtime.GOARCH:
// the check only catches a real mistake.
func checkBinary(p, arch string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("image binary: %w", err)
	}
	defer f.Close()
	magic := make([]byte, len(elf.ELFMAG))
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != elf.ELFMAG {
		if arch == "" {
			arch = runtime.GOARCH
		}
		return arch, nil
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return "", fmt.Errorf("image binary %s: %w", p, err)
	}
	for _, prog := range ef.Progs {
		if prog.Type == elf.PT_INTERP {
			return "", fmt.Errorf("image binary %s: %w", p, ErrDynamic)
		}
	}
	got, ok := archOf[ef.Machine]
	if !ok {
		return "", fmt.Errorf("image binary %s: %v: %w", p, ef.Machine, ErrArch)
	}
	if arch != "" && got != arch {
		return "", fmt.Errorf("image binary %s: %v, not %s: %w", p, ef.Machine, arch, ErrArch)
	}
	return got, nil
}
