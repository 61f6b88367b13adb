// Package bench measures the receiver's cost on this host: agent CPU, peak
// RSS, start-up time and the slowdown of CPU-bound work, while CPU-bound
// workloads run. It has no code of its own outside tests; run `make bench`.
package bench
