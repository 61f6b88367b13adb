package pprofexporter

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

	"github.com/sonde-dev/sonde/exporter/pprofexporter/internal/metadata"
)

// NewFactory returns the factory of the pprof exporter. It supports the
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
		return nil, fmt.Errorf("pprof exporter: config has type %T, want *pprofexporter.Config", cfg)
	}
	e := newExporter(c, set.Logger, time.Now)
	return xexporterhelper.NewProfiles(ctx, set, cfg, e.consumeProfiles,
		exporterhelper.WithStart(e.start),
		exporterhelper.WithCapabilities(consumer.Capabilities{MutatesData: false}),
	)
}
