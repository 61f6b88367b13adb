package dist_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pprof "github.com/google/pprof/profile"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// freePort returns a TCP port on 127.0.0.1 free at the time of the call.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// startProcess starts cmd with its output in dir/name.log and kills it at
// the end of the test unless stop was called; stop sends SIGTERM and waits.
func startProcess(t *testing.T, cmd *exec.Cmd, dir, name string) (logText func() string, stop func()) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); f.Close() }()
	stopped := false
	logText = func() string { b, _ := os.ReadFile(logPath); return string(b) }
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s did not exit cleanly on SIGTERM: %v\n%s", name, err, logText())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s still running 30s after SIGTERM", name)
		}
	}
	t.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			err := <-done
			_ = err // killed: an error by construction
		}
	})
	return logText, stop
}

// promQuery runs an instant query on Prometheus's HTTP API and returns the
// vector's series: labels and value.
func promQuery(t *testing.T, base, query string) []promResult {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	body, err := io.ReadAll(resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
	var r struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     []struct {
				Metric map[string]string
				Value  [2]any
			}
		}
	}
	if err := json.Unmarshal(body, &r); err != nil || r.Status != "success" {
		t.Fatalf("query %q: %v %s: %s", query, err, r.Error, body)
	}
	var out []promResult
	for _, s := range r.Data.Result {
		v, err := strconv.ParseFloat(s.Value[1].(string), 64)
		if err != nil {
			t.Fatalf("query %q: value %v", query, s.Value)
		}
		out = append(out, promResult{labels: s.Metric, value: v})
	}
	return out
}

type promResult struct {
	labels map[string]string
	value  float64
}

// byLabel maps a label's values to the series' values.
func byLabel(rs []promResult, label string) map[string]float64 {
	m := map[string]float64{}
	for _, r := range rs {
		m[r.labels[label]] = r.value
	}
	return m
}

// pprofTotals sums, per executable, the on-CPU samples of the pprof files in
// dir written before the time before (all when before is zero), and per
// interval start and executable for the SQLite comparison.
func pprofTotals(t *testing.T, dir string, before time.Time) (byExe map[string]int64, byInterval map[string]int64, files int) {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "profile-*.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	byExe, byInterval = map[string]int64{}, map[string]int64{}
	for _, name := range names {
		// profile-<UTC time>-<seq>.pb.gz, the time of the export.
		stamp := strings.SplitN(strings.TrimPrefix(filepath.Base(name), "profile-"), "-", 2)[0]
		at, err := time.Parse("20060102T150405.000Z", stamp)
		if err != nil {
			t.Fatalf("file name %s: %v", name, err)
		}
		if !before.IsZero() && !at.Before(before) {
			continue
		}
		files++
		r, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pprof.Parse(r)
		r.Close()
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		ti := -1
		for i, st := range p.SampleType {
			if st.Type == "samples" {
				ti = i
			}
		}
		if ti < 0 {
			continue
		}
		for _, s := range p.Sample {
			exe := ""
			if l := s.Label["process.executable.name"]; len(l) > 0 {
				exe = l[0]
			}
			byExe[exe] += s.Value[ti]
			byInterval[fmt.Sprintf("%d|%s", p.TimeNanos, exe)] += s.Value[ti]
		}
	}
	return byExe, byInterval, files
}

// TestLocalOutputs runs the distribution with what a person debugging one
// machine reads: readable stacks in the log, profile metrics scraped by a
// real Prometheus, and the SQLite store, while three workloads burn (native
// C, Go, and system calls for kernel frames). Prometheus's counts must be
// within 10 % of the pprof files of the same window, the frame types of each
// workload must appear, every panel of the sample dashboard must answer, and
// sqlite3's per-interval totals must equal the pprof files' exactly.
func TestLocalOutputs(t *testing.T) {
	testutil.RequirePrivileges(t, "distribution with Prometheus and SQLite")
	promBin := testutil.RequireTool(t, "prometheus")
	sqlite3 := testutil.RequireTool(t, "sqlite3")
	bin := otelcol(t)
	dir := t.TempDir()

	workloads := map[string]string{ // executable -> frame type it must show
		"spin":            "native",
		testutil.GoChain:  "go",
		testutil.Syscalls: "kernel",
	}
	spin := testutil.BuildC(t, "spin", []string{"-O0", "-fno-omit-frame-pointer", "-fno-inline"}, writeFile(t, dir, "spin.c", workloadC))
	for _, path := range []string{spin, testutil.BuildWorkload(t, testutil.GoChain), testutil.BuildWorkload(t, testutil.Syscalls)} {
		wl := exec.Command(path)
		if err := wl.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = wl.Process.Kill(); _ = wl.Wait() })
	}

	metricsPort, promPort := freePort(t), freePort(t)
	pprofDir, dbPath := filepath.Join(dir, "pprof"), filepath.Join(dir, "profiles.db")
	cfg := writeFile(t, dir, "local.yaml", fmt.Sprintf(`
receivers:
  sonde:
    samples_per_second: 19
    reporter_interval: 1s
    filters:
      include_executables: [spin, %s, %s]
connectors:
  profilemetrics:
exporters:
  prometheus:
    endpoint: 127.0.0.1:%d
  pprof:
    directory: %s
    max_files: 0
    log_stacks: 3
  sqlite:
    path: %s
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [sonde]
      exporters: [pprof, sqlite, profilemetrics]
    metrics/profiles:
      receivers: [profilemetrics]
      exporters: [prometheus]
`, testutil.GoChain, testutil.Syscalls, metricsPort, pprofDir, dbPath))
	colLog, stopCol := startProcess(t, exec.Command(bin, "--config", cfg, "--feature-gates="+profilesGate), dir, "otelcol")

	promCfg := writeFile(t, dir, "prometheus.yml", fmt.Sprintf(`
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: sonde
    static_configs:
      - targets: ["127.0.0.1:%d"]
`, metricsPort))
	promLog, stopProm := startProcess(t, exec.Command(promBin, "--config.file="+promCfg,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address=127.0.0.1:"+strconv.Itoa(promPort)), dir, "prometheus")
	base := "http://127.0.0.1:" + strconv.Itoa(promPort)

	// Burn until Prometheus has scraped 20 s of every workload.
	exeRe := "spin|" + testutil.GoChain + "|" + testutil.Syscalls
	deadline := time.Now().Add(90 * time.Second)
	var first time.Time
	for {
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not see every workload within 90 s\notelcol:\n%s\nprometheus:\n%s", colLog(), promLog())
		}
		time.Sleep(time.Second)
		resp, err := http.Get(base + "/-/ready")
		if err != nil || resp.StatusCode != http.StatusOK {
			continue
		}
		_ = resp.Body.Close() // nothing read
		seen := byLabel(promQuery(t, base, `sum by (process_executable_name) (sonde_profile_samples_total{process_executable_name=~"`+exeRe+`"})`), "process_executable_name")
		if len(seen) < len(workloads) {
			continue
		}
		if first.IsZero() {
			first = time.Now()
		}
		if time.Since(first) >= 20*time.Second {
			break
		}
	}

	// The newest scrape's time and the counters it holds, against the pprof
	// files of the exports before it.
	stampRes := promQuery(t, base, `max(timestamp(sonde_profile_samples_total))`)
	totals := byLabel(promQuery(t, base, `sum by (process_executable_name) (sonde_profile_samples_total{process_executable_name=~"`+exeRe+`"})`), "process_executable_name")
	if len(stampRes) != 1 {
		t.Fatalf("no scrape timestamp: %v", stampRes)
	}
	scrapedAt := time.UnixMilli(int64(stampRes[0].value * 1000))
	pprofByExe, _, files := pprofTotals(t, pprofDir, scrapedAt)
	t.Logf("scrape at %v covers %d pprof files", scrapedAt.UTC(), files)
	for exe := range workloads {
		got, want := totals[exe], float64(pprofByExe[exe])
		t.Logf("%s: Prometheus %v samples, pprof files %v", exe, got, want)
		if want < 50 || math.Abs(got-want) > 0.1*want {
			t.Errorf("%s: Prometheus counts %v samples, the pprof files of the same window %v: want within 10%% (and at least 50)", exe, got, want)
		}
	}
	types := promQuery(t, base, `sum by (process_executable_name, profile_frame_type) (sonde_profile_frame_type_samples_total{process_executable_name=~"`+exeRe+`"})`)
	for exe, typ := range workloads {
		found := false
		for _, r := range types {
			found = found || (r.labels["process_executable_name"] == exe && r.labels["profile_frame_type"] == typ && r.value > 0)
		}
		if !found {
			t.Errorf("%s: no %s frames in sonde_profile_frame_type_samples_total: %v", exe, typ, types)
		}
	}
	if fns := promQuery(t, base, `topk(3, sonde_profile_function_samples_total{process_executable_name="spin"})`); len(fns) == 0 || fns[0].labels["code_function_name"] != "c" {
		t.Errorf("spin's hottest function = %v, want c (it spins in c)", fns)
	}
	// Every panel of the sample dashboard answers.
	checkDashboard(t, base)

	stopCol()
	stopProm()

	// SQLite: the same intervals as the pprof files, exactly.
	_, pprofByInterval, _ := pprofTotals(t, pprofDir, time.Time{})
	out, err := exec.Command(sqlite3, "-readonly", dbPath, `SELECT time_unix_nano || '|' || executable_name, sum(value)
		FROM samples_readable WHERE sample_type = 'samples' GROUP BY 1`).CombinedOutput()
	if err != nil {
		t.Fatalf("sqlite3: %v\n%s", err, out)
	}
	gotSQL := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndex(line, "|")
		n, err := strconv.ParseInt(line[i+1:], 10, 64)
		if i < 0 || err != nil {
			t.Fatalf("sqlite3 row %q", line)
		}
		gotSQL[line[:i]] = n
	}
	if len(pprofByInterval) == 0 {
		t.Fatal("no pprof intervals")
	}
	for k, want := range pprofByInterval {
		if gotSQL[k] != want {
			t.Errorf("interval|executable %s: sqlite3 %d samples, pprof %d", k, gotSQL[k], want)
		}
	}
	if len(gotSQL) != len(pprofByInterval) {
		t.Errorf("sqlite3 has %d interval|executable rows, the pprof files %d", len(gotSQL), len(pprofByInterval))
	}

	// Readable stacks in the log: Go frames of gochain, leaf first.
	log := colLog()
	if !strings.Contains(log, "heaviest stacks, leaf first") || !regexp.MustCompile(`\n\s+go\s+main\.\w+\s+\S+\.go:\d+`).MatchString(log) {
		t.Errorf("collector log lacks readable stacks with Go frames:\n%s", log)
	}
}

// checkDashboard runs every query of deploy/dashboards/sonde-profiles.json,
// its variables set to match all, and wants each to return series.
func checkDashboard(t *testing.T, base string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "dashboards", "sonde-profiles.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	r := strings.NewReplacer("$instance", ".*", "$executable", ".*", "$__rate_interval", "10s")
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			q := r.Replace(tg.Expr)
			res := promQuery(t, base, q)
			if len(res) == 0 && !strings.Contains(p.Title, "Off-CPU") {
				t.Errorf("dashboard panel %q: %s returned no series", p.Title, q)
			}
			t.Logf("panel %q: %s\n%s", p.Title, q, formatResults(res))
		}
	}
}

func formatResults(rs []promResult) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "  %v %.3f\n", r.labels, r.value)
	}
	return b.String()
}
