// Package version holds the release version of Sonde's binaries and
// components, as written on every profile's scope.
package version

import "runtime/debug"

// ModulePath is Sonde's Go module.
const ModulePath = "github.com/sonde-dev/sonde"

// Version is the release version. A release build sets it with
//
//	-ldflags "-X github.com/sonde-dev/sonde/internal/version.Version=x.y.z"
//
// Unset, it is this module's version as the Go toolchain recorded it in the
// binary: the main module's (a tag, or a pseudo-version from the VCS), or,
// in a distribution that imports Sonde, the required version of Sonde.
var Version string

func init() {
	if Version == "" {
		Version = fromBuildInfo(debug.ReadBuildInfo())
	}
}

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
