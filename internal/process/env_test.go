package process

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

func TestParseEnviron(t *testing.T) {
	want := map[string]bool{"DEPLOY": true, "REGION": true}
	tests := []struct {
		name        string
		in          string
		wantEnv     map[string]string
		wantService string
		wantBad     bool
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
			name:        "OTEL_SERVICE_NAME wins over resource attributes, in either order",
			in:          "OTEL_RESOURCE_ATTRIBUTES=service.name=b\x00OTEL_SERVICE_NAME=a",
			wantService: "a",
		},
		{
			name:        "OTEL_SERVICE_NAME wins even over malformed resource attributes",
			in:          "OTEL_SERVICE_NAME=a\x00OTEL_RESOURCE_ATTRIBUTES=service.name=100%",
			wantService: "a",
		},
		{
			name:        "empty OTEL_SERVICE_NAME counts as unset",
			in:          "OTEL_SERVICE_NAME=\x00OTEL_RESOURCE_ATTRIBUTES=service.name=b",
			wantService: "b",
		},
		{
			name:        "a name set twice keeps its first value, as getenv does",
			in:          "OTEL_SERVICE_NAME=first\x00DEPLOY=1\x00OTEL_SERVICE_NAME=second\x00DEPLOY=2\x00",
			wantEnv:     map[string]string{"DEPLOY": "1"},
			wantService: "first",
		},
		{
			name:        "first OTEL_RESOURCE_ATTRIBUTES is the one used",
			in:          "OTEL_RESOURCE_ATTRIBUTES=service.name=first\x00OTEL_RESOURCE_ATTRIBUTES=service.name=second",
			wantService: "first",
		},
		{
			name:    "bad percent encoding discards the whole value",
			in:      "OTEL_RESOURCE_ATTRIBUTES=service.name=100%\x00",
			wantBad: true,
		},
		{
			name:    "a member without '=' discards the whole value",
			in:      "OTEL_RESOURCE_ATTRIBUTES=service.name=a,oops\x00",
			wantBad: true,
		},
		{
			name:        "variable names are case-sensitive",
			in:          "otel_service_name=x\x00deploy=y\x00",
			wantService: "",
		},
		{
			name:        "invalid UTF-8 becomes U+FFFD",
			in:          "OTEL_SERVICE_NAME=a\xffb\x00DEPLOY=\xc3\x00",
			wantEnv:     map[string]string{"DEPLOY": "\uFFFD"},
			wantService: "a\uFFFDb",
		},
		{
			name:    "no terminator, no value, no name",
			in:      "DEPLOY\x00=x\x00REGION=eu",
			wantEnv: map[string]string{"REGION": "eu"},
		},
		{
			name:    "value containing '='",
			in:      "DEPLOY=a=b\x00",
			wantEnv: map[string]string{"DEPLOY": "a=b"},
		},
		{name: "empty", in: ""},
		{name: "only NULs", in: strings.Repeat("\x00", 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := parseEnviron([]byte(tt.in), want)
			if diff := cmp.Diff(tt.wantEnv, e.env); diff != "" {
				t.Errorf("env mismatch (-want +got):\n%s", diff)
			}
			if e.service != tt.wantService {
				t.Errorf("service = %q, want %q", e.service, tt.wantService)
			}
			if e.badResourceAttributes != tt.wantBad {
				t.Errorf("badResourceAttributes = %v, want %v", e.badResourceAttributes, tt.wantBad)
			}
		})
	}
}

func TestServiceFromResourceAttributes(t *testing.T) {
	tests := []struct {
		name, in, want string
		wantErr        bool
	}{
		{name: "only service.name", in: "service.name=checkout", want: "checkout"},
		{name: "among others", in: "deployment.environment=prod,service.name=cart,team=a", want: "cart"},
		{name: "spaces around members, keys and values", in: " a = 1 ,  service.name =  cart  ", want: "cart"},
		{name: "percent-encoded comma, equals and space", in: "service.name=a%2Cb%3Dc%20d", want: "a,b=c d"},
		{name: "percent-encoded UTF-8", in: "service.name=caf%C3%A9", want: "café"},
		{name: "plus is not a space", in: "service.name=a+b", want: "a+b"},
		{name: "percent-encoded key", in: "service%2Ename=x", want: "x"},
		{name: "last of two service.name wins", in: "service.name=a,service.name=b", want: "b"},
		{name: "empty value", in: "service.name=", want: ""},
		{name: "value with '='", in: "service.name=a=b", want: "a=b"},
		{name: "trailing comma tolerated", in: "service.name=a,", want: "a"},
		{name: "empty members tolerated", in: ",, service.name=a ,,", want: "a"},
		{name: "no service.name", in: "a=b,c=d", want: ""},
		{name: "similar keys are not service.name", in: "service.namespace=a,my.service.name=b,Service.Name=c", want: ""},
		{name: "empty", in: "", want: ""},

		{name: "member without '='", in: "service.name=a,b", wantErr: true},
		{name: "empty key", in: "service.name=a,=b", wantErr: true},
		{name: "spaces-only key", in: "  =b,service.name=a", wantErr: true},
		{name: "bad escape in value", in: "service.name=%zz", wantErr: true},
		{name: "truncated escape in another value", in: "service.name=a,x=%4", wantErr: true},
		{name: "bad escape in key", in: "service.name=a,k%g=1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := serviceFromResourceAttributes(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("serviceFromResourceAttributes(%q) error = %v, want error: %v", tt.in, err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, errResourceAttributes) {
					t.Errorf("error %v does not match errResourceAttributes", err)
				}
				if got != "" {
					t.Errorf("serviceFromResourceAttributes(%q) = %q with an error, want \"\" (value discarded)", tt.in, got)
				}
				return
			}
			if got != tt.want {
				t.Errorf("serviceFromResourceAttributes(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// FuzzParseEnviron checks parseEnviron on arbitrary environment blocks
// against properties stated without its code: only wanted names come out,
// every string is valid UTF-8, and a non-empty first OTEL_SERVICE_NAME is
// the service.
func FuzzParseEnviron(f *testing.F) {
	f.Add([]byte("PATH=/bin\x00OTEL_SERVICE_NAME=checkout\x00DEPLOY=blue\x00"))
	f.Add([]byte("OTEL_RESOURCE_ATTRIBUTES=a=1,service.name=x%20y\x00DEPLOY=\xff"))
	f.Add([]byte("OTEL_RESOURCE_ATTRIBUTES=service.name=%\x00=\x00\x00DEPLOY"))
	want := map[string]bool{"DEPLOY": true, "OTEL_SERVICE_NAME": true}
	f.Fuzz(func(t *testing.T, data []byte) {
		e := parseEnviron(data, want)
		for k, v := range e.env {
			if !want[k] || !utf8.ValidString(v) {
				t.Fatalf("env %q=%q: not wanted or not valid UTF-8", k, v)
			}
		}
		if !utf8.ValidString(e.service) {
			t.Fatalf("service %q is not valid UTF-8", e.service)
		}
		for kv := range strings.SplitSeq(string(data), "\x00") {
			if v, ok := strings.CutPrefix(kv, envServiceName+"="); ok {
				if v != "" && e.service != strings.ToValidUTF8(v, "\uFFFD") {
					t.Fatalf("service = %q, want the first OTEL_SERVICE_NAME %q", e.service, v)
				}
				if e.env[envServiceName] != strings.ToValidUTF8(v, "\uFFFD") {
					t.Fatalf("env[%s] = %q, want the first value %q", envServiceName, e.env[envServiceName], v)
				}
				break
			}
		}
	})
}

// FuzzServiceFromResourceAttributes checks that any service name survives
// percent-encoding among other members, and that arbitrary input never
// panics and yields a name only when it mentions service.name somehow.
func FuzzServiceFromResourceAttributes(f *testing.F) {
	f.Add("checkout", "service.name=a,b")
	f.Add("a,b=c d%", "x=%zz")
	f.Add("", "service%2Ename=x")
	f.Fuzz(func(t *testing.T, name, raw string) {
		in := "team=a, service.name = " + url.PathEscape(name) + " ,x=" + url.QueryEscape(raw)
		got, err := serviceFromResourceAttributes(in)
		if err != nil || got != name {
			t.Fatalf("serviceFromResourceAttributes(%q) = %q, %v; want %q", in, got, err, name)
		}

		got, err = serviceFromResourceAttributes(raw)
		if err != nil && got != "" {
			t.Fatalf("serviceFromResourceAttributes(%q) = %q with error %v, want the value discarded", raw, got, err)
		}
		if got != "" && !strings.Contains(raw, "service") && !strings.Contains(raw, "%") {
			t.Fatalf("serviceFromResourceAttributes(%q) = %q from input without a service.name key", raw, got)
		}
	})
}
