// Package dist holds the end-to-end tests of otelcol-profiling, the Collector
// distribution that builder-config.yaml describes. It has no code of its own:
// the tests build the distribution with the Collector Builder (or take a
// prebuilt binary from $SONDE_OTELCOL) and run it as a user would.
package dist
