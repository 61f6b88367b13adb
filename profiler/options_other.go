//go:build !linux

package profiler

// pythonLayoutFunc is the type of Options.pythonLayouts, which only the
// Linux pipeline reads: internal/python is Linux only.
type pythonLayoutFunc = func()

// phpLayoutFunc is the type of Options.phpLayouts, which only the Linux
// pipeline reads.
type phpLayoutFunc = func()

// perlLayoutFunc is the type of Options.perlLayouts, which only the Linux
// pipeline reads.
type perlLayoutFunc = func()

// rubyLayoutFunc is the type of Options.rubyLayouts, which only the Linux
// pipeline reads.
type rubyLayoutFunc = func()

// v8FindFunc is the type of Options.v8Find, which only the Linux pipeline
// reads.
type v8FindFunc = func()
