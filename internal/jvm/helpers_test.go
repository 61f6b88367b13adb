package jvm

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// jdk is one JDK this host has, for tests.
type jdk struct {
	name  string // "17"
	major int
	home  string
}

// testedJDKs are the JDKs the project's tests require.
var testedJDKs = []jdk{
	{"openjdk-17", 17, "/usr/lib/jvm/java-17-openjdk-amd64"},
	{"temurin-25", 25, "/usr/lib/jvm/temurin-25-jdk-amd64"},
}

// installedJDKs lists every required JDK; one missing fails the test under
// CI=true and skips it elsewhere.
func installedJDKs(t testing.TB) []jdk {
	t.Helper()
	var out []jdk
	for _, j := range testedJDKs {
		if _, err := os.Stat(filepath.Join(j.home, "bin", "javac")); err != nil {
			if testutil.InCI() {
				t.Errorf("jdk %s is missing at %s", j.name, j.home)
			} else {
				t.Logf("jdk %s is missing at %s; not tested", j.name, j.home)
			}
			continue
		}
		out = append(out, j)
	}
	if len(out) == 0 && !testutil.InCI() {
		t.Skip("no jdk installed")
	}
	return out
}

// compile compiles testdata/name.java with j's javac into a temporary
// directory and returns it.
func compile(t testing.TB, j jdk, name string) string {
	t.Helper()
	dir := t.TempDir()
	src, err := filepath.Abs(filepath.Join("testdata", name+".java"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(j.home, "bin", "javac"), "-g", "-d", dir, src).CombinedOutput()
	if err != nil {
		t.Fatalf("javac %s: %v\n%s", name, err, out)
	}
	// Other users must reach the classes when the JVM runs as nobody.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startJava runs class main of dir with j and waits for its "ready" line.
func startJava(t testing.TB, j jdk, dir, class string, flags []string, args ...string) *exec.Cmd {
	t.Helper()
	argv := append([]string{"-Xmx64m", "-XX:+UseSerialGC", "-XX:CICompilerCount=2", "-cp", dir}, flags...)
	argv = append(argv, class)
	argv = append(argv, args...)
	cmd := exec.Command(filepath.Join(j.home, "bin", "java"), argv...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				ready <- nil
				break
			}
		}
		ready <- sc.Err()
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("java %s: %v", class, err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("java %s never said ready", class)
	}
	return cmd
}

// findVM finds the JVM of pid.
func findVM(t testing.TB, pid int) (*VM, *python.ProcMem) {
	t.Helper()
	procs := process.NewTable("/proc", zap.NewNop(), process.Options{})
	p, err := procs.Get(pid)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := python.OpenMem("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testutil.Close(t, mem) })
	vm, err := Find(p, mem)
	if err != nil {
		t.Fatalf("find jvm of %d: %v", pid, err)
	}
	testPIDs[vm] = pid
	return vm, mem
}

var versionRe = regexp.MustCompile(`(?m)^(?:OpenJDK|Java\(TM\)).*Runtime Environment.*\(build ([^)]+)\)`)

// javaRelease is what `java -version` says the release is.
func javaRelease(t testing.TB, j jdk) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(j.home, "bin", "java"), "-version").CombinedOutput()
	if err != nil {
		t.Fatalf("java -version: %v\n%s", err, out)
	}
	m := versionRe.FindSubmatch(out)
	if m == nil {
		t.Fatalf("java -version: no build in %q", out)
	}
	return string(m[1])
}

// lineTable is a method's LineNumberTable as javap -l prints it.
type lineTable struct {
	bciLine [][2]int // (start bci, line), in order
}

func (lt lineTable) lineAt(bci int) int {
	line := -1
	for _, e := range lt.bciLine {
		if e[0] <= bci {
			line = e[1]
		}
	}
	return line
}

func (lt lineTable) span() (lo, hi int) {
	lo, hi = 1<<30, 0
	for _, e := range lt.bciLine {
		lo, hi = min(lo, e[1]), max(hi, e[1])
	}
	return lo, hi
}

// javapLines reads the line tables of class's methods (by name) with javap.
func javapLines(t testing.TB, j jdk, dir, class string) map[string]lineTable {
	t.Helper()
	out, err := exec.Command(filepath.Join(j.home, "bin", "javap"), "-c", "-l", "-p", "-cp", dir, class).CombinedOutput()
	if err != nil {
		t.Fatalf("javap %s: %v\n%s", class, err, out)
	}
	res := map[string]lineTable{}
	method := regexp.MustCompile(`^\s+(?:[\w.$<>\[\]]+\s+)*([\w$<>]+)\(`)
	entry := regexp.MustCompile(`^\s+line (\d+): (\d+)`)
	cur := ""
	for _, l := range strings.Split(string(out), "\n") {
		if m := entry.FindStringSubmatch(l); m != nil && cur != "" {
			line, _ := strconv.Atoi(m[1])
			bci, _ := strconv.Atoi(m[2])
			lt := res[cur]
			lt.bciLine = append(lt.bciLine, [2]int{bci, line})
			res[cur] = lt
			continue
		}
		if m := method.FindStringSubmatch(l); m != nil && strings.HasSuffix(strings.TrimSpace(l), ";") {
			cur = m[1]
		}
	}
	return res
}
