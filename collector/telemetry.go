//go:build linux

package collector

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/profiler"
)

// telemetry is the receiver's own metrics, declared in metadata.yaml and
// documented in README.md. Every value is read from one profiler.Stats
// snapshot in one callback when the Collector collects, so the per-sample
// path makes no metric call and the values of one collection agree.
type telemetry struct {
	tb  *metadata.TelemetryBuilder
	reg metric.Registration // the observation callback, between Start and Shutdown
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
	skippedWarmUp    = attrs("reason", "warm_up")
	lostIntervalFull = attrs("reason", "interval_full")
	lostExportFailed = attrs("reason", "export_failed")
	lostBacklog      = attrs("reason", "consumer_backlog")
	lostShutdown     = attrs("reason", "shutdown")

	recordsExecExit = attrs("kind", "exec_exit")
	recordsUnknown  = attrs("kind", "unknown_process")

	unwindUnknownRule = attrs("reason", "unknown_rule")
	unwindReadError   = attrs("reason", "read_error")
	unwindTailCall    = attrs("reason", "tail_call_error")
	unwindKernelStack = attrs("reason", "kernel_stack")
	unwindFPOutside   = attrs("reason", "frame_pointer_outside_code")

	framesCFI = attrs("method", "cfi")
	framesFP  = attrs("method", "frame_pointer")

	tableNoCFI      = attrs("reason", "no_cfi")
	tableOverBudget = attrs("reason", "over_budget")
	tableError      = attrs("reason", "error")

	snapshotWhole   = attrs("outcome", "whole")
	snapshotCut     = attrs("outcome", "cut")
	snapshotSkipped = attrs("outcome", "skipped")

	refusedInflationCap = attrs("reason", "inflation_cap")

	jvmSetupWalked       = attrs("outcome", "walked")
	jvmSetupUnsupported  = attrs("outcome", "unsupported")
	jvmSetupFailed       = attrs("outcome", "failed")
	jvmFrameNamed        = attrs("outcome", "named")
	jvmFrameStale        = attrs("outcome", "stale")
	jvmFrameUnreadable   = attrs("outcome", "unreadable")
	jvmErrNoBlob         = attrs("reason", "no_blob")
	jvmErrReadError      = attrs("reason", "read_error")
	v8SetupWalked        = attrs("outcome", "walked")
	v8SetupUnsupported   = attrs("outcome", "unsupported")
	v8SetupFailed        = attrs("outcome", "failed")
	v8FrameNamed         = attrs("outcome", "named")
	v8FrameStale         = attrs("outcome", "stale")
	v8FrameUnreadable    = attrs("outcome", "unreadable")
	v8ErrReadError       = attrs("reason", "read_error")
	v8ErrNotJS           = attrs("reason", "not_js")
	phpSetupWalked       = attrs("outcome", "walked")
	phpSetupUnsupported  = attrs("outcome", "unsupported")
	phpSetupFailed       = attrs("outcome", "failed")
	phpFrameNamed        = attrs("outcome", "named")
	phpFrameStale        = attrs("outcome", "stale")
	phpFrameUnreadable   = attrs("outcome", "unreadable")
	phpErrReadError      = attrs("reason", "read_error")
	phpErrBadFrame       = attrs("reason", "bad_frame")
	rbSetupWalked        = attrs("outcome", "walked")
	rbSetupUnsupported   = attrs("outcome", "unsupported")
	rbSetupFailed        = attrs("outcome", "failed")
	rbFrameNamed         = attrs("outcome", "named")
	rbFrameStale         = attrs("outcome", "stale")
	rbFrameUnreadable    = attrs("outcome", "unreadable")
	rbErrReadError       = attrs("reason", "read_error")
	rbErrBadFrame        = attrs("reason", "bad_frame")
	rbErrNoTable         = attrs("reason", "no_table")
	perlSetupWalked      = attrs("outcome", "walked")
	perlSetupUnsupported = attrs("outcome", "unsupported")
	perlSetupFailed      = attrs("outcome", "failed")
	perlFrameNamed       = attrs("outcome", "named")
	perlFrameStale       = attrs("outcome", "stale")
	perlFrameUnreadable  = attrs("outcome", "unreadable")
	perlErrReadError     = attrs("reason", "read_error")
	perlErrBadFrame      = attrs("reason", "bad_frame")
	pySetupWalked        = attrs("outcome", "walked")
	pySetupUnsupported   = attrs("outcome", "unsupported")
	pySetupFailed        = attrs("outcome", "failed")
	pyErrNoThread        = attrs("reason", "no_thread")
	pyErrReadError       = attrs("reason", "read_error")
	pyErrBadFrame        = attrs("reason", "bad_frame")

	cacheHit  = attrs("result", "hit")
	cacheMiss = attrs("result", "miss")

	stackAttrs = func() (a [profiler.NumStackOutcomes][2]metric.MeasurementOption) {
		outcomes := [profiler.NumStackOutcomes][2]string{
			profiler.StackNone:        {"none", ""},
			profiler.StackComplete:    {"complete", ""},
			profiler.StackEnded:       {"ended", ""},
			profiler.StackTruncated:   {"truncated", ""},
			profiler.StackUnknownRule: {"failed", "unknown_rule"},
			profiler.StackReadError:   {"failed", "read_error"},
			profiler.StackStackError:  {"failed", "stack_error"},
		}
		for c, o := range outcomes {
			for fp := range 2 {
				kv := []attribute.KeyValue{attribute.String("outcome", o[0]), attribute.Bool("frame_pointer", fp == 1)}
				if o[1] != "" {
					kv = append(kv, attribute.String("reason", o[1]))
				}
				a[c][fp] = metric.WithAttributeSet(attribute.NewSet(kv...))
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

// tableLoaded records one file's table delay (profiler.Options.TableLoaded).
func (t *telemetry) tableLoaded(delay time.Duration) {
	t.tb.UnwindTableDelay.Record(context.Background(), delay.Seconds())
}

// register starts observing p; Start calls it once p exists.
func (t *telemetry) register(p *profiler.Profiler, meter metric.Meter) error {
	tb := t.tb
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		t.observe(p.Stats(), o)
		return nil
	},
		tb.ExportErrors, tb.ExportProfiles, tb.ExportSamples, tb.ExportLag,
		tb.SamplesPending, tb.SamplesEmitting, tb.SamplesLate, tb.RecordsQueued,
		tb.SamplesReceived, tb.SamplesRepeated, tb.SamplesLost, tb.SamplesSkipped, tb.RecordsLost, tb.RecordsMalformed,
		tb.UnwindMappingsStale, tb.OffcpuWaits,
		tb.UnwindStacks, tb.UnwindErrors, tb.UnwindFrames, tb.UnwindProcesses, tb.UnwindRequestsDropped,
		tb.UnwindTableCount, tb.UnwindTableRows, tb.UnwindTableSize,
		tb.UnwindTableBuilds, tb.UnwindTableEvictions, tb.UnwindTableFailures,
		tb.UnwindTableRefused, tb.UnwindTableRetried, tb.UnwindTableLazy, tb.UnwindSnapshots,
		tb.ProcessesTracked,
		tb.SymbolizeCacheRequests, tb.SymbolizeCacheLoads, tb.SymbolizeCacheEvictions, tb.SymbolizeCacheSize,
		tb.PerlProcesses, tb.PerlVersionsUnknown, tb.PerlWalks, tb.PerlFrames, tb.PerlErrors,
		tb.PerlSubCacheSize, tb.PerlSubCacheEvictions,
		tb.SymbolizeRefused,
		tb.PythonProcesses, tb.PythonVersionsUnknown, tb.PythonWalks, tb.PythonFrames, tb.PythonFramesUnnamed,
		tb.PythonErrors, tb.PythonCodeCacheSize, tb.PythonCodeCacheResets,
		tb.JvmProcesses, tb.JvmVersionsUnknown, tb.JvmWalks, tb.JvmFrames, tb.JvmErrors,
		tb.JvmCodeCacheSize, tb.JvmCodeCacheEvictions, tb.JvmCodeCacheLoads,
		tb.V8Processes, tb.V8VersionsUnknown, tb.V8Walks, tb.V8Frames, tb.V8Errors,
		tb.V8CodeCacheSize, tb.V8CodeCacheEvictions,
		tb.PhpProcesses, tb.PhpVersionsUnknown, tb.PhpWalks, tb.PhpFrames, tb.PhpErrors,
		tb.PhpFunctionCacheSize, tb.PhpFunctionCacheEvictions,
		tb.RubyProcesses, tb.RubyVersionsUnknown, tb.RubyWalks, tb.RubyFrames, tb.RubyErrors,
		tb.RubyIseqCacheSize, tb.RubyIseqCacheEvictions,
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

// observe reports one snapshot.
func (t *telemetry) observe(s profiler.Stats, o metric.Observer) {
	tb := t.tb
	i64 := func(v uint64) int64 { return int64(v) }

	o.ObserveInt64(tb.ExportErrors, i64(s.EmitErrors))
	o.ObserveInt64(tb.ExportProfiles, i64(s.EmittedProfiles))
	o.ObserveInt64(tb.ExportSamples, i64(s.EmittedSamples))
	o.ObserveFloat64(tb.ExportLag, s.Lag.Seconds())
	o.ObserveInt64(tb.SamplesPending, int64(s.Pending))
	o.ObserveInt64(tb.SamplesEmitting, int64(s.Emitting))
	o.ObserveInt64(tb.SamplesLate, i64(s.Late))
	o.ObserveInt64(tb.RecordsQueued, int64(s.Queued))
	o.ObserveInt64(tb.SamplesLost, i64(s.Shutdown.Unread+s.Shutdown.Unresolved+s.Shutdown.Unflushed), lostShutdown)
	o.ObserveInt64(tb.SamplesReceived, i64(s.Samples))
	o.ObserveInt64(tb.SamplesRepeated, i64(s.Repeated))
	o.ObserveInt64(tb.SamplesLost, i64(s.IntervalFull), lostIntervalFull)
	o.ObserveInt64(tb.SamplesLost, i64(s.EmitDropped), lostExportFailed)
	o.ObserveInt64(tb.SamplesLost, i64(s.Backlog.Samples), lostBacklog)
	o.ObserveInt64(tb.RecordsMalformed, i64(s.RecordsMalformed))
	for c := range profiler.NumStackOutcomes {
		for fp := range 2 {
			if c == profiler.StackNone && fp == 1 {
				continue // never counted: no user stack, no fallback
			}
			o.ObserveInt64(tb.UnwindStacks, i64(s.Stacks[c][fp]), stackAttrs[c][fp])
		}
	}

	ls := s.Unwind
	o.ObserveInt64(tb.UnwindProcesses, int64(ls.Processes))
	o.ObserveInt64(tb.UnwindRequestsDropped, i64(s.Preparer.Dropped))
	o.ObserveInt64(tb.UnwindTableCount, int64(ls.Tables))
	o.ObserveInt64(tb.UnwindTableRows, ls.Rows)
	o.ObserveInt64(tb.UnwindTableSize, ls.Bytes)
	o.ObserveInt64(tb.UnwindTableBuilds, i64(ls.Built))
	o.ObserveInt64(tb.UnwindTableRefused, int64(ls.Refused))
	o.ObserveInt64(tb.UnwindTableRetried, i64(ls.Retried))
	o.ObserveInt64(tb.UnwindTableEvictions, i64(ls.Evicted))
	o.ObserveInt64(tb.UnwindTableFailures, i64(ls.NoCFI), tableNoCFI)
	o.ObserveInt64(tb.UnwindTableFailures, i64(ls.OverBudget), tableOverBudget)
	o.ObserveInt64(tb.UnwindTableFailures, i64(ls.Failures), tableError)
	o.ObserveInt64(tb.UnwindTableLazy, int64(ls.Lazy))
	rs := s.Resolver
	o.ObserveInt64(tb.UnwindSnapshots, i64(rs.SnapshotsWhole), snapshotWhole)
	o.ObserveInt64(tb.UnwindSnapshots, i64(rs.Snapshots-rs.SnapshotsWhole), snapshotCut)
	o.ObserveInt64(tb.UnwindSnapshots, i64(s.Kernel.SnapshotsSkipped), snapshotSkipped)

	o.ObserveInt64(tb.ProcessesTracked, int64(s.Processes))

	ss := s.Symbols
	o.ObserveInt64(tb.SymbolizeCacheRequests, i64(ss.Hits), cacheHit)
	o.ObserveInt64(tb.SymbolizeCacheRequests, i64(ss.Misses), cacheMiss)
	o.ObserveInt64(tb.SymbolizeCacheLoads, i64(ss.FilesLoaded))
	o.ObserveInt64(tb.SymbolizeCacheEvictions, i64(ss.FilesEvicted))
	o.ObserveInt64(tb.SymbolizeCacheSize, ss.LoadedBytes)
	o.ObserveInt64(tb.SymbolizeRefused, i64(ss.InflateRefused), refusedInflationCap)

	ps := s.Python
	o.ObserveInt64(tb.PythonProcesses, i64(ps.Processes), pySetupWalked)
	o.ObserveInt64(tb.PythonProcesses, i64(ps.Unsupported), pySetupUnsupported)
	o.ObserveInt64(tb.PythonProcesses, i64(ps.Failed), pySetupFailed)
	o.ObserveInt64(tb.PythonVersionsUnknown, i64(ps.UnknownVersions))
	o.ObserveInt64(tb.PythonFramesUnnamed, i64(ps.Unnamed))
	o.ObserveInt64(tb.PythonCodeCacheSize, ps.CacheBytes)
	o.ObserveInt64(tb.PythonCodeCacheResets, i64(ps.CacheResets))

	js := s.JVM
	o.ObserveInt64(tb.JvmProcesses, i64(js.Processes), jvmSetupWalked)
	o.ObserveInt64(tb.JvmProcesses, i64(js.Unsupported), jvmSetupUnsupported)
	o.ObserveInt64(tb.JvmProcesses, i64(js.Failed), jvmSetupFailed)
	o.ObserveInt64(tb.JvmVersionsUnknown, i64(js.UnknownVersions))
	o.ObserveInt64(tb.JvmFrames, i64(js.Named), jvmFrameNamed)
	o.ObserveInt64(tb.JvmFrames, i64(js.Stale), jvmFrameStale)
	o.ObserveInt64(tb.JvmFrames, i64(js.Unnamed-min(js.Unnamed, js.Stale)), jvmFrameUnreadable)
	o.ObserveInt64(tb.JvmCodeCacheSize, js.CacheBytes)
	o.ObserveInt64(tb.JvmCodeCacheEvictions, i64(js.CacheEvictions))
	o.ObserveInt64(tb.JvmCodeCacheLoads, i64(js.CacheLoads))

	vs := s.V8
	o.ObserveInt64(tb.V8Processes, i64(vs.Processes), v8SetupWalked)
	o.ObserveInt64(tb.V8Processes, i64(vs.Unsupported), v8SetupUnsupported)
	o.ObserveInt64(tb.V8Processes, i64(vs.Failed), v8SetupFailed)
	o.ObserveInt64(tb.V8VersionsUnknown, i64(vs.UnknownVersions))
	o.ObserveInt64(tb.V8Frames, i64(vs.Named), v8FrameNamed)
	o.ObserveInt64(tb.V8Frames, i64(vs.Stale), v8FrameStale)
	o.ObserveInt64(tb.V8Frames, i64(vs.Unnamed-min(vs.Unnamed, vs.Stale)), v8FrameUnreadable)
	o.ObserveInt64(tb.V8CodeCacheSize, vs.CacheBytes)
	o.ObserveInt64(tb.V8CodeCacheEvictions, i64(vs.CacheEvictions))

	hs := s.PHP
	o.ObserveInt64(tb.PhpProcesses, i64(hs.Processes), phpSetupWalked)
	o.ObserveInt64(tb.PhpProcesses, i64(hs.Unsupported), phpSetupUnsupported)
	o.ObserveInt64(tb.PhpProcesses, i64(hs.Failed), phpSetupFailed)
	o.ObserveInt64(tb.PhpVersionsUnknown, i64(hs.UnknownVersions))
	o.ObserveInt64(tb.PhpFrames, i64(hs.Named), phpFrameNamed)
	o.ObserveInt64(tb.PhpFrames, i64(hs.Stale), phpFrameStale)
	o.ObserveInt64(tb.PhpFrames, i64(hs.Unnamed-min(hs.Unnamed, hs.Stale)), phpFrameUnreadable)
	o.ObserveInt64(tb.PhpFunctionCacheSize, hs.CacheBytes)
	o.ObserveInt64(tb.PhpFunctionCacheEvictions, i64(hs.CacheEvictions))

	rb := s.Ruby
	o.ObserveInt64(tb.RubyProcesses, i64(rb.Processes), rbSetupWalked)
	o.ObserveInt64(tb.RubyProcesses, i64(rb.Unsupported), rbSetupUnsupported)
	o.ObserveInt64(tb.RubyProcesses, i64(rb.Failed), rbSetupFailed)
	o.ObserveInt64(tb.RubyVersionsUnknown, i64(rb.UnknownVersions))
	o.ObserveInt64(tb.RubyFrames, i64(rb.Named), rbFrameNamed)
	o.ObserveInt64(tb.RubyFrames, i64(rb.Stale), rbFrameStale)
	o.ObserveInt64(tb.RubyFrames, i64(rb.Unnamed-min(rb.Unnamed, rb.Stale)), rbFrameUnreadable)
	o.ObserveInt64(tb.RubyIseqCacheSize, rb.CacheBytes)
	o.ObserveInt64(tb.RubyIseqCacheEvictions, i64(rb.CacheEvictions))

	pl := s.Perl
	o.ObserveInt64(tb.PerlProcesses, i64(pl.Processes), perlSetupWalked)
	o.ObserveInt64(tb.PerlProcesses, i64(pl.Unsupported), perlSetupUnsupported)
	o.ObserveInt64(tb.PerlProcesses, i64(pl.Failed), perlSetupFailed)
	o.ObserveInt64(tb.PerlVersionsUnknown, i64(pl.UnknownVersions))
	o.ObserveInt64(tb.PerlFrames, i64(pl.Named), perlFrameNamed)
	o.ObserveInt64(tb.PerlFrames, i64(pl.Stale), perlFrameStale)
	o.ObserveInt64(tb.PerlFrames, i64(pl.Unnamed-min(pl.Unnamed, pl.Stale)), perlFrameUnreadable)
	o.ObserveInt64(tb.PerlSubCacheSize, pl.CacheBytes)
	o.ObserveInt64(tb.PerlSubCacheEvictions, i64(pl.CacheEvictions))

	c := s.Kernel
	o.ObserveInt64(tb.PerlWalks, i64(c.PerlSamples))
	o.ObserveInt64(tb.PerlErrors, i64(c.PerlReadErrs), perlErrReadError)
	o.ObserveInt64(tb.PerlErrors, i64(c.PerlBadFrames), perlErrBadFrame)
	o.ObserveInt64(tb.RubyWalks, i64(c.RubySamples))
	o.ObserveInt64(tb.RubyErrors, i64(c.RubyReadErrs), rbErrReadError)
	o.ObserveInt64(tb.RubyErrors, i64(c.RubyBadFrames), rbErrBadFrame)
	o.ObserveInt64(tb.RubyErrors, i64(c.RubyNoTable), rbErrNoTable)
	o.ObserveInt64(tb.PhpWalks, i64(c.PHPSamples))
	o.ObserveInt64(tb.PhpErrors, i64(c.PHPReadErrs), phpErrReadError)
	o.ObserveInt64(tb.PhpErrors, i64(c.PHPBadFrames), phpErrBadFrame)
	o.ObserveInt64(tb.V8Walks, i64(c.V8Samples))
	o.ObserveInt64(tb.V8Errors, i64(c.V8ReadErrs), v8ErrReadError)
	o.ObserveInt64(tb.V8Errors, i64(c.V8NotJS), v8ErrNotJS)
	o.ObserveInt64(tb.JvmWalks, i64(c.JVMSamples))
	o.ObserveInt64(tb.JvmErrors, i64(c.JVMNoBlob), jvmErrNoBlob)
	o.ObserveInt64(tb.JvmErrors, i64(c.JVMReadErrs), jvmErrReadError)
	o.ObserveInt64(tb.PythonWalks, i64(c.PythonSamples))
	o.ObserveInt64(tb.PythonFrames, i64(c.PythonFrames))
	o.ObserveInt64(tb.PythonErrors, i64(c.PythonNoThread), pyErrNoThread)
	o.ObserveInt64(tb.PythonErrors, i64(c.PythonReadErrs), pyErrReadError)
	o.ObserveInt64(tb.PythonErrors, i64(c.PythonBadFrames), pyErrBadFrame)
	o.ObserveInt64(tb.SamplesLost, i64(c.SamplesLost), lostRingBuffer)
	o.ObserveInt64(tb.SamplesSkipped, i64(c.IdleSkipped), skippedIdle)
	o.ObserveInt64(tb.SamplesSkipped, i64(c.KernelThreads), skippedKThread)
	o.ObserveInt64(tb.SamplesSkipped, i64(c.Filtered), skippedKernel)
	o.ObserveInt64(tb.SamplesSkipped, i64(s.FilteredInUser), skippedUser)
	o.ObserveInt64(tb.SamplesSkipped, i64(s.WarmUp), skippedWarmUp)
	o.ObserveInt64(tb.UnwindMappingsStale, i64(c.StaleMappings))
	if s.OffCPUEnabled {
		j := s.OffCPU
		o.ObserveInt64(tb.OffcpuWaits, i64(j.Samples), offCPUSampled)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUShortWaits), offCPUShort)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUFiltered), offCPUFiltered)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUStartsLost+c.OffCPUEndsLost), offCPURingFull)
		o.ObserveInt64(tb.OffcpuWaits, i64(c.OffCPUMapFull), offCPUMapFull)
		o.ObserveInt64(tb.OffcpuWaits, i64(j.Expired), offCPUExpired)
		o.ObserveInt64(tb.OffcpuWaits, i64(j.Evicted), offCPUEvicted)
		o.ObserveInt64(tb.OffcpuWaits, i64(j.OrphanEnds), offCPUOrphanEnd)
	}
	o.ObserveInt64(tb.RecordsLost, i64(c.TaskEventsLost), recordsExecExit)
	o.ObserveInt64(tb.RecordsLost, i64(c.UnknownLost), recordsUnknown)
	o.ObserveInt64(tb.UnwindErrors, i64(c.UnknownRule), unwindUnknownRule)
	o.ObserveInt64(tb.UnwindErrors, i64(c.ReadErrors), unwindReadError)
	o.ObserveInt64(tb.UnwindErrors, i64(c.TailCallErrors), unwindTailCall)
	o.ObserveInt64(tb.UnwindErrors, i64(c.KernelStackErrs), unwindKernelStack)
	o.ObserveInt64(tb.UnwindErrors, i64(s.Resolver.FPOutsideCode), unwindFPOutside)
	o.ObserveInt64(tb.UnwindFrames, i64(c.FramesCFI), framesCFI)
	o.ObserveInt64(tb.UnwindFrames, i64(c.FramesFP), framesFP)
}
