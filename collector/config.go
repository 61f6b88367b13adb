package collector

import (
	"errors"
	"fmt"
	"path/filepath"
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
	defaultSymbolCacheBytes = 32 << 20 // 32 MiB of loaded symbol data
	defaultDebugDir         = "/usr/lib/debug"
)

// Bounds checked by Validate.
const (
	minSamplesPerSecond = 1
	maxSamplesPerSecond = 1000
	minReporterInterval = 100 * time.Millisecond
	maxReporterInterval = 10 * time.Minute
	ringBufferPageSize  = 4096
	minRingBufferBytes  = 64 << 10  // 64 KiB
	maxRingBufferBytes  = 256 << 20 // 256 MiB
	minMaxProcesses     = 1
	maxMaxProcesses     = 4 << 20 // the kernel's PID_MAX_LIMIT on 64-bit
	minUnwindTableBytes = 1 << 20 // 1 MiB
	maxUnwindTableBytes = 4 << 30 // 4 GiB
	minSymbolCacheBytes = 1 << 20 // 1 MiB
	maxSymbolCacheBytes = 4 << 30 // 4 GiB
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
	// .gnu_debuglink), after /usr/lib/debug inside the process's own root.
	DebugDirs []string `mapstructure:"debug_dirs"`

	_ struct{}
}

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

	// SymbolCacheBytes bounds the symbol data (symbol tables, line tables,
	// inline trees) kept loaded; the least recently used files are dropped
	// past it and loaded again when needed.
	SymbolCacheBytes int64 `mapstructure:"symbol_cache_bytes"`

	_ struct{}
}

func createDefaultConfig() *Config {
	return &Config{
		SamplesPerSecond: defaultSamplesPerSecond,
		ReporterInterval: defaultReporterInterval,
		ProcFS:           defaultProcFS,
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
