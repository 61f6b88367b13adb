// Package collector is the Sonde receiver for the OpenTelemetry Collector.
//
// The receiver (type "sonde") samples every thread on a Linux host with eBPF,
// unwinds and names kernel, native and Go frames on the host, and hands one
// pprofile.Profiles per reporter interval to the next consumer of a profiles
// pipeline. NewFactory is the only entry point a distribution needs; Config
// holds the settings users write under the "sonde" key.
//
// The receiver adapts package profiler, the profiler core: Config maps to
// profiler.Options, each interval the profiler emits goes to the next
// consumer, and the receiver's telemetry reads profiler.Stats.
//
// The receiver runs on Linux only. On other systems the package builds, so a
// distribution that includes it builds there too, and Start returns an
// error that says so.
//
// The factory is stateless and safe for concurrent use. Each CreateProfiles
// call returns an independent receiver; nothing is shared through package state.
//
//go:generate go tool mdatagen metadata.yaml
package collector
