package profiler

import (
	"github.com/sonde-dev/sonde/internal/perl"
	"github.com/sonde-dev/sonde/internal/php"
	"github.com/sonde-dev/sonde/internal/python"
)

// pythonLayoutFunc is the type of Options.pythonLayouts.
type pythonLayoutFunc = python.LayoutFunc

// phpLayoutFunc is the type of Options.phpLayouts.
type phpLayoutFunc = php.LayoutFunc

// perlLayoutFunc is the type of Options.perlLayouts.
type perlLayoutFunc = perl.LayoutFunc
