// Package profilemetricsconnector is a Collector connector (type
// "profilemetrics") from a profiles pipeline to a metrics pipeline. It counts
// what the profiles hold: on-CPU samples and CPU time by resource
// (process.executable.name, service.name, container.id by default) and leaf
// frame type, samples by every frame type on the stack, off-CPU time, and
// the hottest functions as a bounded top N. The sums are cumulative, so the
// prometheus exporter (or any metrics exporter) takes them as counters.
//
// contrib's signaltometrics connector takes profiles, but keys only on
// resource and sample attributes: frame types are location attributes and
// function names live in the dictionary, so neither the frame-type nor the
// function metrics can be expressed with it (and v0.159.0 of it is not
// served by the module proxy).
//
// The factory is stateless. Each connector it creates owns its series;
// ConsumeProfiles is safe for concurrent use.
//
//go:generate go tool mdatagen metadata.yaml
package profilemetricsconnector
