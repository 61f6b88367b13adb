package sqliteexporter

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	pprof "github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/exporter/exportertest"
	"go.opentelemetry.io/collector/exporter/xexporter"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/sonde-dev/sonde/exporter/pprofexporter"
	"github.com/sonde-dev/sonde/internal/profile"
	"github.com/sonde-dev/sonde/internal/testutil"
)

const samplesPerSecond = 19

var epoch = time.Unix(1_700_000_000, 0)

// intervals returns n intervals of 5 s of pseudo-random samples from seed:
// three processes (one in a container), kernel, native, Go and CPython
// frames, inline functions, unnamed frames, on-CPU and off-CPU samples.
func intervals(seed uint64, n, perInterval int) []pprofile.Profiles {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	libc := &profile.Mapping{Start: 0x7f0000000000, Limit: 0x7f0000200000, File: "/lib/x86_64-linux-gnu/libc.so.6", FileID: "5eed"}
	app := &profile.Mapping{Start: 0x400000, Limit: 0x500000, File: "/usr/bin/app", GNUBuildID: "b1d0"}
	gobin := &profile.Mapping{Start: 0x400000, Limit: 0x600000, File: "/srv/billing", GoBuildID: "go/id"}
	py := &profile.Mapping{Start: 0x500000, Limit: 0x700000, File: "/usr/bin/python3.11"}
	pool := []profile.Frame{
		{Type: profile.FrameKernel, Address: 0xffffffff81000010, Lines: []profile.Line{{Function: "do_syscall_64"}}},
		{Type: profile.FrameKernel, Address: 0xffffffff81000200, Lines: []profile.Line{{Function: "clear_page_erms"}}},
		{Type: profile.FrameNative, Address: 0x401234, Mapping: app, Lines: []profile.Line{
			{Function: "hash_byte", File: "/src/hash.c", Line: 12}, {Function: "hash", SystemName: "_Z4hashPKc", File: "/src/hash.c", Line: 40}}},
		{Type: profile.FrameNative, Address: 0x401500, Mapping: app, Lines: []profile.Line{{Function: "main", File: "/src/main.c", Line: 7}}},
		{Type: profile.FrameNative, Address: 0x7f0000012345, Mapping: libc},
		{Type: profile.FrameNative, Address: 0x7f0000020000, Mapping: libc, Lines: []profile.Line{{Function: "memcpy"}}},
		{Type: profile.FrameGo, Address: 0x401000, Mapping: gobin, Lines: []profile.Line{{Function: "main.compute", File: "/src/billing/main.go", Line: 21}}},
		{Type: profile.FrameGo, Address: 0x402000, Mapping: gobin, Lines: []profile.Line{{Function: "main.main", File: "/src/billing/main.go", Line: 9}}},
		{Type: profile.FrameCPython, Address: 0x7000, Mapping: py, Lines: []profile.Line{{Function: "fib", File: "/app/fib.py", Line: 3}}},
		{Type: profile.FrameCPython, Address: 0x7100, Mapping: py, Lines: []profile.Line{{Function: "<module>", File: "/app/fib.py", Line: 9}}},
	}
	// Each process's frames: kernel frames and libc are shared.
	byProc := [][]int{{0, 1, 2, 3, 4, 5}, {0, 1, 6, 7, 5}, {0, 8, 9, 4}}
	procs := []*profile.Resource{
		{PID: 100, ExecutableName: "app", ExecutablePath: "/usr/bin/app", ServiceName: "checkout"},
		{PID: 200, ExecutableName: "billing", ExecutablePath: "/srv/billing", ServiceName: "billing", ContainerID: "c0ffee"},
		{PID: 300, ExecutableName: "python3.11", ExecutablePath: "/usr/bin/python3.11", ServiceName: "fib"},
	}
	var out []pprofile.Profiles
	for i := range n {
		start := epoch.Add(time.Duration(i) * 5 * time.Second)
		b := profile.NewBuilder(profile.Options{SamplesPerSecond: samplesPerSecond, ScopeVersion: "test"})
		for range perInterval {
			p := rng.IntN(len(procs))
			var frames []profile.Frame
			for range 1 + rng.IntN(5) {
				frames = append(frames, pool[byProc[p][rng.IntN(len(byProc[p]))]])
			}
			s := profile.Sample{
				Kind: profile.OnCPU, Resource: procs[p], TID: procs[p].PID + int64(rng.IntN(3)), CPU: int64(rng.IntN(4)),
				Time: start.Add(time.Duration(rng.IntN(5000)) * time.Millisecond), Frames: frames,
			}
			if s.TID == procs[p].PID {
				s.ThreadName = procs[p].ExecutableName
			}
			if rng.IntN(10) == 0 {
				s.Kind, s.Value = profile.OffCPU, int64(1+rng.IntN(1_000_000))
			}
			b.Add(s)
		}
		out = append(out, b.Flush(start, start.Add(5*time.Second)))
	}
	return out
}

// startExporter creates and starts an exporter of factory f with cfg, the
// way the Collector does, and shuts it down at the end of the test.
func startExporter(t *testing.T, f xexporter.Factory, cfg component.Config) xexporter.Profiles {
	t.Helper()
	exp, err := f.CreateProfiles(t.Context(), exportertest.NewNopSettings(f.Type()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := exp.Start(t.Context(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := exp.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return exp
}

func newSQLite(t *testing.T, edit func(*Config)) (*Config, xexporter.Profiles) {
	t.Helper()
	cfg := createDefaultConfig()
	cfg.Path = filepath.Join(t.TempDir(), "profiles.db")
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg, startExporter(t, NewFactory().(xexporter.Factory), cfg)
}

// sqlite3 runs query on db with the sqlite3 program and returns its rows,
// fields separated by '|'.
func sqlite3(t *testing.T, db, query string) []string {
	t.Helper()
	bin := testutil.RequireTool(t, "sqlite3")
	out, err := exec.Command(bin, "-readonly", db, query).CombinedOutput()
	if err != nil {
		t.Fatalf("sqlite3 %q: %v\n%s", query, err, out)
	}
	s := strings.TrimRight(string(out), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// pprofRows computes, from the pprof files in dir, what the queries of
// TestQueriesMatchPprof return: rows "start|executable|sample type|function|
// value" of leaf functions, and "start|executable|sample type|value" of
// totals, sorted.
func pprofRows(t *testing.T, dir string) (leaf, totals []string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.pb.gz"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no pprof files in %s: %v", dir, err)
	}
	leafSum := map[string]int64{}
	totalSum := map[string]int64{}
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pprof.Parse(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Sample {
			for ti, st := range p.SampleType {
				if s.Value[ti] == 0 {
					continue
				}
				exe := s.Label["process.executable.name"][0]
				fn := "[unknown]"
				if len(s.Location) > 0 {
					if l := s.Location[0]; len(l.Line) > 0 {
						fn = l.Line[0].Function.Name
					} else if l.Mapping != nil {
						fn = "[" + filepath.Base(l.Mapping.File) + "]"
					}
				}
				key := fmt.Sprintf("%d|%s|%s", p.TimeNanos, exe, st.Type)
				leafSum[key+"|"+fn] += s.Value[ti]
				totalSum[key] += s.Value[ti]
			}
		}
	}
	for k, v := range leafSum {
		leaf = append(leaf, k+"|"+strconv.FormatInt(v, 10))
	}
	for k, v := range totalSum {
		totals = append(totals, k+"|"+strconv.FormatInt(v, 10))
	}
	slices.Sort(leaf)
	slices.Sort(totals)
	return leaf, totals
}

// TestQueriesMatchPprof writes the same intervals with the pprof exporter
// and the SQLite exporter; sqlite3 queries of the database must give the
// pprof files' leaf functions and totals per interval and executable
// exactly.
// An interval handed over with a context already cancelled (a receiver
// shutting down mid-emit) is written all the same.
func TestCancelledContextStillWrites(t *testing.T) {
	cfg, sexp := newSQLite(t, func(c *Config) { c.MaxAge = 0 })
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for _, pd := range intervals(1, 2, 50) {
		if err := sexp.ConsumeProfiles(ctx, pd); err != nil {
			t.Fatal(err)
		}
	}
	if got := sqlite3(t, cfg.Path, "SELECT count(*) FROM intervals"); !slices.Equal(got, []string{"2"}) {
		t.Errorf("intervals: %v, want 2", got)
	}
}

func TestQueriesMatchPprof(t *testing.T) {
	pcfg := pprofexporter.NewFactory().CreateDefaultConfig().(*pprofexporter.Config)
	pcfg.Directory = t.TempDir()
	pcfg.MaxFiles = 0
	pexp := startExporter(t, pprofexporter.NewFactory().(xexporter.Factory), pcfg)
	cfg, sexp := newSQLite(t, func(c *Config) { c.MaxAge = 0 })
	for _, pd := range intervals(1, 6, 300) {
		if err := pexp.ConsumeProfiles(t.Context(), pd); err != nil {
			t.Fatal(err)
		}
		if err := sexp.ConsumeProfiles(t.Context(), pd); err != nil {
			t.Fatal(err)
		}
	}
	wantLeaf, wantTotals := pprofRows(t, pcfg.Directory)

	gotLeaf := sqlite3(t, cfg.Path, `
		SELECT s.time_unix_nano, r.executable_name, s.sample_type,
		       coalesce(fn.name, '[' || replace(f.mapping, rtrim(f.mapping, replace(f.mapping, '/', '')), '') || ']'),
		       sum(s.value)
		FROM samples s JOIN resources r ON r.id = s.resource_id JOIN stacks st ON st.id = s.stack_id
		JOIN frames f ON f.id = st.leaf_frame_id LEFT JOIN functions fn ON fn.id = f.function_id
		GROUP BY 1, 2, 3, 4`)
	gotTotals := sqlite3(t, cfg.Path, `
		SELECT time_unix_nano, executable_name, sample_type, sum(value)
		FROM samples_readable GROUP BY 1, 2, 3`)
	slices.Sort(gotLeaf)
	slices.Sort(gotTotals)
	if diff := cmp.Diff(wantLeaf, gotLeaf); diff != "" {
		t.Errorf("leaf functions per interval and executable (-pprof +sqlite3):\n%s", diff)
	}
	if diff := cmp.Diff(wantTotals, gotTotals); diff != "" {
		t.Errorf("totals per interval and executable (-pprof +sqlite3):\n%s", diff)
	}
	if st, err := os.Stat(cfg.Path); err != nil || st.Mode().Perm()&0o077 != 0 {
		t.Errorf("database mode: %v %v, want the owner's only", st.Mode(), err)
	}
	if got := sqlite3(t, cfg.Path, "SELECT count(*) FROM intervals"); !slices.Equal(got, []string{"6"}) {
		t.Errorf("intervals: %v, want 6", got)
	}

	// The README's queries run and answer from the same data.
	t.Run("readme", func(t *testing.T) {
		top := sqlite3(t, cfg.Path, `
			SELECT leaf_function, sum(value) AS samples FROM samples_readable
			WHERE executable_name = 'billing' AND sample_type = 'samples'
			  AND time >= `+strconv.FormatInt(epoch.Unix()+30, 10)+` - 600
			GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10`)
		var want []string
		sums := map[string]int64{}
		for _, row := range wantLeaf {
			f := strings.Split(row, "|")
			if f[1] == "billing" && f[2] == "samples" {
				v, _ := strconv.ParseInt(f[4], 10, 64)
				sums[f[3]] += v
			}
		}
		for fn, v := range sums {
			want = append(want, fmt.Sprintf("%s|%d", fn, v))
		}
		slices.SortFunc(want, func(a, b string) int {
			fa, fb := strings.Split(a, "|"), strings.Split(b, "|")
			va, _ := strconv.Atoi(fa[1])
			vb, _ := strconv.Atoi(fb[1])
			if va != vb {
				return vb - va
			}
			return strings.Compare(fa[0], fb[0])
		})
		if diff := cmp.Diff(want, top); diff != "" {
			t.Errorf("top functions of billing (-pprof +sqlite3):\n%s", diff)
		}
		byLang := sqlite3(t, cfg.Path, `
			SELECT time / 60 * 60 AS minute, language, round(sum(cpu_nanos) / 1e9, 3) AS cpu_seconds
			FROM samples_readable WHERE sample_type = 'samples' GROUP BY 1, 2 ORDER BY 1, 3 DESC`)
		langs := map[string]bool{}
		for _, row := range byLang {
			langs[strings.Split(row, "|")[1]] = true
		}
		for _, l := range []string{"native", "go", "cpython"} {
			if !langs[l] {
				t.Errorf("CPU by language lacks %s: %v", l, byLang)
			}
		}
	})
}

func TestSchemaVersionRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "other.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE t (x); PRAGMA user_version = 7"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := createDefaultConfig()
	cfg.Path = path
	e := newExporter(cfg, nil, nil, time.Now)
	if err := e.start(t.Context(), componenttest.NewNopHost()); err == nil || !strings.Contains(err.Error(), "schema version 7") {
		t.Fatalf("start on a database of version 7: %v, want a schema version error", err)
	}
}
