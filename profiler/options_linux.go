package profiler

import (
	"github.com/sonde-dev/sonde/internal/perl"
	"github.com/sonde-dev/sonde/internal/php"
	"github.com/sonde-dev/sonde/internal/process"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/ruby"
	"github.com/sonde-dev/sonde/internal/v8"
)

// pythonLayoutFunc is the type of Options.pythonLayouts.
type pythonLayoutFunc = python.LayoutFunc

// phpLayoutFunc is the type of Options.phpLayouts.
type phpLayoutFunc = php.LayoutFunc

// perlLayoutFunc is the type of Options.perlLayouts.
type perlLayoutFunc = perl.LayoutFunc

// rubyLayoutFunc is the type of Options.rubyLayouts.
type rubyLayoutFunc = ruby.LayoutFunc

// v8FindFunc is the type of Options.v8Find.
type v8FindFunc = func(*process.Process, v8.Memory) (*v8.VM, error)
