package tracer

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
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

// Start and stop leave no file descriptor, program, map or link behind.
func TestCloseLeavesNothing(t *testing.T) {
	testutil.RequirePrivileges(t, "eBPF sampling")
	before := snapshot(t)
	for range 3 {
		tr, err := New(Options{SamplesPerSecond: 99, RingBufferBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if got := snapshot(t); got.progs <= before.progs || got.links <= before.links {
			t.Fatalf("while running: %+v, before: %+v; the snapshot does not see our objects", got, before)
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if after := snapshot(t); after != before {
		t.Errorf("after Close: %+v, before New: %+v", after, before)
	}
}

type objects struct{ fds, progs, maps, links int }

func snapshot(t *testing.T) objects {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	o := objects{fds: len(fds)}
	count := func(next func(uint32) (uint32, error)) int {
		n := 0
		for id, err := next(0); err == nil; id, err = next(id) {
			n++
		}
		return n
	}
	o.progs = count(func(id uint32) (uint32, error) {
		p, err := ebpf.ProgramGetNextID(ebpf.ProgramID(id))
		return uint32(p), err
	})
	o.maps = count(func(id uint32) (uint32, error) { m, err := ebpf.MapGetNextID(ebpf.MapID(id)); return uint32(m), err })
	o.links = countLinks()
	return o
}
