package collector_test

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/profiler"
)

// The JVM tests' contract with the receiver's output: a Java frame is a
// location whose profile.frame.type is "jvm", with the attribute
// sonde.frame.tier (interpreted, c1, c2, jvmci, native, stub), and one Line
// per inline level, innermost first: Function "pkg.Class.method",
// SystemName "pkg.Class.method(descriptor)", File "pkg/Source.java", Line
// from the line number table. A Java frame the namer could not name (its
// code gone) is a jvm location without lines.

// jdk is one JDK the JVM tests run their workloads with.
type jdk struct {
	name string
	home string
}

func (j jdk) bin(tool string) string { return filepath.Join(j.home, "bin", tool) }

// jdks lists the JDKs under test: Debian's 17 and Temurin's 25. A missing
// one fails under CI=true and is skipped elsewhere; with none the test is
// skipped.
func jdks(t *testing.T) []jdk {
	t.Helper()
	var have []jdk
	for _, j := range []jdk{
		{"17", "/usr/lib/jvm/java-17-openjdk-amd64"},
		{"25", "/usr/lib/jvm/temurin-25-jdk-amd64"},
	} {
		if _, err := os.Stat(j.bin("javac")); err != nil {
			if testutil.InCI() {
				t.Errorf("JDK %s missing at %s (CI=true: it must be installed)", j.name, j.home)
			} else {
				t.Logf("JDK %s missing at %s; not tested", j.name, j.home)
			}
			continue
		}
		have = append(have, j)
	}
	if len(have) == 0 {
		t.Skip("no JDK under test is installed")
	}
	return have
}

// jvmSource is the path of a file of testdata/jvm.
func jvmSource(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", "jvm", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// javac compiles sources with j's javac into a new temporary directory and
// returns it; cp, when given, is the class path.
func javac(t *testing.T, j jdk, cp string, sources ...string) string {
	t.Helper()
	out := t.TempDir()
	args := []string{"-J-Xmx256m", "-g", "-d", out}
	if cp != "" {
		args = append(args, "-cp", cp)
	}
	cmd := exec.Command(j.bin("javac"), append(args, sources...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	return out
}

// jvmMarks maps the names of the "// MARK name" comments of a testdata/jvm
// source to their lines.
func jvmMarks(t *testing.T, name string) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(jvmSource(t, name))
	if err != nil {
		t.Fatal(err)
	}
	marks := map[string]int64{}
	for i, l := range strings.Split(string(b), "\n") {
		if _, m, ok := strings.Cut(l, "// MARK "); ok {
			marks[strings.TrimSpace(m)] = int64(i + 1)
		}
	}
	return marks
}

// jvmMark is marks[name], or a fatal error.
func jvmMark(t *testing.T, marks map[string]int64, name string) int64 {
	t.Helper()
	l, ok := marks[name]
	if !ok {
		t.Fatalf("no MARK %s", name)
	}
	return l
}

// javaProc is a running JVM of a test.
type javaProc struct {
	cmd    *exec.Cmd
	pid    int
	main   int64     // TID of the thread that runs main (not the launcher's)
	ready  time.Time // when the test read "ready"
	stdout string    // the file that receives its standard output after "ready"
}

// startJava runs j's java with -Xmx128m, xargs (options, the class and its
// arguments), until the test ends, and waits until the program prints
// "ready" (lines before it, such as JFR's, are skipped); what it prints
// next goes to p.stdout.
func startJava(t *testing.T, j jdk, xargs ...string) javaProc {
	t.Helper()
	cmd := exec.Command(j.bin("java"), append([]string{"-Xmx128m"}, xargs...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	// Made before the process starts, the directory is removed after it
	// is killed (cleanups run last first).
	stdout := filepath.Join(t.TempDir(), "stdout")
	rest, err := os.Create(stdout)
	if err != nil {
		t.Fatal(err)
	}
	testutil.StartCmd(t, cmd)
	ready := make(chan error, 1)
	go func() {
		r := bufio.NewReader(out)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				ready <- fmt.Errorf("no ready line: %w", err)
				return
			}
			// HotSpot writes a -XX:+PrintCompilation line in pieces,
			// from the compiler's thread: "ready" may end one.
			if strings.HasSuffix(line, "ready\n") {
				ready <- nil
				// The rest, for tests that read the VM's logs; it ends
				// with the process.
				_, _ = io.Copy(rest, r)
				_ = rest.Close()
				return
			}
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: not ready in 60 s", strings.Join(cmd.Args, " "))
	}
	p := javaProc{cmd: cmd, pid: cmd.Process.Pid, ready: time.Now(), stdout: stdout}
	p.main = javaMainThread(t, p.pid)
	return p
}

// javaMainThread is the TID of the thread that runs a JVM's main method:
// the java launcher starts it first, before the VM exists and any of the
// VM's threads, so it is the first TID handed out after the launcher's
// own. The kernel hands IDs out in a cycle up to pid_max: after a wrap the
// VM's threads have smaller numbers than the launcher (a CI run saw the
// JVM 32758 with its VM threads from 303 on), so TIDs are ordered by how
// far after the launcher's PID they come in that cycle.
func javaMainThread(t *testing.T, pid int) int64 {
	t.Helper()
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	pidMax, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("pid_max: %v", err)
	}
	var tids []int64
	for _, d := range dirs {
		tid, err := strconv.ParseInt(filepath.Base(d), 10, 64)
		if err == nil && tid != int64(pid) {
			tids = append(tids, tid)
		}
	}
	if len(tids) == 0 {
		t.Fatalf("java %d has no thread besides the launcher's", pid)
	}
	return firstAfter(tids, int64(pid), pidMax)
}

// firstAfter is the TID of tids that the kernel's cyclic allocation, which
// wraps at pidMax, handed out first after pid.
func firstAfter(tids []int64, pid, pidMax int64) int64 {
	after := func(tid int64) int64 { return ((tid-pid)%pidMax + pidMax) % pidMax }
	return slices.MinFunc(tids, func(a, b int64) int { return cmp.Compare(after(a), after(b)) })
}

// TestFirstAfter checks the main thread's pick with and without a wrap of
// the IDs between the launcher and its threads.
func TestFirstAfter(t *testing.T) {
	for _, c := range []struct {
		tids        []int64
		pid, pidMax int64
		want        int64
	}{
		{[]int64{1001, 1002, 1010}, 1000, 32768, 1001},
		{[]int64{303, 304, 32759, 32767}, 32758, 32768, 32759},
		{[]int64{301, 302, 350}, 32767, 32768, 301},
		{[]int64{4194300, 310}, 4194290, 4194304, 4194300},
	} {
		if got := firstAfter(c.tids, c.pid, c.pidMax); got != c.want {
			t.Errorf("firstAfter(%v, %d, %d) = %d, want %d", c.tids, c.pid, c.pidMax, got, c.want)
		}
	}
}

// jvmLine is one Line of a location.
type jvmLine struct {
	Function, SystemName, File string
	Line                       int64
}

// jvmLoc is one location of a sample, with every Line.
type jvmLoc struct {
	Type, Tier string
	Mapping    string    // the file of its mapping ("": none)
	Lines      []jvmLine // innermost first
}

// jvmSample is a flattened sample with its locations' every Line (flatten
// keeps the innermost only).
type jvmSample struct {
	flatSample
	Locs []jvmLoc // parallel to Frames
}

// jvmFlatten is flatten with each location's lines and tier: it walks the
// samples in flatten's order and pairs them up.
func jvmFlatten(pd pprofile.Profiles) []jvmSample {
	flat := flatten(pd)
	dict := pd.Dictionary()
	strs := dict.StringTable()
	var out []jvmSample
	for _, rp := range pd.ResourceProfiles().All() {
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					js := jvmSample{flatSample: flat[len(out)]}
					stack := dict.StackTable().At(int(s.StackIndex()))
					for _, li := range stack.LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						var l jvmLoc
						if mi := loc.MappingIndex(); mi > 0 {
							l.Mapping = strs.At(int(dict.MappingTable().At(int(mi)).FilenameStrindex()))
						}
						for _, ai := range loc.AttributeIndices().All() {
							kv := dict.AttributeTable().At(int(ai))
							switch strs.At(int(kv.KeyStrindex())) {
							case "profile.frame.type":
								l.Type = kv.Value().AsString()
							case "sonde.frame.tier":
								l.Tier = kv.Value().AsString()
							}
						}
						for _, ln := range loc.Lines().All() {
							fn := dict.FunctionTable().At(int(ln.FunctionIndex()))
							l.Lines = append(l.Lines, jvmLine{
								Function:   strs.At(int(fn.NameStrindex())),
								SystemName: strs.At(int(fn.SystemNameStrindex())),
								File:       strs.At(int(fn.FilenameStrindex())),
								Line:       ln.Line(),
							})
						}
						js.Locs = append(js.Locs, l)
					}
					out = append(out, js)
				}
			}
		}
	}
	return out
}

// jframe is one Java frame of a sample, inlined ones apart: a location
// with three Lines gives three jframes.
type jframe struct {
	jvmLine
	Tier    string
	Loc     int  // index of its location in the sample
	Inlined bool // an inner Line of its location (inlined into the next jframe)
}

// unnamed is the Function of a jframe whose location has no lines.
const unnamed = "?"

// javaFrames are the Java frames of s, leaf first; stubs (tier stub: call
// stubs, adapters) are left out.
func javaFrames(s jvmSample) []jframe {
	var out []jframe
	for i, l := range s.Locs {
		if l.Type != "jvm" || l.Tier == "stub" {
			continue
		}
		if len(l.Lines) == 0 {
			out = append(out, jframe{jvmLine: jvmLine{Function: unnamed}, Tier: l.Tier, Loc: i})
			continue
		}
		for k, ln := range l.Lines {
			out = append(out, jframe{jvmLine: ln, Tier: l.Tier, Loc: i, Inlined: k < len(l.Lines)-1})
		}
	}
	return out
}

// jvmFunctions formats the frames of s for a failure message: Java frames
// as Function:line[tier], others as name(type).
func jvmFunctions(s jvmSample) string {
	var b []string
	for i, l := range s.Locs {
		switch {
		case l.Type == "jvm" && len(l.Lines) == 0:
			b = append(b, fmt.Sprintf("%s[%s]", unnamed, l.Tier))
		case l.Type == "jvm":
			var in []string
			for _, ln := range l.Lines {
				in = append(in, fmt.Sprintf("%s:%d", ln.Function, ln.Line))
			}
			b = append(b, fmt.Sprintf("%s[%s]", strings.Join(in, "<i<"), l.Tier))
		default:
			b = append(b, fmt.Sprintf("%s(%s)", s.Frames[i].Function, l.Type))
		}
	}
	return strings.Join(b, " <- ")
}

// timesIn counts the timestamps of s in [from, to].
func timesIn(s flatSample, from, to time.Time) int {
	n := 0
	for _, ts := range s.Times {
		if t := time.Unix(0, int64(ts)); !t.Before(from) && !t.After(to) {
			n++
		}
	}
	return n
}

// truncated reports whether Sonde marked the sample's user stack cut short.
func truncated(s flatSample) bool {
	return slices.ContainsFunc(s.Frames, func(f frame) bool { return f.Function == profiler.TruncatedFrame })
}

// jvmMethod is a method of the program's classes, as javap shows it.
type jvmMethod struct {
	SystemName string // Class.method(descriptor)
	File       string // the class's source file, with its package's path
	First      int64  // the lowest and highest line of its line number table
	Last       int64
}

var (
	javapClass  = regexp.MustCompile(`^(?:[a-z]+ )*(?:class|interface|enum|record) ([\w.$]+)`)
	javapMethod = regexp.MustCompile(`^  (?:[\w.$<>\[\], ?]+ )?([\w.$]+)\((.*)\)(?: throws [\w.$, ]+)?;$`)
	javapLine   = regexp.MustCompile(`^ +line (\d+): \d+$`)
)

// jvmMethods lists the methods of every class under dir with j's javap,
// by Function (Class.method); overloads share the key.
func jvmMethods(t *testing.T, j jdk, dir string) map[string][]jvmMethod {
	t.Helper()
	var classes []string
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".class") {
			rel, _ := filepath.Rel(dir, p)
			classes = append(classes, strings.TrimSuffix(filepath.ToSlash(rel), ".class"))
		}
		return err
	})
	if err != nil || len(classes) == 0 {
		t.Fatalf("classes under %s: %v (%d)", dir, err, len(classes))
	}
	cmd := exec.Command(j.bin("javap"), append([]string{"-p", "-c", "-l", "-s", "-cp", dir}, classes...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(cmd.Args, " "), err)
	}
	methods := map[string][]jvmMethod{}
	var class, file, name string
	var cur *jvmMethod
	flush := func() {
		if cur != nil {
			methods[class+"."+name] = append(methods[class+"."+name], *cur)
		}
		cur = nil
	}
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(l, "Compiled from \""):
			flush()
			file = strings.TrimSuffix(strings.TrimPrefix(l, "Compiled from \""), "\"")
		case javapClass.MatchString(l):
			flush()
			class = javapClass.FindStringSubmatch(l)[1]
			if pkg, _, ok := cutLast(class, "."); ok {
				file = strings.ReplaceAll(pkg, ".", "/") + "/" + filepath.Base(file)
			}
		case l == "  static {};":
			flush()
			name, cur = "<clinit>", &jvmMethod{File: file}
		case javapMethod.MatchString(l):
			flush()
			name = javapMethod.FindStringSubmatch(l)[1]
			if name == class {
				name = "<init>"
			}
			cur = &jvmMethod{File: file}
		case strings.HasPrefix(l, "    descriptor: ") && cur != nil && cur.SystemName == "":
			cur.SystemName = class + "." + name + strings.TrimPrefix(l, "    descriptor: ")
		case javapLine.MatchString(l) && cur != nil:
			n, _ := strconv.ParseInt(javapLine.FindStringSubmatch(l)[1], 10, 64)
			if cur.First == 0 || n < cur.First {
				cur.First = n
			}
			cur.Last = max(cur.Last, n)
		case strings.HasPrefix(l, "  ") && strings.HasSuffix(l, ";") && !strings.HasPrefix(l, "   "):
			flush() // a field
		}
	}
	flush()
	return methods
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// jdkClass reports whether a Function is the JDK's (java., jdk., sun.,
// com.sun.).
func jdkClass(function string) bool {
	for _, p := range []string{"java.", "javax.", "jdk.", "sun.", "com.sun."} {
		if strings.HasPrefix(function, p) {
			return true
		}
	}
	return false
}

// checkName checks one named Java frame against the program's methods:
// a method of the program must be there with its descriptor, source file
// and a line of its own (or none: unknown); a JDK method must have its descriptor and name a
// file in its package's directory. Anything else is a wrong name.
func checkName(f jframe, methods map[string][]jvmMethod) error {
	if ms, ok := methods[f.Function]; ok {
		for _, m := range ms {
			if m.SystemName != f.SystemName {
				continue
			}
			if f.File != m.File {
				return fmt.Errorf("%s: file %q, want %q", f.SystemName, f.File, m.File)
			}
			if m.First == 0 {
				return nil // no line number table: a native method
			}
			// Line 0 is unknown (a compiled frame past its method's last
			// debug information), not wrong.
			if f.Line != 0 && (f.Line < m.First || f.Line > m.Last) {
				return fmt.Errorf("%s: line %d outside the method's %d-%d", f.SystemName, f.Line, m.First, m.Last)
			}
			return nil
		}
		return fmt.Errorf("%s: no such method (system name %q)", f.Function, f.SystemName)
	}
	if !jdkClass(f.Function) {
		return fmt.Errorf("%q is neither the program's nor the JDK's", f.Function)
	}
	class, _, _ := cutLast(f.Function, ".")
	pkg, _, _ := cutLast(class, ".")
	if !strings.HasPrefix(f.SystemName, f.Function+"(") {
		return fmt.Errorf("%s: system name %q", f.Function, f.SystemName)
	}
	// The file is the class's SourceFile in its package's directory; a
	// class the JDK spins (LambdaForm$MH/0x...) may have no ".java".
	if f.File != "" && !strings.HasPrefix(f.File, strings.ReplaceAll(pkg, ".", "/")+"/") {
		return fmt.Errorf("%s: file %q is not in its package", f.Function, f.File)
	}
	return nil
}

// shares turns counts into percentages of their total.
func shares(counts map[string]int) map[string]float64 {
	total := 0
	for _, n := range counts {
		total += n
	}
	out := map[string]float64{}
	for k, n := range counts {
		out[k] = 100 * float64(n) / float64(max(total, 1))
	}
	return out
}

// compareShares returns, for every key over minShare percent in either
// distribution, a line where the two differ by more than points.
func compareShares(got, want map[string]int, minShare, points float64) []string {
	g, w := shares(got), shares(want)
	keys := map[string]bool{}
	for k, v := range g {
		keys[k] = keys[k] || v > minShare
	}
	for k, v := range w {
		keys[k] = keys[k] || v > minShare
	}
	var bad []string
	for k, big := range keys {
		if big && (g[k]-w[k] > points || w[k]-g[k] > points) {
			bad = append(bad, fmt.Sprintf("%q: Sonde %.1f %%, JFR %.1f %%", k, g[k], w[k]))
		}
	}
	sort.Strings(bad)
	return bad
}

// topShares formats the k largest shares of counts.
func topShares(counts map[string]int, k int) string {
	s := shares(counts)
	keys := make([]string, 0, len(s))
	for key := range s {
		keys = append(keys, key)
	}
	sort.Slice(keys, func(i, j int) bool { return s[keys[i]] > s[keys[j]] || s[keys[i]] == s[keys[j]] && keys[i] < keys[j] })
	var b []string
	for _, key := range keys[:min(k, len(keys))] {
		b = append(b, fmt.Sprintf("%.1f%% %s", s[key], key))
	}
	return strings.Join(b, "; ")
}

// genJavaSources writes n Java sources of package gen into a new temporary
// directory for javac to compile: each class has generic methods, a
// lambda, a stream, a switch on strings, an inner record-like class and
// calls into two other classes, so attribution, inference, lambda
// desugaring and code generation all have work. It returns the files.
func genJavaSources(t *testing.T, n int) []string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "gen")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var files []string
	for i := range n {
		var b strings.Builder
		fmt.Fprintf(&b, `package gen;

import java.util.*;
import java.util.function.*;
import java.util.stream.*;

public class C%[1]d<T extends Comparable<T>> {
    static final class Pair<A, B> {
        final A a;
        final B b;
        Pair(A a, B b) { this.a = a; this.b = b; }
        <C> Pair<A, C> withB(Function<? super B, ? extends C> f) { return new Pair<>(a, f.apply(b)); }
    }

    private final List<T> items = new ArrayList<>();

    public C%[1]d<T> add(T t) { items.add(t); return this; }

    public Optional<T> max() { return items.stream().max(Comparator.naturalOrder()); }

    public <R> List<R> map(Function<? super T, ? extends R> f) {
        return items.stream().map(f).collect(Collectors.toList());
    }

    public static int kind(String s) {
        switch (s) {
            case "alpha": return %[1]d;
            case "beta": return C%[2]d.kind("gamma") + 1;
            case "gamma": return 3;
            default: return s.length();
        }
    }

    public static Map<String, List<Integer>> group(List<String> words) {
        return words.stream().collect(Collectors.groupingBy(w -> w.substring(0, 1), TreeMap::new,
            Collectors.mapping(String::length, Collectors.toList())));
    }

    public static long work(int k) {
        C%[1]d<Integer> c = new C%[1]d<>();
        for (int i = 0; i < k; i++) { c.add(i * %[1]d %% 17); }
        Pair<String, Integer> p = new Pair<>("x", k);
        Pair<String, Long> q = p.withB(v -> (long) v * C%[3]d.kind("alpha"));
        BiFunction<Integer, Integer, Integer> add = Integer::sum;
        return c.map(x -> add.apply(x, 1)).stream().mapToLong(Integer::longValue).sum() + q.b
            + group(Arrays.asList("ab", "ac", "b")).size() + c.max().orElse(0);
    }
}
`, i, (i+1)%n, (i+7)%n)
		p := filepath.Join(dir, fmt.Sprintf("C%d.java", i))
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	return files
}

// jvmBuild is the workloads of testdata/jvm, built with one JDK.
type jvmBuild struct {
	jdk     jdk
	classes string // JBurn, Inline, JniBurn, Churn
	plugins string // Plugin, off the class path
	libs    string // libjniburn.so
	methods map[string][]jvmMethod
}

// buildJVM compiles the workloads with j's javac and the JNI library with
// the C compiler, without frame pointers (only its unwind tables find its
// callers) and with j's JNI headers.
func buildJVM(t *testing.T, j jdk) jvmBuild {
	t.Helper()
	b := jvmBuild{jdk: j}
	b.classes = javac(t, j, "", jvmSource(t, "JBurn.java"), jvmSource(t, "Inline.java"), jvmSource(t, "JniBurn.java"), jvmSource(t, "Churn.java"))
	b.plugins = javac(t, j, b.classes, jvmSource(t, "Plugin.java"))
	inc := filepath.Join(j.home, "include")
	lib := testutil.BuildC(t, "libjniburn.so", append([]string{"-shared", "-fPIC", "-I", inc, "-I", filepath.Join(inc, "linux")}, wholeFlags...), jvmSource(t, "jniburn.c"))
	b.libs = filepath.Dir(lib)
	b.methods = jvmMethods(t, j, b.classes)
	for k, v := range jvmMethods(t, j, b.plugins) {
		b.methods[k] = append(b.methods[k], v...)
	}
	return b
}

// method is the one method of the program named function.
func (b jvmBuild) method(t *testing.T, function string) jvmMethod {
	t.Helper()
	ms := b.methods[function]
	if len(ms) != 1 {
		t.Fatalf("JDK %s: %d methods %s, want one", b.jdk.name, len(ms), function)
	}
	return ms[0]
}

// start runs class (with args) from the build's classes, the JNI library
// on java.library.path; opts go before the class.
func (b jvmBuild) start(t *testing.T, opts []string, class string, args ...string) javaProc {
	t.Helper()
	xargs := append(append([]string{}, opts...), "-cp", b.classes, "-Djava.library.path="+b.libs, class)
	return startJava(t, b.jdk, append(xargs, args...)...)
}
