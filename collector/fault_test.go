package collector

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/sonde-dev/sonde/collector/internal/metadatatest"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// Fault tests: each runs the real receiver through one fault and shows that
// nothing panics, nothing leaks (goroutines, file descriptors, BPF objects),
// what was dropped is counted, and the next interval is exported.

// leakBaseline is what the process holds before a receiver starts.
type leakBaseline struct {
	goroutines goleak.Option
	fds        map[string]string
}

func takeLeakBaseline(t *testing.T) leakBaseline {
	t.Helper()
	return leakBaseline{goroutines: goleak.IgnoreCurrent(), fds: openFDs(t)}
}

// openFDs maps each file descriptor this process has open to what it
// refers to.
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	open := make(map[string]string, len(fds))
	for _, fd := range fds {
		target, _ := os.Readlink("/proc/self/fd/" + fd.Name())
		open[fd.Name()] = target
	}
	return open
}

// ownBPFObjects names the BPF programs, maps and links this process holds a
// file descriptor of, by kernel id (from /proc/self/fdinfo).
func ownBPFObjects(t *testing.T) []string {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var objs []string
	for _, fd := range fds {
		target, err := os.Readlink("/proc/self/fd/" + fd.Name())
		if err != nil || !strings.HasPrefix(target, "anon_inode:bpf") {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + fd.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			for _, kind := range []string{"prog_id", "map_id", "link_id"} {
				if v, ok := strings.CutPrefix(line, kind+":"); ok {
					objs = append(objs, kind+" "+strings.TrimSpace(v))
				}
			}
		}
	}
	return objs
}

// liveBPFObjects names every BPF program, map and link in the kernel, walking
// the id lists without taking references.
func liveBPFObjects() map[string]bool {
	live := map[string]bool{}
	for id, err := ebpf.ProgramGetNextID(0); err == nil; id, err = ebpf.ProgramGetNextID(id) {
		live[fmt.Sprintf("prog_id %d", id)] = true
	}
	for id, err := ebpf.MapGetNextID(0); err == nil; id, err = ebpf.MapGetNextID(id) {
		live[fmt.Sprintf("map_id %d", id)] = true
	}
	it := new(link.Iterator)
	for it.Next() {
		live[fmt.Sprintf("link_id %d", it.ID)] = true
	}
	it.Close()
	return live
}

// check fails t if, after Shutdown, a goroutine started since the baseline
// still runs, more file descriptors are open than then, or one of the
// receiver's BPF objects (taken while it ran) is still in the kernel.
// Conditions the kernel or runtime settle asynchronously are polled with a
// deadline.
func (b leakBaseline) check(t *testing.T, bpf []string) {
	t.Helper()
	if err := goleak.Find(b.goroutines); err != nil {
		t.Errorf("goroutines left after Shutdown: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var fds map[string]string
	var alive []string
	for {
		fds = openFDs(t)
		live := liveBPFObjects()
		alive = alive[:0]
		for _, o := range bpf {
			if live[o] {
				alive = append(alive, o)
			}
		}
		if len(fds) <= len(b.fds) && len(alive) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling kernel and runtime state, bounded by the deadline
	}
	if len(fds) > len(b.fds) {
		var added []string
		for fd, target := range fds {
			if b.fds[fd] != target {
				added = append(added, fd+" -> "+target)
			}
		}
		slices.Sort(added)
		t.Errorf("%d file descriptors open 10 s after Shutdown, %d before Start; new or changed: %v", len(fds), len(b.fds), added)
	}
	if len(alive) > 0 {
		t.Errorf("BPF objects of the receiver still in the kernel 10 s after Shutdown: %v", alive)
	}
}

// faultReceiver is a started receiver with the telemetry it reports to.
type faultReceiver struct {
	r   *profilesReceiver
	tt  *componenttest.Telemetry
	bpf []string // its BPF objects, taken after Start
}

// startFaultReceiver creates and starts a receiver; prepare, when given,
// runs on it before Start. The caller shuts it down (a cleanup does too).
func startFaultReceiver(t *testing.T, cfg *Config, next xconsumer.Profiles, prepare func(*profilesReceiver)) *faultReceiver {
	t.Helper()
	testutil.RequirePrivileges(t, "the sonde receiver")
	tt := componenttest.NewTelemetry()
	t.Cleanup(func() { _ = tt.Shutdown(context.Background()) })
	set := metadatatest.NewSettings(tt)
	set.Logger = zaptest.NewLogger(t)
	rcv, err := createProfiles(context.Background(), set, cfg, next)
	if err != nil {
		t.Fatal(err)
	}
	r := rcv.(*profilesReceiver)
	if prepare != nil {
		prepare(r)
	}
	before := map[string]bool{}
	for _, o := range ownBPFObjects(t) {
		before[o] = true
	}
	if err := r.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	fr := &faultReceiver{r: r, tt: tt}
	for _, o := range ownBPFObjects(t) {
		if !before[o] {
			fr.bpf = append(fr.bpf, o)
		}
	}
	if len(fr.bpf) < 5 {
		t.Fatalf("the receiver holds %d BPF objects (%v): the leak check would see nothing", len(fr.bpf), fr.bpf)
	}
	return fr
}

// shutdownWithin calls Shutdown and fails t if it does not return within
// limit: a liveness bound, not a timing measurement.
func shutdownWithin(t *testing.T, r *profilesReceiver, limit time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- r.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		t.Logf("Shutdown returned in %v", time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(limit):
		t.Fatalf("Shutdown did not return within %v", limit)
	}
}

// recorder is a consumer that keeps what it accepts and lets a test hook
// into each call.
type recorder struct {
	mu     sync.Mutex
	got    []pprofile.Profiles
	calls  atomic.Int64
	before func(call int64, ctx context.Context) error // may block or fail
}

func (rc *recorder) consumer(t *testing.T) xconsumer.Profiles {
	next, err := xconsumer.NewProfiles(func(ctx context.Context, pd pprofile.Profiles) error {
		call := rc.calls.Add(1)
		if rc.before != nil {
			if err := rc.before(call, ctx); err != nil {
				return err
			}
		}
		rc.mu.Lock()
		rc.got = append(rc.got, pd)
		rc.mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return next
}

func (rc *recorder) accepted() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

// waitForInterval waits until an interval after the first n accepted ones
// holds a sample of pid with a frame named fn (any sample, if fn is ""),
// and returns how many were accepted by then.
func (rc *recorder) waitForInterval(t *testing.T, n, pid int, fn string, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		rc.mu.Lock()
		got := rc.got
		rc.mu.Unlock()
		for _, pd := range got[min(n, len(got)):] {
			if fn == "" && pd.SampleCount() > 0 || fn != "" && hasFunction(pd, pid, fn) {
				return len(got)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no interval after the first %d (of %d accepted) with a sample of pid %d in %q within %v",
				n, len(got), pid, fn, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling the consumer, bounded by the deadline
	}
}

// minRingBufferBytes is the smallest limits::ring_buffer_bytes Validate
// accepts.
const minRingBufferBytes = 64 << 10

func faultConfig(sps int) *Config {
	cfg := createDefaultConfig()
	cfg.SamplesPerSecond = sps
	cfg.ReporterInterval = 200 * time.Millisecond
	return cfg
}

// A consumer that fails, one that blocks until its context ends and one
// that blocks regardless, each while Shutdown is called: Shutdown returns
// promptly and leaves nothing behind.
func TestFaultShutdownWithBadConsumer(t *testing.T) {
	for _, tc := range []struct {
		name string
		// consume is the consumer's behaviour from its first call on;
		// entered is closed on that call.
		consume func(ctx context.Context, release <-chan struct{}) error
	}{
		{"failing", func(context.Context, <-chan struct{}) error { return errors.New("backend unavailable") }},
		{"blocking until cancelled", func(ctx context.Context, _ <-chan struct{}) error {
			<-ctx.Done()
			return ctx.Err()
		}},
		{"blocking regardless", func(_ context.Context, release <-chan struct{}) error {
			<-release
			return errors.New("backend unavailable")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.RequirePrivileges(t, "the sonde receiver")
			testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChain))
			base := takeLeakBaseline(t)
			entered := make(chan struct{})
			release := make(chan struct{})
			var enterOnce, releaseOnce sync.Once
			releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
			rc := &recorder{before: func(_ int64, ctx context.Context) error {
				enterOnce.Do(func() { close(entered) })
				return tc.consume(ctx, release)
			}}
			fr := startFaultReceiver(t, faultConfig(499), rc.consumer(t), nil)
			t.Cleanup(releaseAll) // runs before the receiver's Shutdown
			select {
			case <-entered:
			case <-time.After(20 * time.Second):
				t.Fatal("the consumer was not called within 20 s")
			}
			shutdownWithin(t, fr.r, 10*time.Second)
			// A consumer that ignores its context keeps its own goroutine
			// until it returns; once it does, nothing is left.
			releaseAll()
			base.check(t, fr.bpf)
			if f := fr.r.prof.Stats().EmitErrors; f == 0 {
				t.Errorf("no export failure counted for a consumer that never accepted")
			}
		})
	}
}

// A consumer that blocks for several intervals while the resolver is slow:
// the reader waits, the ring buffer (at its minimum size, sampled at the
// maximum rate) fills, and what it could not take is counted, in the
// tracer's counters and in sonde.samples.lost. Once both recover, the next
// interval is delivered.
func TestFaultRingBufferFills(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	bin := testutil.BuildWorkload(t, testutil.CChain)
	pid := testutil.StartWorkload(t, bin).Process.Pid
	testutil.StartWorkload(t, bin)
	base := takeLeakBaseline(t)

	var stalled atomic.Bool
	unstall := make(chan struct{})
	blocked := make(chan struct{})
	release := make(chan struct{})
	var unstallOnce sync.Once
	releaseAll := func() {
		unstallOnce.Do(func() {
			stalled.Store(false)
			close(unstall)
			close(release)
		})
	}
	rc := &recorder{}
	rc.before = func(call int64, _ context.Context) error {
		// The first interval goes through; the second blocks the
		// consumer and stalls the resolver.
		if call == 2 {
			stalled.Store(true)
			close(blocked)
			<-release
		}
		return nil
	}
	cfg := faultConfig(1000)
	cfg.Limits.RingBufferBytes = minRingBufferBytes
	fr := startFaultReceiver(t, cfg, rc.consumer(t), func(r *profilesReceiver) {
		r.beforeResolve = func() {
			if stalled.Load() {
				<-unstall
			}
		}
	})
	t.Cleanup(releaseAll) // runs before the receiver's Shutdown
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer was not called twice within 30 s")
	}
	lostAtBlock := fr.r.prof.Stats().Kernel
	// Several intervals pass with the consumer held: wait for the ring
	// buffer's drops to show in the receiver's telemetry.
	var lost int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		lost = collect(t, fr.tt).sum("sonde.samples.lost", attribute.String("reason", "ring_buffer_full"))
		if lost > int64(lostAtBlock.SamplesLost) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sample lost to a full ring buffer in 30 s with the resolver stalled (sonde.samples.lost = %d)", lost)
		}
		time.Sleep(50 * time.Millisecond) // polling the telemetry, bounded by the deadline
	}
	c := fr.r.prof.Stats().Kernel
	if c.SamplesLost < uint64(lost) {
		t.Errorf("tracer counts %d samples lost, telemetry reported %d before", c.SamplesLost, lost)
	}
	accepted := rc.accepted()
	releaseAll()
	rc.waitForInterval(t, accepted+1, pid, "c", 20*time.Second)
	t.Logf("samples lost to the full ring buffer: %d; intervals accepted: %d", c.SamplesLost, rc.accepted())
	shutdownWithin(t, fr.r, 10*time.Second)
	base.check(t, fr.bpf)
}

// An exec storm: processes that exec and exit while their maps and tables
// are read. The receiver keeps exporting, counts them, and leaks nothing.
func TestFaultExecStorm(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	sh := testutil.RequireTool(t, "sh")
	testutil.RequireTool(t, "true")
	pid := testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChain)).Process.Pid
	base := takeLeakBaseline(t)
	rc := &recorder{}
	fr := startFaultReceiver(t, faultConfig(997), rc.consumer(t), nil)
	n := rc.waitForInterval(t, 0, pid, "c", 20*time.Second)
	queued0 := fr.r.prof.Stats().Preparer.Queued
	records0 := fr.r.prof.Stats().Records
	c0 := fr.r.prof.Stats().Kernel

	// Each child is a shell that execs another with its own command line,
	// which execs true: two execs and an exit per process.
	const procs = 300
	storm := exec.Command(sh, "-c", `i=0; while [ $i -lt `+strconv.Itoa(procs)+` ]; do "$0" -c "exec $0 -c 'exec true storm-$i'" & i=$((i+1)); [ $((i % 20)) -eq 0 ] && wait; done; wait`, sh)
	if out, err := storm.CombinedOutput(); err != nil {
		t.Fatalf("exec storm: %v: %s", err, out)
	}
	// Exports went on and the next ones still arrive.
	n = rc.waitForInterval(t, n, pid, "c", 20*time.Second)
	rc.waitForInterval(t, n, pid, "c", 20*time.Second)
	queued := fr.r.prof.Stats().Preparer.Queued - queued0
	records := fr.r.prof.Stats().Records - records0
	c := fr.r.prof.Stats().Kernel
	// Every process's execs and exit reach the preparer, or their
	// dropping is counted.
	sent, lostEvents := c.TaskEventsSent-c0.TaskEventsSent, c.TaskEventsLost-c0.TaskEventsLost
	if sent+lostEvents < 3*procs {
		t.Errorf("%d exec/exit records sent and %d lost for %d processes that exec'd twice and exited", sent, lostEvents, procs)
	}
	// The reader may still be behind the ring buffer: give it a deadline.
	for deadline := time.Now().Add(10 * time.Second); queued+fr.r.prof.Stats().Preparer.Dropped < sent && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // polling the reader's progress, bounded by the deadline
		queued = fr.r.prof.Stats().Preparer.Queued - queued0
	}
	if queued+fr.r.prof.Stats().Preparer.Dropped < sent {
		t.Errorf("%d preparer requests (%d dropped) for %d exec/exit records sent", queued, fr.r.prof.Stats().Preparer.Dropped, sent)
	}
	t.Logf("%d processes: %d records, %d preparer requests (%d dropped), %d found gone while prepared, %d samples of gone processes",
		procs, records, queued, fr.r.prof.Stats().Preparer.Dropped, fr.r.prof.Stats().Preparer.Gone, fr.r.prof.Stats().Resolver.ProcessGone)
	shutdownWithin(t, fr.r, 10*time.Second)
	base.check(t, fr.bpf)
}

// mapFilesWorkload starts MapFiles with lib dlopened and files mapped and
// returns it once everything is mapped, and the function that lets it run.
func mapFilesWorkload(t *testing.T, lib string, files ...string) (pid int, run func()) {
	t.Helper()
	cmd := exec.Command(testutil.BuildWorkload(t, testutil.MapFiles), append([]string{lib}, files...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	testutil.StartCmd(t, cmd)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("mapfiles: %q, %v; stderr: %s", line, err, stderr.String())
	}
	return cmd.Process.Pid, func() {
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
		// Pipes: "go" is in the pipe already, and the read end has nothing
		// to lose; closing them lets the workload run on.
		_ = stdin.Close()
		_ = stdout.Close()
	}
}

// Files replaced or truncated under a process's mappings, before the
// receiver first reads them: the library it runs in is replaced by rename
// (its mapping now names a deleted file; the old content is read through
// map_files and still names its frames), and files it maps but no longer
// touches are truncated and overwritten with garbage (unreadable: counted).
// The receiver keeps exporting.
func TestFaultFileReplacedOrTruncated(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	dir := t.TempDir()
	lib := filepath.Join(dir, "lib.so")
	copyFile(t, testutil.BuildWorkload(t, testutil.DLOpenLib), lib)
	const victims = 3
	var files []string
	for i := range victims {
		f := filepath.Join(dir, fmt.Sprintf("victim%d.so", i))
		copyFile(t, lib, f)
		files = append(files, f)
	}
	pid, run := mapFilesWorkload(t, lib, files...)

	// Replace the library by rename of a different file.
	other := filepath.Join(dir, "other.so")
	copyFile(t, testutil.BuildWorkload(t, testutil.DLSwapA), other)
	if err := os.Rename(other, lib); err != nil {
		t.Fatal(err)
	}
	// Truncate each victim, then write garbage shorter than an ELF header
	// into it: the process never touches those pages, so it does not fault.
	for _, f := range files {
		if err := os.Truncate(f, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("not an ELF file any more"), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	base := takeLeakBaseline(t)
	rc := &recorder{}
	fr := startFaultReceiver(t, faultConfig(499), rc.consumer(t), nil)
	// The symbolizer is the receiver's own: its counts start at Start,
	// which may already have prepared the waiting workload.
	const errs0 = 0
	run()
	// The frames in the replaced library are still named from its old
	// content, which the process still runs.
	n := rc.waitForInterval(t, 0, pid, "lib_inner", 20*time.Second)
	// The preparer opens every mapped file on its own goroutine, maybe
	// after that interval was named: wait for it, with a deadline.
	for deadline := time.Now().Add(10 * time.Second); fr.r.prof.Stats().Symbols.Errors-errs0 < victims && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // polling the preparer's progress, bounded by the deadline
	}
	if errs := fr.r.prof.Stats().Symbols.Errors - errs0; errs < victims {
		t.Errorf("%d files could not be read (symbolizer errors), want at least the %d truncated ones", errs, victims)
	}
	rc.waitForInterval(t, n, pid, "lib_inner", 20*time.Second)
	ls := fr.r.prof.Stats().Unwind
	t.Logf("symbolizer errors %d, loader: %d tables built, %d failures, %d without CFI",
		fr.r.prof.Stats().Symbols.Errors-errs0, ls.Built, ls.Failures, ls.NoCFI)
	shutdownWithin(t, fr.r, 10*time.Second)
	base.check(t, fr.bpf)
}

// hostileELFs writes corrupt variants of the shared object src into dir and
// returns their paths.
func hostileELFs(t *testing.T, src, goBin, dir string) []string {
	t.Helper()
	orig, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.NewFile(strings.NewReader(string(orig)))
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	clone := func() []byte { return append([]byte(nil), orig...) }
	sectionHeader := func(name string) int {
		for i, s := range ef.Sections {
			if s.Name == name {
				return int(le.Uint64(orig[0x28:])) + i*int(le.Uint16(orig[0x3a:]))
			}
		}
		t.Fatalf("%s has no %s", src, name)
		return 0
	}
	section := func(name string) *elf.Section {
		s := ef.Section(name)
		if s == nil {
			t.Fatalf("%s has no %s", src, name)
		}
		return s
	}
	var variants []struct {
		name string
		data []byte
	}
	add := func(name string, b []byte) {
		variants = append(variants, struct {
			name string
			data []byte
		}{name, b})
	}
	// Truncated: the section headers and half the sections are gone.
	add("truncated", clone()[:len(orig)/2])
	add("truncated-header", clone()[:40])
	// Section header table past the end.
	b := clone()
	le.PutUint64(b[0x28:], 1<<40)
	add("shoff-past-end", b)
	// Huge section and program header counts.
	b = clone()
	le.PutUint16(b[0x3c:], 0xffff)
	add("huge-shnum", b)
	b = clone()
	le.PutUint16(b[0x38:], 0xffff)
	add("huge-phnum", b)
	// .eh_frame's offset past the end, and its size huge.
	b = clone()
	le.PutUint64(b[sectionHeader(".eh_frame")+0x18:], 1<<40)
	add("eh_frame-offset-past-end", b)
	b = clone()
	le.PutUint64(b[sectionHeader(".eh_frame")+0x20:], 1<<62)
	add("eh_frame-huge-size", b)
	// .eh_frame whose first record claims a huge length (32-bit, and the
	// 64-bit escape).
	eh := section(".eh_frame")
	b = clone()
	le.PutUint32(b[eh.Offset:], 0xfffffff0)
	add("eh_frame-huge-length", b)
	b = clone()
	le.PutUint32(b[eh.Offset:], 0xffffffff)
	binary.LittleEndian.PutUint64(b[eh.Offset+4:], 1<<62)
	add("eh_frame-huge-length64", b)
	// Every FDE's CIE pointer pointing at itself, or at the FDE before it:
	// loops for a walker that follows CIE pointers.
	for _, mode := range []string{"self", "previous"} {
		b = clone()
		off, prev := eh.Offset, uint64(0)
		for off+8 <= eh.Offset+eh.Size {
			length := uint64(le.Uint32(b[off:]))
			if length == 0 || length == 0xffffffff {
				break
			}
			if id := le.Uint32(b[off+4:]); id != 0 && (mode == "self" || prev != 0) {
				// CIE pointer: distance back from this field.
				target := off // self
				if mode == "previous" {
					target = prev
				}
				le.PutUint32(b[off+4:], uint32(off+4-target))
			}
			prev = off
			off += 4 + length
		}
		add("eh_frame-cie-loop-"+mode, b)
	}
	// .eh_frame_hdr with a huge FDE count.
	if hdr := ef.Section(".eh_frame_hdr"); hdr != nil {
		b = clone()
		le.PutUint32(b[hdr.Offset+8:], 0x7fffffff)
		add("eh_frame_hdr-huge-count", b)
	}
	// A Go binary whose .gopclntab header claims absurd function and file
	// counts, and a .gopclntab cut short.
	gob, err := os.ReadFile(goBin)
	if err != nil {
		t.Fatal(err)
	}
	gef, err := elf.NewFile(strings.NewReader(string(gob)))
	if err != nil {
		t.Fatal(err)
	}
	if pcln := gef.Section(".gopclntab"); pcln != nil {
		b = append([]byte(nil), gob...)
		le.PutUint64(b[pcln.Offset+8:], 1<<62)  // nfunc
		le.PutUint64(b[pcln.Offset+16:], 1<<62) // nfiles
		add("gopclntab-huge-counts", b)
		b = append([]byte(nil), gob...)
		for i := pcln.Offset + 24; i < pcln.Offset+64; i += 8 {
			le.PutUint64(b[i:], 1<<62) // every table offset
		}
		add("gopclntab-offsets-past-end", b)
	} else {
		t.Fatalf("%s has no .gopclntab", goBin)
	}
	var paths []string
	for _, v := range variants {
		p := filepath.Join(dir, v.name+".so")
		if err := os.WriteFile(p, v.data, 0o755); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	return paths
}

// Hostile ELF files mapped executable by a running process: the preparer
// reads every executable mapping. Each costs a counter, never a crash or
// unbounded memory, and the next interval is exported.
func TestFaultHostileELFMapped(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	lib := testutil.BuildWorkload(t, testutil.DLOpenLib)
	files := hostileELFs(t, lib, testutil.BuildWorkload(t, testutil.GoChain), t.TempDir())
	// The files the standard library's ELF reader (an independent parser)
	// rejects cannot be identified: each must be counted.
	rejected := 0
	for _, f := range files {
		ef, err := elf.Open(f)
		if err != nil {
			rejected++
			continue
		}
		ef.Close()
	}
	if rejected == 0 {
		t.Fatal("debug/elf accepts every hostile file: the corruption is not exercised")
	}
	pid, run := mapFilesWorkload(t, lib, files...)

	base := takeLeakBaseline(t)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rc := &recorder{}
	fr := startFaultReceiver(t, faultConfig(499), rc.consumer(t), nil)
	// The symbolizer and loader are the receiver's own: their counts
	// start at Start, which may already have prepared the waiting workload.
	const errs0 = 0
	var ls0 struct{ Failures, NoCFI, Built uint64 }
	run()
	n := rc.waitForInterval(t, 0, pid, "lib_inner", 20*time.Second)
	// The preparer reads every mapping of the process once its request
	// comes through the queue (behind the other processes on the host):
	// wait for the process to be prepared and the files to be counted.
	counted := func() bool {
		ls := fr.r.prof.Stats().Unwind
		return fr.r.prof.Prepared(pid) &&
			fr.r.prof.Stats().Symbols.Errors-errs0+ls.Failures-ls0.Failures >= uint64(rejected)
	}
	for deadline := time.Now().Add(20 * time.Second); !counted() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond) // polling the preparer, bounded by the deadline
	}
	rc.waitForInterval(t, n, pid, "lib_inner", 20*time.Second)
	ls := fr.r.prof.Stats().Unwind
	symErrs := fr.r.prof.Stats().Symbols.Errors - errs0
	failures := ls.Failures - ls0.Failures
	noCFI := ls.NoCFI - ls0.NoCFI
	t.Logf("%d hostile files (%d rejected by debug/elf): %d symbolizer errors, %d loader failures, %d without CFI, %d tables built",
		len(files), rejected, symErrs, failures, noCFI, ls.Built-ls0.Built)
	if symErrs+failures < uint64(rejected) {
		t.Errorf("%d symbolizer errors and %d loader failures for %d files debug/elf rejects", symErrs, failures, rejected)
	}

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	const bound = 256 << 20
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > bound {
		t.Errorf("heap grew by %d MiB reading %d hostile files, bound %d MiB", grown>>20, len(files), bound>>20)
	}
	shutdownWithin(t, fr.r, 10*time.Second)
	base.check(t, fr.bpf)
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
