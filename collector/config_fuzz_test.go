package collector

import (
	"math/bits"
	"regexp"
	"strings"
	"testing"
	"time"
)

// envNameRE restates the valid include_env_vars name, independently of
// Validate's loop.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// distinctEnvNames reports whether every name matches envNameRE and none
// is listed twice.
func distinctEnvNames(names []string) bool {
	seen := map[string]bool{}
	for _, n := range names {
		if !envNameRE.MatchString(n) || seen[n] {
			return false
		}
		seen[n] = true
	}
	return true
}

// FuzzValidate checks that Validate never panics and accepts exactly the
// configurations inside the documented bounds, restated here independently
// (population count for powers of two, a leading slash for absolute paths).
// Every message must name one of the receiver's keys.
func FuzzValidate(f *testing.F) {
	f.Add(19, int64(5*time.Second), "/proc", 4<<20, 65536, int64(64<<20), "DEPLOY_ENV")
	f.Add(0, int64(0), "", 0, 0, int64(0), "")
	f.Add(1000, int64(10*time.Minute), "/host/proc", 256<<20, 4<<20, int64(4<<30), "_a9")
	f.Add(-1, int64(-1), "proc", -4096, -1, int64(-1), "9A")
	f.Add(1001, int64(99*time.Millisecond), "./proc", 100000, 4<<20+1, int64(4<<30+1), "A,A")
	f.Add(19, int64(5*time.Second), "/proc", 4<<20, 65536, int64(64<<20), "A,b,_C")
	f.Fuzz(func(t *testing.T, sps int, interval int64, procfs string, ringBytes, maxProcs int, unwindBytes int64, envVar string) {
		cfg := &Config{
			SamplesPerSecond: sps,
			ReporterInterval: time.Duration(interval),
			ProcFS:           procfs,
			IncludeEnvVars:   strings.Split(envVar, ","),
			Limits:           LimitsConfig{RingBufferBytes: ringBytes, MaxProcesses: maxProcs, UnwindTableBytes: unwindBytes, SymbolCacheBytes: 32 << 20, MaxPendingSamples: 1 << 16},
		}
		err := cfg.Validate()

		valid := sps >= 1 && sps <= 1000 &&
			interval >= int64(100*time.Millisecond) && interval <= int64(10*time.Minute) &&
			strings.HasPrefix(procfs, "/") &&
			ringBytes >= 1<<16 && ringBytes <= 1<<28 && bits.OnesCount64(uint64(ringBytes)) == 1 &&
			maxProcs >= 1 && maxProcs <= 1<<22 &&
			unwindBytes >= 1<<20 && unwindBytes <= 1<<32 &&
			distinctEnvNames(strings.Split(envVar, ","))
		if valid != (err == nil) {
			t.Fatalf("Validate(%+v) = %v, want valid=%v", cfg, err, valid)
		}
		if err == nil {
			return
		}
		for _, msg := range validationMessages(err) {
			known := false
			for _, key := range []string{"samples_per_second: ", "reporter_interval: ", "procfs: ", "limits::ring_buffer_bytes: ", "limits::max_processes: ", "limits::unwind_table_bytes: ", "include_env_vars["} {
				known = known || strings.HasPrefix(msg, key)
			}
			if !known {
				t.Errorf("message %q does not start with a known key", msg)
			}
		}
	})
}
