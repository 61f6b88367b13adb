// Package bench measures the receiver's cost on this host: agent CPU, peak
// RSS, start-up time and the slowdown of CPU-bound work, while CPU-bound
// workloads run (`make bench`), and the agent under scale and churn: many
// processes, an exec storm, a huge binary, 1000 Hz sampling, with the
// memory it holds against its limits (`make bench-scale`). It has no code
// of its own outside tests.
package bench
