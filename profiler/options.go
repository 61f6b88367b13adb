package profiler

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Defaults of DefaultOptions. The Collector receiver's configuration keys
// that carry over from the OpenTelemetry eBPF profiler's profiling receiver
// (samples_per_second, reporter_interval) keep its defaults.
const (
	defaultSamplesPerSecond = 19
	defaultReporterInterval = 5 * time.Second
	defaultProcFS           = "/proc"
	defaultRingBufferBytes  = 0 // sized for the rate and the CPUs: tracer.RingBufferBytesFor
	defaultMaxProcesses     = 65536
	// defaultUnwindTableBytes bounds the kernel memory of unwind tables (8
	// bytes a row). A node-like host needs about 80 MiB at once: five
	// 100 MB Go binaries take 7-10 MiB each (0.9-1.3 M rows), an LLVM
	// toolchain 21 MiB (libclang-cpp 1.35 M rows, libLLVM 1.17 M), GCC's
	// cc1plus and cc1 8 MiB, node 3 MiB, libc and the rest 2 MiB.
	defaultUnwindTableBytes = 128 << 20
	// defaultSymbolCacheBytes bounds the heap symbolization holds. Symbol
	// tables, pclntabs and DWARF are read in place from mapped files, so
	// what is counted is indexes (16 bytes a function), inflated sections,
	// parsed line programs, the address cache and kallsyms: a node-like
	// host (five 100 MB Go binaries, LLVM, cc1plus, libc...) needs about
	// 25 MiB of it, so 64 MiB loads each file once with room to spare.
	defaultSymbolCacheBytes = 64 << 20
	defaultDebugDir         = "/usr/lib/debug"
	// defaultMaxPendingSamples bounds the samples waiting for the next
	// consumer: 64 Ki, each a 16-byte event in its interval's builder
	// plus, where it is distinct, its key and stack; eight full intervals
	// of 16 busy CPUs at 99 Hz (7 920 samples each). A blocked consumer's
	// backlog of 1 024 samples measured 2.5-3.3 MiB of live heap for the
	// whole profiler (TestBlockedConsumerBacklogBounded).
	defaultMaxPendingSamples = 1 << 16

	// pythonCodeShare is the part of SymbolCacheBytes the CPython code
	// objects may hold (1/8: 8 MiB of the default). A code object costs
	// about 200 bytes plus its name, file and line table: 8 MiB keeps some
	// 20 000 functions of hot Python code named without reading them again.
	pythonCodeShare = 8
	// jvmCodeShare is the part of SymbolCacheBytes the JVM namer may hold
	// (1/8: 8 MiB of the default): Java method names and line tables, and
	// the debug information of compiled methods, about 1 KiB a hot method.
	jvmCodeShare = 8
	// v8CodeShare is the part of SymbolCacheBytes the V8 namer may hold
	// (1/16: 4 MiB of the default): function names, scripts' line ends
	// and code's position tables.
	v8CodeShare = 16
	// phpCodeShare is the part of SymbolCacheBytes the PHP namer may hold
	// (1/32: 2 MiB of the default): function, class and file names, some
	// 200 bytes a function.
	phpCodeShare = 32
	// perlCodeShare is the part of SymbolCacheBytes the Perl namer may
	// hold (1/64: 1 MiB of the default): sub, package and file names.
	perlCodeShare = 64
	// rubyCodeShare is the part of SymbolCacheBytes the Ruby namer may
	// hold (1/32: 2 MiB of the default): labels and file names, some 200
	// bytes an iseq.
	rubyCodeShare = 32
)

// JVMCacheBytes is the part of o.SymbolCacheBytes the JVM namer may hold
// (sonde.jvm.code_cache.size stays within it).
func (o Options) JVMCacheBytes() int64 { return o.SymbolCacheBytes / jvmCodeShare }

// Bounds checked by Validate.
const (
	minSamplesPerSecond    = 1
	maxSamplesPerSecond    = 1000
	minReporterInterval    = 100 * time.Millisecond
	maxReporterInterval    = 10 * time.Minute
	ringBufferPageSize     = 4096
	minRingBufferBytes     = 64 << 10  // 64 KiB
	maxRingBufferBytes     = 256 << 20 // 256 MiB
	minMaxProcesses        = 1
	maxMaxProcesses        = 4 << 20 // the kernel's PID_MAX_LIMIT on 64-bit
	minUnwindTableBytes    = 1 << 20 // 1 MiB
	maxUnwindTableBytes    = 4 << 30 // 4 GiB
	minSymbolCacheBytes    = 1 << 20 // 1 MiB
	minMaxPendingSamples   = 1 << 10
	maxMaxPendingSamples   = 1 << 24
	maxSymbolCacheBytes    = 4 << 30 // 4 GiB
	maxFilterMinProcessAge = 24 * time.Hour
	minOffCPUThreshold     = 0.0
	maxOffCPUThreshold     = 1.0
)

// Values of Filters.Containers.
const (
	ContainersAny  = "any"  // every process (the default; "" means the same)
	ContainersOnly = "only" // processes in a container
	ContainersNone = "none" // processes on the host
)

// Options configure a Profiler. They are plain values: New copies them, and
// Validate checks them without side effects.
type Options struct {
	// Logger receives the profiler's few log lines (start-up, one line per
	// interval for each kind of problem). Nil logs nothing.
	Logger *zap.Logger

	// SamplesPerSecond is the on-CPU sampling frequency per CPU, in Hz.
	SamplesPerSecond int

	// ReporterInterval is how often the samples of the interval are emitted
	// as one pprofile.Profiles.
	ReporterInterval time.Duration

	// OffCPUThreshold is the probability, per context switch, that a thread
	// that blocks is traced while it is off the CPU. 0 turns off-CPU
	// profiling off; 1 traces every blocking switch.
	OffCPUThreshold float64

	// OffCPUMinDuration drops traced waits shorter than this.
	OffCPUMinDuration time.Duration

	// ProcFS is where the host's procfs is mounted (/host/proc in a
	// container that mounts the host's).
	ProcFS string

	// IncludeEnvVars names environment variables read from each process's
	// initial environment into its resource attributes.
	IncludeEnvVars []string

	// IncludeCommandLine adds each process's command line to its resource.
	IncludeCommandLine bool

	// FilterMinProcessAge leaves processes younger than this unprofiled
	// until they reach it. 0 profiles every process.
	FilterMinProcessAge time.Duration

	// Filters choose which processes are profiled.
	Filters Filters

	// NativeSymbols names C, C++ and Rust frames from the files on the
	// host. Kernel and Go frames are always named.
	NativeSymbols bool

	// DebugDirs are searched for separate debug files, after
	// /usr/lib/debug inside the process's own root.
	DebugDirs []string

	// RingBufferBytes sizes the eBPF ring buffer: a power of two and a
	// multiple of the page size, or 0 (the default) to size it for
	// SamplesPerSecond and the CPUs (tracer.RingBufferBytesFor: two
	// seconds of samples and an eighth of a second of stack snapshots, at
	// least 1 MiB; 4 MiB with off-CPU profiling on).
	RingBufferBytes int

	// MaxProcesses is how many processes are tracked at once.
	MaxProcesses int

	// UnwindTableBytes bounds the kernel memory of unwind tables.
	UnwindTableBytes int64

	// SymbolCacheBytes bounds the symbol data kept loaded: the native
	// symbolizer's and, an eighth of it each (pythonCodeShare,
	// jvmCodeShare), the CPython code objects read to name Python frames
	// and the Java methods and compiled code read to name Java frames.
	SymbolCacheBytes int64

	// MaxPendingSamples bounds the samples that wait for the next
	// consumer: those of the intervals not handed over yet, the one being
	// built included (the one the consumer holds is its own). When a
	// consumer that blocks or fails slowly (it has held the reporter for a
	// reporting interval) lets more pile up, the oldest waiting interval
	// is dropped and counted (Stats.Backlog), as is one past 8 open
	// intervals, and the intervals that come next go on.
	MaxPendingSamples int

	// ScopeVersion is the version written on every profile's scope; empty
	// means Sonde's release version (internal/version).
	ScopeVersion string

	// TableLoaded, when set, is called for each file whose unwind table is
	// newly loaded in the kernel, with the time from the first sample that
	// could not be unwound for want of it (of the process the table was
	// built for) to the load: 0 when the table came before any such
	// sample. It runs on the preparer's goroutines, one call at a time,
	// and must not block.
	TableLoaded func(delay time.Duration)

	// BeforeResolve, when set, runs on the resolver goroutine before each
	// record: a test's way to slow the resolver down. Production leaves it
	// nil.
	BeforeResolve func()

	// countCosts makes the tracer keep what sampling cost each process
	// (tracer.Options.CountCosts): for the package's own tests only.
	countCosts bool

	// checkSnapshots makes every on-CPU stack carry a snapshot from its
	// first frame (tracer.Options.SnapshotAll), which the resolver unwinds
	// and compares with the kernel's unwinding (Stats.Resolver): for the
	// package's own tests only.
	checkSnapshots bool

	// pythonLayouts, when set, replaces the CPython versions the walker
	// knows (python.LayoutFor): tests hide a real interpreter's version.
	pythonLayouts pythonLayoutFunc
	// phpLayouts, when set, replaces the PHP versions the walker knows
	// (php.LayoutFor): tests hide a real PHP's version.
	phpLayouts phpLayoutFunc
	// rubyLayouts, when set, replaces the Ruby versions the walker knows
	// (ruby.LayoutFor): tests hide a real Ruby's version.
	rubyLayouts rubyLayoutFunc
	// perlLayouts, when set, replaces the Perl versions the walker knows
	// (perl.LayoutFor): tests hide a real Perl's version.
	perlLayouts perlLayoutFunc
	// v8Find, when set, replaces v8.Find, which reads a V8's layout from
	// its metadata: tests hide a real V8's.
	v8Find v8FindFunc
}

// Filters choose the profiled processes. A process is profiled when it
// passes every rule that is set.
type Filters struct {
	// IncludeExecutables, when not empty, profiles only processes whose
	// executable matches one of these globs (path.Match syntax): a pattern
	// with a '/' is matched against the executable's path, one without
	// against its name.
	IncludeExecutables []string
	// ExcludeExecutables leaves out processes whose executable matches;
	// it wins over the include list.
	ExcludeExecutables []string
	// Containers is ContainersAny (or ""), ContainersOnly or ContainersNone.
	Containers string
	// IncludeCgroups, when not empty, profiles only processes in one of
	// these cgroups or below one.
	IncludeCgroups []string
	// ExcludeCgroups leaves out processes in these cgroups or below them;
	// it wins over the include list.
	ExcludeCgroups []string
	// IncludeIdle keeps the samples of idle CPUs (pid 0).
	IncludeIdle bool
	// IncludeKernelThreads keeps the samples of kernel threads.
	IncludeKernelThreads bool
}

// DefaultOptions are the options of a profiler of the whole host with the
// defaults the Collector receiver documents.
func DefaultOptions() Options {
	return Options{
		SamplesPerSecond: defaultSamplesPerSecond,
		ReporterInterval: defaultReporterInterval,
		ProcFS:           defaultProcFS,
		Filters:          Filters{Containers: ContainersAny},
		NativeSymbols:    true,
		DebugDirs:        []string{defaultDebugDir},
		RingBufferBytes:  defaultRingBufferBytes,
		MaxProcesses:     defaultMaxProcesses,
		UnwindTableBytes: defaultUnwindTableBytes,
		SymbolCacheBytes: defaultSymbolCacheBytes,

		MaxPendingSamples: defaultMaxPendingSamples,
	}
}

// FieldError is one problem Validate found: the option, by its name (with
// an index for a list element, "DebugDirs[1]"), and what is wrong.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// Validate checks every option and returns all problems joined with
// errors.Join, each a *FieldError naming the option by its Go name, the
// bound and the value found. It has no side effects: it reads no files and
// probes no kernel features, which New does.
func (o *Options) Validate() error { return o.ValidateNamed(func(f string) string { return f }) }

// ValidateNamed is Validate with each option named by name(its Go name,
// "Filters.Containers" for a nested one): a configuration layer that maps
// its own keys to Options reports problems in its users' words.
func (o *Options) ValidateNamed(name func(field string) string) error {
	v := validator{name: name}
	v.check(o)
	return errors.Join(v.errs...)
}

type validator struct {
	name func(string) string
	errs []error
}

// add records a problem with field (element i of it when i >= 0).
func (v *validator) add(field string, i int, format string, args ...any) {
	f := v.name(field)
	if i >= 0 {
		f = fmt.Sprintf("%s[%d]", f, i)
	}
	v.errs = append(v.errs, &FieldError{Field: f, Err: fmt.Errorf(format, args...)})
}

func (v *validator) check(o *Options) {
	if o.SamplesPerSecond < minSamplesPerSecond || o.SamplesPerSecond > maxSamplesPerSecond {
		v.add("SamplesPerSecond", -1, "must be between %d and %d, got %d",
			minSamplesPerSecond, maxSamplesPerSecond, o.SamplesPerSecond)
	}
	if o.ReporterInterval < minReporterInterval || o.ReporterInterval > maxReporterInterval {
		v.add("ReporterInterval", -1, "must be between %v and %v, got %v",
			minReporterInterval, maxReporterInterval, o.ReporterInterval)
	}
	// Written so that NaN fails too.
	if !(o.OffCPUThreshold >= minOffCPUThreshold && o.OffCPUThreshold <= maxOffCPUThreshold) {
		v.add("OffCPUThreshold", -1, "must be between %v and %v, got %v",
			minOffCPUThreshold, maxOffCPUThreshold, o.OffCPUThreshold)
	}
	if o.OffCPUMinDuration < 0 {
		v.add("OffCPUMinDuration", -1, "must be at least 0s, got %v", o.OffCPUMinDuration)
	}
	if !filepath.IsAbs(o.ProcFS) {
		v.add("ProcFS", -1, "must be an absolute path, got %q", o.ProcFS)
	}
	v.envVarNames("IncludeEnvVars", o.IncludeEnvVars)
	if o.FilterMinProcessAge < 0 || o.FilterMinProcessAge > maxFilterMinProcessAge {
		v.add("FilterMinProcessAge", -1, "must be between 0s and %v, got %v",
			maxFilterMinProcessAge, o.FilterMinProcessAge)
	}
	v.filters(&o.Filters)
	for i, dir := range o.DebugDirs {
		if !filepath.IsAbs(dir) {
			v.add("DebugDirs", i, "must be an absolute path, got %q", dir)
		}
	}
	v.limits(o)
}

func (v *validator) limits(o *Options) {
	rb := o.RingBufferBytes
	// 0: sized by New for the rate and the CPUs.
	if rb != 0 && (rb < minRingBufferBytes || rb > maxRingBufferBytes) {
		v.add("RingBufferBytes", -1, "must be 0 (sized for the sampling rate) or between %d (64 KiB) and %d (256 MiB), got %d",
			minRingBufferBytes, maxRingBufferBytes, rb)
	}
	if rb < 0 || rb&(rb-1) != 0 || rb%ringBufferPageSize != 0 {
		v.add("RingBufferBytes", -1, "must be a power of two and a multiple of the page size (%d), got %d",
			ringBufferPageSize, rb)
	}
	if o.MaxProcesses < minMaxProcesses || o.MaxProcesses > maxMaxProcesses {
		v.add("MaxProcesses", -1, "must be between %d and %d, got %d",
			minMaxProcesses, maxMaxProcesses, o.MaxProcesses)
	}
	if o.SymbolCacheBytes < minSymbolCacheBytes || o.SymbolCacheBytes > maxSymbolCacheBytes {
		v.add("SymbolCacheBytes", -1, "must be between %d (1 MiB) and %d (4 GiB), got %d",
			minSymbolCacheBytes, maxSymbolCacheBytes, o.SymbolCacheBytes)
	}
	if o.MaxPendingSamples < minMaxPendingSamples || o.MaxPendingSamples > maxMaxPendingSamples {
		v.add("MaxPendingSamples", -1, "must be between %d and %d, got %d",
			minMaxPendingSamples, maxMaxPendingSamples, o.MaxPendingSamples)
	}
	if o.UnwindTableBytes < minUnwindTableBytes || o.UnwindTableBytes > maxUnwindTableBytes {
		v.add("UnwindTableBytes", -1, "must be between %d (1 MiB) and %d (4 GiB), got %d",
			minUnwindTableBytes, maxUnwindTableBytes, o.UnwindTableBytes)
	}
}

func (v *validator) filters(f *Filters) {
	for _, list := range []struct {
		field    string
		patterns []string
	}{{"Filters.IncludeExecutables", f.IncludeExecutables}, {"Filters.ExcludeExecutables", f.ExcludeExecutables}} {
		for i, p := range list.patterns {
			if p == "" {
				v.add(list.field, i, "must not be empty")
			} else if _, err := path.Match(p, ""); err != nil {
				v.add(list.field, i, "%q is not a valid glob: %w", p, err)
			}
		}
	}
	switch f.Containers {
	case "", ContainersAny, ContainersOnly, ContainersNone:
	default:
		v.add("Filters.Containers", -1, "must be %q, %q or %q, got %q",
			ContainersAny, ContainersOnly, ContainersNone, f.Containers)
	}
	for _, list := range []struct {
		field    string
		prefixes []string
	}{{"Filters.IncludeCgroups", f.IncludeCgroups}, {"Filters.ExcludeCgroups", f.ExcludeCgroups}} {
		for i, p := range list.prefixes {
			if !strings.HasPrefix(p, "/") {
				v.add(list.field, i, "must be a cgroup path starting with '/', got %q", p)
			}
		}
	}
}

// envVarNames checks a list of environment variable names: each one not
// empty, made of ASCII letters, digits and '_' and not starting with a
// digit (the portable names of POSIX, in either case), and listed once.
func (v *validator) envVarNames(field string, names []string) {
	first := make(map[string]int, len(names))
	for i, name := range names {
		switch {
		case name == "":
			v.add(field, i, "must not be empty")
			continue
		case !isEnvVarName(name):
			v.add(field, i, "must be an environment variable name (letters, digits and '_', not starting with a digit), got %q", name)
			continue
		}
		if j, dup := first[name]; dup {
			v.add(field, i, "%q is already listed at %s[%d]", name, v.name(field), j)
			continue
		}
		first[name] = i
	}
}

func isEnvVarName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}
