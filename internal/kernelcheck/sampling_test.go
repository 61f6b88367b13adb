package kernelcheck

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/profiler"
)

// workloadDir is where the initramfs keeps the workloads the guest
// profiles (the arm64 check packs them; the x86-64 check has none).
const workloadDir = "/w"

// The profiler samples the workloads until each has wantLeaf samples in its
// leaf after its warm-up, or samplingLimit of guest time passes, and at
// least afterTables once every table is loaded (up to samplingMax): under
// emulation (TCG) a guest second costs several host seconds, and the
// tables' builds compete with the samples' processing for the guest's
// CPUs, so they can come late in the run (the workloads run at the lowest
// priority for that: workloadNice). The stacks that were cut short here
// once, about one in 250, were samples the workloads' exit took while the
// kernel unmapped their memory, which are now taken without a user stack;
// 500 keeps what may remain from deciding the 99 % by chance.
const (
	wantLeaf      = 500
	samplingLimit = 150 * time.Second
	afterTables   = 60 * time.Second
	samplingMax   = 240 * time.Second
)

// guestWorkload is one workload the guest runs and what its stacks must be:
// chain from the leaf outward, then whatever, then root as the outermost
// frame. With interrupted, the chain is a signal handler's: the frame
// below it is the vDSO's signal trampoline, and below that a stack
// interrupted is the end of (the code the signal interrupted and its
// callers, or only its callers), then whatever, then root.
type guestWorkload struct {
	chain       []string
	interrupted []string
	root        string
	// through, in place of chain: the samples checked are those with this
	// frame, which must not be the outermost.
	through string
	// via: frames that must follow the chain, in this order, with
	// others between them.
	via []string
	// next: where set, the frame right after the chain is one of these.
	next []string
	// within: where set, only the samples with this frame are checked
	// (the runtime's own threads reach the chain's leaf too).
	within string
}

// counts says whether st, a sample's stack, is one of w's checked ones:
// its leaf is w.chain's, or it holds w.through.
func (w guestWorkload) counts(st []string) bool {
	if w.through != "" {
		return slices.Contains(st, w.through)
	}
	return len(st) > 0 && st[0] == w.chain[0] && (w.within == "" || slices.Contains(st, w.within))
}

// direct says whether st, a whole stack of a workload with interrupted, has
// the interrupted code's first function right below the signal frame: only
// the signal frame's registers find it there (a leaf that keeps its return
// address in x30, which a frame-pointer walk from the handler skips).
func (w guestWorkload) direct(st []string) bool {
	i := len(w.chain) + 1
	return w.interrupted != nil && len(st) > i && st[i] == w.interrupted[0]
}

// sigreturnFrames are the names the vDSO's signal trampoline may be given:
// its symbol, or the mapping's: a handler's return address is looked up a
// byte before the trampoline, in the nop the kernel puts there, which no
// symbol of the vDSO covers.
var sigreturnFrames = []string{"__kernel_rt_sigreturn", "[vdso]"}

// whole says whether st, a stack whose leaf is w.chain[0], is whole: every
// frame named, what w says from the leaf outward, root the outermost.
func (w guestWorkload) whole(st []string) bool {
	if w.through != "" {
		return len(st) > 1 && st[len(st)-1] == w.root && !slices.Contains(st, "") &&
			slices.Index(st, w.through) < len(st)-1
	}
	if len(st) <= len(w.chain) || !slices.Equal(st[:len(w.chain)], w.chain) ||
		st[len(st)-1] != w.root || slices.Contains(st, "") {
		return false
	}
	rest := st[len(w.chain):]
	if w.next != nil && !slices.Contains(w.next, rest[0]) {
		return false
	}
	for _, f := range w.via {
		i := slices.Index(rest, f)
		if i < 0 {
			return false
		}
		rest = rest[i+1:]
	}
	if w.interrupted == nil {
		return true
	}
	rest = st[len(w.chain):]
	if len(rest) < 2 || !slices.Contains(sigreturnFrames, rest[0]) {
		return false
	}
	rest = rest[1:]
	for i := range w.interrupted {
		tail := w.interrupted[i:]
		if len(rest) > len(tail) && slices.Equal(rest[:len(tail)], tail) {
			return true
		}
	}
	return false
}

// guestWorkloads are the workloads the arm64 check packs, by file name.
var guestWorkloads = map[string]guestWorkload{
	"cchain-nofp": {chain: []string{"c", "b", "a", "main"}, root: "_start"},
	"cpac":        {chain: []string{"c", "b", "a", "main"}, root: "_start"},
	"throw":       {chain: []string{"c", "b", "a", "main"}, root: "_start"},
	"goleaf":      {chain: []string{"main.leaf", "main.beta", "main.alpha", "main.main"}, root: "runtime.goexit"},
	"rchain":      {chain: []string{"rchain::c", "rchain::b", "rchain::a", "rchain::main"}, root: "_start"},
	// A SIGPROF handler that interrupts main -> a -> b (signal.c).
	"signal": {chain: []string{"handler"}, interrupted: []string{"b", "a", "main"}, root: "_start"},
	// Go's collector on the system stack: a stack through
	// runtime.systemstack goes on to the goroutine's bottom.
	"gosys": {through: "runtime.systemstack", root: "runtime.goexit"},
	// Go calling C through cgo: C on the system stack goes on, through
	// runtime.asmcgocall, to the goroutine that called it.
	"gocall": {chain: []string{"c_leaf", "c_outer"}, via: []string{"runtime.asmcgocall", "runtime.cgocall", "main.goOuter", "main.main"},
		root: "runtime.goexit"},
	// Go and C calling each other: C called from a Go callback called from
	// C called from Go. From the callback's goroutine frames the stack
	// crosses back to the system stack (runtime.cgocallback, crosscall2),
	// through the C frames that called it, and to the goroutine again.
	"gocgo": {chain: []string{"c_leaf"}, via: []string{"runtime.asmcgocall", "runtime.cgocall", "main.goInner", "main.goCallback",
		"runtime.cgocallback", "crosscall2", "goCallback", "c_middle", "c_outer",
		"runtime.asmcgocall", "runtime.cgocall", "main.goOuter", "main.main"}, root: "runtime.goexit"},
	// Go reading the clock: the vDSO is called on the system stack by
	// runtime.walltime or runtime.nanotime1, and the stack goes on from
	// their frame record on the goroutine's. The runtime's own clock reads
	// (sysmon, the scheduler below runtime.morestack, where a stack ends)
	// are not main.tick's.
	"gotime": {chain: []string{"__kernel_clock_gettime"}, next: []string{"runtime.walltime", "runtime.nanotime1"},
		via: []string{"main.tick", "main.main"}, root: "runtime.goexit", within: "main.tick"},
}

// samplingResult is what the profiler found of one workload's stacks.
type samplingResult struct {
	Samples int `json:"samples"` // every sample of the process
	// Leaf: samples in the chain's leaf taken once every workload's
	// unwind table was in the kernel; Warmup: those before. Before, a
	// stack is walked from a snapshot of it, and where the ring buffer is
	// half full (emulation makes the reader slow) by frame pointers.
	Leaf   int `json:"leaf"`
	Warmup int `json:"warmup"`
	// Whole: of Leaf, those whose user stack is the chain from the leaf,
	// every frame named, down to the root as the outermost frame.
	Whole int `json:"whole"`
	// Direct: of Whole, for a signal handler's chain, those with the
	// interrupted code's leaf right below the signal frame.
	Direct int `json:"direct,omitempty"`
	// Broken: a few of the Leaf samples that were not whole; Seen: a few
	// distinct stacks of any of its samples.
	Broken []string `json:"broken,omitempty"`
	// Examples: a few distinct whole stacks of Leaf.
	Examples []string `json:"examples,omitempty"`
	Seen     []string `json:"seen,omitempty"`
	Error    string   `json:"error,omitempty"`
}

// profilerStats is the part of the profiler's Stats the host logs, to tell
// why stacks were not whole.
type profilerStats struct {
	// Log: the profiler's log lines about unwind tables (debug level).
	Log      []string `json:"log,omitempty"`
	Stacks   any      `json:"stacks"`
	Kernel   any      `json:"kernel"`
	Unwind   any      `json:"unwind"`
	Resolver any      `json:"resolver"`
}

// runSampling runs the real profiler over the workloads in workloadDir and
// reports each one's stacks, and the profiler's stats.
func runSampling() (map[string]samplingResult, *profilerStats) {
	out, st := map[string]samplingResult{}, &profilerStats{}
	entries, err := os.ReadDir(workloadDir)
	if err != nil {
		out["setup"] = samplingResult{Error: err.Error()}
		return out, nil
	}
	opts := profiler.DefaultOptions()
	opts.SamplesPerSecond = 99
	opts.ReporterInterval = time.Second
	// Only the workloads: their tables are the ones the warm-up waits for.
	opts.Filters.IncludeExecutables = []string{workloadDir + "/*"}
	wantTables := 0
	for _, e := range entries {
		if _, ok := guestWorkloads[e.Name()]; ok {
			wantTables++
		}
	}
	// When the profiler was first seen holding every workload's table:
	// the samples from then on are unwound in the kernel with them.
	var tablesAt time.Time
	var logBuf syncBuffer
	opts.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewDevelopmentEncoderConfig()), &logBuf, zap.DebugLevel))
	defer func() {
		for line := range strings.SplitSeq(logBuf.String(), "\n") {
			if strings.Contains(line, "table") && len(st.Log) < 20 {
				st.Log = append(st.Log, line)
			}
		}
	}()
	p, err := profiler.New(opts)
	if err != nil {
		out["setup"] = samplingResult{Error: "profiler: " + err.Error()}
		return out, nil
	}
	var mu sync.Mutex
	var got []pprofile.Profiles
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(_ context.Context, pd pprofile.Profiles) error {
			mu.Lock()
			got = append(got, pd)
			mu.Unlock()
			return nil
		})
	}()
	pids := map[int]string{}
	var all, cmds []*exec.Cmd
	for _, e := range entries {
		if _, ok := guestWorkloads[e.Name()]; ok {
			all = append(all, exec.Command(filepath.Join(workloadDir, e.Name())))
		}
	}
	for i, err := range startNiced(all) {
		name := filepath.Base(all[i].Path)
		if err != nil {
			out[name] = samplingResult{Error: err.Error()}
			continue
		}
		cmds = append(cmds, all[i])
		pids[all[i].Process.Pid] = name
	}
	start := time.Now()
	deadline := start.Add(samplingLimit)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		if tablesAt.IsZero() {
			if p.Stats().Unwind.Tables < wantTables {
				continue
			}
			tablesAt = time.Now()
			if d := tablesAt.Add(afterTables); d.After(deadline) {
				deadline = d
				if last := start.Add(samplingMax); deadline.After(last) {
					deadline = last
				}
			}
		}
		mu.Lock()
		res := summarize(got, pids, tablesAt)
		mu.Unlock()
		enough := true
		for _, r := range res {
			enough = enough && r.Leaf >= wantLeaf
		}
		if enough {
			break
		}
	}
	for _, cmd := range cmds {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	ps := p.Stats()
	st.Stacks, st.Unwind = ps.Stacks, ps.Unwind
	st.Kernel = ps.Kernel
	st.Resolver = ps.Resolver
	cancel()
	if err := <-done; err != nil {
		out["setup"] = samplingResult{Error: "run: " + err.Error()}
	}
	if err := p.Close(); err != nil {
		out["setup"] = samplingResult{Error: "close: " + err.Error()}
	}
	mu.Lock()
	defer mu.Unlock()
	at := tablesAt
	if at.IsZero() {
		out["setup"] = samplingResult{Error: fmt.Sprintf("%d of %d workload tables loaded within %v", ps.Unwind.Tables, wantTables, samplingLimit)}
		at = time.Now()
	}
	for name, r := range summarize(got, pids, at) {
		if _, failed := out[name]; !failed {
			out[name] = r
		}
	}
	return out, st
}

// workloadNice is the workloads' nice value. Under emulation the guest's
// two CPUs are slow, and ten workloads that never sleep, at the profiler's
// priority, would take most of them from it: its reader falls behind
// (samples lost, snapshots skipped for a full ring) and the tables load
// minutes late. At the lowest priority the workloads still get every cycle
// the profiler leaves, and are sampled as before.
const workloadNice = 19

// startNiced starts cmds at workloadNice and returns each one's error. A
// thread's nice value is its own, and a child takes the one of the thread
// that forked it: the commands are started from a thread of their own,
// locked to a goroutine and never unlocked, so it ends with the goroutine
// rather than going back to the runtime at that priority. Each child's
// nice value is checked.
func startNiced(cmds []*exec.Cmd) []error {
	errs := make([]error, len(cmds))
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), workloadNice); err != nil {
			for i := range errs {
				errs[i] = fmt.Errorf("lower the priority of the thread that starts the workloads: %w", err)
			}
			return
		}
		for i, cmd := range cmds {
			errs[i] = cmd.Start()
		}
	}()
	<-done
	for i, cmd := range cmds {
		if errs[i] != nil {
			continue
		}
		nice, err := niceOf(cmd.Process.Pid)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("the workload's nice value: %w", err)
		case nice != workloadNice:
			errs[i] = fmt.Errorf("workload started at nice %d, want %d", nice, workloadNice)
		default:
			continue
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	return errs
}

// niceOf returns pid's nice value. The system call gives 20 - nice, not
// the nice value the C library's getpriority turns it into.
func niceOf(pid int) (int, error) {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, pid)
	return 20 - prio, err
}

// summarize finds each workload's (pids: name by pid) stacks in got; the
// samples taken before tables are its warm-up.
func summarize(got []pprofile.Profiles, pids map[int]string, tables time.Time) map[string]samplingResult {
	out := map[string]samplingResult{}
	for pid, name := range pids {
		w := guestWorkloads[name]
		var r samplingResult
		for _, pd := range got {
			for _, ts := range userStacks(pd, pid) {
				st := ts.frames
				r.Samples++
				if line := strings.Join(st, " <- "); len(r.Seen) < 8 && !slices.Contains(r.Seen, line) {
					r.Seen = append(r.Seen, line)
				}
				if !w.counts(st) {
					continue
				}
				whole := w.whole(st)
				if ts.at.Before(tables) {
					r.Warmup++
					continue
				}
				r.Leaf++
				if whole {
					r.Whole++
					if w.direct(st) {
						r.Direct++
					}
					if line := strings.Join(st, " <- "); len(r.Examples) < 3 && !slices.Contains(r.Examples, line) {
						r.Examples = append(r.Examples, line)
					}
				} else if len(r.Broken) < 5 {
					r.Broken = append(r.Broken, ts.describe(tables))
				}
			}
		}
		out[name] = r
	}
	return out
}

// timedStack is a sample's user frames' function names (leaf first; "" for
// an unnamed frame), which of them the frame-pointer walk found (fp, by
// index in frames), and when it was taken.
type timedStack struct {
	frames []string
	fp     []bool
	at     time.Time
}

// describe is ts for the host's log: its frames, those found by frame
// pointers marked "(fp)", and when it was taken relative to tables.
func (ts timedStack) describe(tables time.Time) string {
	names := make([]string, len(ts.frames))
	for i, f := range ts.frames {
		names[i] = f
		if ts.fp[i] {
			names[i] += " (fp)"
		}
	}
	return fmt.Sprintf("%s; taken %v after the tables", strings.Join(names, " <- "), ts.at.Sub(tables).Round(time.Millisecond))
}

// userStacks returns pid's samples in pd, one per sample.
func userStacks(pd pprofile.Profiles, pid int) []timedStack {
	dict := pd.Dictionary()
	strs := dict.StringTable()
	var out []timedStack
	for _, rp := range pd.ResourceProfiles().All() {
		if v, ok := rp.Resource().Attributes().Get("process.pid"); !ok || v.Int() != int64(pid) {
			continue
		}
		for _, sp := range rp.ScopeProfiles().All() {
			for _, prof := range sp.Profiles().All() {
				for _, s := range prof.Samples().All() {
					var st []string
					var fp []bool
					for _, li := range dict.StackTable().At(int(s.StackIndex())).LocationIndices().All() {
						loc := dict.LocationTable().At(int(li))
						typ, byFP := "", false
						for _, ai := range loc.AttributeIndices().All() {
							kv := dict.AttributeTable().At(int(ai))
							switch strs.At(int(kv.KeyStrindex())) {
							case "profile.frame.type":
								typ = kv.Value().Str()
							case "sonde.frame.unwinder":
								byFP = kv.Value().Str() == "frame_pointer"
							}
						}
						if typ == "kernel" {
							continue
						}
						// Each inline level is a line, innermost first.
						if loc.Lines().Len() == 0 {
							st = append(st, "")
							fp = append(fp, byFP)
						}
						for _, l := range loc.Lines().All() {
							st = append(st, strs.At(int(dict.FunctionTable().At(int(l.FunctionIndex())).NameStrindex())))
							fp = append(fp, byFP)
						}
					}
					for _, ns := range s.TimestampsUnixNano().All() {
						out = append(out, timedStack{st, fp, time.Unix(0, int64(ns))})
					}
				}
			}
		}
	}
	return out
}

// String is a one-line summary for the host's log.
func (r samplingResult) String() string {
	line := fmt.Sprintf("%d samples; in the leaf: %d before the tables were loaded, %d after, %d of them whole", r.Samples, r.Warmup, r.Leaf, r.Whole)
	if r.Direct > 0 {
		line += fmt.Sprintf(", %d with the interrupted leaf below the signal frame", r.Direct)
	}
	return line
}

// syncBuffer is a bytes.Buffer safe for the logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Sync() error { return nil }

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
