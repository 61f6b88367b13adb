package collector

import (
	"time"

	"github.com/sonde-dev/sonde/profiler"
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
	containersAny  = profiler.ContainersAny
	containersOnly = profiler.ContainersOnly
	containersNone = profiler.ContainersNone
)

// LimitsConfig bounds the resources the receiver allocates.
type LimitsConfig struct {
	// RingBufferBytes is the size of the eBPF ring buffer that carries
	// samples to user space. The kernel requires a power of two that is a
	// multiple of the page size; 0 (the default) sizes it for
	// samples_per_second and the CPUs: two seconds of samples and an
	// eighth of a second of stack snapshots, at least 1 MiB, 4 MiB with
	// off-CPU profiling on.
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
	// needed. An eighth of it holds the CPython code objects that name
	// Python frames.
	SymbolCacheBytes int64 `mapstructure:"symbol_cache_bytes"`

	// MaxPendingSamples bounds the samples waiting for the next consumer,
	// in the intervals not handed over yet (the one being built
	// included). When a consumer that blocks or fails slowly (it has held
	// the receiver for a reporter_interval) lets more wait, or more than 8
	// intervals, the oldest waiting interval is dropped, counted in
	// sonde.samples.lost (reason consumer_backlog) and logged once per
	// interval, and profiling goes on.
	MaxPendingSamples int `mapstructure:"max_pending_samples"`

	_ struct{}
}

func createDefaultConfig() *Config {
	d := profiler.DefaultOptions()
	return &Config{
		SamplesPerSecond: d.SamplesPerSecond,
		ReporterInterval: d.ReporterInterval,
		ProcFS:           d.ProcFS,
		// Empty, not nil: what `include_env_vars: []` unmarshals to.
		IncludeEnvVars: []string{},
		Filters: FiltersConfig{
			IncludeExecutables: []string{},
			ExcludeExecutables: []string{},
			Containers:         d.Filters.Containers,
			IncludeCgroups:     []string{},
			ExcludeCgroups:     []string{},
		},
		Symbolization: SymbolizationConfig{
			Native:    d.NativeSymbols,
			DebugDirs: d.DebugDirs,
		},
		Limits: LimitsConfig{
			RingBufferBytes:   d.RingBufferBytes,
			MaxProcesses:      d.MaxProcesses,
			UnwindTableBytes:  d.UnwindTableBytes,
			SymbolCacheBytes:  d.SymbolCacheBytes,
			MaxPendingSamples: d.MaxPendingSamples,
		},
	}
}

// options maps the configuration to the profiler's options. It copies
// nothing that the profiler could change: New copies what it keeps.
func (c *Config) options() profiler.Options {
	return profiler.Options{
		SamplesPerSecond:    c.SamplesPerSecond,
		ReporterInterval:    c.ReporterInterval,
		OffCPUThreshold:     c.OffCPUThreshold,
		OffCPUMinDuration:   c.OffCPUMinDuration,
		ProcFS:              c.ProcFS,
		IncludeEnvVars:      c.IncludeEnvVars,
		IncludeCommandLine:  c.IncludeCommandLine,
		FilterMinProcessAge: c.FilterMinProcessAge,
		Filters: profiler.Filters{
			IncludeExecutables:   c.Filters.IncludeExecutables,
			ExcludeExecutables:   c.Filters.ExcludeExecutables,
			Containers:           c.Filters.Containers,
			IncludeCgroups:       c.Filters.IncludeCgroups,
			ExcludeCgroups:       c.Filters.ExcludeCgroups,
			IncludeIdle:          c.Filters.IncludeIdle,
			IncludeKernelThreads: c.Filters.IncludeKernelThreads,
		},
		NativeSymbols:    c.Symbolization.Native,
		DebugDirs:        c.Symbolization.DebugDirs,
		RingBufferBytes:  c.Limits.RingBufferBytes,
		MaxProcesses:     c.Limits.MaxProcesses,
		UnwindTableBytes: c.Limits.UnwindTableBytes,
		SymbolCacheBytes: c.Limits.SymbolCacheBytes,

		MaxPendingSamples: c.Limits.MaxPendingSamples,
	}
}

// configKeys names each profiler option by the YAML key that sets it.
var configKeys = map[string]string{
	"SamplesPerSecond":             "samples_per_second",
	"ReporterInterval":             "reporter_interval",
	"OffCPUThreshold":              "off_cpu_threshold",
	"OffCPUMinDuration":            "off_cpu_min_duration",
	"ProcFS":                       "procfs",
	"IncludeEnvVars":               "include_env_vars",
	"IncludeCommandLine":           "include_command_line",
	"FilterMinProcessAge":          "filter_min_process_age",
	"Filters.IncludeExecutables":   "filters::include_executables",
	"Filters.ExcludeExecutables":   "filters::exclude_executables",
	"Filters.Containers":           "filters::containers",
	"Filters.IncludeCgroups":       "filters::include_cgroups",
	"Filters.ExcludeCgroups":       "filters::exclude_cgroups",
	"Filters.IncludeIdle":          "filters::include_idle",
	"Filters.IncludeKernelThreads": "filters::include_kernel_threads",
	"NativeSymbols":                "symbolization::native",
	"DebugDirs":                    "symbolization::debug_dirs",
	"RingBufferBytes":              "limits::ring_buffer_bytes",
	"MaxProcesses":                 "limits::max_processes",
	"UnwindTableBytes":             "limits::unwind_table_bytes",
	"SymbolCacheBytes":             "limits::symbol_cache_bytes",
	"MaxPendingSamples":            "limits::max_pending_samples",
}

func configKey(field string) string {
	if k, ok := configKeys[field]; ok {
		return k
	}
	return field
}

// Validate checks every field and returns all problems joined with
// errors.Join, each naming the YAML key, the bound and the value found.
// It has no side effects: it reads no files and probes no kernel features,
// which Start does. The bounds are the profiler's.
func (c *Config) Validate() error {
	o := c.options()
	return o.ValidateNamed(configKey)
}
