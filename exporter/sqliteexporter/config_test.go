package sqliteexporter

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/sonde-dev/sonde/exporter/sqliteexporter/internal/metadata"
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
		want             *Config
		wantUnmarshalErr string
		wantInvalid      []string
	}{
		{id: component.NewID(metadata.Type), want: createDefaultConfig()},
		{
			id: component.NewIDWithName(metadata.Type, "custom"),
			want: withDefaults(func(c *Config) {
				c.Path = "/var/lib/sonde/profiles.db"
				c.MaxAge = 2 * time.Hour
				c.MaxSizeMiB = 64
			}),
		},
		{
			id:   component.NewIDWithName(metadata.Type, "unbounded"),
			want: withDefaults(func(c *Config) { c.MaxAge = 0; c.MaxSizeMiB = 0 }),
		},
		{
			id: component.NewIDWithName(metadata.Type, "invalid_all"),
			want: withDefaults(func(c *Config) {
				c.Path = ""
				c.MaxAge = -time.Second
				c.MaxSizeMiB = -1
			}),
			wantInvalid: []string{
				"path: must not be empty",
				"max_age: must not be negative, got -1s",
				"max_size_mib: must be between 0 and 1048576, got -1",
			},
		},
		{id: component.NewIDWithName(metadata.Type, "unknown_key"), wantUnmarshalErr: "directory"},
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
