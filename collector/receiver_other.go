//go:build !linux

package collector

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/receiver"
)

// errLinuxOnly is what Start returns where Sonde cannot run: it samples
// with eBPF, which only Linux has.
var errLinuxOnly = errors.New("sonde receiver: Linux only")

// profilesReceiver lets a distribution that includes the receiver build on
// other systems; it refuses to start there.
type profilesReceiver struct {
	set receiver.Settings
}

func newProfilesReceiver(set receiver.Settings, _ *Config, _ xconsumer.Profiles) (*profilesReceiver, error) {
	return &profilesReceiver{set: set}, nil
}

// Start returns an error that says Sonde runs on Linux only.
func (r *profilesReceiver) Start(context.Context, component.Host) error {
	return fmt.Errorf("%w (eBPF), not on %s", errLinuxOnly, runtime.GOOS)
}

// Shutdown has nothing to stop.
func (r *profilesReceiver) Shutdown(context.Context) error { return nil }
