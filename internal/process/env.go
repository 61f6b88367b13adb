package process

import (
	"bytes"
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
)

// parseEnviron returns the variables named in want from the NUL-separated
// environment block data, plus the service name the environment declares.
// env is nil when none of want is set.
func parseEnviron(data []byte, want map[string]bool) (env map[string]string, service string) {
	var svcName, resAttrs string
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
		name := kv[:eq]
		switch string(name) {
		case envServiceName:
			svcName = string(kv[eq+1:])
		case envResourceAttributes:
			resAttrs = string(kv[eq+1:])
		}
		if want[string(name)] {
			if env == nil {
				env = make(map[string]string, len(want))
			}
			env[string(name)] = string(kv[eq+1:])
		}
	}
	if svcName != "" {
		return env, svcName
	}
	return env, serviceFromResourceAttributes(resAttrs)
}

// serviceFromResourceAttributes returns service.name from the value of
// OTEL_RESOURCE_ATTRIBUTES ("key1=value1,key2=value2", values
// percent-encoded), or "".
func serviceFromResourceAttributes(s string) string {
	for pair := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(k) != "service.name" {
			continue
		}
		v = strings.TrimSpace(v)
		if dec, err := url.PathUnescape(v); err == nil {
			v = dec
		}
		return v
	}
	return ""
}
