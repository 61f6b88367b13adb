//go:build linux

package profiler

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/internal/php"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/tracer"
)

// phpBin is Debian's PHP 8.2 CLI; the tests skip without it, or fail
// under CI=true.
func phpBin(t *testing.T) string {
	t.Helper()
	const bin = "/usr/bin/php8.2"
	if _, err := os.Stat(bin); err != nil {
		if testutil.InCI() {
			t.Fatalf("%s is missing (CI=true: apt-get install php-cli): %v", bin, err)
		}
		t.Skipf("%s is missing: %v", bin, err)
	}
	return bin
}

// startBurnPHP runs internal/php's burn.php in mode and waits for its
// "ready" line.
func startBurnPHP(t *testing.T, mode string) int {
	t.Helper()
	cmd := exec.Command(phpBin(t), "../internal/php/testdata/burn.php", mode)
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	return cmd.Process.Pid
}

// phpBurnWhole says whether a javaStacks stack of burn.php in gamma_burn
// holds the whole chain, each PHP frame with a line, then PHP's native
// frames.
func phpBurnWhole(st string) bool {
	rest := st
	for _, fn := range []string{"php:gamma_burn:", "php:beta:", "php:alpha:", "php:main:", "php:{main}:", "native:"} {
		i := strings.Index(rest, fn)
		if i < 0 {
			return false
		}
		rest = rest[i+len(fn):]
		if fn != "native:" && (len(rest) == 0 || rest[0] < '1' || rest[0] > '9') {
			return false // no line
		}
	}
	return true
}

// TestPHPFrames runs burn.php (main -> alpha -> beta -> gamma_burn),
// started after the profiler. From the first sample in gamma_burn on, at
// least 99 % of those samples carry the whole chain with lines, then PHP's
// native frames; the walker's and the namer's counters say so too.
func TestPHPFrames(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	phpBin(t)
	p, s := startProfiler(t, 99)
	pid := startBurnPHP(t, "php")
	var leaf, whole int
	var bad []string
	example := ""
	count := func() {
		leaf, whole, bad = 0, 0, nil
		for _, pd := range s.all() {
			for _, st := range javaStacks(pd, pid) {
				if !strings.HasPrefix(st, "php:gamma_burn:") {
					continue
				}
				leaf++
				if phpBurnWhole(st) {
					whole++
					example = st
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
	t.Logf("%d of %d gamma_burn samples whole; php %+v; kernel php samples %d frames %d read errors %d bad frames %d",
		whole, leaf, st.PHP, st.Kernel.PHPSamples, st.Kernel.PHPFrames, st.Kernel.PHPReadErrs, st.Kernel.PHPBadFrames)
	t.Logf("a whole stack: %s", example)
	for _, b := range bad {
		t.Logf("not whole: %s", b)
	}
	if leaf < 300 {
		t.Fatalf("%d samples in gamma_burn, want 300", leaf)
	}
	if whole*100 < leaf*99 {
		t.Errorf("%d of %d gamma_burn samples whole, want 99 %%", whole, leaf)
	}
	if st.PHP.Processes < 1 || st.PHP.Named == 0 || st.Kernel.PHPSamples == 0 || st.Kernel.PHPFrames < st.PHP.Named {
		t.Errorf("counters: php %+v, kernel samples %d frames %d", st.PHP, st.Kernel.PHPSamples, st.Kernel.PHPFrames)
	}
}

// TestPHPUnknownVersion runs two real PHP 8.2 processes while the
// profiler's layout table hides 8.2: the version is reported once (one log
// line, counted), and its processes keep their native stacks, with
// execute_ex where PHP frames would be.
func TestPHPUnknownVersion(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	phpBin(t)
	core, logs := observer.New(zapcore.WarnLevel)
	p, s := startProfiler(t, 99, func(o *Options) {
		o.Logger = zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
		o.phpLayouts = func(minor int) (php.Layout, error) {
			return php.Layout{}, fmt.Errorf("php 8.%d: hidden by the test: %w", minor, php.ErrUnknownVersion)
		}
	})
	pids := []int{startBurnPHP(t, "php"), startBurnPHP(t, "php")}
	hiddenRuntimeStacks(t, s, pids, "php", "execute_ex", 30)
	if lines := logContexts(logs, "php version not supported", ""); len(lines) != 1 || !strings.Contains(lines[0], "php 8.2.") {
		t.Errorf("unsupported version log lines: %q, want one about php 8.2", lines)
	}
	ps := p.Stats().PHP
	if ps.UnknownVersions != 1 || ps.Unsupported < 2 || ps.Processes != 0 {
		t.Errorf("Stats.PHP = %+v, want 1 unknown version, >= 2 unsupported, none walked", ps)
	}
}

// TestKernelPHPBounds takes every layout of the table and refuses one
// whose fields are outside what the walker reads of a frame or a function.
func TestKernelPHPBounds(t *testing.T) {
	good, err := php.LayoutFor(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, minor := range php.Minors() {
		l, err := php.LayoutFor(minor)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kernelPHP(&php.Interp{Version: fmt.Sprintf("8.%d.0", minor), Layout: l}); err != nil {
			t.Errorf("8.%d: %v", minor, err)
		}
	}
	for name, mutate := range map[string]func(*php.Layout){
		"prev past the frame block":     func(l *php.Layout) { l.ExPrev = int64(tracer.PHPExRead) },
		"opcodes past the function":     func(l *php.Layout) { l.OpOpcodes = int64(tracer.PHPFnRead) },
		"call info not 4-aligned":       func(l *php.Layout) { l.ExCallInfo = 42 },
		"line outside the zend_op":      func(l *php.Layout) { l.OpLineno = l.OpSize },
		"negative function name offset": func(l *php.Layout) { l.FnName = -8 },
	} {
		l := good
		mutate(&l)
		if _, err := kernelPHP(&php.Interp{Version: "8.2.0", Layout: l}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
