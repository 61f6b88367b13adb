package profiler

import (
	"github.com/sonde-dev/sonde/internal/perl"
	"github.com/sonde-dev/sonde/internal/php"
	"github.com/sonde-dev/sonde/internal/python"
	"github.com/sonde-dev/sonde/internal/ruby"
)

// pythonLayoutFunc is the type of Options.pythonLayouts.
type pythonLayoutFunc = python.LayoutFunc

// phpLayoutFunc is the type of Options.phpLayouts.

// perlLayoutFunc is the type of Options.perlLayouts.
type perlLayoutFunc = perl.LayoutFunc
type phpLayoutFunc = php.LayoutFunc

// rubyLayoutFunc is the type of Options.rubyLayouts.
type rubyLayoutFunc = ruby.LayoutFunc
