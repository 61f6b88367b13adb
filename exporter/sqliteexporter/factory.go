package sqliteexporter

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/exporterhelper"
	"go.opentelemetry.io/collector/exporter/exporterhelper/xexporterhelper"
	"go.opentelemetry.io/collector/exporter/xexporter"

	"github.com/sonde-dev/sonde/exporter/sqliteexporter/internal/metadata"
)

// NewFactory returns the factory of the SQLite exporter. It supports the
// profiles signal only; the returned value also implements xexporter.Factory.
func NewFactory() exporter.Factory {
	return xexporter.NewFactory(
		metadata.Type,
		func() component.Config { return createDefaultConfig() },
		xexporter.WithProfiles(createProfiles, metadata.ProfilesStability),
	)
}

func createProfiles(ctx context.Context, set exporter.Settings, cfg component.Config) (xexporter.Profiles, error) {
	c, ok := cfg.(*Config)
	if !ok {
		return nil, fmt.Errorf("sqlite exporter: config has type %T, want *sqliteexporter.Config", cfg)
	}
	tb, err := metadata.NewTelemetryBuilder(set.TelemetrySettings)
	if err != nil {
		return nil, fmt.Errorf("sqlite exporter: telemetry: %w", err)
	}
	e := newExporter(c, set.Logger, tb, time.Now)
	return xexporterhelper.NewProfiles(ctx, set, cfg, e.consumeProfiles,
		exporterhelper.WithStart(e.start),
		exporterhelper.WithShutdown(e.shutdown),
		exporterhelper.WithCapabilities(consumer.Capabilities{MutatesData: false}),
	)
}
