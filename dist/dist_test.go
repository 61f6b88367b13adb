package dist_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	pprof "github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.yaml.in/yaml/v3"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"

	"github.com/sonde-dev/sonde/internal/testutil"
)

const (
	// profilesGate enables profiles pipelines; the signal is alpha in
	// Collector v0.159.0 (go.opentelemetry.io/collector/service).
	profilesGate = "service.profilesSupport"
	sondeModule  = "github.com/sonde-dev/sonde"
	// binaryEnv names a prebuilt otelcol-profiling to test instead of
	// building one (for example ./_build/otelcol-profiling).
	binaryEnv = "SONDE_OTELCOL"
)

// manifest is the part of builder-config.yaml the tests read.
type manifest struct {
	Dist struct {
		Name       string `yaml:"name"`
		OutputPath string `yaml:"output_path"`
		Version    string `yaml:"version"`
	} `yaml:"dist"`
	Receivers  []component `yaml:"receivers"`
	Processors []component `yaml:"processors"`
	Exporters  []component `yaml:"exporters"`
	Extensions []component `yaml:"extensions"`
	Connectors []component `yaml:"connectors"`
	Providers  []component `yaml:"providers"`
	Replaces   []string    `yaml:"replaces"`
}

type component struct {
	GoMod string `yaml:"gomod"`
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func readManifest(t *testing.T) (manifest, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "builder-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatalf("builder-config.yaml: %v", err)
	}
	return m, raw
}

// collectorRelease returns the Collector release of the distribution: the
// version of its OTLP receiver, a core component of every release.
func collectorRelease(t *testing.T, m manifest) string {
	t.Helper()
	for _, c := range m.Receivers {
		if path, version, _ := strings.Cut(c.GoMod, " "); path == "go.opentelemetry.io/collector/receiver/otlpreceiver" {
			return version
		}
	}
	t.Fatal("builder-config.yaml has no otlpreceiver to tell its Collector release")
	return ""
}

// TestManifest checks builder-config.yaml without building it: the replace
// of this module must land on the repository root from the generated module;
// every Collector module must be of one release (its beta v0.X.Y and the
// stable v1 version of the same release for providers), which must be at or
// above the oldest release this repository's go.mod supports; contrib modules
// follow the beta version.
func TestManifest(t *testing.T) {
	root := repoRoot(t)
	m, _ := readManifest(t)

	if m.Dist.Name != "otelcol-profiling" {
		t.Errorf("dist.name = %q, want otelcol-profiling", m.Dist.Name)
	}
	if !semver.IsValid("v" + m.Dist.Version) {
		t.Errorf("dist.version = %q, want a semantic version (make release stamps it)", m.Dist.Version)
	}

	var targets []string
	for _, r := range m.Replaces {
		from, to, ok := strings.Cut(r, "=>")
		if ok && strings.TrimSpace(from) == sondeModule {
			targets = append(targets, strings.TrimSpace(to))
		}
	}
	if len(targets) != 1 {
		t.Fatalf("replaces has %d entries for %s, want 1: %q", len(targets), sondeModule, m.Replaces)
	}
	// Go resolves a relative replace against the generated go.mod's directory.
	got := filepath.Clean(filepath.Join(root, m.Dist.OutputPath, targets[0]))
	if got != root {
		t.Errorf("replace %s => %s resolves to %s from output_path %s, want the repository root %s",
			sondeModule, targets[0], got, m.Dist.OutputPath, root)
	}

	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mf, err := modfile.ParseLax("go.mod", gomod, nil)
	if err != nil {
		t.Fatal(err)
	}
	required := map[string]string{}
	for _, r := range mf.Require {
		required[r.Mod.Path] = r.Mod.Version
	}
	// xreceiver is a beta (v0) module: the oldest release Sonde supports.
	oldest := required["go.opentelemetry.io/collector/receiver/xreceiver"]
	if oldest == "" {
		t.Fatal("go.mod does not require go.opentelemetry.io/collector/receiver/xreceiver")
	}
	beta := collectorRelease(t, m)
	if semver.Compare(beta, oldest) < 0 {
		t.Errorf("the distribution's Collector %s is older than the %s go.mod requires", beta, oldest)
	}
	// A release v0.N.x pairs with the stable v1.(N-94).x: v0.159.0 with v1.65.0.
	minor, err := strconv.Atoi(strings.Split(beta, ".")[1])
	if err != nil {
		t.Fatalf("release %s: %v", beta, err)
	}
	stable := fmt.Sprintf("v1.%d.%s", minor-94, strings.Split(beta, ".")[2])

	all := slices.Concat(m.Receivers, m.Processors, m.Exporters, m.Extensions, m.Connectors, m.Providers)
	for _, c := range all {
		path, version, _ := strings.Cut(c.GoMod, " ")
		switch {
		case path == sondeModule:
		case strings.HasPrefix(path, "go.opentelemetry.io/collector/"):
			if version != stable && version != beta {
				t.Errorf("%s is at %s, want %s or %s (the release of otlpreceiver)", path, version, stable, beta)
			}
		case strings.HasPrefix(path, "github.com/open-telemetry/opentelemetry-collector-contrib/"):
			if version != beta {
				t.Errorf("%s is at %s, want %s (contrib follows the Collector's beta version)", path, version, beta)
			}
		default:
			t.Errorf("unexpected module %s in builder-config.yaml", c.GoMod)
		}
	}
}

// otelcol returns a binary of the distribution: $SONDE_OTELCOL if set,
// otherwise one built now with OCB from builder-config.yaml into a temporary
// directory. Building takes minutes on a cold cache, so -short skips it.
func otelcol(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(binaryEnv); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(abs); err != nil {
			t.Fatalf("%s=%s: %v", binaryEnv, p, err)
		}
		return abs
	}
	if testing.Short() {
		t.Skipf("building otelcol-profiling with OCB takes minutes; run without -short, or set %s to a prebuilt binary", binaryEnv)
	}

	root := repoRoot(t)
	_, raw := readManifest(t)
	// Rewrite a copy, generically so no key of the manifest is lost: build
	// into a temporary directory and point the replace there at the root.
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "build")
	dist, ok := doc["dist"].(map[string]any)
	if !ok {
		t.Fatal("builder-config.yaml has no dist mapping")
	}
	dist["output_path"] = out
	replaces, _ := doc["replaces"].([]any)
	for i, r := range replaces {
		if s, _ := r.(string); strings.HasPrefix(strings.TrimSpace(s), sondeModule+" ") {
			replaces[i] = sondeModule + " => " + root
		}
	}
	cfg, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "builder-config.yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	// The Builder of the distribution's own release, as make dist runs it.
	m, _ := readManifest(t)
	cmd := exec.CommandContext(t.Context(), "go", "run", "go.opentelemetry.io/collector/cmd/builder@"+collectorRelease(t, m), "--config", cfgPath)
	cmd.Dir = root
	if log, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("builder: %v\n%s", err, log)
	}
	t.Logf("built otelcol-profiling in %v", time.Since(start).Round(time.Second))
	return filepath.Join(out, "otelcol-profiling")
}

// run runs the binary to completion and returns its combined output.
func run(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDistribution(t *testing.T) {
	bin := otelcol(t)
	root := repoRoot(t)

	t.Run("components match builder-config.yaml", func(t *testing.T) {
		out, err := run(t, bin, "components")
		if err != nil {
			t.Fatalf("components: %v\n%s", err, out)
		}
		var got struct {
			Receivers  []struct{ Name, Module string } `yaml:"receivers"`
			Processors []struct{ Module string }       `yaml:"processors"`
			Exporters  []struct{ Module string }       `yaml:"exporters"`
			Extensions []struct{ Module string }       `yaml:"extensions"`
			Connectors []struct{ Module string }       `yaml:"connectors"`
			Providers  []struct{ Module string }       `yaml:"providers"`
		}
		if err := yaml.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("components output: %v\n%s", err, out)
		}
		m, _ := readManifest(t)
		var want, have []string
		for _, c := range slices.Concat(m.Receivers, m.Processors, m.Exporters, m.Extensions, m.Connectors, m.Providers) {
			want = append(want, c.GoMod)
		}
		sonde := false
		for _, r := range got.Receivers {
			have = append(have, r.Module)
			sonde = sonde || (r.Name == "sonde" && strings.HasPrefix(r.Module, sondeModule+" "))
		}
		for _, list := range [][]struct{ Module string }{got.Processors, got.Exporters, got.Extensions, got.Connectors, got.Providers} {
			for _, c := range list {
				have = append(have, c.Module)
			}
		}
		slices.Sort(want)
		slices.Sort(have)
		if diff := cmp.Diff(want, have); diff != "" {
			t.Errorf("modules in the binary differ from builder-config.yaml (-want +got):\n%s", diff)
		}
		if !sonde {
			t.Errorf("no receiver named sonde from %s in:\n%s", sondeModule, out)
		}
	})

	t.Run("validate config/local.yaml", func(t *testing.T) {
		out, err := run(t, bin, "validate", "--config", filepath.Join(root, "config", "local.yaml"), "--feature-gates="+profilesGate)
		if err != nil {
			t.Fatalf("validate: %v\n%s", err, out)
		}
	})

	t.Run("validate without the profiles gate names it", func(t *testing.T) {
		out, err := run(t, bin, "validate", "--config", filepath.Join(root, "config", "local.yaml"))
		if err == nil || !strings.Contains(out, profilesGate) {
			t.Fatalf("validate without --feature-gates=%s: err = %v, output:\n%s\nwant a failure naming the gate", profilesGate, err, out)
		}
	})

	t.Run("validate reports every sonde config error", func(t *testing.T) {
		cfg := writeFile(t, t.TempDir(), "bad.yaml", `
receivers:
  sonde:
    samples_per_second: 0
    procfs: proc
exporters:
  debug:
service:
  pipelines:
    profiles:
      receivers: [sonde]
      exporters: [debug]
`)
		out, err := run(t, bin, "validate", "--config", cfg, "--feature-gates="+profilesGate)
		if err == nil {
			t.Fatalf("validate accepted an invalid sonde config:\n%s", out)
		}
		for _, want := range []string{
			"samples_per_second: must be between 1 and 1000, got 0",
			`procfs: must be an absolute path, got "proc"`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("validate output lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("profiles a C workload end to end", func(t *testing.T) {
		testutil.RequirePrivileges(t, "distribution end to end")
		profileWorkload(t, bin)
	})
}

// workloadC spins in c, called through a and b, so a correct profile of it
// has stacks c, b, a (leaf first).
const workloadC = `
volatile unsigned long sink;
void c(void) { for (;;) sink++; }
void b(void) { c(); }
void a(void) { b(); }
int main(void) { a(); return 0; }
`

func profileWorkload(t *testing.T, bin string) {
	dir := t.TempDir()
	src := writeFile(t, dir, "spin.c", workloadC)
	wlBin := testutil.BuildC(t, "spin", []string{"-O0", "-fno-omit-frame-pointer", "-fno-inline"}, src)

	wl := exec.Command(wlBin)
	if err := wl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = wl.Process.Kill()
		_ = wl.Wait()
	})

	output := filepath.Join(dir, "profiles.json")
	pprofDir := filepath.Join(dir, "pprof")
	cfg := writeFile(t, dir, "e2e.yaml", fmt.Sprintf(`
receivers:
  sonde:
    samples_per_second: 99
    reporter_interval: 1s
exporters:
  file:
    path: %s
    format: json
  pprof:
    directory: %s
    folded: true
    log_top: 5
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [sonde]
      exporters: [file, pprof]
`, output, pprofDir))

	logPath := filepath.Join(dir, "otelcol.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	col := exec.Command(bin, "--config", cfg, "--feature-gates="+profilesGate)
	col.Dir = dir
	col.Stdout, col.Stderr = logFile, logFile
	if err := col.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- col.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = col.Process.Kill()
			err := <-exited
			_ = err // killed: an error by construction
		}
	})
	collectorLog := func() string {
		b, _ := os.ReadFile(logPath)
		return string(b)
	}

	pid := int64(wl.Process.Pid)
	want := []string{"c", "b", "a"}
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	poll := time.NewTicker(200 * time.Millisecond)
	defer poll.Stop()
	var last scan
	var pprofFile string
wait:
	for {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("collector exited before a profile of the workload arrived: %v\n%s", err, collectorLog())
		case <-deadline.C:
			t.Fatalf("no profile of pid %d with stack %q within 60s (pprof file: %q); read %d profiles, %d of the workload, stacks seen: %q\ncollector log:\n%s",
				pid, want, pprofFile, last.profiles, last.workloadSamples, last.stacks, collectorLog())
		case <-poll.C:
			if !last.found {
				last = scanOutput(t, output, pid, want)
			}
			if pprofFile == "" {
				pprofFile = findPprof(t, pprofDir, pid)
			}
			if last.found && pprofFile != "" {
				break wait
			}
		}
	}

	if err := col.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("collector did not exit cleanly on SIGTERM: %v\n%s", err, collectorLog())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("collector still running 30s after SIGTERM\n%s", collectorLog())
	}

	checkPprof(t, pprofFile, pid, want)
	if log := collectorLog(); !strings.Contains(log, "top 5 functions of") {
		t.Errorf("collector log has no summary of the pprof exporter (log_top: 5):\n%s", log)
	}
}

// findPprof returns a pprof file in dir that holds a sample of process pid,
// or "" when there is none yet. Files appear by rename, so a file found is
// complete.
func findPprof(t *testing.T, dir string, pid int64) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		p, err := pprof.Parse(r)
		r.Close()
		if err != nil {
			t.Fatalf("%s is not a pprof profile: %v", f, err)
		}
		for _, s := range p.Sample {
			if slices.Contains(s.Label["process.pid"], strconv.FormatInt(pid, 10)) {
				return f
			}
		}
	}
	return ""
}

// checkPprof runs the reference reader, go tool pprof, on a file the pprof
// exporter wrote, restricted to the workload, and expects every function of
// want in its cumulative top list.
func checkPprof(t *testing.T, file string, pid int64, want []string) {
	t.Helper()
	goTool := testutil.RequireTool(t, "go")
	args := []string{"tool", "pprof", "-top", "-cum", fmt.Sprintf("-tagfocus=process.pid=^%d$", pid), file}
	out, err := exec.CommandContext(t.Context(), goTool, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 6 {
			names[f[5]] = true
		}
	}
	for _, fn := range want {
		if !names[fn] {
			t.Errorf("go %s does not list %s:\n%s", strings.Join(args, " "), fn, out)
		}
	}
}

// scan is what one pass over the file exporter's output found.
type scan struct {
	found           bool
	profiles        int
	workloadSamples int
	stacks          [][]string // a few stacks of the workload, for the failure message
}

// scanOutput reads the OTLP JSON lines the file exporter wrote and looks for
// a sample of process pid whose stack holds want in order, leaf first.
func scanOutput(t *testing.T, path string, pid int64, want []string) scan {
	t.Helper()
	var s scan
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s
	}
	if err != nil {
		t.Fatal(err)
	}
	// The last line may still be being written; only complete lines count.
	lines := bytes.Split(raw, []byte("\n"))
	lines = lines[:len(lines)-1]
	var um pprofile.JSONUnmarshaler
	for i, line := range lines {
		pd, err := um.UnmarshalProfiles(line)
		if err != nil {
			t.Fatalf("%s line %d is not OTLP JSON profiles: %v", path, i+1, err)
		}
		s.profiles++
		dict := pd.Dictionary()
		for _, rp := range pd.ResourceProfiles().All() {
			v, ok := rp.Resource().Attributes().Get("process.pid")
			if !ok || v.Int() != pid {
				continue
			}
			for _, sp := range rp.ScopeProfiles().All() {
				for _, p := range sp.Profiles().All() {
					for _, sample := range p.Samples().All() {
						s.workloadSamples++
						stack := functionNames(dict, sample)
						if containsRun(stack, want) {
							s.found = true
							return s
						}
						if len(s.stacks) < 5 {
							s.stacks = append(s.stacks, stack)
						}
					}
				}
			}
		}
	}
	return s
}

// functionNames resolves a sample's stack to function names, leaf first, one
// per line of each location (inlined frames included). Indices out of range
// give "?" so a malformed profile shows up in the failure message.
func functionNames(dict pprofile.ProfilesDictionary, sample pprofile.Sample) []string {
	strs := dict.StringTable()
	str := func(i int32) string {
		if i < 0 || int(i) >= strs.Len() {
			return "?"
		}
		return strs.At(int(i))
	}
	si := sample.StackIndex()
	if si < 0 || int(si) >= dict.StackTable().Len() {
		return []string{"?"}
	}
	var names []string
	for _, li := range dict.StackTable().At(int(si)).LocationIndices().All() {
		if li < 0 || int(li) >= dict.LocationTable().Len() {
			names = append(names, "?")
			continue
		}
		for _, line := range dict.LocationTable().At(int(li)).Lines().All() {
			fi := line.FunctionIndex()
			if fi < 0 || int(fi) >= dict.FunctionTable().Len() {
				names = append(names, "?")
				continue
			}
			names = append(names, str(dict.FunctionTable().At(int(fi)).NameStrindex()))
		}
	}
	return names
}

// containsRun reports whether want appears in stack as consecutive frames.
func containsRun(stack, want []string) bool {
	for i := 0; i+len(want) <= len(stack); i++ {
		if slices.Equal(stack[i:i+len(want)], want) {
			return true
		}
	}
	return false
}
