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

	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/internal/v8"
)

// nodes lists the Node binaries the profiler's V8 test runs: Debian's and
// npm's official build of another major.
func nodes(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{"node22": testutil.NodeBinary(t, 22)}
	if _, err := os.Stat("/usr/bin/node"); err == nil {
		out["debian"] = "/usr/bin/node"
	} else if testutil.InCI() {
		t.Fatalf("Debian's node is not installed (CI=true: the tests need it): %v", err)
	}
	return out
}

// TestV8Frames runs burn.js (main -> nodeAlpha -> nodeBeta ->
// nodeGammaBurn) on each Node, started after the profiler. From the first
// sample in nodeGammaBurn on, at least 99 % of those samples carry the
// whole chain, each level as its own frame or inline level with a line,
// and then node's own native frames below the JavaScript.
func TestV8Frames(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	for name, node := range nodes(t) {
		t.Run(name, func(t *testing.T) {
			p, s := startProfiler(t, 99)
			cmd := exec.Command(node, "../internal/v8/testdata/burn.js")
			cmd.Stderr = os.Stderr
			testutil.StartReady(t, cmd, 30*time.Second)
			pid := cmd.Process.Pid
			var leaf, whole int
			var bad []string
			example := ""
			count := func() {
				leaf, whole, bad = 0, 0, nil
				for _, pd := range s.all() {
					for _, st := range javaStacks(pd, pid) {
						if !strings.HasPrefix(st, "v8js:nodeGammaBurn:") {
							continue
						}
						leaf++
						if v8BurnWhole(st) {
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
			t.Logf("%s: %d of %d nodeGammaBurn samples whole; v8 %+v; kernel v8 samples %d frames %d not-js %d read errors %d",
				name, whole, leaf, st.V8, st.Kernel.V8Samples, st.Kernel.V8Frames, st.Kernel.V8NotJS, st.Kernel.V8ReadErrs)
			t.Logf("a whole stack: %s", example)
			for _, b := range bad {
				t.Logf("not whole: %s", b)
			}
			if leaf < 300 {
				t.Fatalf("%d samples in nodeGammaBurn, want 300", leaf)
			}
			if whole*100 < leaf*99 {
				t.Errorf("%d of %d nodeGammaBurn samples whole, want 99 %%", whole, leaf)
			}
		})
	}
}

// v8BurnWhole says whether a javaStacks stack of burn.js in nodeGammaBurn
// holds the whole chain: nodeGammaBurn, nodeBeta, nodeAlpha and main in
// that order (as frames or inline levels, each with a line), then node's
// native frames.
func v8BurnWhole(st string) bool {
	rest := st
	for _, fn := range []string{"nodeGammaBurn:", "nodeBeta:", "nodeAlpha:", "main:", "native:"} {
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

// TestV8FramelessBuiltinLeaf runs builtins.js, whose optimized
// hotBuiltins calls builtins that build no frame. A sample in one of them
// is to show the builtin, named, and below it hotBuiltins with a line (the
// return address on top of the stack), not hotBuiltins without a line.
// The walker knows that return address only once the CPU has seen
// hotBuiltins' code, so a few early samples keep the short form.
func TestV8FramelessBuiltinLeaf(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	node := nodes(t)["debian"]
	if node == "" {
		t.Skip("Debian's node is not installed")
	}
	_, s := startProfiler(t, 499)
	cmd := exec.Command(node, "../internal/v8/testdata/builtins.js")
	cmd.Stderr = os.Stderr
	testutil.StartReady(t, cmd, 30*time.Second)
	pid := cmd.Process.Pid
	var split, short int
	examples := map[string]int{}
	count := func() {
		split, short = 0, 0
		clear(examples)
		for _, pd := range s.all() {
			for _, st := range javaStacks(pd, pid) {
				f := strings.SplitN(st, " ; ", 3)
				switch {
				case strings.HasPrefix(f[0], "v8js:hotBuiltins:0[builtin]"):
					short++
				case len(f) > 1 && strings.HasSuffix(f[0], "[stub]") &&
					strings.HasPrefix(f[1], "v8js:hotBuiltins:") &&
					!strings.HasPrefix(f[1], "v8js:hotBuiltins:0["):
					split++
					examples[f[0]+" ; "+f[1]]++
				}
			}
		}
	}
	deadline := time.Now().Add(45 * time.Second)
	for count(); split+short < 200 && time.Now().Before(deadline); count() {
		s.waitFor(len(s.all())+1, 5*time.Second)
	}
	t.Logf("samples in builtins hotBuiltins called: %d shown as the builtin over hotBuiltins' line, %d as hotBuiltins without a line", split, short)
	for k, n := range examples {
		if n*20 >= split {
			t.Logf("%5d %s", n, k)
		}
	}
	if split+short < 200 {
		t.Fatalf("%d samples in builtins called by hotBuiltins, want 200", split+short)
	}
	if split*100 < (split+short)*80 {
		t.Errorf("%d of %d samples split into builtin and caller, want 80 %%", split, split+short)
	}
}

// TestV8UnknownVersion runs two burn.js on Debian's Node while the
// profiler's V8 finder reports its V8 as one without a layout, as for a
// V8 whose metadata lacks what the walker needs: the version is reported
// once (one log line, counted), and its processes keep native stacks, with
// no v8js frame.
func TestV8UnknownVersion(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde profiler")
	node := nodes(t)["debian"]
	if node == "" {
		t.Skip("Debian's node is not installed")
	}
	core, logs := observer.New(zapcore.WarnLevel)
	p, s := startProfiler(t, 99, func(o *Options) {
		o.Logger = zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
		o.v8Find = func(proc *process.Process, mem v8.Memory) (*v8.VM, error) {
			vm, err := v8.Find(proc, mem)
			if err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("v8 %s: hidden by the test: %w", vm.V8, v8.ErrUnknownVersion)
		}
	})
	var pids []int
	for range 2 {
		cmd := exec.Command(node, "../internal/v8/testdata/burn.js")
		cmd.Stderr = os.Stderr
		testutil.StartReady(t, cmd, 30*time.Second)
		pids = append(pids, cmd.Process.Pid)
	}
	hiddenRuntimeStacks(t, s, pids, "v8js", "", 30)
	// Other Nodes on the host (another test's) are hidden too, each
	// version reported once: Debian's must be, once.
	if lines := logContexts(logs, "v8 layout not supported", "v8 "+debianV8(t, node)+":"); len(lines) != 1 {
		t.Errorf("unsupported layout log lines about Debian's V8: %q, want one", lines)
	}
	vs := p.Stats().V8
	if vs.UnknownVersions < 1 || vs.Unsupported < 2 || vs.Processes != 0 {
		t.Errorf("Stats.V8 = %+v, want an unknown version, >= 2 unsupported, none walked", vs)
	}
}

// debianV8 is the V8 version node reports (process.versions.v8, less
// Node's own suffix: "11.3.244.8" of "11.3.244.8-node.38").
func debianV8(t *testing.T, node string) string {
	t.Helper()
	out, err := exec.Command(node, "-p", "process.versions.v8").Output()
	if err != nil {
		t.Fatalf("%s -p process.versions.v8: %v", node, err)
	}
	v, _, _ := strings.Cut(strings.TrimSpace(string(out)), "-")
	return v
}
