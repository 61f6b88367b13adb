package collector

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/profiler"
)

// ignoreBlank skips the blank `_ struct{}` fields that forbid unkeyed literals.
var ignoreBlank = cmpopts.IgnoreUnexported(Config{}, LimitsConfig{})

// withDefaults returns the default config changed by edit.
func withDefaults(edit func(*Config)) *Config {
	c := createDefaultConfig()
	edit(c)
	return c
}

// validationMessages returns the messages of a validation error, one per
// problem. errors.Join separates messages with newlines, also when the
// Collector's confmap.Validate nests the joined error, and no message of
// Validate contains a newline.
func validationMessages(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatalf("load testdata: %v", err)
	}

	tests := []struct {
		id component.ID
		// want is the config after unmarshalling; nil when unmarshalling fails.
		want *Config
		// wantUnmarshalErr is a substring of the unmarshal error.
		wantUnmarshalErr string
		// wantInvalid lists the messages Validate must return, in order.
		wantInvalid []string
	}{
		{
			id:   component.NewID(metadata.Type),
			want: createDefaultConfig(),
		},
		{
			id: component.NewIDWithName(metadata.Type, "custom"),
			want: &Config{
				SamplesPerSecond:    99,
				ReporterInterval:    time.Second,
				ProcFS:              "/host/proc",
				IncludeEnvVars:      []string{"DEPLOY_ENV", "REGION", "http_proxy"},
				IncludeCommandLine:  true,
				FilterMinProcessAge: 2 * time.Second,
				Filters: FiltersConfig{
					IncludeExecutables:   []string{"nginx", "/opt/app/bin/*"},
					ExcludeExecutables:   []string{"otelcol-profiling"},
					Containers:           "only",
					IncludeCgroups:       []string{"/kubepods.slice"},
					ExcludeCgroups:       []string{"/kubepods.slice/system"},
					IncludeIdle:          true,
					IncludeKernelThreads: true,
				},
				Symbolization: SymbolizationConfig{Native: false, DebugDirs: []string{"/debug", "/opt/debug"}},
				Limits:        LimitsConfig{RingBufferBytes: 16 << 20, MaxProcesses: 1024, UnwindTableBytes: 8 << 20, SymbolCacheBytes: 16 << 20, MaxPendingSamples: 256 << 10},
			},
		},
		{
			id: component.NewIDWithName(metadata.Type, "partial"),
			want: withDefaults(func(c *Config) {
				c.SamplesPerSecond = 499
				c.Limits.MaxProcesses = 4096
			}),
		},
		{
			id:   component.NewIDWithName(metadata.Type, "env_vars_string"),
			want: withDefaults(func(c *Config) { c.IncludeEnvVars = []string{"DEPLOY_ENV", "REGION"} }),
		},
		{
			id: component.NewIDWithName(metadata.Type, "invalid_env_vars"),
			want: withDefaults(func(c *Config) {
				c.IncludeEnvVars = []string{"DEPLOY_ENV", "", "1ST", "REGION ", "DEPLOY_ENV", "A-B", "REGION"}
			}),
			wantInvalid: []string{
				"include_env_vars[1]: must not be empty",
				`include_env_vars[2]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "1ST"`,
				`include_env_vars[3]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "REGION "`,
				`include_env_vars[4]: "DEPLOY_ENV" is already listed at include_env_vars[0]`,
				`include_env_vars[5]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "A-B"`,
			},
		},
		{
			id:          component.NewIDWithName(metadata.Type, "invalid_samples_per_second"),
			want:        withDefaults(func(c *Config) { c.SamplesPerSecond = 0 }),
			wantInvalid: []string{"samples_per_second: must be between 1 and 1000, got 0"},
		},
		{
			id: component.NewIDWithName(metadata.Type, "invalid_all"),
			want: &Config{
				SamplesPerSecond:    5000,
				ReporterInterval:    10 * time.Millisecond,
				ProcFS:              "proc",
				IncludeEnvVars:      []string{"X=1"},
				FilterMinProcessAge: -time.Second,
				Filters: FiltersConfig{
					IncludeExecutables: []string{"", "[a-"},
					ExcludeExecutables: []string{},
					Containers:         "sometimes",
					IncludeCgroups:     []string{},
					ExcludeCgroups:     []string{"kubepods"},
				},
				Symbolization: SymbolizationConfig{Native: true, DebugDirs: []string{"debug"}},
				Limits:        LimitsConfig{RingBufferBytes: 100000, MaxProcesses: 0, UnwindTableBytes: 1024, SymbolCacheBytes: 1, MaxPendingSamples: 1000},
			},
			wantInvalid: []string{
				"samples_per_second: must be between 1 and 1000, got 5000",
				"reporter_interval: must be between 100ms and 10m0s, got 10ms",
				`procfs: must be an absolute path, got "proc"`,
				`include_env_vars[0]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "X=1"`,
				"filter_min_process_age: must be between 0s and 24h0m0s, got -1s",
				"filters::include_executables[0]: must not be empty",
				`filters::include_executables[1]: "[a-" is not a valid glob: syntax error in pattern`,
				`filters::containers: must be "any", "only" or "none", got "sometimes"`,
				`filters::exclude_cgroups[0]: must be a cgroup path starting with '/', got "kubepods"`,
				`symbolization::debug_dirs[0]: must be an absolute path, got "debug"`,
				"limits::ring_buffer_bytes: must be a power of two and a multiple of the page size (4096), got 100000",
				"limits::max_processes: must be between 1 and 4194304, got 0",
				"limits::symbol_cache_bytes: must be between 1048576 (1 MiB) and 4294967296 (4 GiB), got 1",
				"limits::max_pending_samples: must be between 1024 and 16777216, got 1000",
				"limits::unwind_table_bytes: must be between 1048576 (1 MiB) and 4294967296 (4 GiB), got 1024",
			},
		},
		{
			id: component.NewIDWithName(metadata.Type, "off_cpu"),
			want: withDefaults(func(c *Config) {
				c.OffCPUThreshold = 0.25
				c.OffCPUMinDuration = time.Millisecond
			}),
		},
		{
			id: component.NewIDWithName(metadata.Type, "invalid_off_cpu"),
			want: withDefaults(func(c *Config) {
				c.OffCPUThreshold = 1.5
				c.OffCPUMinDuration = -time.Second
			}),
			wantInvalid: []string{
				"off_cpu_threshold: must be between 0 and 1, got 1.5",
				"off_cpu_min_duration: must be at least 0s, got -1s",
			},
		},
		{
			id:               component.NewIDWithName(metadata.Type, "unknown_key"),
			wantUnmarshalErr: "sample_rate",
		},
		{
			id:               component.NewIDWithName(metadata.Type, "bad_duration"),
			wantUnmarshalErr: "reporter_interval",
		},
	}

	for _, tt := range tests {
		t.Run(tt.id.String(), func(t *testing.T) {
			cfg := NewFactory().CreateDefaultConfig()
			sub, err := cm.Sub(tt.id.String())
			if err != nil {
				t.Fatalf("sub %s: %v", tt.id, err)
			}
			err = sub.Unmarshal(cfg)
			if tt.wantUnmarshalErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantUnmarshalErr) {
					t.Fatalf("Unmarshal error = %v, want one mentioning %q", err, tt.wantUnmarshalErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if diff := cmp.Diff(tt.want, cfg, ignoreBlank); diff != "" {
				t.Errorf("config mismatch (-want +got):\n%s", diff)
			}
			// The Collector validates through confmap.Validate; go the same way.
			gotInvalid := validationMessages(confmap.Validate(cfg))
			if diff := cmp.Diff(tt.wantInvalid, gotInvalid); diff != "" {
				t.Errorf("validation messages mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want []string // nil: valid
	}{
		{name: "defaults", edit: func(*Config) {}},

		{name: "samples_per_second min", edit: func(c *Config) { c.SamplesPerSecond = 1 }},
		{name: "samples_per_second max", edit: func(c *Config) { c.SamplesPerSecond = 1000 }},
		{
			name: "samples_per_second zero",
			edit: func(c *Config) { c.SamplesPerSecond = 0 },
			want: []string{"samples_per_second: must be between 1 and 1000, got 0"},
		},
		{
			name: "samples_per_second negative",
			edit: func(c *Config) { c.SamplesPerSecond = -19 },
			want: []string{"samples_per_second: must be between 1 and 1000, got -19"},
		},
		{
			name: "samples_per_second above max",
			edit: func(c *Config) { c.SamplesPerSecond = 1001 },
			want: []string{"samples_per_second: must be between 1 and 1000, got 1001"},
		},

		{name: "reporter_interval min", edit: func(c *Config) { c.ReporterInterval = 100 * time.Millisecond }},
		{name: "reporter_interval max", edit: func(c *Config) { c.ReporterInterval = 10 * time.Minute }},
		{
			name: "reporter_interval zero",
			edit: func(c *Config) { c.ReporterInterval = 0 },
			want: []string{"reporter_interval: must be between 100ms and 10m0s, got 0s"},
		},
		{
			name: "reporter_interval below min",
			edit: func(c *Config) { c.ReporterInterval = 99 * time.Millisecond },
			want: []string{"reporter_interval: must be between 100ms and 10m0s, got 99ms"},
		},
		{
			name: "reporter_interval above max",
			edit: func(c *Config) { c.ReporterInterval = 10*time.Minute + time.Second },
			want: []string{"reporter_interval: must be between 100ms and 10m0s, got 10m1s"},
		},

		{name: "off_cpu_threshold off", edit: func(c *Config) { c.OffCPUThreshold = 0 }},
		{name: "off_cpu_threshold every switch", edit: func(c *Config) { c.OffCPUThreshold = 1 }},
		{name: "off_cpu_threshold one in a thousand", edit: func(c *Config) { c.OffCPUThreshold = 0.001 }},
		{
			name: "off_cpu_threshold negative",
			edit: func(c *Config) { c.OffCPUThreshold = -0.1 },
			want: []string{"off_cpu_threshold: must be between 0 and 1, got -0.1"},
		},
		{
			name: "off_cpu_threshold above 1",
			edit: func(c *Config) { c.OffCPUThreshold = 1.0000001 },
			want: []string{"off_cpu_threshold: must be between 0 and 1, got 1.0000001"},
		},
		{
			name: "off_cpu_threshold NaN",
			edit: func(c *Config) { c.OffCPUThreshold = math.NaN() },
			want: []string{"off_cpu_threshold: must be between 0 and 1, got NaN"},
		},
		{
			name: "off_cpu_threshold infinite",
			edit: func(c *Config) { c.OffCPUThreshold = math.Inf(1) },
			want: []string{"off_cpu_threshold: must be between 0 and 1, got +Inf"},
		},
		{name: "off_cpu_min_duration long", edit: func(c *Config) { c.OffCPUMinDuration = time.Hour }},
		{
			name: "off_cpu_min_duration negative",
			edit: func(c *Config) { c.OffCPUMinDuration = -time.Nanosecond },
			want: []string{"off_cpu_min_duration: must be at least 0s, got -1ns"},
		},

		{name: "procfs host mount", edit: func(c *Config) { c.ProcFS = "/host/proc" }},
		{
			name: "procfs empty",
			edit: func(c *Config) { c.ProcFS = "" },
			want: []string{`procfs: must be an absolute path, got ""`},
		},
		{
			name: "procfs relative",
			edit: func(c *Config) { c.ProcFS = "host/proc" },
			want: []string{`procfs: must be an absolute path, got "host/proc"`},
		},

		{name: "ring_buffer_bytes min", edit: func(c *Config) { c.Limits.RingBufferBytes = 64 << 10 }},
		{name: "ring_buffer_bytes max", edit: func(c *Config) { c.Limits.RingBufferBytes = 256 << 20 }},
		{
			name: "ring_buffer_bytes power of two below min",
			edit: func(c *Config) { c.Limits.RingBufferBytes = 32 << 10 },
			want: []string{"limits::ring_buffer_bytes: must be 0 (sized for the sampling rate) or between 65536 (64 KiB) and 268435456 (256 MiB), got 32768"},
		},
		{
			name: "ring_buffer_bytes power of two above max",
			edit: func(c *Config) { c.Limits.RingBufferBytes = 512 << 20 },
			want: []string{"limits::ring_buffer_bytes: must be 0 (sized for the sampling rate) or between 65536 (64 KiB) and 268435456 (256 MiB), got 536870912"},
		},
		{
			name: "ring_buffer_bytes page multiple but not power of two",
			edit: func(c *Config) { c.Limits.RingBufferBytes = 24 * 4096 },
			want: []string{"limits::ring_buffer_bytes: must be a power of two and a multiple of the page size (4096), got 98304"},
		},
		{
			name: "ring_buffer_bytes small and not a page multiple",
			edit: func(c *Config) { c.Limits.RingBufferBytes = 1000 },
			want: []string{
				"limits::ring_buffer_bytes: must be 0 (sized for the sampling rate) or between 65536 (64 KiB) and 268435456 (256 MiB), got 1000",
				"limits::ring_buffer_bytes: must be a power of two and a multiple of the page size (4096), got 1000",
			},
		},
		{
			// 0 sizes the ring buffer for the sampling rate.
			name: "ring_buffer_bytes zero",
			edit: func(c *Config) { c.Limits.RingBufferBytes = 0 },
		},
		{
			name: "ring_buffer_bytes negative",
			edit: func(c *Config) { c.Limits.RingBufferBytes = -4096 },
			want: []string{
				"limits::ring_buffer_bytes: must be 0 (sized for the sampling rate) or between 65536 (64 KiB) and 268435456 (256 MiB), got -4096",
				"limits::ring_buffer_bytes: must be a power of two and a multiple of the page size (4096), got -4096",
			},
		},

		{name: "symbol_cache_bytes max", edit: func(c *Config) { c.Limits.SymbolCacheBytes = 4 << 30 }},
		{
			name: "symbol_cache_bytes below min",
			edit: func(c *Config) { c.Limits.SymbolCacheBytes = 1<<20 - 1 },
			want: []string{"limits::symbol_cache_bytes: must be between 1048576 (1 MiB) and 4294967296 (4 GiB), got 1048575"},
		},
		{
			name: "debug_dirs relative",
			edit: func(c *Config) { c.Symbolization.DebugDirs = []string{"/usr/lib/debug", "dbg"} },
			want: []string{`symbolization::debug_dirs[1]: must be an absolute path, got "dbg"`},
		},
		{name: "debug_dirs empty", edit: func(c *Config) { c.Symbolization.DebugDirs = nil }},

		{name: "include_env_vars nil", edit: func(c *Config) { c.IncludeEnvVars = nil }},
		{name: "include_env_vars portable names", edit: func(c *Config) {
			c.IncludeEnvVars = []string{"A", "_", "_x9", "DEPLOY_ENV", "http_proxy", "Z0"}
		}},
		{
			name: "include_env_vars empty name",
			edit: func(c *Config) { c.IncludeEnvVars = []string{"A", ""} },
			want: []string{"include_env_vars[1]: must not be empty"},
		},
		{
			name: "include_env_vars leading digit, '=', space, dot, non-ASCII",
			edit: func(c *Config) { c.IncludeEnvVars = []string{"9A", "A=B", " A", "a.b", "É"} },
			want: []string{
				`include_env_vars[0]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "9A"`,
				`include_env_vars[1]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "A=B"`,
				`include_env_vars[2]: must be an environment variable name (letters, digits and '_', not starting with a digit), got " A"`,
				`include_env_vars[3]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "a.b"`,
				`include_env_vars[4]: must be an environment variable name (letters, digits and '_', not starting with a digit), got "É"`,
			},
		},
		{
			name: "include_env_vars duplicates, each reported against the first",
			edit: func(c *Config) { c.IncludeEnvVars = []string{"A", "B", "A", "a", "A"} },
			want: []string{
				`include_env_vars[2]: "A" is already listed at include_env_vars[0]`,
				`include_env_vars[4]: "A" is already listed at include_env_vars[0]`,
			},
		},
		{name: "unwind_table_bytes min", edit: func(c *Config) { c.Limits.UnwindTableBytes = 1 << 20 }},
		{name: "unwind_table_bytes max", edit: func(c *Config) { c.Limits.UnwindTableBytes = 4 << 30 }},
		{
			name: "unwind_table_bytes below min",
			edit: func(c *Config) { c.Limits.UnwindTableBytes = 1<<20 - 1 },
			want: []string{"limits::unwind_table_bytes: must be between 1048576 (1 MiB) and 4294967296 (4 GiB), got 1048575"},
		},
		{name: "max_pending_samples min", edit: func(c *Config) { c.Limits.MaxPendingSamples = 1 << 10 }},
		{name: "max_pending_samples max", edit: func(c *Config) { c.Limits.MaxPendingSamples = 1 << 24 }},
		{
			name: "max_pending_samples below min",
			edit: func(c *Config) { c.Limits.MaxPendingSamples = 1<<10 - 1 },
			want: []string{"limits::max_pending_samples: must be between 1024 and 16777216, got 1023"},
		},
		{
			name: "max_pending_samples above max",
			edit: func(c *Config) { c.Limits.MaxPendingSamples = 1<<24 + 1 },
			want: []string{"limits::max_pending_samples: must be between 1024 and 16777216, got 16777217"},
		},
		{name: "max_processes min", edit: func(c *Config) { c.Limits.MaxProcesses = 1 }},
		{name: "max_processes max", edit: func(c *Config) { c.Limits.MaxProcesses = 4 << 20 }},
		{
			name: "max_processes zero",
			edit: func(c *Config) { c.Limits.MaxProcesses = 0 },
			want: []string{"limits::max_processes: must be between 1 and 4194304, got 0"},
		},
		{
			name: "max_processes above max",
			edit: func(c *Config) { c.Limits.MaxProcesses = 4<<20 + 1 },
			want: []string{"limits::max_processes: must be between 1 and 4194304, got 4194305"},
		},

		{
			name: "zero config reports every field",
			edit: func(c *Config) { *c = Config{} },
			want: []string{
				"samples_per_second: must be between 1 and 1000, got 0",
				"reporter_interval: must be between 100ms and 10m0s, got 0s",
				`procfs: must be an absolute path, got ""`,
				"limits::max_processes: must be between 1 and 4194304, got 0",
				"limits::symbol_cache_bytes: must be between 1048576 (1 MiB) and 4294967296 (4 GiB), got 0",
				"limits::max_pending_samples: must be between 1024 and 16777216, got 0",
				"limits::unwind_table_bytes: must be between 1048576 (1 MiB) and 4294967296 (4 GiB), got 0",
			},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := withDefaults(tt.edit)
			before := *cfg
			got := validationMessages(cfg.Validate())
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Validate() messages mismatch (-want +got):\n%s", diff)
			}
			// Validate is pure: it must leave the config as it found it.
			if diff := cmp.Diff(&before, cfg, ignoreBlank, cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("Validate() changed the config (-before +after):\n%s", diff)
			}
		})
	}
}

// TestConfigOptions: every key reaches the profiler's options.
func TestConfigOptions(t *testing.T) {
	cfg := &Config{
		SamplesPerSecond:    97,
		ReporterInterval:    3 * time.Second,
		OffCPUThreshold:     0.25,
		OffCPUMinDuration:   time.Millisecond,
		ProcFS:              "/host/proc",
		IncludeEnvVars:      []string{"DEPLOY"},
		IncludeCommandLine:  true,
		FilterMinProcessAge: time.Minute,
		Filters: FiltersConfig{
			IncludeExecutables:   []string{"nginx"},
			ExcludeExecutables:   []string{"sh"},
			Containers:           containersOnly,
			IncludeCgroups:       []string{"/kubepods.slice"},
			ExcludeCgroups:       []string{"/system.slice"},
			IncludeIdle:          true,
			IncludeKernelThreads: true,
		},
		Symbolization: SymbolizationConfig{Native: true, DebugDirs: []string{"/dbg"}},
		Limits: LimitsConfig{
			RingBufferBytes:   1 << 20,
			MaxProcesses:      100,
			UnwindTableBytes:  2 << 20,
			SymbolCacheBytes:  3 << 20,
			MaxPendingSamples: 5000,
		},
	}
	want := profiler.Options{
		SamplesPerSecond:    97,
		ReporterInterval:    3 * time.Second,
		OffCPUThreshold:     0.25,
		OffCPUMinDuration:   time.Millisecond,
		ProcFS:              "/host/proc",
		IncludeEnvVars:      []string{"DEPLOY"},
		IncludeCommandLine:  true,
		FilterMinProcessAge: time.Minute,
		Filters: profiler.Filters{
			IncludeExecutables:   []string{"nginx"},
			ExcludeExecutables:   []string{"sh"},
			Containers:           profiler.ContainersOnly,
			IncludeCgroups:       []string{"/kubepods.slice"},
			ExcludeCgroups:       []string{"/system.slice"},
			IncludeIdle:          true,
			IncludeKernelThreads: true,
		},
		NativeSymbols:    true,
		DebugDirs:        []string{"/dbg"},
		RingBufferBytes:  1 << 20,
		MaxProcesses:     100,
		UnwindTableBytes: 2 << 20,
		SymbolCacheBytes: 3 << 20,

		MaxPendingSamples: 5000,
	}
	if diff := cmp.Diff(want, cfg.options(), cmpopts.IgnoreFields(profiler.Options{}, "Logger", "BeforeResolve"), cmpopts.IgnoreUnexported(profiler.Options{})); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}
