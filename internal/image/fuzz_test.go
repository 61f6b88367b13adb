package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// FuzzCheckLayout gives CheckLayout a layout whose inner index and one
// manifest are arbitrary bytes, each stored under its own digest so the
// walk reaches them: it must return an error or images, never panic.
func FuzzCheckLayout(f *testing.F) {
	manifest := `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",` +
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:` +
		fmt.Sprintf("%064x", 0) + `","size":2},"layers":[]}`
	ms := sha256.Sum256([]byte(manifest))
	index := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[`+
		`{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%x","size":%d,`+
		`"platform":{"os":"linux","architecture":"arm64","variant":"v8"}}]}`, ms, len(manifest))
	f.Add([]byte(index), []byte(manifest))
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{}]}`), []byte(manifest))
	f.Add([]byte(`{`), []byte(`null`))
	f.Fuzz(func(t *testing.T, index, manifest []byte) {
		dir := t.TempDir()
		blobs := filepath.Join(dir, "blobs", "sha256")
		if err := os.MkdirAll(blobs, 0o755); err != nil {
			t.Fatal(err)
		}
		put := func(b []byte) string {
			s := sha256.Sum256(b)
			h := hex.EncodeToString(s[:])
			if err := os.WriteFile(filepath.Join(blobs, h), b, 0o644); err != nil {
				t.Fatal(err)
			}
			return h
		}
		put(manifest)
		top := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[`+
			`{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:%s","size":%d,`+
			`"annotations":{"org.opencontainers.image.ref.name":"1"}}]}`, put(index), len(index))
		writeFile(t, filepath.Join(dir, "index.json"), top)
		writeFile(t, filepath.Join(dir, "oci-layout"), `{"imageLayoutVersion":"1.0.0"}`)
		imgs, err := CheckLayout(dir, "1")
		if err == nil && len(imgs) == 0 {
			t.Error("CheckLayout found no image and no error")
		}
	})
}
