package process

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// maxEnvironLen bounds a read of /proc/PID/environ. The initial environment
// can be megabytes in pathological cases; variables past the bound are not
// seen.
const maxEnvironLen = 256 << 10

// Environment variables that declare an OpenTelemetry service name.
const (
	envServiceName        = "OTEL_SERVICE_NAME"
	envResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
	attrServiceName       = "service.name"
)

// environ is what the table keeps of a process's initial environment.
type environ struct {
	// env holds the wanted variables that are set; nil when none is.
	env map[string]string
	// service is the declared service name, "" when none.
	service string
	// badResourceAttributes reports an OTEL_RESOURCE_ATTRIBUTES value that
	// could not be decoded and was discarded whole.
	badResourceAttributes bool
}

// parseEnviron reads the NUL-separated environment block data: the variables
// named in want, and the service name the environment declares, as an
// OpenTelemetry SDK started with it would: OTEL_SERVICE_NAME when set and not
// empty, else service.name from OTEL_RESOURCE_ATTRIBUTES.
//
// A name set twice takes its first value, as getenv(3) does. Values are made
// valid UTF-8 (invalid bytes become U+FFFD), since they end up as OTLP
// strings.
func parseEnviron(data []byte, want map[string]bool) environ {
	var (
		e                 environ
		svcName, resAttrs string
		haveSvc, haveRes  bool
	)
	for len(data) > 0 {
		var kv []byte
		if i := bytes.IndexByte(data, 0); i >= 0 {
			kv, data = data[:i], data[i+1:]
		} else {
			kv, data = data, nil
		}
		eq := bytes.IndexByte(kv, '=')
		if eq <= 0 {
			continue
		}
		name, value := kv[:eq], kv[eq+1:]
		switch {
		case !haveSvc && string(name) == envServiceName:
			svcName, haveSvc = string(value), true
		case !haveRes && string(name) == envResourceAttributes:
			resAttrs, haveRes = string(value), true
		}
		if want[string(name)] {
			if e.env == nil {
				e.env = make(map[string]string, len(want))
			}
			if _, dup := e.env[string(name)]; !dup {
				e.env[string(name)] = strings.ToValidUTF8(string(value), "\uFFFD")
			}
		}
	}
	if svcName != "" {
		e.service = strings.ToValidUTF8(svcName, "\uFFFD")
		return e
	}
	if resAttrs != "" {
		svc, err := serviceFromResourceAttributes(resAttrs)
		e.service = strings.ToValidUTF8(svc, "\uFFFD")
		e.badResourceAttributes = err != nil
	}
	return e
}

var errResourceAttributes = errors.New("malformed " + envResourceAttributes)

// serviceFromResourceAttributes returns service.name from the value of
// OTEL_RESOURCE_ATTRIBUTES, "" when it names none.
//
// The value is a list "key1=value1,key2=value2" in the W3C Baggage form
// without properties; keys and values are percent-encoded and trimmed of
// surrounding spaces. As the OpenTelemetry resource SDK specifies, a value
// that cannot be decoded (a member without '=', an empty key, a bad percent
// escape) is discarded whole: the error says why and the name is "". Empty
// members (a trailing comma) are tolerated. A key given twice takes its last
// value, as the SDKs' attribute sets do.
func serviceFromResourceAttributes(s string) (string, error) {
	service := ""
	for member := range strings.SplitSeq(s, ",") {
		if strings.TrimSpace(member) == "" {
			continue
		}
		k, v, ok := strings.Cut(member, "=")
		if !ok {
			return "", fmt.Errorf("%w: member %q has no '='", errResourceAttributes, member)
		}
		key, err := url.PathUnescape(strings.TrimSpace(k))
		if err != nil {
			return "", fmt.Errorf("%w: key %q: %w", errResourceAttributes, k, err)
		}
		if key == "" {
			return "", fmt.Errorf("%w: member %q has an empty key", errResourceAttributes, member)
		}
		value, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return "", fmt.Errorf("%w: value of %q: %w", errResourceAttributes, key, err)
		}
		if key == attrServiceName {
			service = value
		}
	}
	return service, nil
}
