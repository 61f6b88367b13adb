package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// BenchmarkDist is `make bench`: the built distribution, as users run it,
// profiling this host in six scenarios (idle; four CPU burners; a
// node-like host; the burners at a high rate, 16 CPUs' worth of 99 Hz;
// busy Python processes; busy JVMs), each with its workloads built from
// source, started before the agent and killed after it. The agent's own
// figures come from its Collector telemetry, scraped from a Prometheus
// reader; the process's from /proc. Each scenario prints a table and
// writes a JSON file. With REF_BIN set, the idle binaries of both agents
// are measured at the same time, ../shared/reference/sidebyside also runs
// the idle host, the burners, the node-like host and the JVMs with the
// reference profiler beside the distribution, the high rate runs both
// side by side with their telemetry (pair), and each ratio line is
// printed.
//
// It runs once whatever b.N is. Figures are never judged here: a failure
// to start the agent, to read its metrics or to stop it is the only error.
func BenchmarkDist(b *testing.B) {
	testutil.RequirePrivileges(b, "distribution benchmark")
	env := newDistEnv(b)
	fmt.Printf("bench: %s at %d Hz, results in %s\n", env.dist, env.hz, env.results)
	var all []*scenarioResult
	keep := func(rs ...*scenarioResult) {
		for _, r := range rs {
			all = append(all, r)
			env.write(b, r.Scenario+".json", r)
		}
	}

	b.Run("idle", func(b *testing.B) {
		sc := scenario{name: "idle", title: "idle host", window: env.window}
		r := env.run(b, sc)
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
	})

	b.Run("burners", func(b *testing.B) {
		sc := scenario{name: "burners", title: "four CPU burners", window: env.window, workloads: burners(b)}
		r := env.run(b, sc)
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
	})

	b.Run("node", func(b *testing.B) {
		sc := scenario{name: "node", title: "node-like host", window: env.nodeWindow, workloads: append(burners(b), env.nodeWorkloads(b)...)}
		compile := calibrateCompile(b, sc.workloads)
		r := env.run(b, sc)
		r.Extra["compile_cpu_s"] = compile.Seconds()
		fmt.Printf("   (one g++ -O2 -c of the compile loop's file took %.2f CPU-s before the agent started)\n", compile.Seconds())
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
	})

	b.Run("highrate", func(b *testing.B) {
		sc := scenario{name: "highrate", title: fmt.Sprintf("four CPU burners at %d Hz (%d CPUs at 99 Hz)", env.highHz, highRateCPUs),
			window: env.window, hz: env.highHz, workloads: burners(b)}
		r := env.run(b, sc)
		if p := env.pair(b, sc); p != nil {
			r.Pair = p
		}
		keep(r)
	})

	b.Run("python", func(b *testing.B) {
		py := pythonInterpreter(b)
		burn, err := filepath.Abs("testdata/burn.py")
		if err != nil {
			b.Fatal(err)
		}
		pythons := func(n int) []workload {
			var ws []workload
			for i := range n {
				ws = append(ws, workload{name: fmt.Sprintf("python-%d", i+1), argv: []string{py, burn}})
			}
			return ws
		}
		c := testutil.BuildWorkload(b, testutil.CChainNoFP)
		cmp := env.runtimeVsNative(b, rtBench{kind: "cpython", metric: "sonde.python", argv: []string{py, burn}}, c)
		ten := env.run(b, scenario{name: "python-ten", title: "ten busy CPython processes", window: env.pythonWindow, workloads: pythons(10)})
		keep(ten)
		cmp.print("cpython")
		fmt.Printf("== python: agent with ten busy CPython processes: steady %.3f CPU-s/min, start-up %.2f CPU-s\n", ten.SteadyCPUPerMin, ten.StartupCPUS)
		env.write(b, "python.json", cmp)
	})

	b.Run("java", func(b *testing.B) {
		argv := jburn(b)
		c := testutil.BuildWorkload(b, testutil.CChainNoFP)
		cmp := env.runtimeVsNative(b, rtBench{kind: "jvm", metric: "sonde.jvm", argv: argv}, c)
		sc := scenario{name: "java", title: "two busy JVMs (JBurn)", window: env.pythonWindow,
			workloads: []workload{{name: "java-1", argv: argv}, {name: "java-2", argv: argv}}}
		r := env.run(b, sc)
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
		cmp.print("jvm")
		env.write(b, "jvm.json", cmp)
	})

	b.Run("nodejs", func(b *testing.B) {
		argv := nodeBurn(b)
		c := testutil.BuildWorkload(b, testutil.CChainNoFP)
		cmp := env.runtimeVsNative(b, rtBench{kind: "v8js", metric: "sonde.v8", argv: argv}, c)
		sc := scenario{name: "nodejs", title: "two busy Node.js processes (burn.js)", window: env.pythonWindow,
			workloads: []workload{{name: "node-1", argv: argv}, {name: "node-2", argv: argv}}}
		r := env.run(b, sc)
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
		cmp.print("v8js")
		env.write(b, "v8.json", cmp)
	})

	b.Run("php", func(b *testing.B) {
		argv := phpBurn(b)
		c := testutil.BuildWorkload(b, testutil.CChainNoFP)
		cmp := env.runtimeVsNative(b, rtBench{kind: "php", metric: "sonde.php", argv: argv}, c)
		sc := scenario{name: "php", title: "two busy PHP processes (burn.php)", window: env.pythonWindow,
			workloads: []workload{{name: "php-1", argv: argv}, {name: "php-2", argv: argv}}}
		r := env.run(b, sc)
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
		cmp.print("php")
		env.write(b, "php.json", cmp)
	})

	b.Run("perl", func(b *testing.B) {
		argv := perlBurn(b)
		c := testutil.BuildWorkload(b, testutil.CChainNoFP)
		cmp := env.runtimeVsNative(b, rtBench{kind: "perl", metric: "sonde.perl", argv: argv}, c)
		cmp.print("perl")
		env.write(b, "perl.json", cmp)
		sc := scenario{name: "perl", title: "two busy Perl processes (burn.pl)", window: env.pythonWindow,
			workloads: []workload{{name: "perl-1", argv: argv}, {name: "perl-2", argv: argv}}}
		r := env.run(b, sc)
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
	})

	b.Run("ruby", func(b *testing.B) {
		argv := rubyBurn(b)
		c := testutil.BuildWorkload(b, testutil.CChainNoFP)
		cmp := env.runtimeVsNative(b, rtBench{kind: "ruby", metric: "sonde.ruby", argv: argv}, c)
		cmp.print("ruby")
		env.write(b, "ruby.json", cmp)
		sc := scenario{name: "ruby", title: "two busy Ruby processes (burn.rb)", window: env.pythonWindow,
			workloads: []workload{{name: "ruby-1", argv: argv}, {name: "ruby-2", argv: argv}}}
		r := env.run(b, sc)
		r.SideBySide = env.sideBySide(b, sc)
		keep(r)
	})

	env.write(b, "summary.json", all)
	fmt.Printf("bench: results in %s\n", env.results)
}

// Knobs, from the environment.
const (
	distBinEnv      = "SONDE_OTELCOL"             // the distribution (make bench sets it)
	hzEnv           = "SONDE_BENCH_HZ"            // samples per second (19)
	highHzEnv       = "SONDE_BENCH_HIGH_HZ"       // the high-rate scenario's (16 CPUs at 99 Hz over this host's CPUs)
	windowEnv       = "SONDE_BENCH_WINDOW"        // idle and burners run length (75s)
	nodeWindowEnv   = "SONDE_BENCH_NODE_WINDOW"   // node-like host run length (120s; 10m for issue 12's targets)
	pythonWindowEnv = "SONDE_BENCH_PYTHON_WINDOW" // each Python run's length (45s)
	warmEnv         = "SONDE_BENCH_WARM"          // start-up period, excluded from steady figures (15s)
	resultsEnv      = "SONDE_BENCH_RESULTS"       // results directory (_build/bench/<UTC time>)
	pythonEnv       = "SONDE_BENCH_PYTHON"        // the interpreter (pyenv's 3.12.1)
	javaEnv         = "SONDE_BENCH_JAVA_HOME"     // the JDK of the Java scenario (OpenJDK 17)
	nodeEnv         = "SONDE_BENCH_NODE"          // the node of the Node.js scenario (Debian's)
	refBinEnv       = "REF_BIN"                   // the reference collector, for sidebyside
	sharedEnv       = "SONDE_SHARED"              // where reference/sidebyside is (../shared)
	featureGateFlag = "--feature-gates=+service.profilesSupport"
)

type distEnv struct {
	dist                     string
	results                  string
	hz, highHz               int
	warm, window             time.Duration
	nodeWindow, pythonWindow time.Duration
	idleConfig               string
	floorKiB                 float64 // peak RSS of the distribution running no profiler
	floor                    floor
}

// highRateCPUs at 99 Hz is the rate the high-rate scenario samples at:
// the same samples a second on this host's CPUs (792 Hz on 2 CPUs).
const highRateCPUs = 16

// floor is the idle binaries' memory: each distribution running no
// profiler, the reference's (when REF_BIN is set) at the same time.
type floor struct {
	Sonde procStatus  `json:"sonde_kib"`
	Ref   *procStatus `json:"reference_kib,omitempty"`
}

func newDistEnv(b *testing.B) *distEnv {
	b.Helper()
	dist := os.Getenv(distBinEnv)
	if dist == "" {
		b.Fatalf("%s is not set: run `make bench`, which builds the distribution and sets it", distBinEnv)
	}
	dist, err := filepath.Abs(dist)
	if err != nil {
		b.Fatal(err)
	}
	if st, err := os.Stat(dist); err != nil || st.Mode()&0o111 == 0 {
		b.Fatalf("%s=%s: not an executable file (%v)", distBinEnv, dist, err)
	}
	e := &distEnv{
		dist:         dist,
		hz:           19,
		warm:         envDuration(b, warmEnv, 15*time.Second),
		window:       envDuration(b, windowEnv, 75*time.Second),
		nodeWindow:   envDuration(b, nodeWindowEnv, 120*time.Second),
		pythonWindow: envDuration(b, pythonWindowEnv, 45*time.Second),
	}
	if v := os.Getenv(hzEnv); v != "" {
		if e.hz, err = strconv.Atoi(v); err != nil || e.hz <= 0 {
			b.Fatalf("%s: want a positive number of samples per second, got %q", hzEnv, v)
		}
	}
	e.highHz = min((highRateCPUs*99+runtime.NumCPU()-1)/runtime.NumCPU(), 1000)
	if v := os.Getenv(highHzEnv); v != "" {
		if e.highHz, err = strconv.Atoi(v); err != nil || e.highHz <= 0 || e.highHz > 1000 {
			b.Fatalf("%s: want samples per second from 1 to 1000, got %q", highHzEnv, v)
		}
	}
	for _, w := range []time.Duration{e.window, e.nodeWindow, e.pythonWindow} {
		if w <= e.warm {
			b.Fatalf("every window must be longer than %s (%v)", warmEnv, e.warm)
		}
	}
	e.results = os.Getenv(resultsEnv)
	if e.results == "" {
		e.results = filepath.Join(filepath.Dir(dist), "bench", time.Now().UTC().Format("20060102T150405Z"))
	}
	if err := os.MkdirAll(e.results, 0o755); err != nil {
		b.Fatal(err)
	}
	e.idleConfig = filepath.Join(e.results, "idle-binary.yaml")
	writeFile(b, e.idleConfig, idleConfig)
	e.floor = e.measureFloor(b)
	e.floorKiB = e.floor.Sonde.HWM
	e.write(b, "floor.json", e.floor)
	return e
}

// idleConfig runs the distribution with no profiler: an OTLP receiver on a
// port of its own and no telemetry endpoint, so copies run side by side.
const idleConfig = `receivers:
  otlp: {protocols: {grpc: {endpoint: 127.0.0.1:0}}}
exporters:
  debug: {verbosity: basic}
service:
  telemetry: {metrics: {level: none}}
  pipelines:
    profiles: {receivers: [otlp], exporters: [debug]}
`

// agentConfig is the profiler's configuration: the receiver's defaults but
// for the rate, a debug exporter that counts (as sidebyside's), and the
// Collector's own telemetry on a Prometheus reader.
func agentConfig(hz, port int) string {
	return fmt.Sprintf(`receivers:
  sonde:
    samples_per_second: %d
    reporter_interval: 5s
exporters:
  debug: {verbosity: basic}
service:
  telemetry:
    metrics:
      level: detailed
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: %d
  pipelines:
    profiles: {receivers: [sonde], exporters: [debug]}
`, hz, port)
}

// measureFloor is the memory of the distribution running no profiler,
// measured as sidebyside does (peak RSS 6 s after start): what the agent
// adds is measured over it. With REF_BIN set the reference's binary runs
// the same configuration at the same time, and the ratio is printed.
func (e *distEnv) measureFloor(b *testing.B) floor {
	b.Helper()
	c := startCollector(b, e.dist, e.idleConfig, filepath.Join(e.results, "idle-binary.log"))
	var ref *distProcess
	if bin := os.Getenv(refBinEnv); bin != "" {
		ref = startCollector(b, bin, e.idleConfig, filepath.Join(e.results, "idle-binary-reference.log"))
	}
	c.awaitReady(b, time.Minute)
	if ref != nil {
		ref.awaitReady(b, time.Minute)
	}
	if rest := 6*time.Second - time.Since(c.start); rest > 0 {
		time.Sleep(rest) // the floor's measuring window
	}
	var f floor
	var err error
	if f.Sonde, err = readStatus(c.pid()); err != nil {
		b.Fatal(err)
	}
	if ref != nil {
		st, err := readStatus(ref.pid())
		if err != nil {
			b.Fatal(err)
		}
		f.Ref = &st
		if _, err := ref.stop(time.Minute); err != nil {
			b.Fatalf("the reference's idle binary: %v", err)
		}
	}
	if _, err := c.stop(time.Minute); err != nil {
		b.Fatalf("the idle binary: %v", err)
	}
	line := func(who string, st procStatus) string {
		return fmt.Sprintf("%s peaks at %.1f MiB RSS (anonymous %.1f, file %.1f)", who, st.HWM/1024, st.Anon/1024, st.File/1024)
	}
	fmt.Printf("bench: %s\n", line("the distribution running no profiler", f.Sonde))
	if f.Ref != nil {
		fmt.Printf("bench: %s\n", line("the reference running no profiler, at the same time,", *f.Ref))
		fmt.Printf("sonde/ref  idle_rss %.2f  idle_anon %.2f  idle_file %.2f\n",
			f.Sonde.HWM/f.Ref.HWM, f.Sonde.Anon/f.Ref.Anon, f.Sonde.File/f.Ref.File)
	}
	return f
}

func (e *distEnv) write(b *testing.B, name string, v any) {
	b.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.results, name), append(data, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
}

// A workload is one command the scenario runs, started before the agent.
type workload struct {
	name string
	argv []string
	// term: the workload is stopped (and dies with its parent) by SIGTERM,
	// which it handles to take its children with it; others get SIGKILL.
	term bool
}

func (w workload) signal() syscall.Signal {
	if w.term {
		return syscall.SIGTERM
	}
	return syscall.SIGKILL
}

// shell is the workload as a command line for sidebyside, which starts it
// with bash and stops it with SIGTERM; setpriv makes it die with sidebyside.
func (w workload) shell() string {
	sig := "KILL"
	if w.term {
		sig = "TERM"
	}
	q := []string{"setpriv", "--pdeathsig", sig, "--"}
	for _, a := range w.argv {
		q = append(q, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return strings.Join(q, " ")
}

type scenario struct {
	name, title string
	window      time.Duration
	hz          int // samples per second; 0 is the bench's
	workloads   []workload
}

func (e *distEnv) rate(sc scenario) int {
	if sc.hz > 0 {
		return sc.hz
	}
	return e.hz
}

// burners are scenario (a): C -O2 -fomit-frame-pointer, C++ (throw and
// catch, no frame pointers), Go, and a C program in qsort's callback,
// a signal handler and a deep recursion.
func burners(b *testing.B) []workload {
	b.Helper()
	mixed := testutil.BuildC(b, "mixed", noFramePointers, testdata(b, "mixed.c"))
	return []workload{
		{name: "c", argv: []string{testutil.BuildWorkload(b, testutil.CChainNoFP)}},
		{name: "c++", argv: []string{testutil.BuildWorkload(b, testutil.Throw)}},
		{name: "go", argv: []string{testutil.BuildWorkload(b, testutil.GoChain)}},
		{name: "qsort-signal-recursion", argv: []string{mixed}},
	}
}

func testdata(b *testing.B, name string) string {
	b.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// nodeWorkloads are what scenario (b) adds to the burners: five big Go
// binaries running (copies of the distribution with the idle config, each
// a file of its own, as a node's kubelet, containerd and agents are), a
// loop of g++ -O2 -c on a large C++ file, and a dlopen/dlclose loop.
func (e *distEnv) nodeWorkloads(b *testing.B) []workload {
	b.Helper()
	dir := b.TempDir()
	var ws []workload
	for i := range 5 {
		bin := distinctCopy(b, e.dist, filepath.Join(dir, fmt.Sprintf("big-go-%d", i+1)), i)
		ws = append(ws, workload{name: filepath.Base(bin), argv: []string{bin, "--config", e.idleConfig, featureGateFlag}})
	}
	gxx := testutil.RequireTool(b, "g++")
	ws = append(ws, workload{name: "g++ -O2 -c loop", term: true,
		argv: []string{testutil.RequireTool(b, "bash"), testdata(b, "compileloop.sh"), gxx, testdata(b, "heavy.cc"), filepath.Join(dir, "heavy.o")}})
	swap := testutil.BuildWorkload(b, testutil.DLSwap)
	ws = append(ws, workload{name: "dlopen/dlclose loop",
		argv: []string{swap, testutil.BuildWorkload(b, testutil.DLSwapA), testutil.BuildWorkload(b, testutil.DLSwapB), "50"}})
	return ws
}

// distinctCopy copies bin to path with a trailer of its own after the ELF
// data: the same program, but a different file to the agent (its file id
// covers the file's size and last bytes), as different binaries are.
func distinctCopy(b *testing.B, bin, path string, i int) string {
	b.Helper()
	src, err := os.Open(bin)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		b.Fatal(err)
	}
	_, err = io.Copy(dst, src)
	if err == nil {
		_, err = fmt.Fprintf(dst, "%s", strings.Repeat(fmt.Sprintf("sonde bench copy %d\n", i+1), 200*(i+1)))
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatalf("copy %s: %v", bin, err)
	}
	return path
}

// calibrateCompile runs the compile loop's compile once, before the
// agent: the file should take 1–2 CPU-s; the figure is reported.
func calibrateCompile(b *testing.B, ws []workload) time.Duration {
	b.Helper()
	for _, w := range ws {
		if !w.term {
			continue
		}
		// argv: bash compileloop.sh CXX SOURCE OBJECT
		cmd := exec.Command(w.argv[2], "-O2", "-c", w.argv[3], "-o", w.argv[4])
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("compile %s: %v\n%s", w.argv[3], err, out)
		}
		return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	b.Fatal("no compile loop among the workloads")
	return 0
}

// pythonInterpreter is the CPython the Python scenario runs.
func pythonInterpreter(b *testing.B) string {
	b.Helper()
	py := os.Getenv(pythonEnv)
	if py == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			b.Fatal(err)
		}
		py = filepath.Join(home, ".pyenv/versions/3.12.1/bin/python3")
	}
	if _, err := os.Stat(py); err != nil {
		if testutil.InCI() {
			b.Fatalf("no CPython for the Python scenario (%s): %v", pythonEnv, err)
		}
		b.Skipf("no CPython for the Python scenario (set %s): %v", pythonEnv, err)
	}
	return py
}

// jburn compiles internal/jvm's JBurn with the JDK the Java scenario runs
// and returns the command line of one JBurn that runs until stopped.
func jburn(b *testing.B) []string {
	b.Helper()
	home := os.Getenv(javaEnv)
	if home == "" {
		home = "/usr/lib/jvm/java-17-openjdk-amd64"
	}
	java := filepath.Join(home, "bin", "java")
	if _, err := os.Stat(java); err != nil {
		if testutil.InCI() {
			b.Fatalf("no JDK for the Java scenario (%s): %v", javaEnv, err)
		}
		b.Skipf("no JDK for the Java scenario (set %s): %v", javaEnv, err)
	}
	dir := b.TempDir()
	src, err := filepath.Abs("../jvm/testdata/JBurn.java")
	if err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(home, "bin", "javac"), "-d", dir, src).CombinedOutput(); err != nil {
		b.Fatalf("javac %s: %v\n%s", src, err, out)
	}
	return []string{java, "-Xmx64m", "-XX:+UseSerialGC", "-cp", dir, "JBurn", "1000000"}
}

// nodeBurn is the Node.js scenario's workload: burn.js (main ->
// nodeAlpha -> nodeBeta -> nodeGammaBurn) on $SONDE_BENCH_NODE, else
// Debian's node.
func nodeBurn(b *testing.B) []string {
	b.Helper()
	node := os.Getenv(nodeEnv)
	if node == "" {
		node = "/usr/bin/node"
	}
	if _, err := os.Stat(node); err != nil {
		if testutil.InCI() {
			b.Fatalf("no node for the Node.js scenario (%s): %v", nodeEnv, err)
		}
		b.Skipf("no node for the Node.js scenario (set %s): %v", nodeEnv, err)
	}
	script, err := filepath.Abs("../v8/testdata/burn.js")
	if err != nil {
		b.Fatal(err)
	}
	return []string{node, script}
}

// phpBurn is the PHP scenario's workload: burn.php (main -> alpha -> beta
// -> gamma_burn) on Debian's PHP 8.2.
func phpBurn(b *testing.B) []string {
	b.Helper()
	const php = "/usr/bin/php8.2"
	if _, err := os.Stat(php); err != nil {
		if testutil.InCI() {
			b.Fatalf("no php for the PHP scenario: %v", err)
		}
		b.Skipf("no php for the PHP scenario: %v", err)
	}
	script, err := filepath.Abs("../php/testdata/burn.php")
	if err != nil {
		b.Fatal(err)
	}
	return []string{php, script}
}

// running is a scenario's started workloads.
type running struct {
	ws   []workload
	cmds []*exec.Cmd
	done []chan struct{}
}

// startWorkloads starts each workload with its output in logPath and waits
// until each has exec'd its program. They die with the bench (Pdeathsig)
// and are stopped at the end of the benchmark if still running.
func startWorkloads(b *testing.B, ws []workload, logPath string) *running {
	b.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { logf.Close() })
	r := &running{ws: ws}
	for _, w := range ws {
		cmd := exec.Command(w.argv[0], w.argv[1:]...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: w.signal()}
		if err := cmd.Start(); err != nil {
			b.Fatalf("start workload %s: %v", w.name, err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		r.cmds, r.done = append(r.cmds, cmd), append(r.done, done)
	}
	b.Cleanup(func() { r.stop() })
	deadline := time.Now().Add(30 * time.Second)
	for i, cmd := range r.cmds {
		want, err := filepath.EvalSymlinks(cmd.Path)
		if err != nil {
			b.Fatal(err)
		}
		for {
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid)); err == nil && exe == want {
				break
			}
			if r.exited(i) {
				b.Fatalf("workload %s exited at start; its output is in %s", ws[i].name, logPath)
			}
			if time.Now().After(deadline) {
				b.Fatalf("workload %s did not start within 30 s", ws[i].name)
			}
			time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
		}
	}
	return r
}

func (r *running) exited(i int) bool {
	select {
	case <-r.done[i]:
		return true
	default:
		return false
	}
}

// stop signals every workload and waits for it, killing it after 10 s.
func (r *running) stop() {
	for i, cmd := range r.cmds {
		if !r.exited(i) {
			_ = cmd.Process.Signal(r.ws[i].signal())
		}
	}
	for i, cmd := range r.cmds {
		select {
		case <-r.done[i]:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-r.done[i]
		}
	}
}

// Metrics other parts of the project are adding, found by the shape of
// their names (their exact names are theirs to choose); "n/a" until then.
var (
	lagMetric     = regexp.MustCompile(`^sonde_(.+_)?lag(_[a-z]+)?$`)
	pendingMetric = regexp.MustCompile(`^sonde_(.+_)?pending(_[a-z]+)?$`)
	// The time from a new file's first sample to its table being loaded.
	tableDelayMetric = regexp.MustCompile(`^sonde_unwind_.*(delay|latency|wait|time_to).*_bucket$`)
)

// scenarioResult is one scenario's figures; a nil pointer is a figure the
// agent does not expose ("n/a", null in JSON).
type scenarioResult struct {
	Scenario  string    `json:"scenario"`
	Title     string    `json:"title"`
	Date      time.Time `json:"date"`
	Dist      string    `json:"dist"`
	Hz        int       `json:"hz"`
	WindowS   float64   `json:"window_s"`
	WarmS     float64   `json:"warm_s"`
	Workloads []string  `json:"workloads"`

	ReadyS       *float64 `json:"ready_s"`
	FirstExportS *float64 `json:"first_export_s"`
	Exports      int      `json:"exports"`
	ShutdownS    float64  `json:"shutdown_s"`

	PeakRSSMiB    float64 `json:"peak_rss_mib"`
	IdleRSSMiB    float64 `json:"idle_binary_rss_mib"`
	AddedRSSMiB   float64 `json:"added_rss_mib"`
	PeakAnonMiB   float64 `json:"peak_anon_mib"`
	PeakFileMiB   float64 `json:"peak_file_mib"`
	SteadyAnonMiB float64 `json:"steady_anon_mib"`
	SteadyFileMiB float64 `json:"steady_file_mib"`

	StartupCPUS     float64 `json:"startup_cpu_s"`
	SteadyCPUPerMin float64 `json:"steady_cpu_s_per_min"`

	BPFMaps         int      `json:"bpf_maps"`
	BPFMapMiB       float64  `json:"bpf_map_mib"`
	BPFProgMiB      float64  `json:"bpf_prog_mib"`
	KernelTablesMiB float64  `json:"kernel_unwind_tables_mib"`
	EBPFUsPerRun    *float64 `json:"ebpf_us_per_run"`
	EBPFRuns        uint64   `json:"ebpf_runs"`

	Received     *float64           `json:"samples_received"`
	ReceivedPerS *float64           `json:"samples_received_per_s"`
	Exported     *float64           `json:"samples_exported"`
	Lost         *float64           `json:"samples_lost"`
	LostBy       map[string]float64 `json:"samples_lost_by_reason"`
	RecordsLost  *float64           `json:"records_lost"`

	SymbolLoads           *float64 `json:"symbol_loads"`
	SymbolEvictions       *float64 `json:"symbol_evictions"`
	SymbolLoadsSteady     *float64 `json:"symbol_loads_steady"`
	SymbolEvictionsSteady *float64 `json:"symbol_evictions_steady"`
	SymbolCachePeakMiB    *float64 `json:"symbol_cache_peak_mib"`

	Tables        *float64           `json:"unwind_tables"`
	TableRows     *float64           `json:"unwind_table_rows"`
	TableMiB      *float64           `json:"unwind_table_mib"`
	TableRowsPeak *float64           `json:"unwind_table_rows_peak"`
	TableMiBPeak  *float64           `json:"unwind_table_mib_peak"`
	TableBuilds   *float64           `json:"unwind_table_builds"`
	TableEvicted  *float64           `json:"unwind_table_evictions"`
	TableFailed   map[string]float64 `json:"unwind_table_failures"`

	LagMetric         string   `json:"lag_metric,omitempty"`
	LagMedianS        *float64 `json:"lag_median_s"`
	LagMaxS           *float64 `json:"lag_max_s"`
	PendingMetric     string   `json:"pending_metric,omitempty"`
	PendingMedian     *float64 `json:"pending_median"`
	PendingMax        *float64 `json:"pending_max"`
	TableDelayMetric  string   `json:"table_delay_metric,omitempty"`
	TableDelayMedianS *float64 `json:"table_delay_median_s"`
	TableDelayP99S    *float64 `json:"table_delay_p99_s"`
	TableDelayCount   *float64 `json:"table_delay_count"`

	Extra      map[string]float64 `json:"extra,omitempty"`
	Metrics    map[string]float64 `json:"metrics"`
	Series     []point            `json:"series"`
	SideBySide *sideBySide        `json:"sidebyside,omitempty"`
	Pair       *pairResult        `json:"pair,omitempty"`
}

// point is one second of the run: the process, and every fifth second the
// gauges of a scrape.
type point struct {
	T       float64            `json:"t"`
	CPUS    float64            `json:"cpu_s"`
	AnonMiB float64            `json:"anon_mib"`
	FileMiB float64            `json:"file_mib"`
	BPFMiB  float64            `json:"bpf_map_mib,omitempty"`
	Gauges  map[string]float64 `json:"gauges,omitempty"`
}

const mib = 1 << 20

func ptr(v float64) *float64 { return &v }

// run measures the agent on one scenario.
func (e *distEnv) run(b *testing.B, sc scenario) *scenarioResult {
	b.Helper()
	r := &scenarioResult{Scenario: sc.name, Title: sc.title, Date: time.Now().UTC(), Dist: e.dist, Hz: e.rate(sc),
		WindowS: sc.window.Seconds(), WarmS: e.warm.Seconds(), IdleRSSMiB: e.floorKiB / 1024, Extra: map[string]float64{}}
	for _, w := range sc.workloads {
		r.Workloads = append(r.Workloads, w.name)
	}
	work := startWorkloads(b, sc.workloads, filepath.Join(e.results, sc.name+"-workloads.log"))

	// The kernel keeps run-time statistics of BPF programs while this is open.
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run-time statistics: %v", err)
	}
	defer testutil.Close(b, stats)

	port := freePort(b)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	cfg := filepath.Join(e.results, sc.name+".yaml")
	writeFile(b, cfg, agentConfig(e.rate(sc), port))
	agent := startCollector(b, e.dist, cfg, filepath.Join(e.results, sc.name+"-agent.log"))
	pid := agent.pid()
	fail := func(format string, args ...any) {
		b.Helper()
		b.Fatalf("%s: %s; agent log %s ends:\n%s", sc.name, fmt.Sprintf(format, args...), agent.log, agent.lastLines())
	}

	var (
		warmCPU             float64
		warmFD              fdObjects
		warmScrape, last    promScrape
		anons, files        []float64
		lags, pendings      []float64
		peakAnon, peakFile  float64
		peakRows, peakTable *float64
		peakSymbols         *float64
		scrapeErrs          int
	)
	lagName, pendingName := "", ""
	peak := func(p **float64, s promScrape, name string) {
		if v, ok := s.sum(name); ok && (*p == nil || v > **p) {
			*p = ptr(v)
		}
	}
	warmAt, end := agent.start.Add(e.warm), agent.start.Add(sc.window)
	for tick := 1; ; tick++ {
		next := agent.start.Add(time.Duration(tick) * time.Second)
		if next.After(end) {
			next = end
		}
		time.Sleep(time.Until(next)) // the measuring clock, not synchronization
		if agent.exited() {
			fail("the agent exited during the run (%v)", agent.err)
		}
		now := time.Now()
		st, err1 := readStatus(pid)
		cpu, err2 := readCPU(pid)
		if err := firstErr(err1, err2); err != nil {
			fail("%v", err)
		}
		peakAnon, peakFile = max(peakAnon, st.Anon), max(peakFile, st.File)
		p := point{T: now.Sub(agent.start).Seconds(), CPUS: cpu, AnonMiB: st.Anon / 1024, FileMiB: st.File / 1024}
		steady := !now.Before(warmAt)
		if steady {
			anons, files = append(anons, st.Anon), append(files, st.File)
		}
		atWarm := steady && warmScrape == nil
		if tick%5 == 0 || atWarm || !now.Before(end) {
			fd, err := scanFDInfo(pid)
			if err != nil {
				fail("%v", err)
			}
			r.BPFMaps = max(r.BPFMaps, fd.Maps)
			r.BPFMapMiB = max(r.BPFMapMiB, float64(fd.MapBytes)/mib)
			r.BPFProgMiB = max(r.BPFProgMiB, float64(fd.ProgBytes)/mib)
			p.BPFMiB = float64(fd.MapBytes) / mib
			if _, tables, err := bpfMemory(pid); err == nil {
				r.KernelTablesMiB = max(r.KernelTablesMiB, float64(tables)/mib)
			}
			s, err := scrapeWithin(url, agent, 15*time.Second, atWarm || !now.Before(end))
			switch {
			case err != nil && (atWarm || !now.Before(end)):
				fail("read the agent's metrics at %s: %v", url, err)
			case err != nil:
				scrapeErrs++
			default:
				last = s
				peak(&peakRows, s, "sonde.unwind.table.rows")
				peak(&peakTable, s, "sonde.unwind.table.size")
				peak(&peakSymbols, s, "sonde.symbolize.cache.size")
				p.Gauges = gauges(s)
				if lagName == "" {
					lagName = s.find(lagMetric)
				}
				if pendingName == "" {
					pendingName = s.find(pendingMetric)
				}
				if steady && lagName != "" {
					lags = append(lags, s.value(lagName)*secondsOf(lagName))
				}
				if steady && pendingName != "" {
					pendings = append(pendings, s.value(pendingName))
				}
			}
			if atWarm {
				warmCPU, warmFD, warmScrape = cpu, fd, s
			}
			if !now.Before(end) {
				r.StartupCPUS = warmCPU
				r.SteadyCPUPerMin = (cpu - warmCPU) / now.Sub(warmAt).Minutes()
				ns0, runs0 := warmFD.perfEventRuns()
				ns1, runs1 := fd.perfEventRuns()
				if runs1 > runs0 {
					r.EBPFRuns = runs1 - runs0
					r.EBPFUsPerRun = ptr(float64(ns1-ns0) / float64(r.EBPFRuns) / 1e3)
				}
				r.PeakRSSMiB = st.HWM / 1024
			}
		}
		r.Series = append(r.Series, p)
		if !now.Before(end) {
			break
		}
	}
	if !hasSonde(last) {
		fail("the agent's telemetry at %s has no sonde_* metric", url)
	}
	var died []string
	for i, w := range sc.workloads {
		if work.exited(i) {
			died = append(died, w.name)
		}
	}
	ready, first, exports := agent.events()
	shutdown, stopErr := agent.stop(2 * time.Minute)
	work.stop()
	if stopErr != nil {
		b.Errorf("%s: %v; log %s ends:\n%s", sc.name, stopErr, agent.log, agent.lastLines())
	}
	if len(died) > 0 {
		b.Errorf("%s: workloads exited during the run: %s (their output is in %s-workloads.log)", sc.name, strings.Join(died, ", "), sc.name)
	}
	if ready > 0 {
		r.ReadyS = ptr(ready.Seconds())
	}
	if first > 0 {
		r.FirstExportS = ptr(first.Seconds())
	}
	r.Exports, r.ShutdownS = exports, shutdown.Seconds()
	r.AddedRSSMiB = r.PeakRSSMiB - r.IdleRSSMiB
	r.PeakAnonMiB, r.PeakFileMiB = peakAnon/1024, peakFile/1024
	r.SteadyAnonMiB, r.SteadyFileMiB = median(anons)/1024, median(files)/1024
	r.SymbolCachePeakMiB, r.TableRowsPeak = scale(peakSymbols, 1.0/mib), peakRows
	r.TableMiBPeak = scale(peakTable, 1.0/mib)
	if scrapeErrs > 0 {
		r.Extra["scrape_errors"] = float64(scrapeErrs)
	}
	r.fromMetrics(warmScrape, last, sc.window-e.warm)
	r.LagMetric, r.PendingMetric = lagName, pendingName
	if len(lags) > 0 {
		r.LagMedianS, r.LagMaxS = ptr(median(lags)), ptr(slices.Max(lags))
	}
	if len(pendings) > 0 {
		r.PendingMedian, r.PendingMax = ptr(median(pendings)), ptr(slices.Max(pendings))
	}
	if name := last.find(tableDelayMetric); name != "" {
		h := last.histogram(name)
		r.TableDelayMetric, r.TableDelayCount = h.Name, ptr(h.Count)
		f := secondsOf(name)
		if v, ok := h.quantile(0.5); ok {
			r.TableDelayMedianS = ptr(v * f)
		}
		if v, ok := h.quantile(0.99); ok {
			r.TableDelayP99S = ptr(v * f)
		}
	}
	r.print(os.Stdout)
	r.report(b)
	return r
}

// scrapeWithin scrapes url; when must is set it retries until within has
// passed (the endpoint may be late to come up on a loaded host) and the
// agent's own metrics are present.
func scrapeWithin(url string, agent *distProcess, within time.Duration, must bool) (promScrape, error) {
	deadline := time.Now().Add(within)
	for {
		s, err := scrape(url)
		if err == nil && !hasSonde(s) {
			err = fmt.Errorf("no sonde_* metric yet")
		}
		if err == nil || !must || time.Now().After(deadline) || agent.exited() {
			return s, err
		}
		time.Sleep(200 * time.Millisecond) // polling a condition with a deadline
	}
}

func hasSonde(s promScrape) bool {
	for _, x := range s {
		if strings.HasPrefix(x.Name, "sonde_") {
			return true
		}
	}
	return false
}

// gauges are the sonde_* series of a scrape that are not counters or
// histogram parts, for the time series in the results file.
func gauges(s promScrape) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s.sonde() {
		name, _, _ := strings.Cut(k, "{")
		if strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_bucket") || strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") {
			continue
		}
		out[k] = v
	}
	return out
}

// fromMetrics fills the figures read from the agent's telemetry: totals at
// the end and, where it says "steady", the change after the warm-up.
func (r *scenarioResult) fromMetrics(warm, end promScrape, steady time.Duration) {
	get := func(s promScrape, name string, attrs ...string) *float64 {
		if v, ok := s.sum(name, attrs...); ok {
			return ptr(v)
		}
		return nil
	}
	diff := func(name string) *float64 {
		a, b := get(warm, name), get(end, name)
		if a == nil || b == nil {
			return nil
		}
		return ptr(*b - *a)
	}
	r.Received, r.Exported = get(end, "sonde.samples.received"), get(end, "sonde.export.samples")
	if d := diff("sonde.samples.received"); d != nil && steady > 0 {
		r.ReceivedPerS = ptr(*d / steady.Seconds())
	}
	r.Lost, r.RecordsLost = get(end, "sonde.samples.lost"), get(end, "sonde.records.lost")
	if r.Lost != nil {
		r.LostBy = end.byLabel("sonde.samples.lost", "reason")
	}
	r.SymbolLoads, r.SymbolEvictions = get(end, "sonde.symbolize.cache.loads"), get(end, "sonde.symbolize.cache.evictions")
	r.SymbolLoadsSteady, r.SymbolEvictionsSteady = diff("sonde.symbolize.cache.loads"), diff("sonde.symbolize.cache.evictions")
	r.Tables, r.TableRows = get(end, "sonde.unwind.table.count"), get(end, "sonde.unwind.table.rows")
	r.TableMiB = scale(get(end, "sonde.unwind.table.size"), 1.0/mib)
	r.TableBuilds, r.TableEvicted = get(end, "sonde.unwind.table.builds"), get(end, "sonde.unwind.table.evictions")
	if end.has("sonde.unwind.table.failures") {
		r.TableFailed = end.byLabel("sonde.unwind.table.failures", "reason")
	}
	r.Metrics = end.sonde()
}

// report gives the main figures to the benchmark framework, for benchstat.
func (r *scenarioResult) report(b *testing.B) {
	b.ReportMetric(r.SteadyCPUPerMin, "steady-cpu-s/min")
	b.ReportMetric(r.StartupCPUS, "startup-cpu-s")
	b.ReportMetric(r.PeakRSSMiB, "peak-rss-MiB")
	b.ReportMetric(r.AddedRSSMiB, "added-rss-MiB")
	b.ReportMetric(r.SteadyAnonMiB, "steady-anon-MiB")
	b.ReportMetric(r.BPFMapMiB, "bpf-maps-MiB")
	if r.EBPFUsPerRun != nil {
		b.ReportMetric(*r.EBPFUsPerRun, "ebpf-µs/run")
	}
	if r.Lost != nil {
		b.ReportMetric(*r.Lost, "samples-lost")
	}
	if r.LagMedianS != nil {
		b.ReportMetric(*r.LagMedianS, "lag-s")
	}
	b.ReportMetric(0, "ns/op")
}

// print writes the scenario's table.
func (r *scenarioResult) print(w io.Writer) {
	// w is os.Stdout: a failed write there has nowhere better to go.
	_, _ = fmt.Fprintf(w, "== %s: %s (%d Hz, %.0f s, steady from %.0f s); ready %s, first export %s, shutdown %.2f s\n",
		r.Scenario, r.Title, r.Hz, r.WindowS, r.WarmS, fmtS(r.ReadyS), fmtS(r.FirstExportS), r.ShutdownS)
	row := func(what, format string, args ...any) {
		_, _ = fmt.Fprintf(w, "   %-14s "+format+"\n", append([]any{what}, args...)...)
	}
	row("RSS", "peak %.1f MiB (%+.1f over the idle binary's %.1f), anon %.1f, file %.1f | steady anon %.1f, file %.1f MiB",
		r.PeakRSSMiB, r.AddedRSSMiB, r.IdleRSSMiB, r.PeakAnonMiB, r.PeakFileMiB, r.SteadyAnonMiB, r.SteadyFileMiB)
	row("CPU", "start-up %.2f CPU-s (first %.0f s), steady %.3f CPU-s/min", r.StartupCPUS, r.WarmS, r.SteadyCPUPerMin)
	row("BPF memory", "maps %.1f MiB (%d maps), programs %.1f MiB, unwind tables in the kernel %.1f MiB (peaks)",
		r.BPFMapMiB, r.BPFMaps, r.BPFProgMiB, r.KernelTablesMiB)
	row("eBPF", "%s per sampler run (%d runs, steady)", fmtUs(r.EBPFUsPerRun), r.EBPFRuns)
	row("samples", "received %s (%s/s steady), exported %s, lost %s%s, records lost %s",
		fmtN(r.Received), fmtF(r.ReceivedPerS, "%.1f"), fmtN(r.Exported), fmtN(r.Lost), fmtReasons(r.LostBy), fmtN(r.RecordsLost))
	row("symbols", "loads %s (steady %s), evictions %s (steady %s), cache peak %s MiB",
		fmtN(r.SymbolLoads), fmtN(r.SymbolLoadsSteady), fmtN(r.SymbolEvictions), fmtN(r.SymbolEvictionsSteady), fmtF(r.SymbolCachePeakMiB, "%.1f"))
	row("unwind tables", "%s tables, %s rows, %s MiB in the kernel (peaks %s rows, %s MiB), builds %s, evictions %s, failures %s%s",
		fmtN(r.Tables), fmtN(r.TableRows), fmtF(r.TableMiB, "%.1f"), fmtN(r.TableRowsPeak), fmtF(r.TableMiBPeak, "%.1f"),
		fmtN(r.TableBuilds), fmtN(r.TableEvicted), fmtN(sumOf(r.TableFailed)), fmtReasons(r.TableFailed))
	row("lag", "median %s, max %s (newest sample's age at export, steady); pending median %s, max %s",
		fmtS(r.LagMedianS), fmtS(r.LagMaxS), fmtF(r.PendingMedian, "%.0f"), fmtF(r.PendingMax, "%.0f"))
	row("table loaded", "median %s, p99 %s after a new file's first sample (%s files)",
		fmtMs(r.TableDelayMedianS), fmtMs(r.TableDelayP99S), fmtN(r.TableDelayCount))
}

func fmtF(v *float64, format string) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf(format, *v)
}

func fmtS(v *float64) string { return fmtF(v, "%.2f s") }

func fmtUs(v *float64) string { return fmtF(v, "%.2f µs") }

func fmtMs(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f ms", *v*1e3)
}

// fmtN prints a count with thousands separators.
func fmtN(v *float64) string {
	if v == nil {
		return "n/a"
	}
	s := strconv.FormatInt(int64(*v), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func fmtReasons(m map[string]float64) string {
	var parts []string
	for k, v := range m {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s %s", k, fmtN(&v)))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	slices.Sort(parts)
	return " (" + strings.Join(parts, ", ") + ")"
}

func sumOf(m map[string]float64) *float64 {
	if m == nil {
		return nil
	}
	var s float64
	for _, v := range m {
		s += v
	}
	return &s
}

func scale(v *float64, f float64) *float64 {
	if v == nil {
		return nil
	}
	return ptr(*v * f)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// sideBySide is what ../shared/reference/sidebyside printed.
type sideBySide struct {
	Command []string `json:"command"`
	Rows    []string `json:"rows"`
	Ratio   string   `json:"ratio"`
	Output  string   `json:"output"`
}

// sideBySide runs ../shared/reference/sidebyside on the scenario's
// workloads when REF_BIN is set, prints its output and keeps its rows.
func (e *distEnv) sideBySide(b *testing.B, sc scenario) *sideBySide {
	b.Helper()
	if os.Getenv(refBinEnv) == "" {
		return nil
	}
	script := sideBySideScript(b)
	args := []string{"-hz", strconv.Itoa(e.rate(sc)), "-secs", strconv.Itoa(int(sc.window.Seconds())), "-warm", strconv.Itoa(int(e.warm.Seconds())), e.dist, "--"}
	for _, w := range sc.workloads {
		args = append(args, w.shell())
	}
	// Both binaries are read from disk, as startCollector's are.
	fromDisk(b, e.dist)
	fromDisk(b, os.Getenv(refBinEnv))
	cmd := exec.Command(script, args...)
	// Its own process group, so whatever it leaves behind can be killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	fmt.Printf("   sidebyside on %s (%d workloads, %v)...\n", sc.name, len(sc.workloads), sc.window)
	if err := cmd.Start(); err != nil {
		b.Fatalf("sidebyside: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(sc.window + 3*time.Minute):
		err = fmt.Errorf("no result within %v", sc.window+3*time.Minute)
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	res := &sideBySide{Command: append([]string{script}, args...), Output: out.String()}
	for line := range strings.SplitSeq(res.Output, "\n") {
		switch {
		case strings.HasPrefix(line, "sonde/ref"):
			res.Ratio = line
		case strings.HasPrefix(line, "sonde ") || strings.HasPrefix(line, "ref "):
			res.Rows = append(res.Rows, line)
		}
	}
	for _, line := range strings.Split(strings.TrimRight(res.Output, "\n"), "\n") {
		fmt.Println("   " + line)
	}
	if err != nil || res.Ratio == "" {
		b.Errorf("sidebyside on %s: %v, no ratio line", sc.name, err)
	}
	return res
}

// sideBySideScript finds reference/sidebyside: under $SONDE_SHARED, else
// ../shared beside the repository.
func sideBySideScript(b *testing.B) string {
	b.Helper()
	shared := os.Getenv(sharedEnv)
	if shared == "" {
		root, err := filepath.Abs("../..") // the repository, from internal/bench
		if err != nil {
			b.Fatal(err)
		}
		shared = filepath.Join(filepath.Dir(root), "shared")
	}
	script := filepath.Join(shared, "reference", "sidebyside")
	if _, err := os.Stat(script); err != nil {
		b.Fatalf("%s is set but %s is missing (set %s to the shared directory): %v", refBinEnv, script, sharedEnv, err)
	}
	return script
}

// rubyBurn is the Ruby scenario's workload: burn.rb (main -> alpha -> beta
// -> gamma_burn) on Debian's Ruby 3.1.
func rubyBurn(b *testing.B) []string {
	b.Helper()
	const ruby = "/usr/bin/ruby"
	if _, err := os.Stat(ruby); err != nil {
		if testutil.InCI() {
			b.Fatalf("no ruby for the Ruby scenario: %v", err)
		}
		b.Skipf("no ruby for the Ruby scenario: %v", err)
	}
	script, err := filepath.Abs("../ruby/testdata/burn.rb")
	if err != nil {
		b.Fatal(err)
	}
	return []string{ruby, script}
}

// perlBurn is the Perl scenario's workload: burn.pl (main -> alpha -> beta
// -> gamma_burn) on Debian's Perl 5.36.
func perlBurn(b *testing.B) []string {
	b.Helper()
	const perl = "/usr/bin/perl"
	if _, err := os.Stat(perl); err != nil {
		if testutil.InCI() {
			b.Fatalf("no perl for the Perl scenario: %v", err)
		}
		b.Skipf("no perl for the Perl scenario: %v", err)
	}
	script, err := filepath.Abs("../perl/testdata/burn.pl")
	if err != nil {
		b.Fatal(err)
	}
	return []string{perl, script}
}
