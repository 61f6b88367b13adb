package collector

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Defaults. Keys shared with the OpenTelemetry eBPF profiler's profiling
// receiver (samples_per_second, reporter_interval) keep its defaults so
// configurations carry over.
const (
	defaultSamplesPerSecond = 19
	defaultReporterInterval = 5 * time.Second
	defaultProcFS           = "/proc"
	defaultRingBufferBytes  = 4 << 20 // 4 MiB: about 20k samples of deep stacks in flight
	defaultMaxProcesses     = 65536
	defaultUnwindTableBytes = 64 << 20 // 64 MiB of kernel memory for unwind tables
	// defaultSymbolCacheBytes bounds the heap symbolization holds. Symbol
	// tables, pclntabs and DWARF are read in place from mapped files, so
	// what is counted is indexes (16 bytes a function), inflated sections,
	// parsed line programs, the address cache and kallsyms: a node-like
	// host (five 100 MB Go binaries, LLVM, cc1plus, libc...) needs about
	// 25 MiB of it, so 64 MiB loads each file once with room to spare.
	defaultSymbolCacheBytes = 64 << 20
	defaultDebugDir         = "/usr/lib/debug"
)

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
	maxSymbolCacheBytes    = 4 << 30 // 4 GiB
	maxFilterMinProcessAge = 24 * time.Hour
)

// Bounds of the off-CPU keys, which default to their zero values (off).
const (
	minOffCPUThreshold = 0.0
	maxOffCPUThreshold = 1.0
)

// Config is the configuration of the sonde receiver.
//
// A Config is a plain value: the Collector unmarshals it once, validates it
// with Validate, and hands the receiver a pointer it must treat as read-only.
type Config struct {
	// SamplesPerSecond is the on-CPU sampling frequency per CPU, in Hz.
	SamplesPerSecond int `mapstructure:"samples_per_second"`

	// ReporterInterval is how often the samples of the interval are emitted
	// as one pprofile.Profiles.
	ReporterInterval time.Duration `mapstructure:"reporter_interval"`

	// OffCPUThreshold is the probability, per context switch, that a thread
	// that blocks is traced while it is off the CPU: its stack when it left
	// and how long it stayed away become the off-CPU profile. 0 (the
	// default) turns off-CPU profiling off; 1 traces every blocking switch.
	// The key and its meaning are those of the reference profiling receiver.
	OffCPUThreshold float64 `mapstructure:"off_cpu_threshold"`

	// OffCPUMinDuration drops traced waits shorter than this.
	OffCPUMinDuration time.Duration `mapstructure:"off_cpu_min_duration"`

	// ProcFS is where the host's procfs is mounted. A node agent that mounts
	// the host's /proc elsewhere (for example /host/proc) sets it here.
	ProcFS string `mapstructure:"procfs"`

	// IncludeEnvVars names environment variables to read from each
	// process's initial environment: each one set becomes the resource
	// attribute process.environment_variable.<NAME>. The key and its
	// meaning are those of the reference profiling receiver; its
	// comma-separated string form ("A,B") is accepted too.
	IncludeEnvVars []string `mapstructure:"include_env_vars"`

	// IncludeCommandLine adds each process's command line (arguments
	// joined by spaces, at most 4 KiB) as the resource attribute
	// process.command_line. Off by default: command lines can carry
	// secrets, and they make every resource larger.
	IncludeCommandLine bool `mapstructure:"include_command_line"`

	// FilterMinProcessAge leaves processes younger than this unprofiled
	// until they reach it (the reference profiling receiver's key): short
	// build steps and health checks cost nothing. 0 profiles every process.
	FilterMinProcessAge time.Duration `mapstructure:"filter_min_process_age"`

	// Filters choose which processes are profiled. The decision is made
	// once per process (and again after an exec) in user space and enforced
	// in the kernel: an excluded process's samples are dropped before any
	// unwinding and take no ring-buffer space.
	Filters FiltersConfig `mapstructure:"filters"`

	// Symbolization says how frames are named on the host.
	Symbolization SymbolizationConfig `mapstructure:"symbolization"`

	// Limits bound the kernel and user-space resources the receiver uses.
	Limits LimitsConfig `mapstructure:"limits"`

	// Prevent unkeyed literals, so fields can be added later.
	_ struct{}
}

// SymbolizationConfig says how frames are named on the host.
type SymbolizationConfig struct {
	// Native names C, C++ and Rust frames from the files on the host. Off,
	// native frames keep only their addresses, mappings and build ids, for a
	// backend that symbolizes. Kernel and Go frames are always named.
	Native bool `mapstructure:"native"`

	// DebugDirs are searched for separate debug files (by build id and by
	// .gnu_debuglink), after /usr/lib/debug inside the process's own root,
	// for symbols and for the CFI (.debug_frame) of unwind tables.
	DebugDirs []string `mapstructure:"debug_dirs"`

	_ struct{}
}

// FiltersConfig chooses the profiled processes. A process is profiled when
// it passes every rule that is set.
type FiltersConfig struct {
	// IncludeExecutables, when not empty, profiles only processes whose
	// executable matches one of these globs (path.Match syntax): a pattern
	// with a '/' is matched against the executable's path, one without
	// against its name ("nginx", "python3*", "/opt/app/bin/*").
	IncludeExecutables []string `mapstructure:"include_executables"`

	// ExcludeExecutables leaves out processes whose executable matches one
	// of these globs, with the same syntax; it wins over the include list.
	ExcludeExecutables []string `mapstructure:"exclude_executables"`

	// Containers selects by container.id: "any" (default), "only"
	// (processes in a container) or "none" (processes on the host).
	Containers string `mapstructure:"containers"`

	// IncludeCgroups, when not empty, profiles only processes whose cgroup
	// path is one of these or below one ("/kubepods.slice").
	IncludeCgroups []string `mapstructure:"include_cgroups"`

	// ExcludeCgroups leaves out processes in these cgroups or below them;
	// it wins over the include list.
	ExcludeCgroups []string `mapstructure:"exclude_cgroups"`

	// IncludeIdle keeps the samples of idle CPUs (the idle task, pid 0).
	IncludeIdle bool `mapstructure:"include_idle"`

	// IncludeKernelThreads keeps the samples of kernel threads, which have
	// kernel stacks only.
	IncludeKernelThreads bool `mapstructure:"include_kernel_threads"`

	_ struct{}
}

// Values of filters::containers.
const (
	containersAny  = "any"
	containersOnly = "only"
	containersNone = "none"
)

// LimitsConfig bounds the resources the receiver allocates.
type LimitsConfig struct {
	// RingBufferBytes is the size of the eBPF ring buffer that carries
	// samples to user space. The kernel requires a power of two that is a
	// multiple of the page size.
	RingBufferBytes int `mapstructure:"ring_buffer_bytes"`

	// MaxProcesses is how many processes the receiver tracks at once; it
	// sizes the per-process BPF maps and the process table.
	MaxProcesses int `mapstructure:"max_processes"`

	// UnwindTableBytes bounds the kernel memory of the unwind tables derived
	// from the sampled processes' files. Tables no process maps any more are
	// evicted to make room; a file whose table does not fit is unwound by
	// frame pointers, and counted.
	UnwindTableBytes int64 `mapstructure:"unwind_table_bytes"`

	// SymbolCacheBytes bounds all the heap symbolization holds: per-file
	// indexes (symbols, inflated sections, line tables, inline trees), the
	// address cache and the kernel's symbols. Symbol sources themselves are
	// read in place from read-only mappings (page cache, not counted). The
	// least recently used files are dropped past it and loaded again when
	// needed.
	SymbolCacheBytes int64 `mapstructure:"symbol_cache_bytes"`

	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{
		SamplesPerSecond: defaultSamplesPerSecond,
		ReporterInterval: defaultReporterInterval,
		ProcFS:           defaultProcFS,
		// Empty, not nil: what `include_env_vars: []` unmarshals to.
		IncludeEnvVars: []string{},
		Filters: FiltersConfig{
			IncludeExecutables: []string{},
			ExcludeExecutables: []string{},
			Containers:         containersAny,
			IncludeCgroups:     []string{},
			ExcludeCgroups:     []string{},
		},
		Symbolization: SymbolizationConfig{
			Native:    true,
			DebugDirs: []string{defaultDebugDir},
		},
		Limits: LimitsConfig{
			RingBufferBytes:  defaultRingBufferBytes,
			MaxProcesses:     defaultMaxProcesses,
			UnwindTableBytes: defaultUnwindTableBytes,
			SymbolCacheBytes: defaultSymbolCacheBytes,
		},
	}
}

// Validate checks every field and returns all problems joined with
// errors.Join, each naming the YAML key, the bound and the value found.
// It has no side effects: it reads no files and probes no kernel features,
// which Start does.
func (c *Config) Validate() error {
	var errs []error
	if c.SamplesPerSecond < minSamplesPerSecond || c.SamplesPerSecond > maxSamplesPerSecond {
		errs = append(errs, fmt.Errorf("samples_per_second: must be between %d and %d, got %d",
			minSamplesPerSecond, maxSamplesPerSecond, c.SamplesPerSecond))
	}
	if c.ReporterInterval < minReporterInterval || c.ReporterInterval > maxReporterInterval {
		errs = append(errs, fmt.Errorf("reporter_interval: must be between %v and %v, got %v",
			minReporterInterval, maxReporterInterval, c.ReporterInterval))
	}
	// Written so that NaN fails too.
	if !(c.OffCPUThreshold >= minOffCPUThreshold && c.OffCPUThreshold <= maxOffCPUThreshold) {
		errs = append(errs, fmt.Errorf("off_cpu_threshold: must be between %v and %v, got %v",
			minOffCPUThreshold, maxOffCPUThreshold, c.OffCPUThreshold))
	}
	if c.OffCPUMinDuration < 0 {
		errs = append(errs, fmt.Errorf("off_cpu_min_duration: must be at least 0s, got %v", c.OffCPUMinDuration))
	}
	if !filepath.IsAbs(c.ProcFS) {
		errs = append(errs, fmt.Errorf("procfs: must be an absolute path, got %q", c.ProcFS))
	}
	errs = append(errs, validateEnvVarNames("include_env_vars", c.IncludeEnvVars)...)
	if c.FilterMinProcessAge < 0 || c.FilterMinProcessAge > maxFilterMinProcessAge {
		errs = append(errs, fmt.Errorf("filter_min_process_age: must be between 0s and %v, got %v",
			maxFilterMinProcessAge, c.FilterMinProcessAge))
	}
	errs = append(errs, c.Filters.validate()...)
	for i, dir := range c.Symbolization.DebugDirs {
		if !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("symbolization::debug_dirs[%d]: must be an absolute path, got %q", i, dir))
		}
	}
	errs = append(errs, c.Limits.validate()...)
	return errors.Join(errs...)
}

// validate is not named Validate on purpose: Config.Validate covers the
// limits, and the Collector would otherwise report each problem twice.
func (l *LimitsConfig) validate() []error {
	var errs []error
	rb := l.RingBufferBytes
	if rb < minRingBufferBytes || rb > maxRingBufferBytes {
		errs = append(errs, fmt.Errorf("limits::ring_buffer_bytes: must be between %d (64 KiB) and %d (256 MiB), got %d",
			minRingBufferBytes, maxRingBufferBytes, rb))
	}
	if rb <= 0 || rb&(rb-1) != 0 || rb%ringBufferPageSize != 0 {
		errs = append(errs, fmt.Errorf("limits::ring_buffer_bytes: must be a power of two and a multiple of the page size (%d), got %d",
			ringBufferPageSize, rb))
	}
	if l.MaxProcesses < minMaxProcesses || l.MaxProcesses > maxMaxProcesses {
		errs = append(errs, fmt.Errorf("limits::max_processes: must be between %d and %d, got %d",
			minMaxProcesses, maxMaxProcesses, l.MaxProcesses))
	}
	if l.SymbolCacheBytes < minSymbolCacheBytes || l.SymbolCacheBytes > maxSymbolCacheBytes {
		errs = append(errs, fmt.Errorf("limits::symbol_cache_bytes: must be between %d (1 MiB) and %d (4 GiB), got %d",
			minSymbolCacheBytes, maxSymbolCacheBytes, l.SymbolCacheBytes))
	}
	if l.UnwindTableBytes < minUnwindTableBytes || l.UnwindTableBytes > maxUnwindTableBytes {
		errs = append(errs, fmt.Errorf("limits::unwind_table_bytes: must be between %d (1 MiB) and %d (4 GiB), got %d",
			minUnwindTableBytes, maxUnwindTableBytes, l.UnwindTableBytes))
	}
	return errs
}

// validate checks the filters; see LimitsConfig.validate for the name.
func (f *FiltersConfig) validate() []error {
	var errs []error
	for _, list := range []struct {
		key      string
		patterns []string
	}{{"filters::include_executables", f.IncludeExecutables}, {"filters::exclude_executables", f.ExcludeExecutables}} {
		for i, p := range list.patterns {
			if p == "" {
				errs = append(errs, fmt.Errorf("%s[%d]: must not be empty", list.key, i))
			} else if _, err := path.Match(p, ""); err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %q is not a valid glob: %w", list.key, i, p, err))
			}
		}
	}
	switch f.Containers {
	case "", containersAny, containersOnly, containersNone: // "": any
	default:
		errs = append(errs, fmt.Errorf("filters::containers: must be %q, %q or %q, got %q",
			containersAny, containersOnly, containersNone, f.Containers))
	}
	for _, list := range []struct {
		key      string
		prefixes []string
	}{{"filters::include_cgroups", f.IncludeCgroups}, {"filters::exclude_cgroups", f.ExcludeCgroups}} {
		for i, p := range list.prefixes {
			if !strings.HasPrefix(p, "/") {
				errs = append(errs, fmt.Errorf("%s[%d]: must be a cgroup path starting with '/', got %q", list.key, i, p))
			}
		}
	}
	return errs
}

// validateEnvVarNames checks a list of environment variable names: each one
// not empty, made of ASCII letters, digits and '_' and not starting with a
// digit (the portable names of POSIX, in either case), and listed once.
func validateEnvVarNames(key string, names []string) []error {
	var errs []error
	first := make(map[string]int, len(names))
	for i, name := range names {
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("%s[%d]: must not be empty", key, i))
			continue
		case !isEnvVarName(name):
			errs = append(errs, fmt.Errorf("%s[%d]: must be an environment variable name (letters, digits and '_', not starting with a digit), got %q",
				key, i, name))
			continue
		}
		if j, dup := first[name]; dup {
			errs = append(errs, fmt.Errorf("%s[%d]: %q is already listed at %s[%d]", key, i, name, key, j))
			continue
		}
		first[name] = i
	}
	return errs
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
