package process

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseEnviron(t *testing.T) {
	want := map[string]bool{"DEPLOY": true, "REGION": true}
	tests := []struct {
		name        string
		in          string
		wantEnv     map[string]string
		wantService string
	}{
		{
			name:        "service name and wanted variables",
			in:          "PATH=/bin\x00OTEL_SERVICE_NAME=checkout\x00DEPLOY=blue\x00REGION=\x00",
			wantEnv:     map[string]string{"DEPLOY": "blue", "REGION": ""},
			wantService: "checkout",
		},
		{
			name:        "service from resource attributes, percent-decoded",
			in:          "OTEL_RESOURCE_ATTRIBUTES=team=a, service.name=my%20svc ,x=y\x00",
			wantService: "my svc",
		},
		{
			name:        "OTEL_SERVICE_NAME wins over resource attributes",
			in:          "OTEL_RESOURCE_ATTRIBUTES=service.name=b\x00OTEL_SERVICE_NAME=a",
			wantService: "a",
		},
		{
			name:        "bad percent encoding kept as written",
			in:          "OTEL_RESOURCE_ATTRIBUTES=service.name=100%\x00",
			wantService: "100%",
		},
		{
			name:    "no terminator, no value, no name",
			in:      "DEPLOY\x00=x\x00REGION=eu",
			wantEnv: map[string]string{"REGION": "eu"},
		},
		{name: "empty", in: ""},
		{name: "only NULs", in: strings.Repeat("\x00", 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, svc := parseEnviron([]byte(tt.in), want)
			if diff := cmp.Diff(tt.wantEnv, env); diff != "" {
				t.Errorf("env mismatch (-want +got):\n%s", diff)
			}
			if svc != tt.wantService {
				t.Errorf("service = %q, want %q", svc, tt.wantService)
			}
		})
	}
}
