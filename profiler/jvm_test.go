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
// returns once the program printed "ready".
func startJava(t *testing.T, home, src, main string, args ...string) int {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command(filepath.Join(home, "bin", "javac"), "-d", dir, src).CombinedOutput(); err != nil {
		t.Fatalf("javac %s: %v\n%s", src, err, out)
	}
	cmd := exec.Command(filepath.Join(home, "bin", "java"), append([]string{"-Xmx64m", "-XX:+UseSerialGC", "-cp", dir, main}, args...)...)
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

func TestJVMFramesDev(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	for name, home := range jdks(t) {
		t.Run(name, func(t *testing.T) {
			p, s := startProfiler(t, 99)
			pid := startJava(t, home, "../internal/jvm/testdata/JBurn.java", "JBurn", "20")
			time.Sleep(10 * time.Second)
			shapes := map[string]int{}
			for _, pd := range s.all() {
				for _, st := range javaStacks(pd, pid) {
					shapes[st]++
				}
			}
			st := p.Stats()
			t.Logf("jvm %+v kernel jvm samples %d frames %d noblob %d readerr %d", st.JVM, st.Kernel.JVMSamples, st.Kernel.JVMFrames, st.Kernel.JVMNoBlob, st.Kernel.JVMReadErrs)
			for k, v := range shapes {
				if v > 2 {
					t.Logf("%5d %s", v, k)
				}
			}
		})
	}
}
