package pprofexporter

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/sonde-dev/sonde/exporter/pprofexporter/internal/metadata"
)

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatalf("load testdata: %v", err)
	}
	withDefaults := func(edit func(*Config)) *Config {
		c := createDefaultConfig()
		edit(c)
		return c
	}
	tests := []struct {
		id               component.ID
		want             *Config // nil when unmarshalling fails
		wantUnmarshalErr string
		wantInvalid      []string
	}{
		{id: component.NewID(metadata.Type), want: createDefaultConfig()},
		{
			id: component.NewIDWithName(metadata.Type, "custom"),
			want: withDefaults(func(c *Config) {
				c.Directory = "/var/lib/profiles"
				c.SplitBy = SplitService
				c.MaxFiles = 10
				c.MaxAge = time.Hour
				c.Folded = true
				c.LogTop = 5
				c.LogStacks = 3
				c.FileMode = 0o640
			}),
		},
		{
			id:   component.NewIDWithName(metadata.Type, "mode_number"),
			want: withDefaults(func(c *Config) { c.FileMode = 0o644 }),
		},
		{
			id:   component.NewIDWithName(metadata.Type, "mode_0o"),
			want: withDefaults(func(c *Config) { c.FileMode = 0o660 }),
		},
		{
			id:   component.NewIDWithName(metadata.Type, "executable"),
			want: withDefaults(func(c *Config) { c.SplitBy = SplitExecutable }),
		},
		{
			id: component.NewIDWithName(metadata.Type, "invalid_all"),
			want: withDefaults(func(c *Config) {
				c.Directory = ""
				c.SplitBy = "pid"
				c.MaxFiles = -1
				c.MaxAge = -time.Second
				c.LogTop = 5000
				c.LogStacks = -1
				c.FileMode = 600
			}),
			wantInvalid: []string{
				"directory: must not be empty",
				`split_by: must be none, service or executable, got "pid"`,
				"max_files: must be between 0 and 1000000, got -1",
				"max_age: must not be negative, got -1s",
				"log_top: must be between 0 and 1000, got 5000",
				"log_stacks: must be between 0 and 1000, got -1",
				`file_mode: must be permission bits within 0777, got 01130 (write it in octal, e.g. "0640")`,
				"file_mode: the owner must be able to read and write, got 01130",
			},
		},
		{id: component.NewIDWithName(metadata.Type, "mode_not_octal"), wantUnmarshalErr: `file mode "rw-r-----"`},
		{id: component.NewIDWithName(metadata.Type, "unknown_key"), wantUnmarshalErr: "path"},
	}
	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			sub, err := cm.Sub(tt.id.String())
			if err != nil {
				t.Fatal(err)
			}
			cfg := NewFactory().CreateDefaultConfig()
			err = sub.Unmarshal(cfg)
			if tt.wantUnmarshalErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantUnmarshalErr) {
					t.Fatalf("unmarshal error = %v, want one containing %q", err, tt.wantUnmarshalErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if diff := cmp.Diff(tt.want, cfg, cmpopts.IgnoreUnexported(Config{})); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			var got []string
			if err := cfg.(*Config).Validate(); err != nil {
				got = strings.Split(err.Error(), "\n")
			}
			if diff := cmp.Diff(tt.wantInvalid, got); diff != "" {
				t.Errorf("Validate messages (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSanitizeKey(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "checkout-v2.1_a", "checkout-v2.1_a"},
		{"path traversal", "../../etc/passwd", ".._.._etc_passwd"},
		{"spaces and colon", "unknown_service:my app", "unknown_service_my_app"},
		{"non-ASCII", "dienst-ä", "dienst-__"},
		{"too long", strings.Repeat("a", 100), strings.Repeat("a", maxKeyLength)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sanitizeKey(tc.in); got != tc.want {
				t.Errorf("sanitizeKey(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
