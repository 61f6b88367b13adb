// Package tracer owns the kernel side of Sonde: it loads the eBPF objects from
// package support, attaches the sampler to a perf event on every online CPU,
// the exec/exit tracepoints and, when off-CPU profiling is on, the
// context-switch tracepoint, and decodes what arrives on the ring buffer.
//
// A Tracer owns every file descriptor it opens (programs, maps, links, perf
// events, the ring buffer readers) and closes all of them in Close, also on
// every error path of New. Read must be called from one goroutine at a time;
// Close and Counters are safe to call concurrently with Read.
package tracer

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"

	"github.com/sonde-dev/sonde/internal/caps"
	"github.com/sonde-dev/sonde/support"
)

// ErrNotSupported is wrapped by the errors New returns when the kernel lacks a
// feature Sonde needs; the message says which and how to get it.
var ErrNotSupported = errors.New("not supported")

// ErrClosed is returned by Read after Close.
var ErrClosed = os.ErrClosed

// ErrDrained is returned by ReadInto after Stop, once every record written
// before Stop was read.
var ErrDrained = errors.New("ring buffer drained")

// Options configure a Tracer.
type Options struct {
	// SamplesPerSecond is the on-CPU sampling frequency per CPU.
	SamplesPerSecond int
	// RingBufferBytes is the size of the BPF ring buffer: a power of two and a
	// multiple of the page size; 0 sizes it for the sampling rate and the
	// CPUs (RingBufferBytesFor).
	RingBufferBytes int
	// IncludeIdle keeps samples of idle CPUs (pid 0).
	IncludeIdle bool
	// IncludeKernelThreads keeps samples of kernel threads (kernel stacks
	// only).
	IncludeKernelThreads bool
	// FilterPending, when not zero, turns per-process filtering on: a
	// process that execs is not sampled for this long, or until Filter
	// decides about it. With it zero, Filter fails and samples skip the
	// filter lookup.
	FilterPending time.Duration
	// MaxProcesses sizes the per-process unwind maps.
	MaxProcesses int
	// MaxMappingPrefixes sizes the trie of executable mappings: each mapping
	// takes one entry per aligned power-of-two block of its range.
	MaxMappingPrefixes int
	// PollInterval is how long ReadInto waits before it reads what the ring
	// buffer holds without a wake-up; default 1 s. The eBPF side wakes the
	// reader only once an eighth of the ring buffer is full, so a record
	// waits at most about this long, unless Kick asks for it sooner.
	PollInterval time.Duration
	// OffCPUThreshold is the probability, per context switch, that a thread
	// that blocks is traced off the CPU (0: off-CPU profiling is off and its
	// programs are not loaded; 1: every blocking switch).
	OffCPUThreshold float64
	// OffCPUMinDuration: traced waits shorter than this are dropped (their
	// end records carry OffCPUShort).
	OffCPUMinDuration time.Duration
	// CountCosts keeps, per process, what sampling it cost (Cost). It costs
	// every sample a map update, so it is for tests and diagnostics only.
	CountCosts bool
	// SnapshotAll makes every on-CPU stack carry a snapshot from its first
	// frame (Record.Snapshot), whatever the tables: for tests that unwind
	// the same stacks in user space and compare.
	SnapshotAll bool
}

// DefaultPollInterval is the default Options.PollInterval.
const DefaultPollInterval = time.Second

// objects are the eBPF objects a Tracer loads: every map, and one build of
// the user-stack unwinder (see New), so the other is never loaded.
type objects struct {
	support.SondeMaps
	support.SondeVariables
	SampleCPU  *ebpf.Program `ebpf:"sample_cpu"`
	UnwindUser *ebpf.Program `ebpf:"unwind_user"`
	OnExec     *ebpf.Program `ebpf:"on_exec"`
	OnExit     *ebpf.Program `ebpf:"on_exit"`
}

func (o *objects) Close() error {
	errs := []error{o.SondeMaps.Close()}
	for _, p := range []*ebpf.Program{o.SampleCPU, o.UnwindUser, o.OnExec, o.OnExit} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}

// offCPUPrograms are loaded only when off-CPU profiling is on: the
// context-switch program and one build of its unwinder.
type offCPUPrograms struct {
	OffCPU           *ebpf.Program `ebpf:"off_cpu"`
	OffCPUUnwindUser *ebpf.Program `ebpf:"off_cpu_unwind_user"`
}

func (o *offCPUPrograms) Close() error {
	var errs []error
	for _, p := range []*ebpf.Program{o.OffCPU, o.OffCPUUnwindUser} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}

// offCPUThreshold turns a probability into the bound bpf_get_prandom_u32()
// is compared with: 1 becomes 1<<32, above every 32-bit value.
func offCPUThreshold(p float64) uint64 {
	switch {
	case !(p > 0): // also NaN
		return 0
	case p >= 1:
		return 1 << 32
	}
	return uint64(math.Round(p * (1 << 32)))
}

// Tracer is the loaded and attached set of eBPF programs.
type Tracer struct {
	objs   objects
	offCPU offCPUPrograms // nil programs when off-CPU profiling is off
	// CheckedMappings: the unwinder checks each mapping entry against the
	// live mapping (bpf_find_vma), so a stale entry is never used.
	checked bool
	// filtering: Options.FilterPending was set; the eBPF side looks up
	// Filter's decisions.
	filtering bool
	links     []link.Link
	perf      []*perfEvent
	events    *ring // samples, exec, exit and off-CPU records (ReadInto)
	notices   *ring // requests for unwind information (ReadNotice)
	clock     clock
	poll      time.Duration
	// jvmGen numbers the JVM entries set (SetJVM), from 1.
	jvmGen atomic.Uint32
	// mappingGen numbers the settings of a process's mapping entries
	// (SetMappings), from 1.
	mappingGen atomic.Uint64
	// runtimes holds, by pid, the runtimes whose walker is set (a bit
	// 1 << support.SondeRuntimeId each), which its known_pids entry carries
	// so that a stack looks in those runtimes' maps only. runtimesMu orders
	// the entry's writes: SetMappings and the Set/Forget of a runtime.
	runtimesMu sync.Mutex
	runtimes   map[uint32]uint32
	// knownMask is known_slots' entries less one: pid's slot is
	// pid & knownMask.
	knownMask uint32

	closeOnce sync.Once
	closeErr  error
	stopOnce  sync.Once
	stopErr   error
}

// New checks the host, loads the eBPF objects and attaches them. On error
// nothing is left behind.
func New(opts Options) (_ *Tracer, err error) {
	if err := CheckHost(); err != nil {
		return nil, err
	}
	if opts.SamplesPerSecond <= 0 {
		return nil, fmt.Errorf("samples per second must be positive, got %d", opts.SamplesPerSecond)
	}
	if !(opts.OffCPUThreshold >= 0 && opts.OffCPUThreshold <= 1) {
		return nil, fmt.Errorf("off-CPU threshold must be between 0 and 1, got %v", opts.OffCPUThreshold)
	}
	if opts.OffCPUMinDuration < 0 {
		return nil, fmt.Errorf("off-CPU minimum duration must not be negative, got %v", opts.OffCPUMinDuration)
	}
	offCPU := opts.OffCPUThreshold > 0

	spec, err := support.LoadSonde()
	if err != nil {
		return nil, err
	}
	// The CPUs sampled: one perf event each, and the ring buffer's size.
	cpus, err := onlineCPUs()
	if err != nil {
		return nil, err
	}
	rb := opts.RingBufferBytes
	if rb <= 0 {
		rb = RingBufferBytesFor(opts.SamplesPerSecond, len(cpus), offCPU)
	}
	spec.Maps[support.SondeMapEvents].MaxEntries = uint32(rb)
	if opts.MaxProcesses > 0 {
		spec.Maps[support.SondeMapKnownPids].MaxEntries = uint32(opts.MaxProcesses)
		spec.Maps[support.SondeMapPidFilter].MaxEntries = uint32(opts.MaxProcesses)
	}
	knownSlots := knownSlotsFor(spec.Maps[support.SondeMapKnownPids].MaxEntries, pidMax())
	spec.Maps[support.SondeMapKnownSlots].MaxEntries = knownSlots
	// Where the kernel can look up a task's VMAs and has bpf_loop (both
	// 5.17+), the unwinder checks every mapping entry it uses against the
	// live mapping and walks the whole stack in one bpf_loop; elsewhere the
	// build without that check, which tail-calls itself every
	// FRAMES_PER_RUN frames, is loaded in its place.
	checked := features.HaveProgramHelper(ebpf.PerfEvent, asm.FnFindVma) == nil &&
		features.HaveProgramHelper(ebpf.PerfEvent, asm.FnLoop) == nil
	if !checked {
		spec.Programs[support.SondeProgUnwindUser] = spec.Programs[support.SondeProgUnwindUserUnchecked]
		spec.Programs[support.SondeProgOffCpuUnwindUser] = spec.Programs[support.SondeProgOffCpuUnwindUserUnchecked]
	}
	// The row cache holds each possible CPU's entries: the object's size
	// is one CPU's, both unwinders'; the off-CPU one's half only where it
	// is on.
	possible, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible CPUs: %w", err)
	}
	rowStride := spec.Maps[support.SondeMapRowCache].MaxEntries
	if !offCPU {
		// Every map is created (the generated struct names them all); the
		// one sized for off-CPU work takes no memory when it is off.
		spec.Maps[support.SondeMapOffcpuStarts].MaxEntries = 1
		rowStride /= 2
	}
	spec.Maps[support.SondeMapRowCache].MaxEntries = rowStride * uint32(possible)
	if opts.MaxMappingPrefixes > 0 {
		spec.Maps[support.SondeMapMappings].MaxEntries = uint32(opts.MaxMappingPrefixes)
	}
	var vars support.SondeVariableSpecs
	if err := spec.Assign(&vars); err != nil {
		return nil, fmt.Errorf("assign variables: %w", err)
	}
	if err := vars.IncludeIdle.Set(opts.IncludeIdle); err != nil {
		return nil, fmt.Errorf("set include_idle: %w", err)
	}
	if err := vars.IncludeKernelThreads.Set(opts.IncludeKernelThreads); err != nil {
		return nil, fmt.Errorf("set include_kernel_threads: %w", err)
	}
	if err := vars.FilterPendingNs.Set(uint64(max(opts.FilterPending, 0))); err != nil {
		return nil, fmt.Errorf("set filter_pending_ns: %w", err)
	}
	if err := vars.WakeupBytes.Set(uint64(spec.Maps[support.SondeMapEvents].MaxEntries / 8)); err != nil {
		return nil, fmt.Errorf("set wakeup_bytes: %w", err)
	}
	if err := vars.OffcpuThreshold.Set(offCPUThreshold(opts.OffCPUThreshold)); err != nil {
		return nil, fmt.Errorf("set offcpu_threshold: %w", err)
	}
	if err := vars.CountCosts.Set(opts.CountCosts); err != nil {
		return nil, fmt.Errorf("set count_costs: %w", err)
	}
	if err := vars.RowCacheStride.Set(rowStride); err != nil {
		return nil, fmt.Errorf("set row_cache_stride: %w", err)
	}
	if err := vars.KnownSlotMask.Set(knownSlots - 1); err != nil {
		return nil, fmt.Errorf("set known_slot_mask: %w", err)
	}
	if err := vars.SnapshotAll.Set(opts.SnapshotAll); err != nil {
		return nil, fmt.Errorf("set snapshot_all: %w", err)
	}
	if err := vars.OffcpuMinNs.Set(uint64(opts.OffCPUMinDuration.Nanoseconds())); err != nil {
		return nil, fmt.Errorf("set offcpu_min_ns: %w", err)
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}

	t := &Tracer{clock: newClock(), poll: opts.PollInterval, checked: checked, filtering: opts.FilterPending > 0,
		runtimes: map[uint32]uint32{}, knownMask: knownSlots - 1}
	defer func() {
		if err != nil {
			_ = t.Close() // err, which made New fail, is the one to report
		}
	}()

	// Only the programs named in the destination are loaded: the off-CPU
	// ones only when off-CPU profiling is on.
	var dst any = &t.objs
	if offCPU {
		dst = &struct {
			Base   *objects
			OffCPU *offCPUPrograms
		}{&t.objs, &t.offCPU}
	}
	if err := spec.LoadAndAssign(dst, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			// %+v prints the whole verifier log; %w would print only its summary.
			return nil, fmt.Errorf("load eBPF objects: verifier rejected a program: %+v", ve) //nolint:errorlint
		}
		return nil, fmt.Errorf("load eBPF objects: %w", err)
	}

	// The sampler hands each user stack to the unwinder by tail call, and
	// the unwinder calls itself for the next batch of frames.
	if err := t.objs.Unwinders.Put(uint32(0), t.objs.UnwindUser); err != nil {
		return nil, fmt.Errorf("install unwinder: %w", err)
	}
	tracepoints := []struct {
		name string
		prog *ebpf.Program
	}{
		{"sched_process_exec", t.objs.OnExec},
		{"sched_process_exit", t.objs.OnExit},
	}
	if offCPU {
		if err := t.objs.OffcpuUnwinders.Put(uint32(0), t.offCPU.OffCPUUnwindUser); err != nil {
			return nil, fmt.Errorf("install off-CPU unwinder: %w", err)
		}
		tracepoints = append(tracepoints, struct {
			name string
			prog *ebpf.Program
		}{"sched_switch", t.offCPU.OffCPU})
	}

	for _, tp := range tracepoints {
		l, err := link.AttachTracing(link.TracingOptions{Program: tp.prog})
		if err != nil {
			return nil, fmt.Errorf("attach BTF tracepoint %s: %w", tp.name, err)
		}
		t.links = append(t.links, l)
	}

	// The readers exist before sampling starts so no record waits unread.
	if t.events, err = newRing(t.objs.Events); err != nil {
		return nil, fmt.Errorf("ring buffer reader: %w", err)
	}
	if t.notices, err = newRing(t.objs.Notices); err != nil {
		return nil, fmt.Errorf("notice ring buffer reader: %w", err)
	}

	for _, cpu := range cpus {
		pe, err := openCPUClock(cpu, opts.SamplesPerSecond)
		if err != nil {
			return nil, err
		}
		t.perf = append(t.perf, pe)
		if err := pe.attach(t.objs.SampleCPU); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// CheckHost reports, in one error, what this host lacks to run Sonde: an
// x86-64 or aarch64 CPU, capabilities, kernel BTF, BPF ring buffers, BTF tracepoints, and locked
// memory on kernels that still account BPF memory to RLIMIT_MEMLOCK.
func CheckHost() error {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		// support's objects for other architectures exist only so the
		// packages build; the programs read each CPU's own registers and
		// signal frames.
		return fmt.Errorf("sonde cannot start: its eBPF programs support x86-64 (amd64) and aarch64 (arm64) only, not %s: %w", runtime.GOARCH, ErrNotSupported)
	}
	var problems []string
	missing, err := caps.Missing(caps.Profiler()...)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("missing capabilities %s: run as root or grant them (for example `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep otelcol-profiling`, or securityContext.capabilities.add in Kubernetes)",
			strings.Join(missing, ", ")))
		// Without CAP_BPF the feature probes below fail with EPERM, which
		// would only repeat this message less clearly.
		return fmt.Errorf("sonde cannot start: %s", strings.Join(problems, "; "))
	}
	if err := haveKernelBTF(); err != nil {
		problems = append(problems, fmt.Sprintf("kernel BTF is not available (%v): Sonde needs Linux >= 5.10 built with CONFIG_DEBUG_INFO_BTF=y (/sys/kernel/btf/vmlinux)", err))
	}
	if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		problems = append(problems, fmt.Sprintf("BPF ring buffers are not supported (%v): Sonde needs Linux >= 5.8", err))
	}
	if err := features.HaveProgramType(ebpf.PerfEvent); err != nil {
		problems = append(problems, fmt.Sprintf("perf-event BPF programs are not supported (%v)", err))
	}
	// Kernels >= 5.11 charge BPF memory to the cgroup and need no
	// RLIMIT_MEMLOCK raise; older ones need CAP_SYS_RESOURCE for it.
	if err := rlimit.RemoveMemlock(); err != nil {
		problems = append(problems, fmt.Sprintf("this kernel accounts BPF memory to RLIMIT_MEMLOCK and raising it failed (%v): grant CAP_SYS_RESOURCE or raise the memlock limit (ulimit -l unlimited)", err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("sonde cannot start: %s: %w", strings.Join(problems, "; "), ErrNotSupported)
	}
	return nil
}

// haveKernelBTF checks that the kernel's BTF can be had without parsing it
// where the kernel exposes it: loading the programs parses it once, and a
// second parse here would cost the start-up 4 MB of heap and tens of
// milliseconds. Elsewhere btf.LoadKernelSpec looks for a vmlinux file.
func haveKernelBTF() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err == nil {
		return nil
	}
	_, err := btf.LoadKernelSpec()
	return err
}

// Close detaches and unloads everything. It is idempotent and safe to call
// while another goroutine is blocked in Read, which then returns ErrClosed.
func (t *Tracer) Close() error {
	t.closeOnce.Do(func() {
		// Stop the producers first, then the reader, then the objects.
		errs := []error{t.stopProducers()}
		errs = append(errs, t.events.close(), t.notices.close())
		errs = append(errs, t.offCPU.Close(), t.objs.Close())
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

// Stop stops sampling and every other producer of records: nothing is
// written to the ring buffer from now on. ReadInto then returns the records
// still in it, and ErrDrained once they are read. The maps stay usable until
// Close, which is still needed. Stop is idempotent and safe to call while
// another goroutine is blocked in ReadInto.
func (t *Tracer) Stop() error {
	err := t.stopProducers()
	return errors.Join(err, t.events.flush(), t.notices.flush())
}

// stopProducers detaches the perf events and programs, once.
func (t *Tracer) stopProducers() error {
	t.stopOnce.Do(func() {
		var errs []error
		for _, pe := range t.perf {
			errs = append(errs, pe.close())
		}
		for _, l := range t.links {
			errs = append(errs, l.Close())
		}
		t.stopErr = errors.Join(errs...)
	})
	return t.stopErr
}

// CheckedMappings reports whether the unwinder checks mapping entries
// against the live mappings (kernels with bpf_find_vma).
func (t *Tracer) CheckedMappings() bool { return t.checked }

// OffCPU reports whether off-CPU profiling is on: its programs are loaded
// and attached.
func (t *Tracer) OffCPU() bool { return t.offCPU.OffCPU != nil }

// CPUs returns how many CPUs are sampled.
func (t *Tracer) CPUs() int { return len(t.perf) }

// Counters are the eBPF side's counters summed over all CPUs.
type Counters struct {
	Samples         uint64 // perf events that fired
	SamplesSent     uint64 // samples written to the ring buffer
	SamplesLost     uint64 // samples dropped: ring buffer full
	IdleSkipped     uint64 // samples of an idle CPU, not sent
	KernelStackErrs uint64 // kernel stacks that could not be read
	TaskEventsSent  uint64
	TaskEventsLost  uint64 // exec/exit records dropped: ring buffer full
	UnknownSent     uint64 // notifications of processes without unwind information
	UnknownLost     uint64 // notifications dropped: ring buffer full
	FramesCFI       uint64 // user frames unwound with an unwind table row
	FramesFP        uint64 // user frames unwound by frame pointers (no table)
	UnknownRule     uint64 // stacks stopped at a PC whose CFI has no usable rule
	ReadErrors      uint64 // stacks stopped at unreadable user memory
	TailCallErrors  uint64 // stacks cut short by a failed tail call
	Filtered        uint64 // samples of processes the filters exclude, dropped before any work
	KernelThreads   uint64 // samples of kernel threads, not sent
	StaleMappings   uint64 // mapping entries that no longer matched the live mapping
	VMACheckBusy    uint64 // mapping entries used unchecked: the mm lock was busy
	MappingsByFile  uint64 // mappings unwound from their file's table, without a process entry

	OffCPUFiltered   uint64 // traced waits of processes the filters exclude, dropped before any work
	OffCPUStartsSent uint64 // off-CPU start records written
	OffCPUStartsLost uint64 // off-CPU start records dropped: ring buffer full
	OffCPUMapFull    uint64 // starts that could not be remembered: their ends are never sent
	OffCPUEndsSent   uint64 // off-CPU end records written, short ones included
	OffCPUEndsLost   uint64 // off-CPU end records dropped: ring buffer full
	OffCPUShortWaits uint64 // waits shorter than the minimum duration, dropped

	PythonSamples   uint64 // user stacks of processes set with SetPython
	PythonFrames    uint64 // Python frames reported
	PythonNoThread  uint64 // stacks whose thread had no state in its interpreter's first threads
	PythonReadErrs  uint64 // Python walks ended at unreadable memory
	PythonBadFrames uint64 // Python walks ended at a frame without a code object
	JVMSamples      uint64 // user stacks of processes set with SetJVM
	JVMFrames       uint64 // Java frames reported (interpreted and code blobs)
	JVMNoBlob       uint64 // JVM walks ended at a code cache PC in no code blob
	JVMReadErrs     uint64 // JVM walks ended at unreadable memory
	V8Samples       uint64 // user stacks of processes set with SetV8
	V8Frames        uint64 // V8 frames reported (JavaScript and typed frames)
	V8NotJS         uint64 // frames in V8 code without a JavaScript function, unwound as native
	V8ReadErrs      uint64 // V8 walks ended at unreadable memory
	PHPSamples      uint64 // user stacks of processes set with SetPHP
	PHPFrames       uint64 // PHP frames reported
	PHPReadErrs     uint64 // PHP walks ended at unreadable memory
	PHPBadFrames    uint64 // PHP walks ended at a frame without a function the walker knows
	PerlSamples     uint64 // user stacks of main threads of processes set with SetPerl
	PerlFrames      uint64 // Perl frames reported
	PerlReadErrs    uint64 // Perl walks ended at unreadable memory
	PerlBadFrames   uint64 // Perl walks ended at a context or statement that made no sense
	RubySamples     uint64 // user stacks of processes set with SetRuby
	RubyFrames      uint64 // Ruby frames reported
	RubyReadErrs    uint64 // Ruby walks ended at unreadable memory
	RubyBadFrames   uint64 // Ruby walks ended at a context or frame that made no sense
	RubyNoTable     uint64 // Ruby stacks left native: libruby's unwind table was not loaded yet

	Snapshots        uint64 // samples sent with a stack snapshot (Record.Snapshot)
	SnapshotsSkipped uint64 // snapshots not taken: the ring buffer was half full
}

// Lost is every record the ring buffer could not take.
func (c Counters) Lost() uint64 {
	return c.SamplesLost + c.TaskEventsLost + c.UnknownLost + c.OffCPUStartsLost + c.OffCPUEndsLost
}

// counter is one entry of the eBPF side's counters map: its name (the C
// enum's, lower case, without COUNTER_) and where Counters keeps it.
type counter struct {
	name  string
	field func(*Counters) *uint64
}

// counters is indexed by the C enum counter, and sized by its COUNTER_MAX:
// a counter added in C without an entry here fails TestEveryCounterNamed.
var counters = [support.SondeCounterCOUNTER_MAX]counter{
	support.SondeCounterCOUNTER_SAMPLES:              {"samples", func(c *Counters) *uint64 { return &c.Samples }},
	support.SondeCounterCOUNTER_SAMPLES_SENT:         {"samples_sent", func(c *Counters) *uint64 { return &c.SamplesSent }},
	support.SondeCounterCOUNTER_SAMPLES_LOST:         {"samples_lost", func(c *Counters) *uint64 { return &c.SamplesLost }},
	support.SondeCounterCOUNTER_IDLE_SKIPPED:         {"idle_skipped", func(c *Counters) *uint64 { return &c.IdleSkipped }},
	support.SondeCounterCOUNTER_KERNEL_STACK_ERR:     {"kernel_stack_err", func(c *Counters) *uint64 { return &c.KernelStackErrs }},
	support.SondeCounterCOUNTER_TASK_EVENTS_SENT:     {"task_events_sent", func(c *Counters) *uint64 { return &c.TaskEventsSent }},
	support.SondeCounterCOUNTER_TASK_EVENTS_LOST:     {"task_events_lost", func(c *Counters) *uint64 { return &c.TaskEventsLost }},
	support.SondeCounterCOUNTER_UNKNOWN_SENT:         {"unknown_sent", func(c *Counters) *uint64 { return &c.UnknownSent }},
	support.SondeCounterCOUNTER_UNKNOWN_LOST:         {"unknown_lost", func(c *Counters) *uint64 { return &c.UnknownLost }},
	support.SondeCounterCOUNTER_FRAMES_CFI:           {"frames_cfi", func(c *Counters) *uint64 { return &c.FramesCFI }},
	support.SondeCounterCOUNTER_FRAMES_FP:            {"frames_fp", func(c *Counters) *uint64 { return &c.FramesFP }},
	support.SondeCounterCOUNTER_UNWIND_UNKNOWN_RULE:  {"unwind_unknown_rule", func(c *Counters) *uint64 { return &c.UnknownRule }},
	support.SondeCounterCOUNTER_UNWIND_READ_ERR:      {"unwind_read_err", func(c *Counters) *uint64 { return &c.ReadErrors }},
	support.SondeCounterCOUNTER_UNWIND_TAIL_CALL_ERR: {"unwind_tail_call_err", func(c *Counters) *uint64 { return &c.TailCallErrors }},
	support.SondeCounterCOUNTER_FILTERED:             {"filtered", func(c *Counters) *uint64 { return &c.Filtered }},
	support.SondeCounterCOUNTER_KTHREAD_SKIPPED:      {"kthread_skipped", func(c *Counters) *uint64 { return &c.KernelThreads }},
	support.SondeCounterCOUNTER_MAPPING_STALE:        {"mapping_stale", func(c *Counters) *uint64 { return &c.StaleMappings }},
	support.SondeCounterCOUNTER_VMA_CHECK_BUSY:       {"vma_check_busy", func(c *Counters) *uint64 { return &c.VMACheckBusy }},
	support.SondeCounterCOUNTER_MAPPING_BY_FILE:      {"mapping_by_file", func(c *Counters) *uint64 { return &c.MappingsByFile }},
	support.SondeCounterCOUNTER_OFFCPU_FILTERED:      {"offcpu_filtered", func(c *Counters) *uint64 { return &c.OffCPUFiltered }},
	support.SondeCounterCOUNTER_OFFCPU_STARTS_SENT:   {"offcpu_starts_sent", func(c *Counters) *uint64 { return &c.OffCPUStartsSent }},
	support.SondeCounterCOUNTER_OFFCPU_STARTS_LOST:   {"offcpu_starts_lost", func(c *Counters) *uint64 { return &c.OffCPUStartsLost }},
	support.SondeCounterCOUNTER_OFFCPU_MAP_FULL:      {"offcpu_map_full", func(c *Counters) *uint64 { return &c.OffCPUMapFull }},
	support.SondeCounterCOUNTER_OFFCPU_ENDS_SENT:     {"offcpu_ends_sent", func(c *Counters) *uint64 { return &c.OffCPUEndsSent }},
	support.SondeCounterCOUNTER_OFFCPU_ENDS_LOST:     {"offcpu_ends_lost", func(c *Counters) *uint64 { return &c.OffCPUEndsLost }},
	support.SondeCounterCOUNTER_OFFCPU_SHORT:         {"offcpu_short", func(c *Counters) *uint64 { return &c.OffCPUShortWaits }},
	support.SondeCounterCOUNTER_PY_SAMPLES:           {"py_samples", func(c *Counters) *uint64 { return &c.PythonSamples }},
	support.SondeCounterCOUNTER_PY_FRAMES:            {"py_frames", func(c *Counters) *uint64 { return &c.PythonFrames }},
	support.SondeCounterCOUNTER_PY_NO_THREAD:         {"py_no_thread", func(c *Counters) *uint64 { return &c.PythonNoThread }},
	support.SondeCounterCOUNTER_PY_READ_ERR:          {"py_read_err", func(c *Counters) *uint64 { return &c.PythonReadErrs }},
	support.SondeCounterCOUNTER_PY_BAD_FRAME:         {"py_bad_frame", func(c *Counters) *uint64 { return &c.PythonBadFrames }},
	support.SondeCounterCOUNTER_JVM_SAMPLES:          {"jvm_samples", func(c *Counters) *uint64 { return &c.JVMSamples }},
	support.SondeCounterCOUNTER_JVM_FRAMES:           {"jvm_frames", func(c *Counters) *uint64 { return &c.JVMFrames }},
	support.SondeCounterCOUNTER_JVM_NO_BLOB:          {"jvm_no_blob", func(c *Counters) *uint64 { return &c.JVMNoBlob }},
	support.SondeCounterCOUNTER_JVM_READ_ERR:         {"jvm_read_err", func(c *Counters) *uint64 { return &c.JVMReadErrs }},
	support.SondeCounterCOUNTER_V8SAMPLES:            {"v8_samples", func(c *Counters) *uint64 { return &c.V8Samples }},
	support.SondeCounterCOUNTER_V8FRAMES:             {"v8_frames", func(c *Counters) *uint64 { return &c.V8Frames }},
	support.SondeCounterCOUNTER_V8NOT_JS:             {"v8_not_js", func(c *Counters) *uint64 { return &c.V8NotJS }},
	support.SondeCounterCOUNTER_PERL_SAMPLES:         {"perl_samples", func(c *Counters) *uint64 { return &c.PerlSamples }},
	support.SondeCounterCOUNTER_PERL_FRAMES:          {"perl_frames", func(c *Counters) *uint64 { return &c.PerlFrames }},
	support.SondeCounterCOUNTER_PERL_READ_ERR:        {"perl_read_err", func(c *Counters) *uint64 { return &c.PerlReadErrs }},
	support.SondeCounterCOUNTER_PERL_BAD_FRAME:       {"perl_bad_frame", func(c *Counters) *uint64 { return &c.PerlBadFrames }},
	support.SondeCounterCOUNTER_V8READ_ERR:           {"v8_read_err", func(c *Counters) *uint64 { return &c.V8ReadErrs }},
	support.SondeCounterCOUNTER_PHP_SAMPLES:          {"php_samples", func(c *Counters) *uint64 { return &c.PHPSamples }},
	support.SondeCounterCOUNTER_PHP_FRAMES:           {"php_frames", func(c *Counters) *uint64 { return &c.PHPFrames }},
	support.SondeCounterCOUNTER_PHP_READ_ERR:         {"php_read_err", func(c *Counters) *uint64 { return &c.PHPReadErrs }},
	support.SondeCounterCOUNTER_PHP_BAD_FRAME:        {"php_bad_frame", func(c *Counters) *uint64 { return &c.PHPBadFrames }},
	support.SondeCounterCOUNTER_RUBY_SAMPLES:         {"ruby_samples", func(c *Counters) *uint64 { return &c.RubySamples }},
	support.SondeCounterCOUNTER_RUBY_FRAMES:          {"ruby_frames", func(c *Counters) *uint64 { return &c.RubyFrames }},
	support.SondeCounterCOUNTER_RUBY_READ_ERR:        {"ruby_read_err", func(c *Counters) *uint64 { return &c.RubyReadErrs }},
	support.SondeCounterCOUNTER_RUBY_BAD_FRAME:       {"ruby_bad_frame", func(c *Counters) *uint64 { return &c.RubyBadFrames }},
	support.SondeCounterCOUNTER_RUBY_NO_TABLE:        {"ruby_no_table", func(c *Counters) *uint64 { return &c.RubyNoTable }},
	support.SondeCounterCOUNTER_SNAPSHOTS:            {"snapshots", func(c *Counters) *uint64 { return &c.Snapshots }},
	support.SondeCounterCOUNTER_SNAPSHOTS_SKIPPED:    {"snapshots_skipped", func(c *Counters) *uint64 { return &c.SnapshotsSkipped }},
}

// Counters reads the eBPF side's counters.
func (t *Tracer) Counters() (Counters, error) {
	var c Counters
	var perCPU []uint64
	for idx, ctr := range counters {
		if err := t.objs.Counters.Lookup(uint32(idx), &perCPU); err != nil {
			return Counters{}, fmt.Errorf("read counter %s: %w", ctr.name, err)
		}
		dst := ctr.field(&c)
		for _, v := range perCPU {
			*dst += v
		}
	}
	return c, nil
}

// Bounds of RingBufferBytesFor.
const (
	minAutoRingBuffer    = 1 << 20
	maxAutoRingBuffer    = 64 << 20
	offCPUAutoRingBuffer = 4 << 20
	// A sample record of a typical stack (30 user and 10 kernel frames)
	// takes about 600 bytes; the estimate leaves room for deeper ones.
	autoRecordBytes = 1 << 10
	// A sample record with a whole snapshot: both regions full, and the
	// snapshot's header and frames.
	snapshotRecordBytes = int64(MaxSnapshotBytes + MaxSnapshot2Bytes + 1<<10)
)

// RingBufferBytesFor is the ring buffer size for samplesPerSecond on cpus
// CPUs when none is configured: two seconds of samples of 1 KiB from every
// CPU, plus an eighth of a second of samples that all carry a whole stack
// snapshot (snapshotRecordBytes), rounded up to a power of two, at least
// 1 MiB (4 MiB when off-CPU profiling, whose record rate follows context
// switches, is on) and at most 64 MiB. The snapshot allowance is what lets
// new programs' first stacks through while the resolver is busy with a big
// file's first symbols (~0.1-0.3 s): a snapshot is some twenty samples'
// bytes, and once the buffer is half full none is taken. The kernel maps
// the buffer's pages twice, and they count in the agent's RSS once
// written: a bigger buffer than the rate needs costs memory and buys
// nothing.
func RingBufferBytesFor(samplesPerSecond, cpus int, offCPU bool) int {
	rate := int64(max(samplesPerSecond, 1)) * int64(max(cpus, 1))
	want := rate*autoRecordBytes*2 + rate*snapshotRecordBytes/8
	n := int64(minAutoRingBuffer)
	if offCPU {
		n = offCPUAutoRingBuffer
	}
	for n < want && n < maxAutoRingBuffer {
		n <<= 1
	}
	return int(n)
}
