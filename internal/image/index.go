package image

import (
	"archive/tar"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the image index's descriptor in an OCI layout's
// index.json: the tag a tool is asked for (`oci-archive:file.tar:0.2.0`),
// and the full name containerd (and Docker with its image store) gives the
// image when loading the archive.
const (
	RefNameAnnotation        = "org.opencontainers.image.ref.name"
	ContainerdNameAnnotation = "io.containerd.image.name"
)

// archOf maps an ELF machine to the GOARCH that the image config and the
// index's platform name.
var archOf = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
}

// variantOf is the platform variant of an architecture: the image spec names
// v8 for arm64 (containerd and Docker treat an empty one as v8 too).
func variantOf(arch string) string {
	if arch == "arm64" {
		return "v8"
	}
	return ""
}

// Index returns an OCI image index (application/vnd.oci.image.index.v1+json)
// of imgs, each listed with the platform its config names, so that a
// runtime pulls the image of its own architecture. Two images of one
// platform are an error.
func Index(imgs []v1.Image) (v1.ImageIndex, error) {
	if len(imgs) == 0 {
		return nil, errors.New("image index: no images")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	var adds []mutate.IndexAddendum
	for _, img := range imgs {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("image index: %w", err)
		}
		p := cf.Platform()
		if p == nil || p.OS == "" || p.Architecture == "" {
			return nil, errors.New("image index: an image's config names no os or architecture")
		}
		if seen[p.String()] {
			return nil, fmt.Errorf("image index: two images for %s", p)
		}
		seen[p.String()] = true
		mt, err := img.MediaType()
		if err != nil {
			return nil, fmt.Errorf("image index: %w", err)
		}
		if mt != types.OCIManifestSchema1 {
			return nil, fmt.Errorf("image index: manifest media type %s, want %s", mt, types.OCIManifestSchema1)
		}
		adds = append(adds, mutate.IndexAddendum{
			Add:        containerImage{img},
			Descriptor: v1.Descriptor{MediaType: mt, Platform: p},
		})
	}
	return mutate.AppendManifests(idx, adds...), nil
}

// containerImage is an image whose descriptor in an index has no
// artifactType: the library fills it with the config's media type, which the
// image spec allows, but an index of container images as container tools
// write it (and registries show it) has none.
type containerImage struct{ v1.Image }

// ArtifactType is the empty string: a container image is no artifact.
func (containerImage) ArtifactType() (string, error) { return "", nil }

// WriteLayout writes idx as an OCI image layout in dir (oci-layout,
// index.json, blobs/sha256/...): index.json lists the one index, annotated
// with tag as its reference name and ref (repository:tag) as containerd's
// image name. dir must not exist or be empty.
func WriteLayout(dir, ref, tag string, idx v1.ImageIndex) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("image layout %s: not empty", dir)
	}
	top := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add: idx,
		Descriptor: v1.Descriptor{
			MediaType: types.OCIImageIndex,
			Annotations: map[string]string{
				RefNameAnnotation:        tag,
				ContainerdNameAnnotation: ref,
			},
		},
	})
	if _, err := layout.Write(dir, top); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	return nil
}

// WriteOCIArchive writes idx as an OCI layout packed in a tar at path (what
// `skopeo copy oci-archive:path:tag` and `crane push` read), its entries
// sorted, owned by root and stamped with mtime, so the same index gives the
// same bytes; a zero mtime is the Unix epoch.
func WriteOCIArchive(path, ref, tag string, idx v1.ImageIndex, mtime time.Time) (err error) {
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".oci-layout-")
	if err != nil {
		return fmt.Errorf("oci archive: %w", err)
	}
	defer func() {
		if rerr := os.RemoveAll(tmp); err == nil && rerr != nil {
			err = fmt.Errorf("oci archive: %w", rerr)
		}
	}()
	if err := WriteLayout(tmp, ref, tag, idx); err != nil {
		return err
	}
	if _, err := CheckLayout(tmp, tag); err != nil {
		return err
	}
	var paths []string
	err = filepath.WalkDir(tmp, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != tmp {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("oci archive: %w", err)
	}
	slices.Sort(paths)

	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("oci archive: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("oci archive: %w", cerr)
		}
	}()
	tw := tar.NewWriter(out)
	for _, p := range paths {
		if err := addToArchive(tw, tmp, p, mtime.UTC()); err != nil {
			return fmt.Errorf("oci archive %s: %w", path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("oci archive %s: %w", path, err)
	}
	return nil
}

func addToArchive(tw *tar.Writer, root, p string, mtime time.Time) error {
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return err
	}
	rel = filepath.ToSlash(rel)
	st, err := os.Lstat(p)
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: rel, ModTime: mtime, Uname: "root", Gname: "root", Format: tar.FormatPAX}
	switch {
	case st.IsDir():
		hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, rel+"/", 0o755
		return tw.WriteHeader(hdr)
	case st.Mode().IsRegular():
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, st.Size()
	default:
		return fmt.Errorf("%s: not a file or directory", rel)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// What CheckLayout reads: the parts of the image spec's JSON it checks,
// declared here rather than taken from the library that wrote the layout.
type (
	specDescriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Platform    *specPlatform     `json:"platform,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	specPlatform struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Variant      string `json:"variant,omitempty"`
	}
	specIndex struct {
		SchemaVersion int              `json:"schemaVersion"`
		MediaType     string           `json:"mediaType"`
		Manifests     []specDescriptor `json:"manifests"`
	}
	specManifest struct {
		SchemaVersion int              `json:"schemaVersion"`
		MediaType     string           `json:"mediaType"`
		Config        specDescriptor   `json:"config"`
		Layers        []specDescriptor `json:"layers"`
	}
	specConfig struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Variant      string `json:"variant,omitempty"`
	}
)

// LayoutImage is one image of the index CheckLayout read.
type LayoutImage struct {
	// OS, Architecture and Variant are the platform the index lists it
	// with, the same as its config's.
	OS, Architecture, Variant string
	// Manifest and Config are the digests of its manifest and config.
	Manifest, Config string
	// Layers are the paths of its layer blobs, in order.
	Layers []string
}

// maxJSONBytes bounds an index, manifest or config blob read into memory.
const maxJSONBytes = 4 << 20

// CheckLayout reads the OCI image layout in dir as the image spec lays it
// out and returns the images of the index that index.json lists under the
// reference name tag. Every blob reached (the index, the manifests, the
// configs and the layers) must be at blobs/sha256/<digest>, of the size its
// descriptor says and with that SHA-256; each manifest's platform must be its
// config's.
func CheckLayout(dir, tag string) ([]LayoutImage, error) {
	var ol struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := readJSON(filepath.Join(dir, "oci-layout"), &ol); err != nil {
		return nil, err
	}
	if ol.Version != "1.0.0" {
		return nil, fmt.Errorf("oci layout %s: imageLayoutVersion %q, want 1.0.0", dir, ol.Version)
	}
	var top specIndex
	if err := readJSON(filepath.Join(dir, "index.json"), &top); err != nil {
		return nil, err
	}
	if err := checkIndex(top); err != nil {
		return nil, fmt.Errorf("oci layout %s: index.json: %w", dir, err)
	}
	var found *specDescriptor
	for i, d := range top.Manifests {
		if d.Annotations[RefNameAnnotation] == tag {
			if found != nil {
				return nil, fmt.Errorf("oci layout %s: two manifests named %q", dir, tag)
			}
			found = &top.Manifests[i]
		}
	}
	if found == nil {
		return nil, fmt.Errorf("oci layout %s: no manifest named %q", dir, tag)
	}
	if found.MediaType != string(types.OCIImageIndex) {
		return nil, fmt.Errorf("oci layout %s: %q is a %s, not an image index", dir, tag, found.MediaType)
	}
	var idx specIndex
	if err := readBlobJSON(dir, *found, &idx); err != nil {
		return nil, err
	}
	if err := checkIndex(idx); err != nil {
		return nil, fmt.Errorf("oci layout %s: index %s: %w", dir, found.Digest, err)
	}
	var imgs []LayoutImage
	for _, d := range idx.Manifests {
		if d.MediaType != string(types.OCIManifestSchema1) {
			return nil, fmt.Errorf("oci layout %s: manifest %s is a %s", dir, d.Digest, d.MediaType)
		}
		if d.Platform == nil {
			return nil, fmt.Errorf("oci layout %s: manifest %s has no platform", dir, d.Digest)
		}
		var m specManifest
		if err := readBlobJSON(dir, d, &m); err != nil {
			return nil, err
		}
		if m.SchemaVersion != 2 || m.MediaType != d.MediaType {
			return nil, fmt.Errorf("oci layout %s: manifest %s: schemaVersion %d, mediaType %q", dir, d.Digest, m.SchemaVersion, m.MediaType)
		}
		if m.Config.MediaType != string(types.OCIConfigJSON) {
			return nil, fmt.Errorf("oci layout %s: config %s is a %s", dir, m.Config.Digest, m.Config.MediaType)
		}
		var cf specConfig
		if err := readBlobJSON(dir, m.Config, &cf); err != nil {
			return nil, err
		}
		if p := *d.Platform; cf != specConfig(p) {
			return nil, fmt.Errorf("oci layout %s: manifest %s listed for %+v, its config says %+v", dir, d.Digest, p, cf)
		}
		img := LayoutImage{
			OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant,
			Manifest: d.Digest, Config: m.Config.Digest,
		}
		for _, l := range m.Layers {
			if l.MediaType != string(types.OCILayer) {
				return nil, fmt.Errorf("oci layout %s: layer %s is a %s", dir, l.Digest, l.MediaType)
			}
			p, err := checkBlob(dir, l)
			if err != nil {
				return nil, err
			}
			img.Layers = append(img.Layers, p)
		}
		imgs = append(imgs, img)
	}
	return imgs, nil
}

func checkIndex(idx specIndex) error {
	if idx.SchemaVersion != 2 {
		return fmt.Errorf("schemaVersion %d, want 2", idx.SchemaVersion)
	}
	if idx.MediaType != string(types.OCIImageIndex) {
		return fmt.Errorf("mediaType %q, want %s", idx.MediaType, types.OCIImageIndex)
	}
	if len(idx.Manifests) == 0 {
		return errors.New("no manifests")
	}
	return nil
}

func readJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("oci layout: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxJSONBytes+1))
	if err != nil {
		return fmt.Errorf("oci layout %s: %w", path, err)
	}
	if len(b) > maxJSONBytes {
		return fmt.Errorf("oci layout %s: larger than %d bytes", path, maxJSONBytes)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("oci layout %s: %w", path, err)
	}
	return nil
}

func readBlobJSON(dir string, d specDescriptor, v any) error {
	if d.Size > maxJSONBytes {
		return fmt.Errorf("oci layout %s: blob %s of %d bytes", dir, d.Digest, d.Size)
	}
	p, err := checkBlob(dir, d)
	if err != nil {
		return err
	}
	return readJSON(p, v)
}

// checkBlob returns the path of d's blob once its size and SHA-256 are
// the descriptor's.
func checkBlob(dir string, d specDescriptor) (string, error) {
	hexSum, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok || len(hexSum) != sha256.Size*2 || strings.Trim(hexSum, "0123456789abcdef") != "" {
		return "", fmt.Errorf("oci layout %s: digest %q is not a sha256 one", dir, d.Digest)
	}
	p := filepath.Join(dir, "blobs", "sha256", hexSum)
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("oci layout: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", fmt.Errorf("oci layout %s: %w", p, err)
	}
	if n != d.Size {
		return "", fmt.Errorf("oci layout %s: %d bytes, the descriptor says %d", p, n, d.Size)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != hexSum {
		return "", fmt.Errorf("oci layout %s: sha256 is %s", p, got)
	}
	return p, nil
}
