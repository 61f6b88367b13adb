package profilemetricsconnector

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/connector/xconnector"
	"go.opentelemetry.io/collector/consumer"

	"github.com/sonde-dev/sonde/connector/profilemetricsconnector/internal/metadata"
)

// NewFactory returns the factory of the profile metrics connector: profiles
// in, metrics out. The returned value also implements xconnector.Factory.
func NewFactory() connector.Factory {
	return xconnector.NewFactory(
		metadata.Type,
		func() component.Config { return createDefaultConfig() },
		xconnector.WithProfilesToMetrics(createProfilesToMetrics, metadata.ProfilesToMetricsStability),
	)
}

func createProfilesToMetrics(_ context.Context, set connector.Settings, cfg component.Config, next consumer.Metrics) (xconnector.Profiles, error) {
	c, ok := cfg.(*Config)
	if !ok {
		return nil, fmt.Errorf("profilemetrics connector: config has type %T, want *profilemetricsconnector.Config", cfg)
	}
	return newConnector(c, set.Logger, next, time.Now), nil
}
