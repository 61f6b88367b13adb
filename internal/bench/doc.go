// Package bench measures Sonde's cost. `make bench` (BenchmarkDist) runs the
// built distribution, as users run it, on an idle host, four CPU burners, a
// node-like host and busy Python processes, and reads the agent's figures
// from its Collector telemetry and from /proc; with REF_BIN set it also runs
// ../shared/reference/sidebyside beside it. `make bench-scale` runs the
// receiver under scale and churn (many processes, an exec storm, a huge
// binary, 1000 Hz) against its memory limits, and `make bench-micro` the
// receiver's overhead in a test binary. It has no code of its own outside
// tests.
package bench
