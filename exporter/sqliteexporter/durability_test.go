package sqliteexporter

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/exporter/xexporter"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sonde-dev/sonde/exporter/sqliteexporter/internal/metadatatest"
	"github.com/sonde-dev/sonde/internal/profileview"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// crashChildEnv names the database a child process of TestSIGKILLMidWrite
// writes into until it is killed.
const crashChildEnv = "SONDE_SQLITE_CRASH_CHILD_DB"

// total is the sum of pd's sample values.
func total(pd pprofile.Profiles) int64 {
	var n int64
	for s := range profileview.NewReader(pd).Samples() {
		n += s.Value
	}
	return n
}

// TestCrashChild is the child of TestSIGKILLMidWrite: it writes intervals
// without pause and prints "committed <start> <total>" after each one the
// exporter reports written.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("runs as the child of TestSIGKILLMidWrite")
	}
	cfg := createDefaultConfig()
	cfg.Path = path
	cfg.MaxAge = 0
	exp := startExporter(t, NewFactory().(xexporter.Factory), cfg)
	for i, pd := range intervals(7, 100, 400) {
		if err := exp.ConsumeProfiles(t.Context(), pd); err != nil {
			t.Fatalf("interval %d: %v", i, err)
		}
		fmt.Printf("committed %d %d\n", epoch.Add(time.Duration(i)*5*time.Second).UnixNano(), total(pd))
	}
}

// TestSIGKILLMidWrite kills a process that writes intervals without pause;
// the database must pass SQLite's integrity check and hold every interval
// the exporter reported committed, each whole.
func TestSIGKILLMidWrite(t *testing.T) {
	testutil.RequireTool(t, "sqlite3")
	db := filepath.Join(t.TempDir(), "profiles.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+db)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	committed := map[string]string{} // start -> total
	sc := bufio.NewScanner(stdout)
	// Kill after a number of commits that varies with the clock, so runs
	// hit different points of a write.
	killAfter := 10 + int(time.Now().UnixNano()%7)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "committed" {
			committed[f[1]] = f[2]
		}
		if len(committed) == killAfter {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	_ = cmd.Wait()
	if len(committed) < killAfter {
		t.Fatalf("the child committed %d intervals before it ended, want %d", len(committed), killAfter)
	}

	if got := sqlite3(t, db, "PRAGMA integrity_check"); len(got) != 1 || got[0] != "ok" {
		t.Fatalf("integrity check after SIGKILL: %v", got)
	}
	rows := sqlite3(t, db, `SELECT i.start_unix_nano, coalesce(sum(s.value), 0) FROM intervals i
		LEFT JOIN samples s ON s.interval_id = i.id GROUP BY i.id`)
	inDB := map[string]string{}
	for _, r := range rows {
		start, sum, _ := strings.Cut(r, "|")
		inDB[start] = sum
	}
	for start, sum := range committed {
		if inDB[start] != sum {
			t.Errorf("committed interval %s: database holds total %q, want %s", start, inDB[start], sum)
		}
	}
	// At most one more interval: committed, killed before it was printed.
	if len(inDB) > len(committed)+1 {
		t.Errorf("database holds %d intervals, %d were reported committed", len(inDB), len(committed))
	}
	// The exporter opens it again and writes on.
	cfg, exp := newSQLite(t, func(c *Config) { c.Path = db; c.MaxAge = 0 })
	pd := intervals(8, 1, 10)[0]
	if err := exp.ConsumeProfiles(t.Context(), pd); err != nil {
		t.Fatalf("write after the crash: %v", err)
	}
	if got := sqlite3(t, cfg.Path, "SELECT count(*) FROM intervals"); got[0] != fmt.Sprint(len(inDB)+1) {
		t.Errorf("intervals after one more write: %v, want %d", got, len(inDB)+1)
	}
}

// counter sums the data points of metric name whose attribute key has
// value.
func counter(t *testing.T, tt *componenttest.Telemetry, name, key, value string) int64 {
	t.Helper()
	m, err := tt.GetMetric(name)
	if err != nil {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if v, ok := dp.Attributes.Value(attribute.Key(key)); ok && v.AsString() == value {
			n += dp.Value
		}
	}
	return n
}

// TestFullDisk writes into a 4 MiB tmpfs until it is full: the failed
// intervals are counted as dropped and returned as errors, and the database
// keeps every interval written before, intact.
func TestFullDisk(t *testing.T) {
	testutil.RequireRoot(t, "a small tmpfs to fill")
	testutil.RequireTool(t, "sqlite3")
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { _ = tt.Shutdown(t.Context()) })
	cfg := createDefaultConfig()
	cfg.Path = filepath.Join(dir, "profiles.db")
	cfg.MaxAge, cfg.MaxSizeMiB = 0, 0
	exp, err := NewFactory().(xexporter.Factory).CreateProfiles(t.Context(), metadatatest.NewSettings(tt), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := exp.Start(t.Context(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	written := map[string]string{}
	failures := 0
	for i, pd := range intervals(3, 400, 400) {
		err := exp.ConsumeProfiles(t.Context(), pd)
		if err != nil {
			failures++
			if !strings.Contains(err.Error(), "full") {
				t.Errorf("interval %d: error %v, want one that says the disk is full", i, err)
			}
			if failures == 5 {
				break
			}
			continue
		}
		written[fmt.Sprint(epoch.Add(time.Duration(i)*5*time.Second).UnixNano())] = fmt.Sprint(total(pd))
	}
	if err := exp.Shutdown(t.Context()); err != nil {
		t.Logf("shutdown on a full disk: %v", err)
	}
	if failures == 0 {
		t.Fatalf("400 intervals fit in 4 MiB; the test must fill the disk")
	}
	if got, want := counter(t, tt, "sonde.exporter.sqlite.intervals", "outcome", "dropped"), int64(failures); got != want {
		t.Errorf("dropped intervals counted %d, want %d", got, want)
	}
	if got, want := counter(t, tt, "sonde.exporter.sqlite.intervals", "outcome", "written"), int64(len(written)); got != want {
		t.Errorf("written intervals counted %d, want %d", got, want)
	}
	if got := sqlite3(t, cfg.Path, "PRAGMA integrity_check"); len(got) != 1 || got[0] != "ok" {
		t.Fatalf("integrity check after a full disk: %v", got)
	}
	rows := sqlite3(t, cfg.Path, `SELECT i.start_unix_nano, sum(s.value) FROM intervals i JOIN samples s ON s.interval_id = i.id GROUP BY i.id`)
	if len(rows) != len(written) {
		t.Errorf("database holds %d intervals, %d were written", len(rows), len(written))
	}
	for _, r := range rows {
		start, sum, _ := strings.Cut(r, "|")
		if written[start] != sum {
			t.Errorf("interval %s: total %s, want %q", start, sum, written[start])
		}
	}
}
