package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// hello builds a small static Go program for linux/goarch: a real ELF
// binary of that machine.
func hello(t *testing.T, goarch string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range map[string]string{
		"go.mod":  "module hello\n\ngo 1.26\n",
		"main.go": "package main\n\nfunc main() { println(\"hello\") }\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return testutil.BuildGoFor(t, "hello-"+goarch, dir, goarch)
}

// TestOCIArchive builds images of an amd64 and an arm64 binary, each
// architecture read from the ELF file, writes their index as an OCI
// archive and reads it back: by CheckLayout, and by skopeo, which reads the
// archive as registries and runtimes do and picks each platform's image.
func TestOCIArchive(t *testing.T) {
	created := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	var imgs []v1.Image
	configs := map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := Build(Options{Binary: hello(t, arch), Version: "1.2.3", Created: created})
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != arch {
			t.Errorf("image of the %s binary: config says %s/%s", arch, cf.OS, cf.Architecture)
		}
		name, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		configs[arch] = name.String()
		imgs = append(imgs, img)
	}
	idx, err := Index(imgs)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "index.oci.tar")
	const ref, tag = "ghcr.io/sonde-dev/otelcol-profiling:1.2.3", "1.2.3"
	if err := WriteOCIArchive(path, ref, tag, idx, created); err != nil {
		t.Fatal(err)
	}

	// GNU tar unpacks it; CheckLayout reads the layout.
	layoutDir := t.TempDir()
	if out, err := exec.Command(testutil.RequireTool(t, "tar"), "-xf", path, "-C", layoutDir).CombinedOutput(); err != nil {
		t.Fatalf("tar -xf: %v\n%s", err, out)
	}
	got, err := CheckLayout(layoutDir, tag)
	if err != nil {
		t.Fatal(err)
	}
	type plat struct{ OS, Arch, Variant, Config string }
	var gotPlats []plat
	for _, img := range got {
		gotPlats = append(gotPlats, plat{img.OS, img.Architecture, img.Variant, img.Config})
		if len(img.Layers) != 1 {
			t.Errorf("%s: %d layers, want 1", img.Architecture, len(img.Layers))
		}
	}
	wantPlats := []plat{{"linux", "amd64", "", configs["amd64"]}, {"linux", "arm64", "v8", configs["arm64"]}}
	if diff := cmp.Diff(wantPlats, gotPlats); diff != "" {
		t.Errorf("index platforms (-want +got):\n%s", diff)
	}
	var top struct {
		Manifests []struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(readFile(t, filepath.Join(layoutDir, "index.json")), &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations[ContainerdNameAnnotation] != ref {
		t.Errorf("index.json lists %+v, want one index named %s", top.Manifests, ref)
	}

	// skopeo, an independent reader of OCI archives.
	skopeo := testutil.RequireTool(t, "skopeo")
	raw, err := exec.Command(skopeo, "inspect", "--raw", "oci-archive:"+path+":"+tag).Output()
	if err != nil {
		t.Fatalf("skopeo inspect --raw: %v", err)
	}
	var idxJSON struct {
		MediaType string `json:"mediaType"`
		Manifests []struct {
			Digest       string `json:"digest"`
			ArtifactType string `json:"artifactType"`
			Platform     struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &idxJSON); err != nil {
		t.Fatalf("skopeo inspect --raw: %v\n%s", err, raw)
	}
	wantDigest, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(raw); "sha256:"+hex.EncodeToString(sum[:]) != wantDigest.String() {
		t.Errorf("skopeo reads an index of digest %x, want %s", sum, wantDigest)
	}
	if idxJSON.MediaType != "application/vnd.oci.image.index.v1+json" || len(idxJSON.Manifests) != 2 {
		t.Fatalf("skopeo reads %s with %d manifests, want an OCI index of 2", idxJSON.MediaType, len(idxJSON.Manifests))
	}
	for i, arch := range []string{"amd64", "arm64"} {
		m := idxJSON.Manifests[i]
		if m.Platform.OS != "linux" || m.Platform.Architecture != arch || m.Digest != got[i].Manifest || m.ArtifactType != "" {
			t.Errorf("skopeo: manifest %d is %+v, want linux/%s %s", i, m, arch, got[i].Manifest)
		}
		// --config --raw: the config of the image picked for the
		// platform, as its bytes, which hash to the config's digest.
		c := testutil.SkopeoConfig(t, skopeo, "oci-archive:"+path+":"+tag, arch)
		if c.OS != "linux" || c.Architecture != arch || c.Digest != got[i].Config || c.Labels["org.opencontainers.image.version"] != "1.2.3" {
			t.Errorf("skopeo picks for %s: %s/%s config %s (version %q), want config %s", arch, c.OS, c.Architecture,
				c.Digest, c.Labels["org.opencontainers.image.version"], got[i].Config)
		}
	}

	// The same index gives the same archive.
	again := filepath.Join(dir, "again.oci.tar")
	if err := WriteOCIArchive(again, ref, tag, idx, created); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, path), readFile(t, again)) {
		t.Error("two archives of the same index differ")
	}
}

func TestIndexErrors(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, []byte("not ELF"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Build(Options{Binary: bin, Arch: "arm64"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(Options{Binary: bin, Arch: "arm64", Version: "2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Index([]v1.Image{a, b}); err == nil || !strings.Contains(err.Error(), "two images for linux/arm64") {
		t.Errorf("Index of two arm64 images = %v, want an error", err)
	}
	if _, err := Index(nil); err == nil {
		t.Error("Index of no image succeeded")
	}
	// An ELF binary of one machine is not put in an image of another.
	if _, err := Build(Options{Binary: hello(t, "arm64"), Arch: "amd64"}); !errors.Is(err, ErrArch) {
		t.Errorf("Build(arm64 binary, Arch amd64) = %v, want ErrArch", err)
	}
}

// TestCheckLayoutRejects changes one thing of a valid layout at a time:
// CheckLayout must notice each.
func TestCheckLayoutRejects(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, []byte("not ELF"), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := Build(Options{Binary: bin, Arch: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	idx, err := Index([]v1.Image{img})
	if err != nil {
		t.Fatal(err)
	}
	layerDigest := func(t *testing.T) string {
		ls, err := img.Layers()
		if err != nil || len(ls) != 1 {
			t.Fatalf("layers: %d, %v", len(ls), err)
		}
		d, err := ls[0].Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.Hex
	}
	tests := []struct {
		name   string
		tag    string
		change func(t *testing.T, dir string)
	}{
		{"valid", "1", func(*testing.T, string) {}},
		{"another tag", "2", func(*testing.T, string) {}},
		{"layout version", "1", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "oci-layout"), `{"imageLayoutVersion":"2.0.0"}`)
		}},
		{"layer changed", "1", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "blobs", "sha256", layerDigest(t))
			b := readFile(t, p)
			b[len(b)/2] ^= 0xff
			writeFile(t, p, string(b))
		}},
		{"layer missing", "1", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "blobs", "sha256", layerDigest(t))); err != nil {
				t.Fatal(err)
			}
		}},
		{"index.json not an index", "1", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "index.json")
			writeFile(t, p, strings.Replace(string(readFile(t, p)), "image.index", "image.manifest", 1))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "layout")
			if err := WriteLayout(dir, "example.com/x:1", "1", idx); err != nil {
				t.Fatal(err)
			}
			tt.change(t, dir)
			_, err := CheckLayout(dir, tt.tag)
			if tt.name == "valid" {
				if err != nil {
					t.Errorf("CheckLayout of the layout as written: %v", err)
				}
				return
			}
			if err == nil {
				t.Error("CheckLayout passed")
			}
		})
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
