package tracer

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// records starts reading tr into a channel; the channel closes when tr does.
func records(t *testing.T, tr *Tracer) <-chan Record {
	t.Helper()
	ch := make(chan Record, 1024)
	go func() {
		defer close(ch)
		for {
			var rec Record
			err := tr.ReadInto(&rec)
			if errors.Is(err, ErrClosed) {
				return
			}
			if err != nil {
				t.Errorf("ReadInto: %v", err)
				return
			}
			ch <- rec
		}
	}()
	return ch
}

// waitFor returns the first record that matches, failing after timeout.
func waitFor(t *testing.T, ch <-chan Record, timeout time.Duration, what string, match func(Record) bool) Record {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case rec, ok := <-ch:
			if !ok {
				t.Fatalf("tracer closed before %s", what)
			}
			if match(rec) {
				return rec
			}
		case <-deadline:
			t.Fatalf("no %s within %v", what, timeout)
		}
	}
}

func newTracer(t *testing.T, opts Options) *Tracer {
	t.Helper()
	testutil.RequirePrivileges(t, "eBPF sampling")
	tr, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return tr
}

// burn keeps one locked OS thread busy until stop closes and reports its tid.
func burn(stop <-chan struct{}, syscalls bool) <-chan int {
	tid := make(chan int, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		x := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			for i := 0; i < 100000; i++ {
				if syscalls {
					unix.Getppid()
				}
				x += i
			}
		}
	}()
	return tid
}

func TestSamplesThisProcess(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 499})
	ch := records(t, tr)
	stop := make(chan struct{})
	defer close(stop)
	tid := <-burn(stop, false)

	rec := waitFor(t, ch, 10*time.Second, "sample of the burning thread", func(r Record) bool {
		return r.Type == RecordSample && int(r.TID) == tid
	})
	if int(rec.PID) != os.Getpid() {
		t.Errorf("sample pid = %d, want %d", rec.PID, os.Getpid())
	}
	if rec.Comm == "" {
		t.Error("sample has no comm")
	}
	if rec.CPU >= uint32(tr.CPUs()) {
		t.Errorf("sample cpu = %d, only %d CPUs sampled", rec.CPU, tr.CPUs())
	}
	if d := time.Since(rec.Time); d < 0 || d > time.Minute {
		t.Errorf("sample time %v is %v from now", rec.Time, d)
	}
	// Go keeps frame pointers, so the walk reaches beyond the leaf.
	if len(rec.User) < 2 {
		t.Errorf("user stack has %d frames, want at least 2: %x", len(rec.User), rec.User)
	}
	if rec.Flags&FlagFramePointers == 0 {
		t.Errorf("flags %#x do not say the stack came from frame pointers", rec.Flags)
	}
	c, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Samples == 0 || c.SamplesSent == 0 {
		t.Errorf("counters = %+v, want samples counted", c)
	}
}

func TestKernelStackOfSyscalls(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 499})
	ch := records(t, tr)
	stop := make(chan struct{})
	defer close(stop)
	tid := <-burn(stop, true)

	rec := waitFor(t, ch, 20*time.Second, "sample in the kernel", func(r Record) bool {
		return r.Type == RecordSample && int(r.TID) == tid && len(r.Kernel) > 0
	})
	for _, pc := range rec.Kernel {
		if pc < 0xffff800000000000 {
			t.Errorf("kernel frame %#x is not a kernel address", pc)
		}
	}
}

func TestExecAndExitEvents(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 19})
	ch := records(t, tr)
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	exe := waitFor(t, ch, 10*time.Second, "exec record", func(r Record) bool { return r.Type == RecordExec && r.PID == pid })
	if exe.Comm != "true" {
		t.Errorf("exec comm = %q, want %q", exe.Comm, "true")
	}
	waitFor(t, ch, 10*time.Second, "exit record", func(r Record) bool { return r.Type == RecordExit && r.PID == pid })
}

func TestCloseUnblocksRead(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1})
	done := make(chan error, 1)
	go func() {
		for {
			var rec Record
			if err := tr.ReadInto(&rec); err != nil {
				done <- err
				return
			}
		}
	}()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("ReadInto after Close = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadInto still blocked 10s after Close")
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
}

// A reader that polls once an hour still reads at once when kicked: a
// Kick while it waits ends the wait, and one that comes before the wait
// begins is not lost. TryReadInto never waits.
func TestKickEndsWait(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 1, PollInterval: time.Hour})
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		tr.Wait()
	}()
	// Kick until the waiting goroutine is parked and wakes: a kick that
	// lands before it parks ends its wait at once too.
	tr.Kick()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("Wait still parked 10 s after Kick")
	}
	tr.Kick()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.Wait() // the kick came first: returns at once
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a Kick before Wait was lost: Wait parked for its hour")
	}
	// Empty or not, TryReadInto returns.
	for {
		var rec Record
		err := tr.TryReadInto(&rec)
		if errors.Is(err, ErrEmpty) {
			break
		}
		if err != nil {
			t.Fatalf("TryReadInto: %v", err)
		}
	}
}

// Start and stop leave no file descriptor, program, map or link behind. The
// check follows this tracer's own objects by id, so BPF objects that other
// tests load at the same time do not disturb it.
func TestCloseLeavesNothing(t *testing.T) {
	testutil.RequirePrivileges(t, "eBPF sampling")
	fdsBefore := openFDs(t)
	for i := range 4 {
		// Off-CPU profiling on every other time: its programs and the
		// program array they tail-call through go too.
		offCPU := float64(i % 2)
		tr, err := New(Options{SamplesPerSecond: 99, RingBufferBytes: 1 << 20, OffCPUThreshold: offCPU})
		if err != nil {
			t.Fatal(err)
		}
		progs, maps, links := objectIDs(t, tr)
		if len(progs) < 4+2*int(offCPU) || len(maps) < 5 || len(links) < tr.CPUs()+2+int(offCPU) {
			t.Fatalf("while running: %d programs, %d maps, %d links; the test does not see the tracer's objects", len(progs), len(maps), len(links))
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		// The unwinder and the program array it tail-calls through refer to
		// each other; the kernel breaks that cycle in deferred work after the
		// last file descriptor closes, so wait for it with a deadline.
		var alive []string
		deadline := time.Now().Add(10 * time.Second)
		for {
			alive = aliveObjects(progs, maps, links)
			if len(alive) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond) // polling a kernel condition, bounded by the deadline
		}
		if len(alive) > 0 {
			t.Errorf("still in the kernel 10s after Close: %v", alive)
		}
	}
	if after := openFDs(t); after != fdsBefore {
		t.Errorf("%d file descriptors open after Close, %d before New", after, fdsBefore)
	}
}

// aliveObjects names the objects among the ids that the kernel still has.
// It walks the id lists and takes no reference: opening a program array by
// id while the kernel's deferred cleanup runs can keep it alive for good
// (seen on 6.18).
func aliveObjects(progs []ebpf.ProgramID, maps []ebpf.MapID, links []link.ID) []string {
	var alive []string
	live := map[string]bool{}
	for id, err := ebpf.ProgramGetNextID(0); err == nil; id, err = ebpf.ProgramGetNextID(id) {
		live[fmt.Sprintf("program %d", id)] = true
	}
	for id, err := ebpf.MapGetNextID(0); err == nil; id, err = ebpf.MapGetNextID(id) {
		live[fmt.Sprintf("map %d", id)] = true
	}
	it := new(link.Iterator)
	for it.Next() {
		live[fmt.Sprintf("link %d", it.ID)] = true
	}
	it.Close()
	var want []string
	for _, id := range progs {
		want = append(want, fmt.Sprintf("program %d", id))
	}
	for _, id := range maps {
		want = append(want, fmt.Sprintf("map %d", id))
	}
	for _, id := range links {
		want = append(want, fmt.Sprintf("link %d", id))
	}
	for _, w := range want {
		if live[w] {
			alive = append(alive, w)
		}
	}
	return alive
}

func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// objectIDs returns the kernel ids of the tracer's programs, maps and links.
func objectIDs(t *testing.T, tr *Tracer) (progs []ebpf.ProgramID, maps []ebpf.MapID, links []link.ID) {
	t.Helper()
	for _, p := range []*ebpf.Program{tr.objs.SampleCPU, tr.objs.UnwindUser, tr.objs.OnExec, tr.objs.OnExit,
		tr.offCPU.OffCPU, tr.offCPU.OffCPUUnwindUser} {
		if p == nil {
			continue
		}
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		progs = append(progs, id)
	}
	for _, m := range []*ebpf.Map{tr.objs.Events, tr.objs.Counters, tr.objs.Scratch, tr.objs.Mappings, tr.objs.Tables, tr.objs.Unwinders,
		tr.objs.OffcpuUnwinders, tr.objs.OffcpuStarts} {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		maps = append(maps, id)
	}
	var all []link.Link
	all = append(all, tr.links...)
	for _, pe := range tr.perf {
		if pe.link != nil {
			all = append(all, pe.link)
		}
	}
	for _, l := range all {
		info, err := l.Info()
		if err != nil {
			t.Fatal(err)
		}
		links = append(links, info.ID)
	}
	return progs, maps, links
}

// New loads one of two builds of the unwinder, by kernel; both must pass
// this kernel's verifier, so the one older kernels get is checked here too.
func TestBothUnwinderBuildsLoad(t *testing.T) {
	testutil.RequirePrivileges(t, "loading eBPF programs")
	for _, name := range []string{support.SondeProgUnwindUser, support.SondeProgUnwindUserUnchecked} {
		t.Run(name, func(t *testing.T) {
			spec, err := support.LoadSonde()
			if err != nil {
				t.Fatal(err)
			}
			var objs struct {
				Prog *ebpf.Program `ebpf:"unwind_user"`
			}
			spec.Programs[support.SondeProgUnwindUser] = spec.Programs[name]
			if err := spec.LoadAndAssign(&objs, nil); err != nil {
				var ve *ebpf.VerifierError
				if errors.As(err, &ve) {
					t.Fatalf("%s: %+v", name, ve)
				}
				t.Fatalf("%s: %v", name, err)
			}
			defer testutil.Close(t, objs.Prog)
			info, err := objs.Prog.Info()
			if err != nil {
				t.Fatal(err)
			}
			// The kernel keeps 15 bytes of a name; cilium/ebpf may find
			// the whole one in BTF.
			if info.Name != name && info.Name != name[:min(len(name), 15)] {
				t.Errorf("loaded program %q, want %q", info.Name, name)
			}
		})
	}
}
