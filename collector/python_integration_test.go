package collector_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pyInterpreter is one CPython this host must profile.
type pyInterpreter struct {
	name  string
	minor int
	bin   string
}

// pyInterpreters lists pyenv's 3.6–3.13 and Debian's static, stripped
// python3.11. A missing one fails under CI=true and is skipped elsewhere.
func pyInterpreters(t *testing.T) []pyInterpreter {
	home, _ := os.UserHomeDir()
	var out []pyInterpreter
	for _, v := range []struct {
		version string
		minor   int
	}{{"3.6.15", 6}, {"3.7.16", 7}, {"3.8.18", 8}, {"3.9.18", 9}, {"3.10.13", 10}, {"3.11.7", 11}, {"3.12.1", 12}, {"3.13.0", 13}} {
		out = append(out, pyInterpreter{v.version, v.minor, filepath.Join(home, ".pyenv", "versions", v.version, "bin", "python3")})
	}
	out = append(out, pyInterpreter{"debian-3.11", 11, "/usr/bin/python3.11"})
	var have []pyInterpreter
	for _, in := range out {
		if _, err := os.Stat(in.bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Errorf("interpreter %s missing", in.bin)
			} else {
				t.Logf("interpreter %s missing; not tested", in.bin)
			}
			continue
		}
		have = append(have, in)
	}
	return have
}

// pyWorkload is the absolute path of the Python workload.
func pyWorkload(t *testing.T) string {
	p, err := filepath.Abs(filepath.Join("..", "internal", "python", "testdata", "workload.py"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// pyMark is the line of the workload marked "# MARK name".
func pyMark(t *testing.T, name string) int64 {
	b, err := os.ReadFile(pyWorkload(t))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(l, "# MARK "+name) {
			return int64(i + 1)
		}
	}
	t.Fatalf("no MARK %s", name)
	return 0
}

// startPython runs the workload in mode and waits until it is ready;
// xargs go to the interpreter.
func startPython(t *testing.T, bin, mode string, xargs ...string) int {
	cmd := exec.Command(bin, append(xargs, pyWorkload(t), mode)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close() // a pipe: the workload is killed next anyway
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if len(xargs) > 0 {
			// -X perf writes the trampolines' names there.
			_ = os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("perf-%d.map", cmd.Process.Pid)))
		}
	})
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("%s %s: %q, %v", bin, mode, line, err)
	}
	return cmd.Process.Pid
}

// pyFrame is a Python frame as the output shows it.
type pyFrame struct {
	name string
	file string
	line int64 // 0: any line of the function
}

func (f pyFrame) String() string {
	return fmt.Sprintf("%s %s:%d", f.name, filepath.Base(f.file), f.line)
}

// pyStack checks one sample: its Python frames (type cpython), leaf
// first, must be want (the chain, leaf first; lines checked where given)
// and, when last is set, end with it. A thread between two calls of the
// chain whose innermost frame is at or next to its call line (running its
// own bytecode, or native call machinery above it): partial says so. No native eval-loop frame may sit between Python
// frames, and native frames must follow the last Python frame (the
// interpreter's main or thread start). leafLines bounds the leaf's line.
func pyStack(s flatSample, want []pyFrame, last *pyFrame, leafLines [2]int64, libAbove bool) (partial bool, err error) {
	var py []pyFrame
	first, lastPy := -1, -1
	for i, f := range s.Frames {
		if f.Type != "cpython" {
			continue
		}
		if first < 0 {
			first = i
		}
		lastPy = i
		py = append(py, pyFrame{f.Function, s.Files[i], s.Lines[i]})
	}
	if len(py) == 0 {
		return false, fmt.Errorf("no python frames")
	}
	if libAbove {
		// Library code the chain called (asyncio.sleep): drop it.
		for len(py) > 1 && py[0].file != want[0].file {
			py = py[1:]
		}
	}
	k := 0 // chain frames missing on the leaf side
	for k < len(want)-1 && py[0].name != want[k].name {
		k++
	}
	if len(py) < len(want)-k {
		return false, fmt.Errorf("%d python frames, want at least %d", len(py), len(want)-k)
	}
	for i, w := range want[k:] {
		g := py[i]
		if g.name != w.name || g.file != w.file {
			return false, fmt.Errorf("python frame %d is %v, want %v", i, g, w)
		}
		if k+i == 0 && (g.line < leafLines[0] || g.line > leafLines[1]) {
			return false, fmt.Errorf("leaf %v: line outside %d-%d", g, leafLines[0], leafLines[1])
		}
		if i == 0 && k > 0 && (g.line < w.line-1 || g.line > w.line+1) {
			// Between calls: at the call, or at the loop around it.
			return false, fmt.Errorf("innermost %v: want a line near %d", g, w.line)
		}
		if i > 0 && w.line != 0 && g.line != w.line {
			return false, fmt.Errorf("python frame %d is %v, want line %d", i, g, w.line)
		}
	}
	if last != nil && py[len(py)-1] != *last {
		return false, fmt.Errorf("outermost python frame %v, want %v", py[len(py)-1], *last)
	}
	for i := first; i <= lastPy; i++ {
		if s.Frames[i].Function == "_PyEval_EvalFrameDefault" {
			return false, fmt.Errorf("native eval-loop frame %d among the python frames", i)
		}
	}
	if lastPy == len(s.Frames)-1 {
		return false, fmt.Errorf("no native frame below the python frames")
	}
	return k > 0, nil
}

// TestPythonStacks profiles the workload in every interpreter, in each of
// its shapes, and requires at least 99 % of each workload's samples after
// warm-up (until an export holds a whole stack) to carry the whole Python
// chain with names, files and
// lines, between the native frames of the interpreter.
func TestPythonStacks(t *testing.T) {
	wl := pyWorkload(t)
	burn := [2]int64{pyMark(t, "burn") - 3, pyMark(t, "burn") + 1} // gamma_burn's body
	regex := [2]int64{pyMark(t, "regex") - 1, pyMark(t, "regex")}  // its def line, at entry, and its call
	modes := []struct {
		mode string
		main bool // the samples are the main thread's (else another thread's)
		// coroutine: only samples running the coroutine (alpha_async on
		// the stack) count; the event loop's own samples are checked to
		// reach <module> and counted apart. Library frames may sit above.
		coroutine bool
		leafLines [2]int64
		want      func(minor int) ([]pyFrame, *pyFrame)
		// xargs are the interpreter's options, for the interpreters of
		// minMinor and later.
		xargs    []string
		minMinor int
	}{
		{"burn", true, false, burn, func(minor int) ([]pyFrame, *pyFrame) {
			return []pyFrame{{"gamma_burn", wl, 0}, {method(minor), wl, pyMark(t, "call-leaf")},
				{"alpha", wl, pyMark(t, "call-method")}, {"<module>", wl, pyMark(t, "call-alpha")}}, nil
		}, nil, 0},
		// CPython's perf support (3.12+) calls every Python function
		// through a trampoline in anonymous memory, without frame
		// pointers or CFI: the unwinder steps over it by its code.
		{"perf-trampoline", true, false, burn, func(minor int) ([]pyFrame, *pyFrame) {
			return []pyFrame{{"gamma_burn", wl, 0}, {method(minor), wl, pyMark(t, "call-leaf")},
				{"alpha", wl, pyMark(t, "call-method")}, {"<module>", wl, pyMark(t, "call-alpha")}}, nil
		}, []string{"-X", "perf"}, 12},
		{"regex", true, false, regex, func(minor int) ([]pyFrame, *pyFrame) {
			return []pyFrame{{"gamma_regex", wl, 0}, {method(minor), wl, pyMark(t, "call-leaf")},
				{"alpha", wl, pyMark(t, "call-method")}, {"<module>", wl, pyMark(t, "call-alpha")}}, nil
		}, nil, 0},
		{"thread", false, false, burn, func(minor int) ([]pyFrame, *pyFrame) {
			return []pyFrame{{"gamma_burn", wl, 0}, {method(minor), wl, pyMark(t, "call-leaf")},
				{"alpha", wl, pyMark(t, "call-method")}}, nil
		}, nil, 0},
		{"async", true, true, burn, func(int) ([]pyFrame, *pyFrame) {
			return []pyFrame{{"gamma_burn", wl, 0}, {"alpha_async", wl, pyMark(t, "call-burn-async")}},
				&pyFrame{"<module>", wl, pyMark(t, "call-async")}
		}, nil, 0},
	}
	interps := pyInterpreters(t)
	for _, m := range modes {
		t.Run(m.mode, func(t *testing.T) {
			// The workloads run before the receiver starts: their samples
			// are the workload's, not the interpreter's start-up.
			pids := map[int]pyInterpreter{}
			mode := m.mode
			if mode == "perf-trampoline" {
				mode = "burn" // run through the trampolines
			}
			for _, in := range interps {
				if in.minor >= m.minMinor {
					pids[startPython(t, in.bin, mode, m.xargs...)] = in
				}
			}
			sink := startReceiver(t, 199)
			const n = 200
			type tally struct {
				total, complete, partial, warm, loop int
				seen                                 bool
				bad                                  []string
			}
			got := map[int]*tally{}
			for pid := range pids {
				got[pid] = &tally{}
			}
			done := func() bool {
				for _, tl := range got {
					if tl.total < n {
						return false
					}
				}
				return true
			}
			deadline := time.Now().Add(150 * time.Second)
			read := 0
			for !done() && time.Now().Before(deadline) {
				all := sink.AllProfiles()
				for _, pd := range all[read:] {
					// Warm-up lasts until an export holds a whole stack of
					// the process (its tables are in), as for native code.
					warmNow := map[int]bool{}
					for _, s := range flatten(pd) {
						tl, ok := got[int(s.PID)]
						if !ok || (s.TID == s.PID) != m.main {
							continue
						}
						in := pids[int(s.PID)]
						want, last := m.want(in.minor)
						if m.coroutine && !hasPyFunction(s, "alpha_async") {
							if _, err := pyStack(s, []pyFrame{*last}, last, [2]int64{0, 1 << 30}, true); err != nil && tl.seen {
								tl.total += s.Count
								if len(tl.bad) < 5 {
									tl.bad = append(tl.bad, "event loop: "+err.Error()+": "+pyFunctions(s))
								}
							} else if tl.seen {
								tl.loop += s.Count
							}
							continue
						}
						partial, err := pyStack(s, want, last, m.leafLines, m.coroutine)
						if !tl.seen {
							tl.warm += s.Count
							if err == nil {
								warmNow[int(s.PID)] = true
							} else if len(tl.bad) < 5 {
								tl.bad = append(tl.bad, "warm-up: "+err.Error()+": "+pyFunctions(s))
							}
							continue
						}
						if tl.total == 0 {
							tl.bad = nil // keep examples of the measured samples only
						}
						tl.total += s.Count
						if err != nil {
							if len(tl.bad) < 5 {
								tl.bad = append(tl.bad, err.Error()+": "+pyFunctions(s))
							}
							continue
						}
						tl.complete += s.Count
						if partial {
							tl.partial += s.Count
						}
					}
					for pid := range warmNow {
						got[pid].seen = true
					}
				}
				read = len(all)
				waitForExport(sink, read, time.Until(deadline))
			}
			for pid, tl := range got {
				in := pids[pid]
				share := 0.0
				if tl.total > 0 {
					share = float64(tl.complete) / float64(tl.total)
				}
				t.Logf("%s %s: %d/%d samples whole (%.1f%%; %d between calls), %d warm-up, %d in the event loop",
					m.mode, in.name, tl.complete, tl.total, 100*share, tl.partial, tl.warm, tl.loop)
				if tl.total < n || share < 0.99 {
					t.Errorf("%s %s: %d/%d samples carry the whole python chain, want >= 99%% of at least %d; e.g.\n%s",
						m.mode, in.name, tl.complete, tl.total, n, strings.Join(tl.bad, "\n"))
				}
				// Between calls is a moment; the leaf's own work is most.
				if tl.total > 0 && float64(tl.partial) > 0.2*float64(tl.total) {
					t.Errorf("%s %s: %d of %d samples end before the leaf", m.mode, in.name, tl.partial, tl.total)
				}
			}
		})
	}
}

func method(minor int) string {
	if minor >= 11 {
		return "Beta.method" // co_qualname
	}
	return "method"
}

func pyFunctions(s flatSample) string {
	var b []string
	for i, f := range s.Frames {
		if f.Type == "cpython" {
			b = append(b, fmt.Sprintf("%s:%d(py)", f.Function, s.Lines[i]))
		} else {
			b = append(b, fmt.Sprintf("%s(%s)", f.Function, f.Type))
		}
	}
	return strings.Join(b, " <- ")
}

func hasPyFunction(s flatSample, name string) bool {
	for _, f := range s.Frames {
		if f.Type == "cpython" && f.Function == name {
			return true
		}
	}
	return false
}

// TestPythonDeepStacks profiles a workload that recurses 300 Python calls
// deep, past the 256 user frames a sample holds, in every interpreter. Each
// sample after warm-up must hold a chain of correctly named Python frames
// (gamma_burn, then recurse at its call lines) that ends with the
// [truncated] frame, the counted marker of a walk cut by the frame limit,
// never with a garbage or unnamed frame. From 3.11 a Python call does not
// recurse in C, so the chain must hold at least 128 Python frames; up to
// 3.10 each Python call also costs native frames of the interpreter
// (_PyEval_EvalFrameDefault, _PyFunction_Vectorcall, ...), all of which
// count against the same 256 frames, so fewer Python frames fit (see
// minFrames).
func TestPythonDeepStacks(t *testing.T) {
	wl := pyWorkload(t)
	burn := [2]int64{pyMark(t, "burn") - 3, pyMark(t, "burn") + 1}
	callRecurse, callBurn := pyMark(t, "call-recurse"), pyMark(t, "call-burn-deep")
	// Up to 3.10 the interpreter's native frames between two Python frames
	// of the recursion (one on 3.9 and 3.10, two on 3.6–3.8, e.g.
	// function_code_fastcall and call_function) share the 256 frames.
	minFrames := func(minor int) int {
		switch {
		case minor >= 11:
			return 128
		case minor >= 9:
			return 120
		}
		return 80
	}
	// check returns how many Python frames s holds, or why it is wrong.
	check := func(s flatSample) (n int, partial bool, err error) {
		var py []pyFrame
		for i, f := range s.Frames {
			if f.Type == "cpython" {
				py = append(py, pyFrame{f.Function, s.Files[i], s.Lines[i]})
			}
		}
		if len(py) == 0 {
			return 0, false, fmt.Errorf("no python frames")
		}
		if last := s.Frames[len(s.Frames)-1]; last.Function != "[truncated]" || last.Type != "" {
			return len(py), false, fmt.Errorf("last frame %v, want [truncated]", last)
		}
		i := 0
		if py[0].name == "gamma_burn" {
			if py[0].file != wl || py[0].line < burn[0] || py[0].line > burn[1] {
				return len(py), false, fmt.Errorf("leaf %v", py[0])
			}
			i = 1
		} else {
			partial = true // between two calls of gamma_burn
		}
		for j, f := range py[i:] {
			// The innermost recurse frame calls gamma_burn; the others
			// call recurse. (In a sample between two calls of gamma_burn
			// that frame is py[0], else py[1].)
			want := callRecurse
			if j == 0 {
				want = callBurn
			}
			if f.name != "recurse" || f.file != wl || (f.line != want && (!partial || j != 0 || f.line != want-1)) {
				return len(py), partial, fmt.Errorf("python frame %d is %v, want recurse at %d", i+j, f, want)
			}
		}
		return len(py), partial, nil
	}

	interps := pyInterpreters(t)
	pids := map[int]pyInterpreter{}
	for _, in := range interps {
		pids[startPython(t, in.bin, "deep")] = in
	}
	sink := startReceiver(t, 99)
	const n = 100
	type tally struct {
		total, good, partial, minPy, maxPy int
		seen                               bool
		bad                                []string
	}
	got := map[int]*tally{}
	for pid := range pids {
		got[pid] = &tally{minPy: 1 << 30}
	}
	done := func() bool {
		for _, tl := range got {
			if tl.total < n {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(150 * time.Second)
	read := 0
	for !done() && time.Now().Before(deadline) {
		all := sink.AllProfiles()
		for _, pd := range all[read:] {
			warmNow := map[int]bool{}
			for _, s := range flatten(pd) {
				tl, ok := got[int(s.PID)]
				if !ok || s.Type != "samples" {
					continue
				}
				k, partial, err := check(s)
				if err == nil && k < minFrames(pids[int(s.PID)].minor) {
					err = fmt.Errorf("%d python frames, want at least %d", k, minFrames(pids[int(s.PID)].minor))
				}
				if !tl.seen {
					if err == nil {
						warmNow[int(s.PID)] = true
					}
					continue
				}
				tl.total += s.Count
				if err != nil {
					if len(tl.bad) < 5 {
						tl.bad = append(tl.bad, err.Error()+": "+pyFunctions(s))
					}
					continue
				}
				tl.good += s.Count
				tl.minPy, tl.maxPy = min(tl.minPy, k), max(tl.maxPy, k)
				if partial {
					tl.partial += s.Count
				}
			}
			for pid := range warmNow {
				got[pid].seen = true
			}
		}
		read = len(all)
		waitForExport(sink, read, time.Until(deadline))
	}
	for pid, tl := range got {
		in := pids[pid]
		share := 0.0
		if tl.total > 0 {
			share = float64(tl.good) / float64(tl.total)
		}
		t.Logf("deep %s: %d/%d samples whole (%.1f%%; %d between calls), %d-%d python frames", in.name, tl.good, tl.total, 100*share, tl.partial, tl.minPy, tl.maxPy)
		if tl.total < n || share < 0.99 {
			t.Errorf("deep %s: %d/%d samples carry >= %d named python frames ending in [truncated], want >= 99%% of at least %d; e.g.\n%s",
				in.name, tl.good, tl.total, minFrames(in.minor), n, strings.Join(tl.bad, "\n"))
		}
		if tl.total > 0 && float64(tl.partial) > 0.2*float64(tl.total) {
			t.Errorf("deep %s: %d of %d samples end before the leaf", in.name, tl.partial, tl.total)
		}
	}
}
