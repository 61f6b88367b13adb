package collector

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/confmap/confmaptest"
	"go.yaml.in/yaml/v3"

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

// metricRow is one metric as the README's telemetry table describes it.
type metricRow struct {
	Type, Unit, Attributes string
}

// TestREADMETelemetry checks that the README's telemetry table lists exactly
// the metrics metadata.yaml declares, each with its type, unit and
// attributes.
func TestREADMETelemetry(t *testing.T) {
	raw, err := os.ReadFile("metadata.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var md struct {
		Attributes map[string]struct {
			NameOverride string `yaml:"name_override"`
		}
		Telemetry struct {
			Metrics map[string]struct {
				Prefix     string
				Unit       string
				Sum        *struct{ Monotonic bool }
				Gauge      *struct{}
				Histogram  *struct{}
				Attributes []string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &md); err != nil {
		t.Fatalf("metadata.yaml: %v", err)
	}
	want := map[string]metricRow{}
	for key, m := range md.Telemetry.Metrics {
		row := metricRow{Unit: "`" + m.Unit + "`"}
		switch {
		case m.Gauge != nil:
			row.Type = "gauge"
		case m.Sum != nil && m.Sum.Monotonic:
			row.Type = "counter"
		case m.Sum != nil:
			row.Type = "updowncounter"
		case m.Histogram != nil:
			row.Type = "histogram"
		default:
			t.Errorf("metadata.yaml: metric %s is neither a sum, a gauge nor a histogram", key)
		}
		var names []string
		for _, a := range m.Attributes {
			name := a
			if o := md.Attributes[a].NameOverride; o != "" {
				name = o
			}
			names = append(names, "`"+name+"`")
		}
		row.Attributes = strings.Join(names, ", ")
		want[m.Prefix+key] = row
	}
	if len(want) == 0 {
		t.Fatal("metadata.yaml declares no telemetry metrics")
	}

	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Telemetry\n")
	if !ok {
		t.Fatal("README.md has no \"## Telemetry\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	got := map[string]metricRow{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		if len(cols) != 5 {
			t.Errorf("README.md telemetry row has %d columns, want 5: %s", len(cols), line)
			continue
		}
		for i := range cols {
			cols[i] = strings.TrimSpace(cols[i])
		}
		name := strings.Trim(cols[0], "`")
		if _, dup := got[name]; dup {
			t.Errorf("README.md lists %s twice", name)
		}
		if cols[4] == "" {
			t.Errorf("README.md does not say what %s means", name)
		}
		got[name] = metricRow{Type: cols[1], Unit: cols[2], Attributes: cols[3]}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("README.md telemetry table differs from metadata.yaml (-want +got):\n%s", diff)
	}
}
