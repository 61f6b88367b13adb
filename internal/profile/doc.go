// Package profile aggregates the samples of one reporting interval and builds
// the OTLP profiles (pprofile.Profiles) that Sonde hands to the Collector.
//
// A Builder receives fully named samples (one per sample event) from the
// tracer, deduplicates every dictionary entry by content while the interval
// runs, and on Flush writes one self-contained pprofile.Profiles: one
// ResourceProfiles per process, one ScopeProfiles per resource and one Profile
// per sample Kind (on-CPU, off-CPU) that occurred in that process.
//
// Values and timestamps: OTLP profiles allow a sample to carry timestamps
// only, an aggregated value only, or one value per timestamp (both lists of
// equal length, element i of each describing the same event). The builder
// always writes the third shape for every kind, so a consumer that only sums
// Values and a consumer that only reads TimestampsUnixNano both see the right
// answer, and on-CPU and off-CPU profiles have the same shape. An on-CPU
// sample event contributes the value 1, an off-CPU event its nanoseconds.
// Within a sample the events keep the order in which they were added.
package profile
