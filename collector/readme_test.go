package collector

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
)

// TestREADMEStatus checks the status table against the generated metadata,
// so the README cannot drift from metadata.yaml.
func TestREADMEStatus(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := []struct{ label, value string }{
		{"Type", "`" + metadata.Type.String() + "`"},
		{"Stability", "[" + strings.ToLower(metadata.ProfilesStability.String()) + "]: profiles"},
		{"Distributions", "[otelcol-profiling]"},
	}
	for _, r := range rows {
		re := regexp.MustCompile(`(?m)^\|\s*` + regexp.QuoteMeta(r.label) + `\s*\|\s*` + regexp.QuoteMeta(r.value) + `\s*\|$`)
		if !re.Match(readme) {
			t.Errorf("README.md status table has no row %q with value %q", r.label, r.value)
		}
	}
}

// TestREADMEConfigExample checks that the first YAML example in the README
// names every key with its default: unmarshalled into a zero Config it must
// equal the factory's default config.
func TestREADMEConfigExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no ```yaml example")
	}
	path := filepath.Join(t.TempDir(), "example.yaml")
	if err := os.WriteFile(path, m[1], 0o600); err != nil {
		t.Fatal(err)
	}
	cm, err := confmaptest.LoadConf(path)
	if err != nil {
		t.Fatalf("README example is not valid YAML: %v", err)
	}
	sub, err := cm.Sub("receivers::" + metadata.Type.String())
	if err != nil {
		t.Fatal(err)
	}
	var got Config // zero, so a key missing from the example shows up as a diff
	if err := sub.Unmarshal(&got); err != nil {
		t.Fatalf("README example does not unmarshal: %v", err)
	}
	if diff := cmp.Diff(createDefaultConfig(), &got, ignoreBlank); diff != "" {
		t.Errorf("README example differs from the defaults (-want +got):\n%s", diff)
	}
}
