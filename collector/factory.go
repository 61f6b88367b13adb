package collector

import (
	"context"
	"fmt"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/sonde-dev/sonde/collector/internal/metadata"
)

// NewFactory returns the factory of the sonde receiver. It supports the
// profiles signal only; the returned value also implements xreceiver.Factory.
func NewFactory() receiver.Factory {
	return xreceiver.NewFactory(
		metadata.Type,
		func() component.Config { return createDefaultConfig() },
		xreceiver.WithProfiles(createProfiles, metadata.ProfilesStability),
	)
}

func createProfiles(_ context.Context, set receiver.Settings, cfg component.Config, next xconsumer.Profiles) (xreceiver.Profiles, error) {
	c, ok := cfg.(*Config)
	if !ok {
		return nil, fmt.Errorf("sonde receiver: config has type %T, want *collector.Config", cfg)
	}
	r, err := newProfilesReceiver(set, c, next)
	if err != nil {
		// Return an untyped nil: a nil *profilesReceiver in the interface
		// would look like a receiver to the caller.
		return nil, fmt.Errorf("sonde receiver %s: %w", set.ID, err)
	}
	return r, nil
}
