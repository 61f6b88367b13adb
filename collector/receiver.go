//go:build linux

package collector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/receiver"
	"go.uber.org/zap"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/profiler"
)

// profilesReceiver runs a profiler.Profiler between Start and Shutdown and
// hands each interval it emits to the next consumer. The profiler counts
// and logs a refused interval; the receiver keeps running.
type profilesReceiver struct {
	set  receiver.Settings
	cfg  *Config
	next xconsumer.Profiles
	log  *zap.Logger
	tel  *telemetry

	// beforeResolve, when set (by tests, before Start), becomes the
	// profiler's BeforeResolve: a slow resolver.
	beforeResolve func()

	prof    *profiler.Profiler
	cancel  context.CancelFunc
	runDone chan struct{} // closed when Run returns

	shutdownOnce sync.Once
}

func newProfilesReceiver(set receiver.Settings, cfg *Config, next xconsumer.Profiles) (*profilesReceiver, error) {
	tb, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return &profilesReceiver{set: set, cfg: cfg, next: next, log: set.Logger, tel: newTelemetry(tb)}, nil
}

// Start checks the host, loads and attaches the eBPF programs and starts the
// pipeline. It returns one error naming what the host lacks.
func (r *profilesReceiver) Start(_ context.Context, _ component.Host) error {
	started := time.Now()
	opts := r.cfg.options()
	opts.Logger = r.log
	opts.BeforeResolve = r.beforeResolve
	opts.TableLoaded = r.tel.tableLoaded
	p, err := profiler.New(opts)
	if err != nil {
		return fmt.Errorf("sonde receiver: %w", err)
	}
	if err := r.tel.register(p, metadata.Meter(r.set.TelemetrySettings)); err != nil {
		return errors.Join(fmt.Errorf("sonde receiver: %w", err), p.Close())
	}
	r.prof = p
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.runDone = make(chan struct{})
	go func() {
		defer close(r.runDone)
		if err := p.Run(ctx, r.next.ConsumeProfiles); err != nil {
			r.log.Warn("sonde profiler stopped with an error", zap.Error(err))
		}
	}()
	r.log.Info("sonde receiver started",
		zap.Int("cpus", p.CPUs()),
		zap.Int("samples_per_second", r.cfg.SamplesPerSecond),
		zap.Float64("off_cpu_threshold", r.cfg.OffCPUThreshold),
		zap.Duration("reporter_interval", r.cfg.ReporterInterval),
		zap.Duration("start_time", time.Since(started)))
	return nil
}

// shutdownGrace bounds how long Shutdown waits for the profiler to resolve
// what the ring buffer still holds and hand the last, partial interval to
// the next consumer.
const shutdownGrace = 2 * time.Second

// Shutdown stops sampling, lets the profiler hand over the last interval,
// and releases everything. It is idempotent and safe to call without Start.
// It waits at most shutdownGrace (or until ctx ends, if sooner); what was
// not handed over by then is counted in sonde.samples.lost, and a next
// consumer that ignores cancellation keeps the profiler's Run until it
// returns.
func (r *profilesReceiver) Shutdown(ctx context.Context) error {
	var err error
	r.shutdownOnce.Do(func() {
		if r.cancel != nil {
			r.cancel()
		}
		if r.prof != nil {
			grace := time.NewTimer(shutdownGrace)
			defer grace.Stop()
			select {
			case <-r.runDone:
			case <-grace.C:
				r.log.Warn("the last interval was not handed over in time; not waiting for it",
					zap.Duration("waited", shutdownGrace))
			case <-ctx.Done():
			}
			err = r.prof.Close()
		}
		err = errors.Join(err, r.tel.unregister())
	})
	return err
}
