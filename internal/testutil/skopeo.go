package testutil

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"testing"
)

// ImageConfig is what skopeo says of the image an OCI reference gives
// for a platform: its config's OS, architecture and labels, and the
// digest of the config's bytes.
type ImageConfig struct {
	OS, Architecture string
	Labels           map[string]string
	Digest           string
}

// SkopeoConfig runs skopeo (the path given) to pick the linux/arch image of
// ref (an index holding several) and read its config, raw: the bytes the
// config's digest is taken of.
func SkopeoConfig(tb testing.TB, skopeo, ref, arch string) ImageConfig {
	tb.Helper()
	cfg, err := exec.Command(skopeo, "inspect", "--override-os", "linux", "--override-arch", arch,
		"--config", "--raw", ref).Output()
	if err != nil {
		tb.Fatalf("skopeo inspect --config --override-arch %s %s: %v", arch, ref, err)
	}
	var insp struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			Labels map[string]string `json:"Labels"`
		} `json:"config"`
	}
	if err := json.Unmarshal(cfg, &insp); err != nil {
		tb.Fatalf("skopeo inspect --config: %v\n%s", err, cfg)
	}
	sum := sha256.Sum256(cfg)
	return ImageConfig{OS: insp.OS, Architecture: insp.Architecture, Labels: insp.Config.Labels,
		Digest: "sha256:" + hex.EncodeToString(sum[:])}
}
