package tracer

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sonde-dev/sonde/internal/testutil"
	"github.com/sonde-dev/sonde/support"
)

// sleeper blocks one locked OS thread in nanosleep(d) over and over until
// stop closes, and reports its tid.
func sleeper(stop <-chan struct{}, d time.Duration) <-chan int {
	tid := make(chan int, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ts := unix.NsecToTimespec(d.Nanoseconds())
			_ = unix.Nanosleep(&ts, nil)
		}
	}()
	return tid
}

func TestOffCPUThreshold(t *testing.T) {
	for _, tc := range []struct {
		p    float64
		want uint64
	}{
		{0, 0}, {-1, 0}, {1, 1 << 32}, {2, 1 << 32}, {0.5, 1 << 31}, {0.25, 1 << 30},
	} {
		if got := offCPUThreshold(tc.p); got != tc.want {
			t.Errorf("offCPUThreshold(%v) = %d, want %d", tc.p, got, tc.want)
		}
	}
}

func TestOffCPUOptionsRejected(t *testing.T) {
	testutil.RequirePrivileges(t, "eBPF sampling")
	for _, opts := range []Options{
		{SamplesPerSecond: 19, OffCPUThreshold: 1.5},
		{SamplesPerSecond: 19, OffCPUThreshold: -0.5},
		{SamplesPerSecond: 19, OffCPUThreshold: 1, OffCPUMinDuration: -time.Second},
	} {
		if tr, err := New(opts); err == nil {
			testutil.Close(t, tr)
			t.Errorf("New(%+v) succeeded, want an error", opts)
		}
	}
}

// Off by default: the off-CPU programs are not even loaded.
func TestOffCPUOffLoadsNothing(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 19})
	if tr.OffCPU() || tr.offCPU.OffCPU != nil || tr.offCPU.OffCPUUnwindUser != nil {
		t.Errorf("off-CPU programs loaded with threshold 0: %+v", tr.offCPU)
	}
	if n := len(tr.links); n != 2 {
		t.Errorf("%d tracepoints attached, want 2 (exec, exit)", n)
	}
}

// A thread that sleeps is traced when it leaves the CPU (its stacks) and
// when it comes back (how long it was away, keyed by the start's time).
func TestOffCPUStartAndEnd(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 19, OffCPUThreshold: 1})
	if !tr.OffCPU() {
		t.Fatal("OffCPU() = false with threshold 1")
	}
	ch := records(t, tr)
	stop := make(chan struct{})
	defer close(stop)
	const nap = 50 * time.Millisecond
	tid := <-sleeper(stop, nap)

	starts := map[uint64]Record{}
	var end Record
	deadline := time.After(20 * time.Second)
	for end.Type == 0 {
		select {
		case rec, ok := <-ch:
			if !ok {
				t.Fatal("tracer closed")
			}
			if int(rec.TID) != tid {
				continue
			}
			switch rec.Type {
			case RecordOffCPUStart:
				rec.Kernel = append([]uint64(nil), rec.Kernel...)
				rec.User = append([]uint64(nil), rec.User...)
				starts[rec.KTime] = rec
			case RecordOffCPUEnd:
				// The sleep, not the first wait (handing over the tid).
				if _, ok := starts[rec.KTime]; ok && rec.OffCPU >= nap {
					end = rec
				}
			}
		case <-deadline:
			t.Fatalf("no start and end of a %v sleep of thread %d; %d starts", nap, tid, len(starts))
		}
	}
	start := starts[end.KTime]
	if start.PID != end.PID || int(start.PID) != unix.Getpid() {
		t.Errorf("start pid %d, end pid %d, want %d", start.PID, end.PID, unix.Getpid())
	}
	if !start.Time.Equal(end.Time) {
		t.Errorf("end time %v, start time %v: the end names its start", end.Time, start.Time)
	}
	if end.Flags&OffCPUShort != 0 {
		t.Errorf("end flags %#x say short without a minimum duration", end.Flags)
	}
	if len(start.Kernel) == 0 {
		t.Error("start has no kernel stack")
	}
	for _, pc := range start.Kernel {
		if pc < 0xffff800000000000 {
			t.Errorf("kernel frame %#x is not a kernel address", pc)
		}
	}
	// Go keeps frame pointers: the walk from the saved registers goes past
	// the syscall wrapper.
	if len(start.User) < 3 {
		t.Errorf("user stack of the sleep has %d frames, want at least 3: %x", len(start.User), start.User)
	}
	if start.Flags&(FlagUserStackErr|FlagKernelStackErr) != 0 {
		t.Errorf("start flags %#x report a stack error", start.Flags)
	}
	c, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.OffCPUStartsSent == 0 || c.OffCPUEndsSent == 0 || c.TailCallErrors != 0 {
		t.Errorf("counters = %+v, want starts and ends counted and no tail call error", c)
	}
}

// Waits shorter than the minimum still close their start, flagged short.
func TestOffCPUMinDuration(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 19, OffCPUThreshold: 1, OffCPUMinDuration: time.Hour})
	ch := records(t, tr)
	stop := make(chan struct{})
	defer close(stop)
	tid := <-sleeper(stop, 5*time.Millisecond)
	end := waitFor(t, ch, 20*time.Second, "end record of the sleeper", func(r Record) bool {
		return r.Type == RecordOffCPUEnd && int(r.TID) == tid
	})
	if end.Flags&OffCPUShort == 0 || end.OffCPU >= time.Hour {
		t.Errorf("end of a %v wait: flags %#x, want OffCPUShort", end.OffCPU, end.Flags)
	}
	c, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.OffCPUShortWaits == 0 {
		t.Errorf("counters = %+v, want short waits counted", c)
	}
}

// The filters drop a process's waits before any work, as its samples.
func TestOffCPUFiltered(t *testing.T) {
	tr := newTracer(t, Options{SamplesPerSecond: 19, OffCPUThreshold: 1, FilterPending: time.Second})
	if err := tr.Filter(uint32(unix.Getpid()), ExcludeForever); err != nil {
		t.Fatal(err)
	}
	// Waits that began before the filter was set may still end (and must,
	// so their starts are freed): only later ones must not be traced.
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	filtered := uint64(ts.Nano())
	ch := records(t, tr)
	stop := make(chan struct{})
	defer close(stop)
	tid := <-sleeper(stop, time.Millisecond)
	// Poll the counter (a kernel condition) with a deadline.
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		if c.OffCPUFiltered > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no filtered off-CPU wait counted: %+v", c)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		select {
		case rec := <-ch:
			if int(rec.TID) == tid && (rec.Type == RecordOffCPUStart || rec.Type == RecordOffCPUEnd) && rec.KTime >= filtered {
				t.Fatalf("record %d of the filtered thread, for a wait that began %d ns after the filter was set", rec.Type, rec.KTime-filtered)
			}
		default:
			return
		}
	}
}

// New loads one of two builds of the off-CPU unwinder too; both must pass
// this kernel's verifier and be tail-callable from off_cpu.
func TestBothOffCPUUnwinderBuildsLoad(t *testing.T) {
	testutil.RequirePrivileges(t, "loading eBPF programs")
	for _, name := range []string{support.SondeProgOffCpuUnwindUser, support.SondeProgOffCpuUnwindUserUnchecked} {
		t.Run(name, func(t *testing.T) {
			spec, err := support.LoadSonde()
			if err != nil {
				t.Fatal(err)
			}
			var objs struct {
				Switch  *ebpf.Program `ebpf:"off_cpu"`
				Unwind  *ebpf.Program `ebpf:"off_cpu_unwind_user"`
				Targets *ebpf.Map     `ebpf:"offcpu_unwinders"`
			}
			spec.Programs[support.SondeProgOffCpuUnwindUser] = spec.Programs[name]
			if err := spec.LoadAndAssign(&objs, nil); err != nil {
				var ve *ebpf.VerifierError
				if errors.As(err, &ve) {
					t.Fatalf("%s: %+v", name, ve)
				}
				t.Fatalf("%s: %v", name, err)
			}
			defer testutil.Close(t, objs.Switch)
			defer testutil.Close(t, objs.Unwind)
			defer testutil.Close(t, objs.Targets)
			// The kernel checks at insertion that the target may be
			// tail-called from the array's owner.
			if err := objs.Targets.Put(uint32(0), objs.Unwind); err != nil {
				t.Fatalf("install %s in the off-CPU program array: %v", name, err)
			}
			if err := objs.Targets.Delete(uint32(0)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
