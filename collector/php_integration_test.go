//go:build linux

package collector_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/consumer/consumertest"

	"github.com/sonde-dev/sonde/internal/testutil"
)

// phpBin is Debian's PHP 8.2 CLI (php-cli).
const phpBin = "/usr/bin/php8.2"

// requirePHP skips without Debian's PHP, or fails under CI=true.
func requirePHP(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(phpBin); err != nil {
		if testutil.InCI() {
			t.Fatalf("%s is missing (CI=true: apt-get install php-cli): %v", phpBin, err)
		}
		t.Skipf("%s is missing: %v", phpBin, err)
	}
}

// phpScript is the absolute path of a file of internal/php/testdata.
func phpScript(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "internal", "php", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// phpLineOf is the 1-based line of the first line of a testdata file
// holding text.
func phpLineOf(t *testing.T, name, text string) int64 {
	t.Helper()
	b, err := os.ReadFile(phpScript(t, name))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return int64(i + 1)
		}
	}
	t.Fatalf("%s: no line holds %q", name, text)
	return 0
}

// phpWant is one PHP frame a chain must hold: its function, its file and
// its line, or (body) a line among the eight after it.
type phpWant struct {
	function, file string
	line           int64
	body           bool
}

// phpChain is one mode of burn.php: the PHP frames of a sample in its
// leaf, innermost first, after leafInternal (functions of PHP's own,
// named as php frames, run by C code whose native frames stay above).
type phpChain struct {
	mode, label  string   // burn.php's mode, and the test's name for it ("": the mode)
	flags        []string // PHP's own options
	leafInternal string
	chain        []phpWant
}

func phpChains(t *testing.T, minor int) []phpChain {
	at := func(file, text string) int64 { return phpLineOf(t, file, text) }
	// A closure is {closure}; from 8.4 PHP names it by where it is
	// defined: the enclosing function, else the file, and the line.
	closure := func(file, text, in string) string {
		if minor < 4 {
			return "{closure}"
		}
		if in == "" {
			in = phpScript(t, file)
		}
		return fmt.Sprintf("{closure:%s:%d}", in, at(file, text))
	}
	common := []phpWant{
		{"alpha", "burn.php", at("burn.php", "return beta($mode, $n, $data) + 1;"), false},
		{"main", "burn.php", at("burn.php", "$sum = ($sum + alpha($mode, 200000, $data)) % 1000003;"), false},
		{"{main}", "burn.php", at("burn.php", "main($argv);"), false},
	}
	return []phpChain{
		{mode: "php", chain: append([]phpWant{
			{"gamma_burn", "burn.php", at("burn.php", "function gamma_burn(int $n): int"), true},
			{"beta", "burn.php", at("burn.php", "return gamma_burn($n) + 1;"), false}}, common...)},
		{mode: "ext", leafInternal: "hash", chain: append([]phpWant{
			{"gamma_hash", "burn.php", at("burn.php", "return strlen(hash('sha256', $data));"), false},
			{"beta", "burn.php", at("burn.php", "return gamma_hash($data) + 1;"), false}}, common...)},
		// opcache's tracing JIT: gamma_burn's loop and its callers run as
		// JIT code on execute_ex's frame.
		{mode: "php", label: "php, jit", flags: []string{"-d", "opcache.enable_cli=1", "-d", "opcache.jit=tracing",
			"-d", "opcache.jit_buffer_size=64M"}, chain: append([]phpWant{
			{"gamma_burn", "burn.php", at("burn.php", "function gamma_burn(int $n): int"), true},
			{"beta", "burn.php", at("burn.php", "return gamma_burn($n) + 1;"), false}}, common...)},
		{mode: "closure", chain: append([]phpWant{
			{"Burner::" + closure("burner.php", "$burn = function (int $n): int {", "Burner::run()"), "burner.php",
				at("burner.php", "$burn = function (int $n): int {"), true},
			{"Burner::run", "burner.php", at("burner.php", "return $burn($n);"), false},
			{"beta", "burn.php", at("burn.php", "return (new Burner())->run($n) + 1;"), false}}, common...)},
		// With opcache, as PHP runs in production: without it an included
		// file is compiled anew at each include and freed when it ends,
		// and a frame of it is often gone before its sample is named
		// (docs/php.md).
		{mode: "include", flags: []string{"-d", "opcache.enable_cli=1"}, chain: append([]phpWant{
			{"gamma_burn", "burn.php", at("burn.php", "function gamma_burn(int $n): int"), true},
			{closure("inc_burn.php", "$f = fn (int $k): int => gamma_burn($k);", ""), "inc_burn.php",
				at("inc_burn.php", "$f = fn (int $k): int => gamma_burn($k);"), false},
			{"{include}", "inc_burn.php", at("inc_burn.php", "return $f($n);"), false},
			{"beta", "burn.php", at("burn.php", "return (include __DIR__ . '/inc_burn.php') + 1;"), false}}, common...)},
	}
}

// isExecuteScript says whether fn runs a script for the CLI: 8.4's
// php_execute_script tail-calls php_execute_script_ex, which runs it.
func isExecuteScript(fn string) bool {
	return fn == "php_execute_script" || fn == "php_execute_script_ex"
}

// phpFrame is one location of a sample, flattened: its type and innermost
// line.
type phpFrame struct {
	Type string
	jvmLine
}

func phpFrames(s jvmSample) []phpFrame {
	out := make([]phpFrame, 0, len(s.Locs))
	for _, l := range s.Locs {
		f := phpFrame{Type: l.Type}
		if len(l.Lines) > 0 {
			f.jvmLine = l.Lines[0]
		}
		out = append(out, f)
	}
	return out
}

// leafOf returns the index of the first php frame of fs after c's leaf
// internal function (-1: none) and whether fs is in c's leaf.
func (c phpChain) leafOf(fs []phpFrame) (int, bool) {
	i := 0
	for i < len(fs) && fs[i].Type != "php" {
		i++
	}
	if i < len(fs) && c.leafInternal != "" && fs[i].Function == c.leafInternal {
		i++
	}
	return i, i < len(fs) && fs[i].Type == "php" && fs[i].Function == c.chain[0].function
}

// whole checks a sample in c's leaf: the chain in order from index i, each
// frame named with its file and line, nothing but php frames in between;
// then native frames of PHP down to php_execute_script; and, for a leaf in
// C, native frames above the PHP ones.
func (c phpChain) whole(fs []phpFrame, i int) error {
	first := 0
	for first < len(fs) && fs[first].Type == "kernel" {
		first++
	}
	// In the internal function (C), its native frames are above it; a
	// sample between its calls has none.
	if c.leafInternal != "" && i > 0 && fs[i-1].Type == "php" && fs[i-1].Function == c.leafInternal &&
		(i < first+2 || fs[first].Type != "native") {
		return fmt.Errorf("no native frames above %s", c.leafInternal)
	}
	for k, w := range c.chain {
		if i+k >= len(fs) {
			return fmt.Errorf("chain ends before %s", w.function)
		}
		f := fs[i+k]
		if f.Type != "php" || f.Function != w.function || filepath.Base(f.File) != w.file {
			return fmt.Errorf("frame %d: %s %s in %s, want %s in %s", i+k, f.Type, f.Function, f.File, w.function, w.file)
		}
		if w.body && (f.Line <= w.line || f.Line > w.line+8) || !w.body && f.Line != w.line {
			return fmt.Errorf("%s at line %d, want %d (body %v)", f.Function, f.Line, w.line, w.body)
		}
	}
	for _, f := range fs[i+len(c.chain):] {
		if f.Type == "php" {
			return fmt.Errorf("php frame %s below {main}", f.Function)
		}
		if isExecuteScript(f.Function) {
			return nil
		}
	}
	return fmt.Errorf("no php_execute_script below the PHP frames")
}

// phpTally counts one process's samples in its chain's leaf.
type phpTally struct {
	leaf, whole int
	inC         int // leaf samples in the chain's internal function (C), whole

	first uint64 // the first leaf sample's time (Unix ns)
	bad   []string
}

// collectPHP reads the sink until each process of chains (by pid) has n
// samples in its leaf, or limit passes, checking each.
func collectPHP(sink *consumertest.ProfilesSink, chains map[int64]phpChain, n int, limit time.Duration) map[int64]*phpTally {
	got := map[int64]*phpTally{}
	for pid := range chains {
		got[pid] = &phpTally{}
	}
	enough := func() bool {
		for _, tl := range got {
			if tl.leaf < n {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(limit)
	read := 0
	for time.Now().Before(deadline) && !enough() {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range jvmFlatten(pd) {
				c, ok := chains[s.PID]
				if !ok {
					continue
				}
				fs := phpFrames(s)
				i, in := c.leafOf(fs)
				if !in {
					continue
				}
				tl := got[s.PID]
				if tl.first == 0 || (len(s.Times) > 0 && s.Times[0] < tl.first) {
					tl.first = s.Times[0]
				}
				tl.leaf += s.Count
				if err := c.whole(fs, i); err != nil {
					if len(tl.bad) < 5 {
						tl.bad = append(tl.bad, fmt.Sprintf("%v (%v after the first): %v", err,
							time.Duration(s.Times[0]-tl.first), fs))
					}
					continue
				}
				tl.whole += s.Count
				if c.leafInternal != "" && i > 0 && fs[i-1].Function == c.leafInternal {
					tl.inC += s.Count
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	return got
}

// warmPHP runs burn.php until the receiver shows one of its stacks whole
// down to php_execute_script, and stops it: the PHP binary's unwind table
// is then in the kernel, as it is on a host that has run PHP for a
// second. A process started before then has its first native frames
// below the PHP ones unwound from stack snapshots, which the eBPF side
// skips while the ring buffer is half full (docs/php.md).
func warmPHP(t *testing.T, sink *consumertest.ProfilesSink, php testutil.Interpreter, args ...string) {
	t.Helper()
	cmd := php.Command(args...)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	defer func() { _ = cmd.Process.Kill() }()
	pid := int64(cmd.Process.Pid)
	deadline := time.Now().Add(60 * time.Second)
	read := 0
	for time.Now().Before(deadline) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			for _, s := range jvmFlatten(pd) {
				if s.PID != pid {
					continue
				}
				fs := phpFrames(s)
				if len(fs) > 0 && fs[len(fs)-1].Function == "_start" && slices.ContainsFunc(fs, func(f phpFrame) bool {
					return isExecuteScript(f.Function)
				}) {
					return
				}
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	t.Fatalf("no whole stack of %s within a minute", strings.Join(cmd.Args, " "))
}

// TestPHPStacks runs each mode of burn.php on Debian's PHP 8.2, started
// after the receiver (and after a first PHP process: warmPHP), and counts from each one's first sample in its leaf:
// at least 99 % of them carry the whole chain of PHP frames (functions,
// methods, a closure, an include's top-level code), each with its file and
// line, frame type php, and PHP's native frames below down to
// php_execute_script; where the leaf is C (hash), its native frames stay
// above the PHP frames.
func TestPHPStacks(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	for _, php := range testutil.PHPs(t) {
		t.Run(php.Version, func(t *testing.T) { testPHPStacks(t, php) })
	}
}

func testPHPStacks(t *testing.T, php testutil.Interpreter) {
	sink := startReceiver(t, jvmRate)
	warmPHP(t, sink, php, phpScript(t, "burn.php"))
	chains := map[int64]phpChain{}
	for _, c := range phpChains(t, php.Minor) {
		cmd := php.Command(append(c.flags, phpScript(t, "burn.php"), c.mode)...)
		cmd.Stderr = os.Stderr
		testutil.StartReady(t, cmd, 30*time.Second)
		chains[int64(cmd.Process.Pid)] = c
	}
	const n = 300
	got := collectPHP(sink, chains, n, 3*time.Minute)
	for pid, tl := range got {
		c := chains[pid]
		name := c.label
		if name == "" {
			name = c.mode
		}
		t.Logf("burn.php %s: %d of %d leaf samples whole (%.2f %%)", name, tl.whole, tl.leaf,
			100*float64(tl.whole)/float64(max(tl.leaf, 1)))
		for _, b := range tl.bad {
			t.Logf("  not whole: %s", b)
		}
		if tl.leaf < n {
			t.Errorf("%s: %d samples in the leaf, want %d", name, tl.leaf, n)
		}
		if tl.whole*100 < tl.leaf*99 {
			t.Errorf("%s: %d of %d leaf samples whole, want 99 %%", name, tl.whole, tl.leaf)
		}
		if c.leafInternal != "" {
			t.Logf("  %d of them in %s, native frames above", tl.inC, c.leafInternal)
			if tl.inC*10 < tl.leaf*9 {
				t.Errorf("%s: %d of %d leaf samples in %s, want 90 %%", name, tl.inC, tl.leaf, c.leafInternal)
			}
		}
	}
}
