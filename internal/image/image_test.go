package image

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sonde-dev/sonde/internal/testutil"
)

type entry struct {
	Mode int64
	Dir  bool
	Data string
}

func TestBuildRoundTrip(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name  string
		opts  Options
		files map[string]entry
	}{
		{
			name: "binary only",
			opts: Options{Binary: write("bin1", "fake binary"), Version: "1.2.3", Arch: "arm64"},
			files: map[string]entry{
				"otelcol-profiling": {Mode: 0o755, Data: "fake binary"},
			},
		},
		{
			name: "binary, certificates and config",
			opts: Options{
				Binary:  write("bin2", "#!fake binary"),
				CACerts: write("ca.crt", "-----BEGIN CERTIFICATE-----\n"),
				Config:  write("config.yaml", "receivers: {}\n"),
				Version: "0.1.0",
				Source:  "https://github.com/sonde-dev/sonde",
				Arch:    "amd64",
				Created: created,
			},
			files: map[string]entry{
				"otelcol-profiling":                 {Mode: 0o755, Data: "#!fake binary"},
				"etc/":                              {Mode: 0o755, Dir: true},
				"etc/ssl/":                          {Mode: 0o755, Dir: true},
				"etc/ssl/certs/":                    {Mode: 0o755, Dir: true},
				"etc/ssl/certs/ca-certificates.crt": {Mode: 0o644, Data: "-----BEGIN CERTIFICATE-----\n"},
				"etc/otelcol/":                      {Mode: 0o755, Dir: true},
				"etc/otelcol/config.yaml":           {Mode: 0o644, Data: "receivers: {}\n"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img, err := Build(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "image.tar")
			ref := "ghcr.io/sonde-dev/otelcol-profiling:" + tt.opts.Version
			if err := WriteTarball(out, ref, img); err != nil {
				t.Fatal(err)
			}
			tag, err := name.NewTag(ref)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tarball.ImageFromPath(out, &tag)
			if err != nil {
				t.Fatalf("read back %s: %v", out, err)
			}

			cf, err := got.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			wantCreated := tt.opts.Created
			if wantCreated.IsZero() {
				wantCreated = time.Unix(0, 0)
			}
			type summary struct {
				OS, Arch, Variant, User string
				Entrypoint              []string
				Cmd                     []string
				Labels                  map[string]string
				Created                 time.Time
			}
			wantSum := summary{
				OS: "linux", Arch: tt.opts.Arch, Variant: variantOf(tt.opts.Arch), User: "0",
				Entrypoint: []string{"/otelcol-profiling"},
				Cmd:        []string{"--config=/etc/otelcol/config.yaml", "--feature-gates=service.profilesSupport"},
				Labels:     Labels(tt.opts.Version, tt.opts.Source),
				Created:    wantCreated.UTC(),
			}
			gotSum := summary{
				OS: cf.OS, Arch: cf.Architecture, Variant: cf.Variant, User: cf.Config.User,
				Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd,
				Labels: cf.Config.Labels, Created: cf.Created.UTC(),
			}
			if diff := cmp.Diff(wantSum, gotSum); diff != "" {
				t.Errorf("image config (-want +got):\n%s", diff)
			}
			for _, k := range []string{"org.opencontainers.image.title", "org.opencontainers.image.licenses"} {
				if cf.Config.Labels[k] == "" {
					t.Errorf("label %s missing", k)
				}
			}
			if tt.opts.Version != "" && cf.Config.Labels["org.opencontainers.image.version"] != tt.opts.Version {
				t.Errorf("version label = %q, want %q", cf.Config.Labels["org.opencontainers.image.version"], tt.opts.Version)
			}

			// The tarball format has no media types (reading it back reports
			// Docker's), so check the built image: registries get OCI.
			if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
				t.Errorf("manifest media type = %q, %v; want %q", mt, err, types.OCIManifestSchema1)
			}
			layers, err := got.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 1 {
				t.Fatalf("%d layers, want 1", len(layers))
			}
			files := readLayer(t, layers[0])
			if diff := cmp.Diff(tt.files, files); diff != "" {
				t.Errorf("layer files (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildReproducible(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, []byte("same bytes"), 0o600); err != nil {
		t.Fatal(err)
	}
	digest := func() v1.Hash {
		img, err := Build(Options{Binary: bin, Version: "1"})
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if a, b := digest(), digest(); a != b {
		t.Errorf("two builds of the same inputs differ: %v and %v", a, b)
	}
}

func TestBuildErrors(t *testing.T) {
	tests := []struct {
		name string
		opts Options
	}{
		{"no binary", Options{}},
		{"missing binary", Options{Binary: filepath.Join(t.TempDir(), "absent")}},
		{"missing certificates", Options{Binary: os.Args[0], CACerts: filepath.Join(t.TempDir(), "absent")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Build(tt.opts); err == nil {
				t.Fatal("Build succeeded, want an error")
			}
		})
	}
	// The oracle for "dynamic" is the C toolchain's default: a program linked
	// against the shared libc has an interpreter; -static has none.
	src := filepath.Join(t.TempDir(), "main.c")
	if err := os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dynamic := testutil.BuildC(t, "dynamic", nil, src)
	if _, err := Build(Options{Binary: dynamic}); !errors.Is(err, ErrDynamic) {
		t.Errorf("Build(dynamic C binary) = %v, want ErrDynamic", err)
	}
	static := testutil.BuildGo(t, "static", "cmd/mkimage")
	if _, err := Build(Options{Binary: static}); err != nil {
		t.Errorf("Build(static Go binary) = %v, want success", err)
	}
	if err := WriteTarball(filepath.Join(t.TempDir(), "x.tar"), "not a valid ref::", nil); err == nil {
		t.Error("WriteTarball accepted an invalid reference")
	}
}

// readLayer lists a layer's entries with their mode and content.
func readLayer(t *testing.T, l v1.Layer) map[string]entry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer testutil.Close(t, rc)
	tr := tar.NewReader(rc)
	got := map[string]entry{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want 0:0", hdr.Name, hdr.Uid, hdr.Gid)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got[hdr.Name] = entry{Mode: hdr.Mode, Dir: hdr.Typeflag == tar.TypeDir, Data: string(data)}
	}
	return got
}
