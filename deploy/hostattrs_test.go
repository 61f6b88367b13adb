package deploy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"go.yaml.in/yaml/v3"
)

// hostProcessors are the processors of config/agent.yaml (and of the
// chart's hostAttributes) that stand for resource_detection's env and
// system detectors.
var hostProcessors = []string{"transform/otel_resource_attributes", "resource/host"}

// TestHostAttributes runs the built distribution with the host-attribute
// processors of config/agent.yaml between an OTLP receiver and a file
// exporter, sends it profiles and reads their resources back: host.name
// from K8S_NODE_NAME, os.type linux and the pairs of
// OTEL_RESOURCE_ATTRIBUTES are inserted, the environment's pairs win over
// the node's, and a value a profile already carries wins over both.
func TestHostAttributes(t *testing.T) {
	bin := os.Getenv("SONDE_OTELCOL")
	if bin == "" {
		t.Skip("SONDE_OTELCOL not set: needs the built distribution (make chart-test sets it)")
	}
	b, err := os.ReadFile(filepath.Join("..", "config", "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var agent map[string]any
	if err := yaml.Unmarshal(b, &agent); err != nil {
		t.Fatal(err)
	}
	processors := map[string]any{}
	for _, p := range hostProcessors {
		processors[p] = lookup(t, agent, "processors", p)
	}
	if diff := cmp.Diff(hostProcessors, pipelineProcessors(t, agent, hostProcessors)); diff != "" {
		t.Fatalf("config/agent.yaml runs the host processors out of order (-want +got):\n%s", diff)
	}

	// The first resource carries nothing the processors set; the second
	// carries host.name and k8s.cluster.name already.
	bare := map[string]any{"process.pid": int64(42)}
	own := map[string]any{"process.pid": int64(43), "host.name": "own-host", "k8s.cluster.name": "own"}
	tests := []struct {
		name    string
		env     []string
		wantAll []map[string]any
	}{
		{
			name: "node only",
			env:  []string{"K8S_NODE_NAME=node-1"},
			wantAll: []map[string]any{
				{"process.pid": int64(42), "host.name": "node-1", "os.type": "linux"},
				{"process.pid": int64(43), "host.name": "own-host", "k8s.cluster.name": "own", "os.type": "linux"},
			},
		},
		{
			name: "OTEL_RESOURCE_ATTRIBUTES",
			env: []string{"K8S_NODE_NAME=node-1",
				"OTEL_RESOURCE_ATTRIBUTES=k8s.cluster.name=c1, deployment.environment.name=prod ,os.type=from-env,process.pid=7"},
			wantAll: []map[string]any{
				{"process.pid": int64(42), "host.name": "node-1", "os.type": "from-env",
					"k8s.cluster.name": "c1", "deployment.environment.name": "prod"},
				{"process.pid": int64(43), "host.name": "own-host", "k8s.cluster.name": "own", "os.type": "from-env",
					"deployment.environment.name": "prod"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "profiles.json")
			port := freePort(t)
			config := map[string]any{
				"receivers": map[string]any{"otlp": map[string]any{"protocols": map[string]any{
					"http": map[string]any{"endpoint": fmt.Sprintf("127.0.0.1:%d", port)}}}},
				"processors": processors,
				"exporters":  map[string]any{"file": map[string]any{"path": out}},
				"service": map[string]any{
					"telemetry": map[string]any{"metrics": map[string]any{"level": "none"}},
					"pipelines": map[string]any{"profiles": map[string]any{
						"receivers": []any{"otlp"}, "processors": hostProcessors, "exporters": []any{"file"}}},
				},
			}
			startDistribution(t, bin, dir, config, tt.env)

			sent := pprofile.NewProfiles()
			// Index 0 of each table is the empty entry.
			sent.Dictionary().StringTable().Append("", "samples", "count")
			sent.Dictionary().StackTable().AppendEmpty()
			for _, attrs := range []map[string]any{bare, own} {
				rp := sent.ResourceProfiles().AppendEmpty()
				if err := rp.Resource().Attributes().FromRaw(attrs); err != nil {
					t.Fatal(err)
				}
				prof := rp.ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
				prof.SampleType().SetTypeStrindex(1)
				prof.SampleType().SetUnitStrindex(2)
				prof.SetTime(pcommon.NewTimestampFromTime(time.Now()))
				prof.Samples().AppendEmpty().Values().Append(1)
			}
			send(t, port, sent)

			got := readResources(t, out, len(tt.wantAll))
			if diff := cmp.Diff(tt.wantAll, got); diff != "" {
				t.Errorf("resources after the host processors (-want +got):\n%s", diff)
			}
		})
	}
}

// pipelineProcessors is the profiles pipeline's processors of doc among
// names, in the pipeline's order.
func pipelineProcessors(t *testing.T, doc map[string]any, names []string) []string {
	t.Helper()
	var got []string
	for _, p := range lookup(t, doc, "service", "pipelines", "profiles", "processors").([]any) {
		for _, n := range names {
			if p == n {
				got = append(got, n)
			}
		}
	}
	return got
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// startDistribution runs bin with config and env until the test ends.
func startDistribution(t *testing.T, bin, dir string, config map[string]any, env []string) {
	t.Helper()
	text, err := yaml.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, text, 0o600); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "--config", path, "--feature-gates=service.profilesSupport")
	// Only env sets what the processors read.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_RESOURCE_ATTRIBUTES=") && !strings.HasPrefix(kv, "K8S_NODE_NAME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: %v\n%s", bin, err, log.String())
		}
		if t.Failed() {
			t.Logf("config:\n%s\nlog:\n%s", text, log.String())
		}
	})
}

// send posts profiles to the OTLP/HTTP receiver on port, retrying until it
// accepts them or a deadline passes (the Collector is starting).
func send(t *testing.T, port int, p pprofile.Profiles) {
	t.Helper()
	body, err := pprofileotlp.NewExportRequestFromProfiles(p).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/v1development/profiles", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-protobuf")
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("send profiles to %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readResources polls the file exporter's output until it holds n
// resources, and returns their attributes.
func readResources(t *testing.T, path string, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got []map[string]any
		if b, err := os.ReadFile(path); err == nil {
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(nil, 16<<20)
			for sc.Scan() {
				line := strings.TrimSpace(sc.Text())
				if line == "" {
					continue
				}
				p, err := (&pprofile.JSONUnmarshaler{}).UnmarshalProfiles([]byte(line))
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				for i := range p.ResourceProfiles().Len() {
					got = append(got, p.ResourceProfiles().At(i).Resource().Attributes().AsRaw())
				}
			}
		}
		if len(got) >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(100 * time.Millisecond)
	}
}
