package sqliteexporter

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/exporter/sqliteexporter/internal/metadata"
)

// newDirect returns a started exporter whose clock is *now, and its
// telemetry.
func newDirect(t *testing.T, edit func(*Config), now *time.Time) (*sqliteExporter, *componenttest.Telemetry) {
	t.Helper()
	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { _ = tt.Shutdown(t.Context()) })
	tb, err := metadata.NewTelemetryBuilder(tt.NewTelemetrySettings())
	if err != nil {
		t.Fatal(err)
	}
	cfg := createDefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "profiles.db")
	edit(cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e := newExporter(cfg, zap.NewNop(), tb, func() time.Time { return *now })
	if err := e.start(t.Context(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.shutdown(t.Context()) })
	return e, tt
}

// orphans counts rows that no sample reaches.
const orphans = `SELECT
	(SELECT count(*) FROM stacks WHERE id NOT IN (SELECT stack_id FROM samples)) +
	(SELECT count(*) FROM stack_frames WHERE stack_id NOT IN (SELECT id FROM stacks)) +
	(SELECT count(*) FROM frames WHERE id NOT IN (SELECT frame_id FROM stack_frames)) +
	(SELECT count(*) FROM functions WHERE id NOT IN (SELECT function_id FROM frames WHERE function_id IS NOT NULL)) +
	(SELECT count(*) FROM resources WHERE id NOT IN (SELECT resource_id FROM samples))`

func TestRetentionByAge(t *testing.T) {
	now := epoch.Add(31 * time.Second)
	e, tt := newDirect(t, func(c *Config) { c.MaxAge = 70 * time.Second; c.MaxSizeMiB = 0 }, &now)
	ivs := intervals(5, 7, 200)
	for _, pd := range ivs[:6] {
		if err := e.consumeProfiles(t.Context(), pd); err != nil {
			t.Fatal(err)
		}
	}
	// A minute later the next write deletes the intervals that ended
	// before now - max_age = epoch+21s: those ending at 5, 10, 15 and 20 s.
	now = now.Add(time.Minute)
	if err := e.consumeProfiles(t.Context(), ivs[6]); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 4; i < 7; i++ {
		want = append(want, fmt.Sprint(epoch.Add(time.Duration(i)*5*time.Second).UnixNano()))
	}
	got := sqlite3(t, e.cfg.Path, "SELECT start_unix_nano FROM intervals ORDER BY 1")
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("intervals left: %v, want %v", got, want)
	}
	if got := sqlite3(t, e.cfg.Path, "SELECT count(*) FROM samples WHERE interval_id NOT IN (SELECT id FROM intervals)"); got[0] != "0" {
		t.Errorf("samples of deleted intervals: %v", got)
	}
	if got := sqlite3(t, e.cfg.Path, orphans); got[0] != "0" {
		t.Errorf("rows no sample reaches: %v", got)
	}
	if n := counter(t, tt, "sonde.exporter.sqlite.deleted_intervals", "reason", "max_age"); n != 4 {
		t.Errorf("deleted by age counted %d, want 4", n)
	}
}

func TestRetentionBySize(t *testing.T) {
	now := epoch
	e, tt := newDirect(t, func(c *Config) { c.MaxAge = 0; c.MaxSizeMiB = 1 }, &now)
	const n = 80
	ivs := intervals(6, n, 400)
	for _, pd := range ivs {
		if err := e.consumeProfiles(t.Context(), pd); err != nil {
			t.Fatal(err)
		}
	}
	used, err := e.usedBytes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if used > 1<<20 {
		t.Errorf("pages in use: %d bytes, want at most 1 MiB", used)
	}
	deleted := counter(t, tt, "sonde.exporter.sqlite.deleted_intervals", "reason", "max_size")
	if deleted == 0 {
		t.Fatalf("no interval deleted by size: %d intervals must exceed 1 MiB", n)
	}
	got := sqlite3(t, e.cfg.Path, "SELECT count(*), min(start_unix_nano), max(start_unix_nano) FROM intervals")
	want := fmt.Sprintf("%d|%d|%d", n-deleted, epoch.Add(time.Duration(deleted)*5*time.Second).UnixNano(),
		epoch.Add(time.Duration(n-1)*5*time.Second).UnixNano())
	if got[0] != want {
		t.Errorf("intervals left (count|oldest|newest): %s, want %s (the newest, %d deleted)", got[0], want, deleted)
	}
	if got := sqlite3(t, e.cfg.Path, orphans); got[0] != "0" {
		t.Errorf("rows no sample reaches: %v", got)
	}
	// The file follows: free pages went back to the file system.
	st, err := os.Stat(e.cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 2<<20 {
		t.Errorf("database file is %d bytes with max_size_mib 1", st.Size())
	}
	if got := sqlite3(t, e.cfg.Path, "PRAGMA integrity_check"); got[0] != "ok" {
		t.Errorf("integrity: %v", got)
	}
}
