// Package release writes the artifacts of a Sonde release from a built
// otelcol-profiling: a versioned tarball of the static binary, a CycloneDX
// SBOM derived from the binary's own build information, the packaged Helm
// chart, and a SHA256SUMS file over everything in the release directory.
//
// Every writer is deterministic for the same inputs and time, so a release
// can be rebuilt and compared byte for byte. Nothing here is shared; the
// functions are safe for concurrent use on different paths.
package release

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
)

// File is one file put into the tarball.
type File struct {
	// Src is the file on disk; Name its path inside the archive.
	Src, Name string
	// Mode is the permission in the archive.
	Mode int64
}

// WriteTarball writes a gzipped tar of files to path, each with the time
// mtime, owned by root, in the order given, under the directory prefix.
func WriteTarball(path, prefix string, mtime time.Time, files []File) (err error) {
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("tarball: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	gz, err := gzip.NewWriterLevel(out, gzip.BestCompression)
	if err != nil {
		return fmt.Errorf("tarball: %w", err)
	}
	gz.ModTime = mtime
	tw := tar.NewWriter(gz)
	for _, f := range files {
		if err := addFile(tw, prefix, mtime, f); err != nil {
			return fmt.Errorf("tarball %s: %w", path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("tarball %s: %w", path, err)
	}
	if err := gz.Close(); err != nil {
		return fmt.Errorf("tarball %s: %w", path, err)
	}
	return nil
}

func addFile(tw *tar.Writer, prefix string, mtime time.Time, f File) error {
	in, err := os.Open(f.Src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", f.Src)
	}
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     filepath.ToSlash(filepath.Join(prefix, f.Name)),
		Size:     st.Size(),
		Mode:     f.Mode,
		ModTime:  mtime,
		Uname:    "root",
		Gname:    "root",
		Format:   tar.FormatPAX,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.Copy(tw, in); err != nil {
		return fmt.Errorf("%s: %w", f.Src, err)
	}
	return nil
}

// PackageChart packages the chart in dir into destDir as
// <name>-<version>.tgz with both the chart's version and appVersion set to
// version, as `helm package --version V --app-version V` does, and returns
// the file's path.
func PackageChart(dir, destDir, version string) (string, error) {
	c, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("chart %s: %w", dir, err)
	}
	p := action.NewPackage()
	p.Version = version
	p.AppVersion = version
	p.Destination = destDir
	path, err := p.Run(dir, nil)
	if err != nil {
		return "", fmt.Errorf("package chart %s: %w", c.Name(), err)
	}
	return path, nil
}

// WriteChecksums writes dir/SHA256SUMS over the regular files in dir (the
// sums file aside), sorted by name, in the format `sha256sum -c` reads.
func WriteChecksums(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("checksums: %w", err)
	}
	var b strings.Builder
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == SumsFile {
			continue
		}
		sum, err := fileSHA256(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", fmt.Errorf("checksums: %w", err)
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, e.Name())
	}
	path := filepath.Join(dir, SumsFile)
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("checksums: %w", err)
	}
	return path, nil
}

// SumsFile is the name of the checksum file in a release directory.
const SumsFile = "SHA256SUMS"

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// CycloneDX 1.5 JSON, the part of it an SBOM of a Go binary needs.
type (
	// BOM is the document.
	BOM struct {
		BOMFormat    string       `json:"bomFormat"`
		SpecVersion  string       `json:"specVersion"`
		SerialNumber string       `json:"serialNumber"`
		Version      int          `json:"version"`
		Metadata     BOMMetadata  `json:"metadata"`
		Components   []Component  `json:"components"`
		Dependencies []Dependency `json:"dependencies"`
	}
	// BOMMetadata says when and by which tool the BOM was written, and of
	// which binary.
	BOMMetadata struct {
		Timestamp string    `json:"timestamp"`
		Tools     BOMTools  `json:"tools"`
		Component Component `json:"component"`
	}
	// BOMTools lists the tools that wrote the BOM.
	BOMTools struct {
		Components []Component `json:"components"`
	}
	// Component is the binary, or a module or the standard library linked
	// into it.
	Component struct {
		Type       string     `json:"type"`
		BOMRef     string     `json:"bom-ref,omitempty"`
		Name       string     `json:"name"`
		Version    string     `json:"version,omitempty"`
		PURL       string     `json:"purl,omitempty"`
		Hashes     []Hash     `json:"hashes,omitempty"`
		Licenses   []License  `json:"licenses,omitempty"`
		Properties []Property `json:"properties,omitempty"`
	}
	// Hash is a digest of a component.
	Hash struct {
		Alg     string `json:"alg"`
		Content string `json:"content"`
	}
	// License is a component's licence, as an SPDX identifier.
	License struct {
		License struct {
			ID string `json:"id"`
		} `json:"license"`
	}
	// Property is a name-value pair CycloneDX has no field for.
	Property struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	// Dependency lists the components one component depends on.
	Dependency struct {
		Ref       string   `json:"ref"`
		DependsOn []string `json:"dependsOn"`
	}
)

// SBOM builds a CycloneDX SBOM of the Go binary at path from its embedded
// build information: the binary as the main component (name, version,
// SHA-256 of the file, Go version and build settings as properties), and
// every module linked into it, with the version and go.sum hash the build
// used (a replaced module is listed as its replacement). Only what the
// binary records is claimed: no licences are guessed for dependencies.
func SBOM(path, name, version, license string, timestamp time.Time) (*BOM, error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sbom %s: %w", path, err)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return nil, fmt.Errorf("sbom: %w", err)
	}
	main := Component{
		Type:    "application",
		BOMRef:  "pkg:golang/" + info.Main.Path + "@" + version,
		Name:    name,
		Version: version,
		PURL:    "pkg:golang/" + info.Main.Path + "@" + version,
		Hashes:  []Hash{{Alg: "SHA-256", Content: sum}},
		Properties: []Property{
			{Name: "go:version", Value: info.GoVersion},
			{Name: "go:main_module", Value: info.Main.Path},
		},
	}
	if license != "" {
		var l License
		l.License.ID = license
		main.Licenses = []License{l}
	}
	for _, s := range info.Settings {
		main.Properties = append(main.Properties, Property{Name: "go:build:" + s.Key, Value: s.Value})
	}
	bom := &BOM{
		BOMFormat:   "CycloneDX",
		SpecVersion: "1.5",
		// The serial number follows from the binary: the same binary gives
		// the same SBOM.
		SerialNumber: "urn:uuid:" + uuidFrom(sum),
		Version:      1,
		Metadata: BOMMetadata{
			Timestamp: timestamp.UTC().Format(time.RFC3339),
			Tools: BOMTools{Components: []Component{{
				Type: "application", Name: "sonde-release", Version: version,
			}}},
			Component: main,
		},
	}
	std := Component{
		Type: "library", BOMRef: "pkg:golang/stdlib@" + info.GoVersion, Name: "stdlib",
		Version: info.GoVersion, PURL: "pkg:golang/stdlib@" + info.GoVersion,
	}
	bom.Components = append(bom.Components, std)
	refs := []string{std.BOMRef}
	for _, d := range info.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		c := Component{Type: "library", Name: m.Path, Version: m.Version}
		if strings.HasPrefix(m.Path, ".") || strings.HasPrefix(m.Path, "/") || m.Version == "" || m.Version == "(devel)" {
			// A local replacement (the repository itself): no version on
			// any proxy, so no purl that could resolve to other code.
			c.BOMRef = "local:" + d.Path
			c.Name = d.Path
			c.Version = version
			c.Properties = []Property{{Name: "go:replaced_by", Value: m.Path}}
		} else {
			c.PURL = "pkg:golang/" + m.Path + "@" + m.Version
			c.BOMRef = c.PURL
			if h := h1Hash(m); h != "" {
				c.Hashes = []Hash{{Alg: "SHA-256", Content: h}}
				c.Properties = append(c.Properties, Property{Name: "go:sum", Value: m.Sum})
			}
		}
		if d.Replace != nil && c.Properties == nil {
			c.Properties = []Property{{Name: "go:replaces", Value: d.Path + "@" + d.Version}}
		}
		bom.Components = append(bom.Components, c)
		refs = append(refs, c.BOMRef)
	}
	slices.SortFunc(bom.Components[1:], func(a, b Component) int { return strings.Compare(a.BOMRef, b.BOMRef) })
	slices.Sort(refs)
	bom.Dependencies = []Dependency{{Ref: main.BOMRef, DependsOn: refs}}
	return bom, nil
}

// h1Hash returns the SHA-256 of a go.sum "h1:" hash in hex (the hash of the
// module's file list, as the checksum database records it).
func h1Hash(m *debug.Module) string {
	b64, ok := strings.CutPrefix(m.Sum, "h1:")
	if !ok {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != sha256.Size {
		return ""
	}
	return hex.EncodeToString(raw)
}

// uuidFrom formats the first 16 bytes of a hex SHA-256 as a version-5-style
// UUID (name-based: the variant and version bits set).
func uuidFrom(sum string) string {
	b, _ := hex.DecodeString(sum[:32])
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// WriteSBOM writes bom as indented JSON.
func WriteSBOM(path string, bom *BOM) error {
	b, err := json.MarshalIndent(bom, "", "  ")
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	return nil
}
