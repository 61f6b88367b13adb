package collector

import (
	"math/bits"
	"strings"
	"testing"
	"time"
)

// FuzzValidate checks that Validate never panics and accepts exactly the
// configurations inside the documented bounds, restated here independently
// (population count for powers of two, a leading slash for absolute paths).
// Every message must name one of the receiver's keys.
func FuzzValidate(f *testing.F) {
	f.Add(19, int64(5*time.Second), "/proc", 4<<20, 65536, int64(64<<20))
	f.Add(0, int64(0), "", 0, 0, int64(0))
	f.Add(1000, int64(10*time.Minute), "/host/proc", 256<<20, 4<<20, int64(4<<30))
	f.Add(-1, int64(-1), "proc", -4096, -1, int64(-1))
	f.Add(1001, int64(99*time.Millisecond), "./proc", 100000, 4<<20+1, int64(4<<30+1))
	f.Fuzz(func(t *testing.T, sps int, interval int64, procfs string, ringBytes, maxProcs int, unwindBytes int64) {
		cfg := &Config{
			SamplesPerSecond: sps,
			ReporterInterval: time.Duration(interval),
			ProcFS:           procfs,
			Limits:           LimitsConfig{RingBufferBytes: ringBytes, MaxProcesses: maxProcs, UnwindTableBytes: unwindBytes, SymbolCacheBytes: 32 << 20},
		}
		err := cfg.Validate()

		valid := sps >= 1 && sps <= 1000 &&
			interval >= int64(100*time.Millisecond) && interval <= int64(10*time.Minute) &&
			strings.HasPrefix(procfs, "/") &&
			ringBytes >= 1<<16 && ringBytes <= 1<<28 && bits.OnesCount64(uint64(ringBytes)) == 1 &&
			maxProcs >= 1 && maxProcs <= 1<<22 &&
			unwindBytes >= 1<<20 && unwindBytes <= 1<<32
		if valid != (err == nil) {
			t.Fatalf("Validate(%+v) = %v, want valid=%v", cfg, err, valid)
		}
		if err == nil {
			return
		}
		for _, msg := range validationMessages(err) {
			known := false
			for _, key := range []string{"samples_per_second: ", "reporter_interval: ", "procfs: ", "limits::ring_buffer_bytes: ", "limits::max_processes: ", "limits::unwind_table_bytes: "} {
				known = known || strings.HasPrefix(msg, key)
			}
			if !known {
				t.Errorf("message %q does not start with a known key", msg)
			}
		}
	})
}
