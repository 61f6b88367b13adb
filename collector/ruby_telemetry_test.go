//go:build linux

package collector

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// TestRubyTelemetry profiles internal/ruby's burn.rb with the receiver and
// checks the sonde.ruby.* metrics against the profiler's own counts: the
// process is walked, its frames are reported and named, every error reason
// has its point, and the iseq cache holds bytes within its share of
// limits::symbol_cache_bytes.
func TestRubyTelemetry(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	if runtime.GOARCH != "amd64" {
		t.Skip("the ruby walker runs on x86-64")
	}
	const bin = "/usr/bin/ruby3.1"
	if _, err := os.Stat(bin); err != nil {
		if testutil.InCI() {
			t.Fatalf("%s is missing (CI=true: apt-get install ruby): %v", bin, err)
		}
		t.Skipf("%s is missing: %v", bin, err)
	}
	src, err := filepath.Abs(filepath.Join("..", "internal", "ruby", "testdata", "burn.rb"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, src, "class")
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)

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

	var m collected
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(60 * time.Second); ; {
		m = collect(t, tt)
		if m.sum("sonde.ruby.frames", attribute.String("outcome", "named")) > 0 && m.sum("sonde.ruby.iseq_cache.size") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ruby frames named in 60s: frames %d, iseq cache %d bytes",
				m.sum("sonde.ruby.frames"), m.sum("sonde.ruby.iseq_cache.size"))
		}
		<-tick.C
	}
	m, rs := quietCollect(t, tt, "ruby", func() profiler.RubyStats { return r.prof.Stats().Ruby })
	for _, name := range []string{
		"sonde.ruby.processes", "sonde.ruby.versions.unknown", "sonde.ruby.walks", "sonde.ruby.frames",
		"sonde.ruby.errors", "sonde.ruby.iseq_cache.size", "sonde.ruby.iseq_cache.evictions",
	} {
		if len(m[name]) == 0 {
			t.Errorf("metric %s not reported", name)
		}
	}
	t.Logf("ruby: %+v; walks %d, frames %d, errors %d", rs, m.sum("sonde.ruby.walks"),
		m.sum("sonde.ruby.frames"), m.sum("sonde.ruby.errors"))
	if n := m.sum("sonde.ruby.processes", attribute.String("outcome", "walked")); n < 1 || n != int64(rs.Processes) {
		t.Errorf("sonde.ruby.processes{walked} = %d, want the profiler's %d, at least 1", n, rs.Processes)
	}
	if n := m.sum("sonde.ruby.frames", attribute.String("outcome", "named")); n != int64(rs.Named) {
		t.Errorf("sonde.ruby.frames{named} = %d, want the profiler's %d", n, rs.Named)
	}
	if n := m.sum("sonde.ruby.walks"); n <= 0 {
		t.Errorf("sonde.ruby.walks = %d, want > 0", n)
	}
	if n := len(m["sonde.ruby.errors"]); n != 3 {
		t.Errorf("sonde.ruby.errors has %d points, want one per reason (3)", n)
	}
	size := m.sum("sonde.ruby.iseq_cache.size")
	if size != rs.CacheBytes || size <= 0 || size > cfg.Limits.SymbolCacheBytes/32 {
		t.Errorf("sonde.ruby.iseq_cache.size = %d, want the profiler's %d, in 1..%d (a thirty-second of symbol_cache_bytes)",
			size, rs.CacheBytes, cfg.Limits.SymbolCacheBytes/32)
	}
}
