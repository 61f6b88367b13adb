// Package version holds the release version of Sonde's binaries and
// components, as written on every profile's scope.
package version

import (
	"runtime/debug"
	"sync"
)

// ModulePath is Sonde's Go module.
const ModulePath = "github.com/sonde-dev/sonde"

// Version is the release version. A release build sets it with
//
//	-ldflags "-X github.com/sonde-dev/sonde/internal/version.Version=x.y.z"
//
// Read it with Get, which falls back to the build information.
var Version string

// Get is the release version: Version when the linker set it, else this
// module's version as the Go toolchain recorded it in the binary: the main
// module's (a tag, or a pseudo-version from the VCS), or, in a
// distribution that imports Sonde, the required version of Sonde.
//
// The build information is parsed at the first call, not at start: it
// lists every module of the binary (in the distribution, 46 kB allocated
// in 660 allocations at each start, GODEBUG=inittrace=1), and a binary
// that links Sonde but runs no profiler never needs it.
func Get() string { return get() }

var get = sync.OnceValue(func() string {
	if Version != "" {
		return Version
	}
	return fromBuildInfo(debug.ReadBuildInfo())
})

// fromBuildInfo is Sonde's module version in bi, "devel" if none is known.
func fromBuildInfo(bi *debug.BuildInfo, ok bool) string {
	if !ok {
		return "devel"
	}
	if bi.Main.Path == ModulePath && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	for _, dep := range bi.Deps {
		if dep.Path != ModulePath {
			continue
		}
		if dep.Replace != nil && dep.Replace.Version != "" {
			return dep.Replace.Version
		}
		if dep.Version != "" && dep.Version != "(devel)" {
			return dep.Version
		}
	}
	return "devel"
}
