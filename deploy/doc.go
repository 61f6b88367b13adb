// Package deploy holds what runs Sonde on a cluster: the Helm chart in
// helm/sonde (a DaemonSet of otelcol-profiling) and, in its tests, the checks
// that the chart renders to valid Kubernetes objects with the minimal
// privileges and a Collector configuration the distribution accepts.
package deploy
