package profiler

import (
	"testing"

	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/internal/symbolize"
	"github.com/sonde-dev/sonde/tracer"
)

func TestClassifyStack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flags  uint32
		frames int
		want   StackOutcome
		fp     bool
	}{
		{"kernel thread", 0, 0, StackNone, false},
		{"complete by CFI", tracer.FlagUserComplete, 5, StackComplete, false},
		{"complete after a frame-pointer frame", tracer.FlagUserComplete | tracer.FlagFramePointers, 5, StackComplete, true},
		{"frame-pointer chain ran out", tracer.FlagFramePointers, 4, StackEnded, true},
		{"return address zero", 0, 3, StackEnded, false},
		{"truncated", tracer.FlagUserTruncated, 256, StackTruncated, false},
		{"unknown rule", tracer.FlagUnknownRule, 2, StackUnknownRule, false},
		{"read error after frame pointers", tracer.FlagUserReadErr | tracer.FlagFramePointers, 2, StackReadError, true},
		{"tail call failed before the walk", tracer.FlagUserStackErr, 0, StackStackError, false},
		{"kernel stack error only", tracer.FlagKernelStackErr, 0, StackNone, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, fp := classifyStack(tc.flags, tc.frames)
			if c != tc.want || fp != tc.fp {
				t.Errorf("classifyStack(%#x, %d) = %d, %v; want %d, %v", tc.flags, tc.frames, c, fp, tc.want, tc.fp)
			}
		})
	}
}

// The per-file inflation cap is what README.md and the collector's README
// say: a quarter of the native symbols' 39/64 of symbol_cache_bytes,
// 9.75 MiB (10,223,616 bytes) at the default, at most 32 MiB, at least
// 1 MiB.
func TestInflateCapAsDocumented(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cache int64
		want  int64
	}{
		{"default", DefaultOptions().SymbolCacheBytes, 39 << 20 / 4},
		{"large", 1 << 30, 32 << 20},
		{"small", 1 << 20, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := symbolize.New(zap.NewNop(), symbolize.Options{MaxSymbolBytes: nativeSymbolBytes(tc.cache)})
			if got := s.InflateCap(); got != tc.want {
				t.Errorf("symbol_cache_bytes %d: inflation cap %d bytes, want %d", tc.cache, got, tc.want)
			}
		})
	}
}
