package profile

import (
	"testing"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Every attribute name of the output contract is the one of the semantic
// conventions SchemaURL names; Sonde's own are prefixed sonde.
func TestAttributeNamesMatchSchema(t *testing.T) {
	for _, tc := range []struct{ ours, theirs string }{
		{attrPID, string(semconv.ProcessPIDKey)},
		{attrExeName, string(semconv.ProcessExecutableNameKey)},
		{attrExePath, string(semconv.ProcessExecutablePathKey)},
		{attrContainerID, string(semconv.ContainerIDKey)},
		{attrServiceName, string(semconv.ServiceNameKey)},
		{attrEnvVarPrefix + "X", string(semconv.ProcessEnvironmentVariable("X", "").Key)},
		{attrCommandLine, string(semconv.ProcessCommandLineKey)},
		{attrThreadID, string(semconv.ThreadIDKey)},
		{attrThreadName, string(semconv.ThreadNameKey)},
		{attrCPU, string(semconv.CPULogicalNumberKey)},
		{attrFrameType, string(semconv.ProfileFrameTypeKey)},
		{attrBuildIDGNU, string(semconv.ProcessExecutableBuildIDGNUKey)},
		{attrBuildIDGo, string(semconv.ProcessExecutableBuildIDGoKey)},
		{attrFileID, string(semconv.ProcessExecutableBuildIDHtlhashKey)},
		{FrameKernel.String(), semconv.ProfileFrameTypeKernel.Value.AsString()},
		{FrameNative.String(), semconv.ProfileFrameTypeNative.Value.AsString()},
		{FrameGo.String(), semconv.ProfileFrameTypeGo.Value.AsString()},
		{FrameRust.String(), semconv.ProfileFrameTypeRust.Value.AsString()},
		{FrameJVM.String(), semconv.ProfileFrameTypeJVM.Value.AsString()},
		{FrameV8JS.String(), semconv.ProfileFrameTypeV8JS.Value.AsString()},
		{FramePHP.String(), semconv.ProfileFrameTypePHP.Value.AsString()},
		{FramePerl.String(), semconv.ProfileFrameTypePerl.Value.AsString()},
		{FrameRuby.String(), semconv.ProfileFrameTypeRuby.Value.AsString()},
	} {
		if tc.ours != tc.theirs {
			t.Errorf("we write %q, %s says %q", tc.ours, SchemaURL, tc.theirs)
		}
	}
}
