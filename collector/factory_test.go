package collector

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pipeline"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
)

func TestFactory(t *testing.T) {
	f, ok := NewFactory().(xreceiver.Factory)
	if !ok {
		t.Fatalf("NewFactory() is %T, want an xreceiver.Factory", NewFactory())
	}
	if got, want := f.Type(), component.MustNewType("sonde"); got != want {
		t.Errorf("Type() = %v, want %v", got, want)
	}
	if got, want := f.ProfilesStability(), component.StabilityLevelDevelopment; got != want {
		t.Errorf("ProfilesStability() = %v, want %v", got, want)
	}
	// Profiles only: the other signals must be refused.
	set := receivertest.NewNopSettings(metadata.Type)
	cfg := f.CreateDefaultConfig()
	if _, err := f.CreateTraces(context.Background(), set, cfg, consumertest.NewNop()); !errors.Is(err, pipeline.ErrSignalNotSupported) {
		t.Errorf("CreateTraces error = %v, want %v", err, pipeline.ErrSignalNotSupported)
	}
	if _, err := f.CreateMetrics(context.Background(), set, cfg, consumertest.NewNop()); !errors.Is(err, pipeline.ErrSignalNotSupported) {
		t.Errorf("CreateMetrics error = %v, want %v", err, pipeline.ErrSignalNotSupported)
	}
	if _, err := f.CreateLogs(context.Background(), set, cfg, consumertest.NewNop()); !errors.Is(err, pipeline.ErrSignalNotSupported) {
		t.Errorf("CreateLogs error = %v, want %v", err, pipeline.ErrSignalNotSupported)
	}
}

func TestDefaultConfig(t *testing.T) {
	cfg, ok := NewFactory().CreateDefaultConfig().(*Config)
	if !ok {
		t.Fatalf("CreateDefaultConfig() is %T, want *Config", NewFactory().CreateDefaultConfig())
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("default config does not validate: %v", err)
	}
	// Each call builds a fresh value: no default is shared through package
	// state, so one receiver's config cannot leak into another's.
	cfg.SamplesPerSecond = 997
	cfg.Limits.MaxProcesses = 3
	if diff := cmp.Diff(createDefaultConfig(), NewFactory().CreateDefaultConfig(), ignoreBlank); diff != "" {
		t.Errorf("defaults changed after editing an earlier default config (-want +got):\n%s", diff)
	}
}

func TestCreateProfiles(t *testing.T) {
	f := NewFactory().(xreceiver.Factory)
	set := receivertest.NewNopSettings(metadata.Type)

	// Not started: Start loads eBPF and belongs to the privileged tests.
	r, err := f.CreateProfiles(context.Background(), set, f.CreateDefaultConfig(), consumertest.NewNop())
	if err != nil {
		t.Fatalf("CreateProfiles: %v", err)
	}
	if r == nil {
		t.Fatal("CreateProfiles returned a nil receiver and no error")
	}

	type otherConfig struct{}
	r, err = f.CreateProfiles(context.Background(), set, &otherConfig{}, consumertest.NewNop())
	if err == nil {
		t.Fatal("CreateProfiles with a foreign config type succeeded, want an error")
	}
	if r != nil {
		t.Errorf("CreateProfiles with a foreign config type returned receiver %T, want nil", r)
	}
}

// Start refuses a procfs that is not one, with a clear error: a missing
// path, and a plain directory dressed as one (empty self/stat and
// self/maps), which only its file system type tells apart.
func TestStartRefusesNotAProcFS(t *testing.T) {
	fake := t.TempDir()
	if err := os.MkdirAll(filepath.Join(fake, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"self/stat", "self/maps"} {
		if err := os.WriteFile(filepath.Join(fake, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, root := range []string{"/nonexistent/proc", fake} {
		cfg := createDefaultConfig()
		cfg.ProcFS = root
		r, err := createProfiles(context.Background(), receivertest.NewNopSettings(metadata.Type), cfg, consumertest.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		err = r.Start(context.Background(), componenttest.NewNopHost())
		if err == nil || !strings.Contains(err.Error(), "procfs "+root+" is not a mounted procfs") {
			t.Errorf("Start with procfs %s: %v, want it refused as not a procfs", root, err)
		}
		if err := r.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown after a failed Start: %v", err)
		}
	}
}
