//go:build linux

package profiler

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// jdks lists the JDKs this machine tests; a missing one is skipped, or a
// failure under CI.
func jdks(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, home := range map[string]string{
		"jdk17": "/usr/lib/jvm/java-17-openjdk-amd64",
		"jdk25": "/usr/lib/jvm/temurin-25-jdk-amd64",
	} {
		if _, err := os.Stat(filepath.Join(home, "bin", "javac")); err != nil {
			if testutil.InCI() {
				t.Fatalf("%s is not installed at %s (CI=true: the tests need it)", name, home)
			}
			t.Logf("%s is not installed at %s: not tested", name, home)
			continue
		}
		out[name] = home
	}
	return out
}

// startJava compiles src (a .java file in ../internal/jvm/testdata) with
// home's javac and runs class main with args until the test ends; it
// returns once the program printed "ready". jvmArgs go to java before
// the class.
func startJava(t *testing.T, home, src string, jvmArgs []string, main string, args ...string) int {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command(filepath.Join(home, "bin", "javac"), "-d", dir, src).CombinedOutput(); err != nil {
		t.Fatalf("javac %s: %v\n%s", src, err, out)
	}
	argv := append([]string{"-Xmx64m", "-XX:+UseSerialGC", "-cp", dir}, jvmArgs...)
	cmd := exec.Command(filepath.Join(home, "bin", "java"), append(append(argv, main), args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if sc.Text() == "ready" {
			return cmd.Process.Pid
		}
	}
	t.Fatalf("%s never said ready", main)
	return 0
}

// javaStacks returns pid's stacks in pd as text, leaf first, each frame
// as type:function:line[tier] with its inline levels joined by "<".
func javaStacks(pd pprofile.Profiles, pid int) []string {
	dict := pd.Dictionary()
	strs := dict.StringTable()
	var out []string
	for _, rp := range pd.ResourceProfiles().All() {
		if v, ok := rp.Resource().Attributes().Get("process.pid"); !ok || v.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					var b strings.Builder
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						typ, tier := "", ""
						for _, ai := range loc.AttributeIndices().All() {
							kv := dict.AttributeTable().At(int(ai))
							switch strs.At(int(kv.KeyStrindex())) {
							case "profile.frame.type":
								typ = kv.Value().Str()
							case "sonde.frame.tier":
								tier = kv.Value().Str()
							}
						}
						b.WriteString(typ + ":")
						for k, ln := range loc.Lines().All() {
							if k > 0 {
								b.WriteString("<")
							}
							fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
							fmt.Fprintf(&b, "%s:%d", strs.At(int(fn.NameStrindex())), ln.Line())
						}
						if loc.Lines().Len() == 0 {
							fmt.Fprintf(&b, "%#x", loc.Address())
						}
						if tier != "" {
							b.WriteString("[" + tier + "]")
						}
						b.WriteString(" ; ")
					}
					for range s.TimestampsUnixNano().Len() {
						out = append(out, b.String())
					}
				}
			}
		}
	}
	return out
}

// TestJVMFrames runs JBurn (main -> jAlpha -> jBeta -> jGammaBurn) on each
// JDK, with DebugNonSafepoints, started after the profiler, so the profiler meets its JVM before
// the JVM has set up its code cache and reads it again until it has. From
// the first sample in jGammaBurn on, at least 99 % of those samples carry
// the whole chain, each level as its own frame or inline level, under the
// call stub and the launcher's native frames; every Java frame has a tier.
func TestJVMFrames(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	for name, home := range jdks(t) {
		t.Run(name, func(t *testing.T) {
			p, s := startProfiler(t, 99)
			// C2 inlines the whole chain into main's loop; with
			// DebugNonSafepoints (what JFR and async-profiler ask for too)
			// its debug information places every PC, not only safepoints.
			pid := startJava(t, home, "../internal/jvm/testdata/JBurn.java",
				[]string{"-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"}, "JBurn", "60")
			var leaf, whole int
			var bad []string
			tiers := map[string]int{}
			count := func() {
				leaf, whole, bad = 0, 0, nil
				clear(tiers)
				seen := false
				for _, pd := range s.all() {
					for _, st := range javaStacks(pd, pid) {
						for _, tier := range []string{"[interpreted]", "[c1]", "[c2]", "[stub]"} {
							tiers[tier] += strings.Count(st, tier)
						}
						if !strings.HasPrefix(st, "jvm:JBurn.jGammaBurn:") && !seen {
							continue
						}
						if !strings.HasPrefix(st, "jvm:JBurn.jGammaBurn:") {
							continue
						}
						seen = true
						leaf++
						if jburnWhole(st) {
							whole++
						} else if len(bad) < 5 {
							bad = append(bad, st)
						}
					}
				}
			}
			deadline := time.Now().Add(45 * time.Second)
			for count(); leaf < 300 && time.Now().Before(deadline); count() {
				s.waitFor(len(s.all())+1, 5*time.Second)
			}
			st := p.Stats()
			t.Logf("%s: %d of %d jGammaBurn samples whole; tiers %v; jvm %+v", name, whole, leaf, tiers, st.JVM)
			for _, b := range bad {
				t.Logf("not whole: %s", b)
			}
			if leaf < 300 {
				t.Fatalf("%d samples in jGammaBurn, want 300", leaf)
			}
			if whole*100 < leaf*99 {
				t.Errorf("%d of %d jGammaBurn samples whole, want 99 %%", whole, leaf)
			}
			if st.JVM.Processes < 1 {
				t.Errorf("no jvm set up: %+v", st.JVM)
			}
			if tiers["[c2]"] == 0 || tiers["[stub]"] == 0 {
				t.Errorf("frames by tier %v: want c2 frames and the call stub", tiers)
			}
		})
	}
}

// jburnWhole says whether a javaStacks stack of JBurn in jGammaBurn holds
// the whole chain: jGammaBurn, jBeta, jAlpha and main in that order (as
// frames or inline levels, each with a line), then the call stub, then the
// launcher's native JavaMain.
func jburnWhole(st string) bool {
	rest := st
	for _, fn := range []string{"JBurn.jGammaBurn:", "JBurn.jBeta:", "JBurn.jAlpha:", "JBurn.main:", "[stub]", "native:JavaMain:"} {
		i := strings.Index(rest, fn)
		if i < 0 {
			return false
		}
		if strings.HasPrefix(fn, "JBurn.") && strings.HasPrefix(rest[i+len(fn):], "0") {
			return false // no line
		}
		rest = rest[i+len(fn):]
	}
	return true
}

// TestJVMStartingWantsTables pauses a JVM at its start
// (-XX:+PauseAtStartup), with libjvm.so mapped but no interpreter yet:
// prepare cannot set it up, asks to read it again, and reports it
// starting, so the preparer has its tables built while it starts, not
// after (prepareRuntimes). The test's own process is no JVM, and not
// starting one.
func TestJVMStartingWantsTables(t *testing.T) {
	home := "/usr/lib/jvm/java-17-openjdk-amd64"
	if _, err := os.Stat(filepath.Join(home, "bin", "java")); err != nil {
		if testutil.InCI() {
			t.Fatalf("no JDK 17 at %s (CI=true: the test needs it)", home)
		}
		t.Skipf("no JDK 17 at %s", home)
	}
	dir := t.TempDir()
	pause := filepath.Join(dir, "paused")
	cmd := exec.Command(filepath.Join(home, "bin", "java"), "-XX:+UnlockDiagnosticVMOptions",
		"-XX:+PauseAtStartup", "-XX:PauseAtStartupFile="+pause, "-version")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// The JVM creates the file when it pauses, and waits for it to go.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(pause); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the JVM did not pause in 30 s")
		}
		time.Sleep(10 * time.Millisecond) // polling for the file, not waiting out a race
	}

	retried := make(chan int, 1)
	jp := newJVMProcs(zap.NewNop(), nil, "/proc", 1<<20)
	jp.retries.retry = func(pid int) {
		select {
		case retried <- pid:
		default:
		}
	}
	procs := process.NewTable("/proc", nil, process.Options{})
	proc, err := procs.Get(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if jp.prepare(proc) {
		t.Fatal("a JVM paused before its interpreter exists was set up")
	}
	if !jp.starting(proc.PID) {
		t.Error("the paused JVM is not reported starting")
	}
	if pid := <-retried; pid != proc.PID {
		t.Errorf("retry asked for pid %d, want %d", pid, proc.PID)
	}
	self, err := procs.Get(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if jp.prepare(self) || jp.starting(self.PID) {
		t.Error("the test's own process is taken for a JVM")
	}
	jp.forgetImage(proc.PID)
	if jp.starting(proc.PID) {
		t.Error("a forgotten image is still reported starting")
	}
}
