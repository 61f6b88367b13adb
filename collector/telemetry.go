package collector

import (
	"context"
	"fmt"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/tracer"
)

// telemetry is the receiver's own metrics, declared in metadata.yaml and
// documented in README.md. Values that other components already count (the
// eBPF counters, the unwind loader, the process table, the symbolizer) are
// read in one callback when the Collector collects; what the reader
// goroutine counts per sample goes into atomics read by the same callback,
// so the per-sample path makes no metric call. Only the per-interval export
// outcome uses synchronous counters.
type telemetry struct {
	tb  *metadata.TelemetryBuilder
	reg metric.Registration // the observation callback, between Start and Shutdown

	// Counted by the reader goroutine under profilesReceiver.mu, with the
	// sample's addition to the interval.
	stacks       [numStackSlots]atomic.Uint64
	intervalFull atomic.Uint64 // samples the interval's builder refused (full)
	// Counted by the reporter goroutine.
	exportFailed atomic.Uint64 // samples of intervals the next consumer refused
}

// stackClass is how a received sample's user-stack walk ended, from the
// flags the eBPF side set on the sample. Each sample has exactly one class.
type stackClass uint8

const (
	stackNone        stackClass = iota // no user stack: a kernel thread, or no user registers
	stackComplete                      // an unwind row marked the outermost frame
	stackEnded                         // the frame-pointer chain or return addresses ran out, unconfirmed by CFI
	stackTruncated                     // frame limit reached, or a tail call failed mid-walk
	stackUnknownRule                   // failed: a PC whose CFI has no usable rule
	stackReadError                     // failed: user memory could not be read
	stackStackError                    // failed: the walk could not start (its tail call failed)
	numStackClasses
)

// A stack slot is a class and whether the frame-pointer fallback was used.
const numStackSlots = 2 * int(numStackClasses)

func stackSlot(c stackClass, fp bool) int {
	if fp {
		return 2*int(c) + 1
	}
	return 2 * int(c)
}

// classifyStack maps a sample's flags to its class. The failure flags are
// checked first: a failed walk may have found frames by frame pointer.
func classifyStack(flags uint32, userFrames int) (stackClass, bool) {
	fp := flags&tracer.FlagFramePointers != 0
	switch {
	case flags&tracer.FlagUserStackErr != 0:
		return stackStackError, fp
	case flags&tracer.FlagUnknownRule != 0:
		return stackUnknownRule, fp
	case flags&tracer.FlagUserReadErr != 0:
		return stackReadError, fp
	case flags&tracer.FlagUserTruncated != 0:
		return stackTruncated, fp
	case flags&tracer.FlagUserComplete != 0:
		return stackComplete, fp
	case userFrames == 0:
		return stackNone, false
	}
	return stackEnded, fp
}

// Attribute sets, built once: the callback allocates nothing for them.
var (
	lostRingBuffer   = attrs("reason", "ring_buffer_full")
	skippedIdle      = attrs("reason", "idle")
	offCPUSampled    = attrs("outcome", "sampled")
	offCPUShort      = attrs("outcome", "short")
	offCPUFiltered   = attrs("outcome", "filtered")
	offCPURingFull   = attrs("outcome", "ring_buffer_full")
	offCPUMapFull    = attrs("outcome", "map_full")
	offCPUExpired    = attrs("outcome", "expired")
	offCPUEvicted    = attrs("outcome", "evicted")
	offCPUOrphanEnd  = attrs("outcome", "orphan_end")
	skippedKThread   = attrs("reason", "kernel_thread")
	skippedKernel    = attrs("reason", "filtered_in_kernel")
	skippedUser      = attrs("reason", "filtered_in_user")
	lostIntervalFull = attrs("reason", "interval_full")
	lostExportFailed = attrs("reason", "export_failed")

	recordsExecExit = attrs("kind", "exec_exit")
	recordsUnknown  = attrs("kind", "unknown_process")

	unwindUnknownRule = attrs("reason", "unknown_rule")
	unwindReadError   = attrs("reason", "read_error")
	unwindTailCall    = attrs("reason", "tail_call_error")
	unwindKernelStack = attrs("reason", "kernel_stack")

	framesCFI = attrs("method", "cfi")
	framesFP  = attrs("method", "frame_pointer")

	tableNoCFI      = attrs("reason", "no_cfi")
	tableOverBudget = attrs("reason", "over_budget")
	tableError      = attrs("reason", "error")

	cacheHit  = attrs("result", "hit")
	cacheMiss = attrs("result", "miss")

	stackAttrs = func() (a [numStackSlots]metric.MeasurementOption) {
		outcomes := [numStackClasses][2]string{
			stackNone:        {"none", ""},
			stackComplete:    {"complete", ""},
			stackEnded:       {"ended", ""},
			stackTruncated:   {"truncated", ""},
			stackUnknownRule: {"failed", "unknown_rule"},
			stackReadError:   {"failed", "read_error"},
			stackStackError:  {"failed", "stack_error"},
		}
		for c, o := range outcomes {
			for _, fp := range []bool{false, true} {
				kv := []attribute.KeyValue{attribute.String("outcome", o[0]), attribute.Bool("frame_pointer", fp)}
				if o[1] != "" {
					kv = append(kv, attribute.String("reason", o[1]))
				}
				a[stackSlot(stackClass(c), fp)] = metric.WithAttributeSet(attribute.NewSet(kv...))
			}
		}
		return a
	}()
)

func attrs(key, value string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String(key, value)))
}

func newTelemetry(tb *metadata.TelemetryBuilder) *telemetry {
	return &telemetry{tb: tb}
}

// countSample counts one received sample; added says whether the interval's
// builder took it. Called with profilesReceiver.mu held.
func (t *telemetry) countSample(rec *tracer.Record, added bool) {
	c, fp := classifyStack(rec.Flags, len(rec.User))
	t.stacks[stackSlot(c, fp)].Add(1)
	if !added {
		t.intervalFull.Add(1)
	}
}

// exported counts an interval the next consumer accepted.
func (t *telemetry) exported(profiles, samples int) {
	ctx := context.Background()
	t.tb.ExportProfiles.Add(ctx, int64(profiles))
	t.tb.ExportSamples.Add(ctx, int64(samples))
}

// refused counts an interval the next consumer refused.
func (t *telemetry) refused(samples int) {
	t.exportFailed.Add(uint64(samples))
	t.tb.ExportErrors.Add(context.Background(), 1)
}

// register starts observing r's components; Start calls it once they exist.
func (t *telemetry) register(r *profilesReceiver, meter metric.Meter) error {
	tb := t.tb
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		return t.observe(r, o)
	},
		tb.SamplesReceived, tb.SamplesLost, tb.SamplesSkipped, tb.RecordsLost, tb.RecordsMalformed,
		tb.UnwindMappingsStale, tb.OffcpuWaits,
		tb.UnwindStacks, tb.UnwindErrors, tb.UnwindFrames, tb.UnwindProcesses, tb.UnwindRequestsDropped,
		tb.UnwindTableCount, tb.UnwindTableRows, tb.UnwindTableSize,
		tb.UnwindTableBuilds, tb.UnwindTableEvictions, tb.UnwindTableFailures,
		tb.ProcessesTracked,
		tb.SymbolizeCacheRequests, tb.SymbolizeCacheLoads, tb.SymbolizeCacheEvictions, tb.SymbolizeCacheSize,
	)
	if err != nil {
		return fmt.Errorf("register telemetry callback: %w", err)
	}
	t.reg = reg
	return nil
}

// unregister stops observing; Shutdown calls it before the tracer closes.
// The SDK waits for a collection in progress.
func (t *telemetry) unregister() error {
	t.tb.Shutdown()
	if t.reg == nil {
		return nil
	}
	err := t.reg.Unregister()
	t.reg = nil
	return err
}

// observe reports one snapshot of every source. A failed read of the eBPF
// counters leaves their metrics out of this collection and is returned; the
// others are still reported.
func (t *telemetry) observe(r *profilesReceiver, o metric.Observer) error {
	tb := t.tb
	i64 := func(v uint64) int64 { return int64(v) }

	o.ObserveInt64(tb.SamplesReceived, i64(r.stats.samples.Load()))
	o.ObserveInt64(tb.SamplesLost, i64(t.intervalFull.Load()), lostIntervalFull)
	o.ObserveInt64(tb.SamplesLost, i64(t.exportFailed.Load()), lostExportFailed)
	o.ObserveInt64(tb.RecordsMalformed, i64(r.stats.decodeErrors.Load()))
	for c := range numStackClasses {
		for _, fp := range []bool{false, true} {
			if c == stackNone && fp {
				continue // classifyStack never yields it
			}
			s := stackSlot(c, fp)
			o.ObserveInt64(tb.UnwindStacks, i64(t.stacks[s].Load()), stackAttrs[s])
		}
	}

	ls := r.preparer.loader.Stats()
	o.ObserveInt64(tb.UnwindProcesses, int64(ls.Processes))
	o.ObserveInt64(tb.UnwindRequestsDropped, i64(r.preparer.dropped.Load()))
	o.ObserveInt64(tb.UnwindTableCount, int64(ls.Tables))
	o.ObserveInt64(tb.UnwindTableRows, ls.Rows)
	o.ObserveInt64(tb.UnwindTableSize, ls.Bytes)
	o.ObserveInt64(tb.UnwindTableBuilds, i64(ls.Built))
	o.ObserveInt64(tb.UnwindTableEvictions, i64(ls.Evicted))
	o.ObserveInt64(tb.UnwindTableFailures, i64(ls.NoCFI), tableNoCFI)
	o.ObserveInt64(tb.UnwindTableFailures, i64(ls.OverBudget), tableOverBudget)
	o.ObserveInt64(tb.UnwindTableFailures, i64(ls.Failures), tableError)

	o.ObserveInt64(tb.ProcessesTracked, int64(r.resolver.procs.Len()))

	ss := r.resolver.syms.Stats()
	o.ObserveInt64(tb.SymbolizeCacheRequests, i64(ss.Hits), cacheHit)
	o.ObserveInt64(tb.SymbolizeCacheRequests, i64(ss.Misses), cacheMiss)
	o.ObserveInt64(tb.SymbolizeCacheLoads, i64(ss.FilesLoaded))
	o.ObserveInt64(tb.SymbolizeCacheEvictions, i64(ss.FilesEvicted))
	o.ObserveInt64(tb.SymbolizeCacheSize, ss.LoadedBytes)

	c, err := r.tracer.Counters()
	if err != nil {
		return fmt.Errorf("sonde receiver telemetry: %w", err)
	}
	o.ObserveInt64(tb.SamplesLost, i64(c.SamplesLost), lostRingBuffer)
	o.ObserveInt64(tb.SamplesSkipped, i64(c.IdleSkipped), skippedIdle)
	o.ObserveInt64(tb.SamplesSkipped, i64(c.KernelThreads), skippedKThread)
	o.ObserveInt64(tb.SamplesSkipped, i64(c.Filtered), skippedKernel)
	o.ObserveInt64(tb.SamplesSkipped, i64(r.stats.filtered.Load()), skippedUser)
	o.ObserveInt64(tb.UnwindMappingsStale, i64(c.StaleMappings))
	if r.tracer.OffCPU() && r.offCPU != nil {
		j := &r.offCPU.stats
		o.ObserveInt64(tb.OffcpuWaits, i64(j.samples.Load()), offCPUSampled)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUShortWaits), offCPUShort)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUFiltered), offCPUFiltered)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUStartsLost+c.OffCPUEndsLost), offCPURingFull)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUMapFull), offCPUMapFull)
		o.ObserveInt64(tb.OffcpuWaits, i64(j.expired.Load()), offCPUExpired)
		o.ObserveInt64(tb.OffcpuWaits, i64(j.evicted.Load()), offCPUEvicted)
		o.ObserveInt64(tb.OffcpuWaits, i64(j.orphanEnds.Load()), offCPUOrphanEnd)
	}
	o.ObserveInt64(tb.RecordsLost, i64(c.TaskEventsLost), recordsExecExit)
	o.ObserveInt64(tb.RecordsLost, i64(c.UnknownLost), recordsUnknown)
	o.ObserveInt64(tb.UnwindErrors, i64(c.UnknownRule), unwindUnknownRule)
	o.ObserveInt64(tb.UnwindErrors, i64(c.ReadErrors), unwindReadError)
	o.ObserveInt64(tb.UnwindErrors, i64(c.TailCallErrors), unwindTailCall)
	o.ObserveInt64(tb.UnwindErrors, i64(c.KernelStackErrs), unwindKernelStack)
	o.ObserveInt64(tb.UnwindFrames, i64(c.FramesCFI), framesCFI)
	o.ObserveInt64(tb.UnwindFrames, i64(c.FramesFP), framesFP)
	return nil
}
