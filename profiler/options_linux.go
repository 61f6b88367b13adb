package profiler

import "github.com/sonde-dev/sonde/internal/python"

// pythonLayoutFunc is the type of Options.pythonLayouts.
type pythonLayoutFunc = python.LayoutFunc
