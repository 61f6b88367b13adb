// Package pprofexporter is a Collector exporter (type "pprof") that writes the
// profiles a pipeline carries as gzipped pprof files (profile.proto), the
// format `go tool pprof` and most profile viewers read, and optionally as
// folded stacks for flame graph tools.
//
// Each export becomes one file per group of ResourceProfiles: the whole
// export (split_by: none), or one group per service.name or
// process.executable.name. Files are written to a temporary name and renamed,
// so a reader never sees half a file; old files are removed by count and age.
//
// The factory is stateless. Each exporter it creates owns its directory's
// profile files; ConsumeProfiles is safe for concurrent use.
//
//go:generate go tool mdatagen metadata.yaml
package pprofexporter
