package collector_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sonde-dev/sonde/collector"
	"github.com/sonde-dev/sonde/collector/internal/metadata"
	"github.com/sonde-dev/sonde/internal/testutil"
)

// A consumer that fails costs one log line per interval and the profiles of
// that interval; the receiver keeps running and the next interval arrives.
func TestFailingConsumerIsLoggedAndReceiverKeepsRunning(t *testing.T) {
	testutil.RequirePrivileges(t, "the sonde receiver")
	const failures = 2
	var calls atomic.Int32
	delivered := make(chan pprofile.Profiles, 1)
	next, err := xconsumer.NewProfiles(func(_ context.Context, pd pprofile.Profiles) error {
		if calls.Add(1) <= failures {
			return errors.New("backend unavailable")
		}
		select {
		case delivered <- pd:
		default:
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	set := receivertest.NewNopSettings(metadata.Type)
	set.Logger = zap.New(core)
	f := collector.NewFactory().(xreceiver.Factory)
	cfg := f.CreateDefaultConfig().(*collector.Config)
	cfg.SamplesPerSecond = 99
	cfg.ReporterInterval = 200 * time.Millisecond
	rcv, err := f.CreateProfiles(context.Background(), set, cfg, next)
	if err != nil {
		t.Fatal(err)
	}
	if err := rcv.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rcv.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	testutil.StartWorkload(t, testutil.BuildWorkload(t, testutil.CChain))

	select {
	case pd := <-delivered:
		if pd.SampleCount() == 0 {
			t.Error("the interval after the failures holds no samples")
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no interval delivered after %d failures (%d calls)", failures, calls.Load())
	}
	if err := rcv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	refused := logs.FilterMessageSnippet("next consumer refused").All()
	if len(refused) != failures {
		t.Errorf("%d warnings about the consumer for %d failed intervals, want one each", len(refused), failures)
	}
}

func TestShutdownIsIdempotentAndSafeWithoutStart(t *testing.T) {
	f := collector.NewFactory().(xreceiver.Factory)
	next, _ := xconsumer.NewProfiles(func(context.Context, pprofile.Profiles) error { return nil })
	rcv, err := f.CreateProfiles(context.Background(), receivertest.NewNopSettings(metadata.Type), f.CreateDefaultConfig(), next)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := rcv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown without Start = %v", err)
		}
	}

	testutil.RequirePrivileges(t, "the sonde receiver")
	rcv, err = f.CreateProfiles(context.Background(), receivertest.NewNopSettings(metadata.Type), f.CreateDefaultConfig(), next)
	if err != nil {
		t.Fatal(err)
	}
	if err := rcv.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() {
		done <- rcv.Shutdown(context.Background())
		done <- rcv.Shutdown(context.Background())
	}()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Shutdown = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Shutdown did not return within 10s")
		}
	}
}
