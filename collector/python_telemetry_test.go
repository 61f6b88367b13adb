//go:build linux

package collector

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/collector/internal/metadatatest"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/profiler"
)

// TestPythonTelemetry profiles a real CPython 3.12 workload and checks the
// sonde.python.* metrics against the profiler's own counts: the process is
// walked, frames are reported and named, and the code object cache holds
// bytes within its share of limits::symbol_cache_bytes.
func TestPythonTelemetry(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	home, _ := os.UserHomeDir()
	bin := filepath.Join(home, ".pyenv", "versions", "3.12.1", "bin", "python3")
	if _, err := os.Stat(bin); err != nil {
		if testutil.InCI() {
			t.Fatalf("interpreter %s missing", bin)
		}
		t.Skipf("interpreter %s missing", bin)
	}
	wl, err := filepath.Abs(filepath.Join("..", "internal", "python", "testdata", "workload.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, wl, "burn")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartCmd(t, cmd)
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("workload: %q, %v", line, err)
	}

	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { _ = tt.Shutdown(context.Background()) })
	cfg := createDefaultConfig()
	cfg.SamplesPerSecond = 99
	cfg.ReporterInterval = 300 * time.Millisecond
	cfg.Limits.SymbolCacheBytes = 16 << 20
	set := metadatatest.NewSettings(tt)
	set.Logger = zaptest.NewLogger(t)
	rcv, err := createProfiles(context.Background(), set, cfg, new(consumertest.ProfilesSink))
	if err != nil {
		t.Fatal(err)
	}
	r := rcv.(*profilesReceiver)
	if err := r.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})

	// Wait until the workload's frames were walked and named.
	var m collected
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(60 * time.Second); ; {
		m = collect(t, tt)
		if m.sum("sonde.python.frames") > 0 && m.sum("sonde.python.code_cache.size") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no python frames named in 60s: frames %d, code cache %d bytes",
				m.sum("sonde.python.frames"), m.sum("sonde.python.code_cache.size"))
		}
		<-tick.C
	}
	m, ps := quietCollect(t, tt, "python", func() profiler.PythonStats { return r.prof.Stats().Python })
	for _, name := range []string{
		"sonde.python.processes", "sonde.python.versions.unknown", "sonde.python.walks", "sonde.python.frames",
		"sonde.python.frames.unnamed", "sonde.python.errors", "sonde.python.code_cache.size", "sonde.python.code_cache.resets",
	} {
		if len(m[name]) == 0 {
			t.Errorf("metric %s not reported", name)
		}
	}
	t.Logf("python: %+v; walks %d, frames %d, errors %d", ps, m.sum("sonde.python.walks"),
		m.sum("sonde.python.frames"), m.sum("sonde.python.errors"))
	if n := m.sum("sonde.python.processes", attribute.String("outcome", "walked")); n < 1 || n != int64(ps.Processes) {
		t.Errorf("sonde.python.processes{walked} = %d, want the profiler's %d, at least 1", n, ps.Processes)
	}
	if n := m.sum("sonde.python.processes", attribute.String("outcome", "unsupported")); n != int64(ps.Unsupported) {
		t.Errorf("sonde.python.processes{unsupported} = %d, want the profiler's %d", n, ps.Unsupported)
	}
	if n := m.sum("sonde.python.frames.unnamed"); n != int64(ps.Unnamed) {
		t.Errorf("sonde.python.frames.unnamed = %d, want the profiler's %d", n, ps.Unnamed)
	}
	if n := m.sum("sonde.python.walks"); n <= 0 {
		t.Errorf("sonde.python.walks = %d, want > 0", n)
	}
	if n := len(m["sonde.python.errors"]); n != 3 {
		t.Errorf("sonde.python.errors has %d points, want one per reason (3)", n)
	}
	size := m.sum("sonde.python.code_cache.size")
	if size != ps.CacheBytes || size <= 0 || size > cfg.Limits.SymbolCacheBytes/8 {
		t.Errorf("sonde.python.code_cache.size = %d, want the profiler's %d, in 1..%d (an eighth of symbol_cache_bytes)",
			size, ps.CacheBytes, cfg.Limits.SymbolCacheBytes/8)
	}
	if n := m.sum("sonde.symbolize.cache.size"); n > cfg.Limits.SymbolCacheBytes-cfg.Limits.SymbolCacheBytes/8 {
		t.Errorf("sonde.symbolize.cache.size = %d, want within the other seven eighths, %d", n, cfg.Limits.SymbolCacheBytes-cfg.Limits.SymbolCacheBytes/8)
	}
}
