package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"no build info", nil, false, "devel"},
		{"main module tagged", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "v1.2.3"}}, true, "v1.2.3"},
		{"main module untagged", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "(devel)"}}, true, "devel"},
		{"a dependency of a distribution", &debug.BuildInfo{
			Main: debug.Module{Path: "example.com/otelcol", Version: "(devel)"},
			Deps: []*debug.Module{{Path: "go.opentelemetry.io/collector", Version: "v1.0.0"}, {Path: ModulePath, Version: "v0.4.0"}},
		}, true, "v0.4.0"},
		{"a replaced dependency", &debug.BuildInfo{
			Main: debug.Module{Path: "example.com/otelcol"},
			Deps: []*debug.Module{{Path: ModulePath, Version: "v0.4.0", Replace: &debug.Module{Path: "../sonde", Version: "v0.4.1"}}},
		}, true, "v0.4.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(tc.bi, tc.ok); got != tc.want {
				t.Errorf("fromBuildInfo = %q, want %q", got, tc.want)
			}
		})
	}
}

// A binary built with -ldflags -X carries that version.
func TestLinkerSetsVersion(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(`package main

import (
	"fmt"

	"github.com/sonde-dev/sonde/internal/version"
)

func main() { fmt.Print(version.Get()) }
`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Build inside the module, so the internal package may be imported.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	cmdDir, err := os.MkdirTemp(wd, "tmpmain-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(cmdDir); err != nil {
			t.Error(err)
		}
	})
	if err := os.Rename(src, filepath.Join(cmdDir, "main.go")); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "v")
	build := exec.Command(goBin, "build", "-o", bin,
		"-ldflags", "-X github.com/sonde-dev/sonde/internal/version.Version=9.8.7", "./"+filepath.Base(cmdDir))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "9.8.7" {
		t.Errorf("version = %q, want 9.8.7", got)
	}
}
