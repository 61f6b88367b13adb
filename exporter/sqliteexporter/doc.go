// Package sqliteexporter is a Collector exporter (type "sqlite") that writes
// the profiles a pipeline carries into a SQLite database, through a pure-Go
// driver (modernc.org/sqlite, no cgo), in a schema a person queries with
// sqlite3: intervals, samples, stacks, frames, functions and resources, with
// time as a column.
//
// Each export is one interval written in one transaction, in WAL mode with
// full synchronization: a crash mid-write loses at most the interval being
// written, and a failed write (a full disk) is rolled back and counted,
// leaving every committed interval intact. Retention deletes the oldest
// intervals by age and by database size.
//
// The factory is stateless. Each exporter it creates owns its database
// connection; ConsumeProfiles is safe for concurrent use.
//
//go:generate go tool mdatagen metadata.yaml
package sqliteexporter
