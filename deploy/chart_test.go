package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	chartDir  = "helm/sonde"
	release   = "sonde"
	namespace = "observability"
)

// objects are the Kubernetes objects one rendering produced, by kind.
type objects struct {
	daemonSet      *appsv1.DaemonSet
	configMap      *corev1.ConfigMap
	serviceAccount *corev1.ServiceAccount
	clusterRole    *rbacv1.ClusterRole
	binding        *rbacv1.ClusterRoleBinding
	// collector is the Collector configuration in the ConfigMap, as text
	// and parsed.
	collectorText string
	collector     map[string]any
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return c
}

// render renders the chart as `helm install` would, with values merged over
// values.yaml and checked against values.schema.json.
func render(t *testing.T, c *chart.Chart, vals map[string]any) (map[string]string, error) {
	t.Helper()
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion("v1.31.0")
	if err != nil {
		t.Fatal(err)
	}
	caps.KubeVersion = *kv
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, IsInstall: true, Revision: 1,
	}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(c, rv)
}

// decode parses every rendered manifest strictly into its k8s.io/api type:
// a field the API does not know is an error, not silently dropped.
func decode(t *testing.T, files map[string]string) objects {
	t.Helper()
	var o objects
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for _, doc := range releaseutil.SplitManifests(files[name]) {
			var meta metav1.TypeMeta
			if err := sigsyaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if meta.Kind == "" {
				continue // a template that rendered to nothing but comments
			}
			var dst any
			switch meta.Kind {
			case "DaemonSet":
				o.daemonSet = new(appsv1.DaemonSet)
				dst = o.daemonSet
			case "ConfigMap":
				o.configMap = new(corev1.ConfigMap)
				dst = o.configMap
			case "ServiceAccount":
				o.serviceAccount = new(corev1.ServiceAccount)
				dst = o.serviceAccount
			case "ClusterRole":
				o.clusterRole = new(rbacv1.ClusterRole)
				dst = o.clusterRole
			case "ClusterRoleBinding":
				o.binding = new(rbacv1.ClusterRoleBinding)
				dst = o.binding
			default:
				t.Fatalf("%s: unexpected kind %s", name, meta.Kind)
			}
			if err := sigsyaml.UnmarshalStrict([]byte(doc), dst); err != nil {
				t.Fatalf("%s: strict decode of %s: %v\n%s", name, meta.Kind, err, doc)
			}
		}
	}
	if o.daemonSet == nil || o.configMap == nil {
		t.Fatalf("rendering lacks the DaemonSet or the ConfigMap: %v", names)
	}
	o.collectorText = o.configMap.Data["config.yaml"]
	if err := yaml.Unmarshal([]byte(o.collectorText), &o.collector); err != nil {
		t.Fatalf("collector config: %v\n%s", err, o.collectorText)
	}
	return o
}

// lookup walks a parsed YAML document by keys.
func lookup(t *testing.T, doc map[string]any, path ...string) any {
	t.Helper()
	var cur any = doc
	for _, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("collector config: %s is not a map", strings.Join(path, "."))
		}
		cur, ok = m[k]
		if !ok {
			t.Fatalf("collector config: no %s", strings.Join(path, "."))
		}
	}
	return cur
}

func TestRender(t *testing.T) {
	c := loadChart(t)
	minimal := []corev1.Capability{"BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"}
	tests := []struct {
		name           string
		vals           map[string]any
		wantPrivileged bool
		wantCaps       []corev1.Capability // nil when privileged
		wantProcessors []any
		wantRBAC       bool
		wantInsecure   bool
		wantHeaders    map[string]any
		wantImage      string
		wantSamples    int
		// wantOffCPU is the receiver's off_cpu_threshold and
		// off_cpu_min_duration, as the rendered YAML parses.
		wantOffCPU []any
		// wantFilters is the receiver's filters (nil: none rendered) and
		// filter_min_process_age.
		wantFilters map[string]any
		wantMinAge  string
	}{
		{
			name:           "defaults",
			vals:           map[string]any{"otlp": map[string]any{"endpoint": "collector.observability:4317"}},
			wantCaps:       minimal,
			wantProcessors: []any{"memory_limiter", "k8s_attributes", "resource_detection"},
			wantRBAC:       true,
			wantImage:      "ghcr.io/sonde-dev/otelcol-profiling:" + c.Metadata.AppVersion,
			wantSamples:    19,
			wantOffCPU:     []any{0, "0s"},
		},
		{
			name: "old kernel, extras, no kubernetes attributes",
			vals: map[string]any{
				"image": map[string]any{"tag": "9.9.9"},
				"otlp": map[string]any{
					"endpoint": "pyroscope:4317",
					"insecure": true,
					"headers":  map[string]any{"x-scope-orgid": "tenant-1", "authorization": "Bearer ${env:OTLP_TOKEN}"},
				},
				"profiling": map[string]any{"samplesPerSecond": 99, "reporterInterval": "10s",
					"offCPUThreshold": 0.05, "offCPUMinDuration": "1ms", "filterMinProcessAge": "30s",
					"filters": map[string]any{"containers": "only", "exclude_executables": []any{"pause"}}},
				"kernel":               map[string]any{"before511": true},
				"extraCapabilities":    []any{"SYSLOG"},
				"kubernetesAttributes": map[string]any{"enabled": false},
				"rbac":                 map[string]any{"create": false},
				"extraProcessors": []any{
					map[string]any{"name": "memory_limiter/second", "config": map[string]any{"check_interval": "2s", "limit_mib": 100}},
				},
				"extraEnv": []any{map[string]any{"name": "OTLP_TOKEN", "valueFrom": map[string]any{
					"secretKeyRef": map[string]any{"name": "otlp", "key": "token"}}}},
			},
			wantCaps:       append(slices.Clone(minimal), "SYS_RESOURCE", "SYSLOG"),
			wantProcessors: []any{"memory_limiter", "resource_detection", "memory_limiter/second"},
			wantInsecure:   true,
			wantHeaders:    map[string]any{"x-scope-orgid": "tenant-1", "authorization": "Bearer ${env:OTLP_TOKEN}"},
			wantImage:      "ghcr.io/sonde-dev/otelcol-profiling:9.9.9",
			wantSamples:    99,
			wantOffCPU:     []any{0.05, "1ms"},
			wantFilters:    map[string]any{"containers": "only", "exclude_executables": []any{"pause"}},
			wantMinAge:     "30s",
		},
		{
			name: "privileged",
			vals: map[string]any{
				"otlp":   map[string]any{"endpoint": "collector:4317"},
				"kernel": map[string]any{"privileged": true},
			},
			wantPrivileged: true,
			wantProcessors: []any{"memory_limiter", "k8s_attributes", "resource_detection"},
			wantRBAC:       true,
			wantImage:      "ghcr.io/sonde-dev/otelcol-profiling:" + c.Metadata.AppVersion,
			wantSamples:    19,
			wantOffCPU:     []any{0, "0s"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, err := render(t, c, tt.vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			o := decode(t, files)
			ds := o.daemonSet
			pod := ds.Spec.Template.Spec
			if !pod.HostPID {
				t.Error("hostPID is false: /proc would not list the node's processes")
			}
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(pod.Containers))
			}
			ctr := pod.Containers[0]
			if ctr.Image != tt.wantImage {
				t.Errorf("image = %q, want %q", ctr.Image, tt.wantImage)
			}

			// Security context.
			sc := ctr.SecurityContext
			if sc == nil {
				t.Fatal("no container securityContext")
			}
			if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
				t.Errorf("runAsUser = %v, want 0", sc.RunAsUser)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("readOnlyRootFilesystem is not true")
			}
			if got := sc.Privileged != nil && *sc.Privileged; got != tt.wantPrivileged {
				t.Errorf("privileged = %v, want %v", got, tt.wantPrivileged)
			}
			if tt.wantPrivileged {
				if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
					t.Error("privileged with allowPrivilegeEscalation=false: the API server rejects that")
				}
			} else {
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					t.Error("allowPrivilegeEscalation is not false")
				}
				if sc.Capabilities == nil {
					t.Fatal("no capabilities")
				}
				if diff := cmp.Diff([]corev1.Capability{"ALL"}, sc.Capabilities.Drop); diff != "" {
					t.Errorf("capabilities.drop (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tt.wantCaps, sc.Capabilities.Add); diff != "" {
					t.Errorf("capabilities.add (-want +got):\n%s", diff)
				}
			}
			wantUnconfined := &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
			if diff := cmp.Diff(wantUnconfined, sc.AppArmorProfile); diff != "" {
				t.Errorf("appArmorProfile (-want +got):\n%s", diff)
			}

			// Mounts: only the configuration, read-only; no host paths.
			for _, m := range ctr.VolumeMounts {
				if !m.ReadOnly {
					t.Errorf("volume mount %s at %s is writable", m.Name, m.MountPath)
				}
			}
			for _, v := range pod.Volumes {
				if v.HostPath != nil {
					t.Errorf("volume %s mounts host path %s; hostPID already gives /proc", v.Name, v.HostPath.Path)
				}
				if v.ConfigMap != nil && v.ConfigMap.Name != o.configMap.Name {
					t.Errorf("volume %s names ConfigMap %q, rendered %q", v.Name, v.ConfigMap.Name, o.configMap.Name)
				}
			}

			// Every node.
			if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
				return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
			}) {
				t.Errorf("tolerations %v do not tolerate every taint", pod.Tolerations)
			}

			// Probes hit the health_check extension's port.
			healthEndpoint, _ := lookup(t, o.collector, "extensions", "health_check", "endpoint").(string)
			var healthPort int32
			for _, p := range ctr.Ports {
				if p.Name == "health" {
					healthPort = p.ContainerPort
				}
			}
			if healthPort == 0 || !strings.HasSuffix(healthEndpoint, ":"+itoa(healthPort)) {
				t.Errorf("container port health=%d, health_check endpoint %q", healthPort, healthEndpoint)
			}
			for name, p := range map[string]*corev1.Probe{"liveness": ctr.LivenessProbe, "readiness": ctr.ReadinessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "health" {
					t.Errorf("%s probe = %+v, want httpGet on port health", name, p)
				}
			}

			// Resources.
			if got, want := ctr.Resources.Requests.Cpu(), resource.MustParse("50m"); got.Cmp(want) != 0 {
				t.Errorf("cpu request = %v, want %v", got, want)
			}
			if got, want := ctr.Resources.Requests.Memory(), resource.MustParse("320Mi"); got.Cmp(want) != 0 {
				t.Errorf("memory request = %v, want %v", got, want)
			}
			if got, want := ctr.Resources.Limits.Memory(), resource.MustParse("512Mi"); got.Cmp(want) != 0 {
				t.Errorf("memory limit = %v, want %v", got, want)
			}

			// k8s_attributes filters by this env var.
			if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool {
				return e.Name == "K8S_NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil &&
					e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
			}) {
				t.Error("no K8S_NODE_NAME from spec.nodeName")
			}
			if ds.Spec.Template.Annotations["checksum/config"] == "" {
				t.Error("no checksum/config annotation: config changes would not roll the pods")
			}
			if diff := cmp.Diff(ds.Spec.Selector.MatchLabels, selectorSubset(ds.Spec.Template.Labels, ds.Spec.Selector.MatchLabels)); diff != "" {
				t.Errorf("pod labels do not match the selector (-want +got):\n%s", diff)
			}

			// RBAC.
			if tt.wantRBAC {
				checkRBAC(t, o, pod.ServiceAccountName)
			} else if o.clusterRole != nil || o.binding != nil {
				t.Error("rbac.create=false still renders RBAC objects")
			}
			if o.serviceAccount == nil || o.serviceAccount.Name != pod.ServiceAccountName {
				t.Errorf("ServiceAccount %v does not match the pod's %q", o.serviceAccount, pod.ServiceAccountName)
			}

			// The Collector configuration carries the values.
			if diff := cmp.Diff(tt.wantProcessors, lookup(t, o.collector, "service", "pipelines", "profiles", "processors")); diff != "" {
				t.Errorf("pipeline processors (-want +got):\n%s", diff)
			}
			for _, p := range tt.wantProcessors {
				lookup(t, o.collector, "processors", p.(string))
			}
			if got := lookup(t, o.collector, "receivers", "sonde", "samples_per_second"); got != tt.wantSamples {
				t.Errorf("samples_per_second = %v, want %d", got, tt.wantSamples)
			}
			gotOffCPU := []any{
				lookup(t, o.collector, "receivers", "sonde", "off_cpu_threshold"),
				lookup(t, o.collector, "receivers", "sonde", "off_cpu_min_duration"),
			}
			if diff := cmp.Diff(tt.wantOffCPU, gotOffCPU); diff != "" {
				t.Errorf("off_cpu_threshold, off_cpu_min_duration (-want +got):\n%s", diff)
			}
			sonde := o.collector["receivers"].(map[string]any)["sonde"].(map[string]any)
			var gotFilters map[string]any
			if f, ok := sonde["filters"]; ok {
				gotFilters, _ = f.(map[string]any)
				if gotFilters == nil {
					t.Errorf("filters rendered as %T, want a map", f)
				}
			}
			if diff := cmp.Diff(tt.wantFilters, gotFilters, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("filters (-want +got):\n%s", diff)
			}
			wantAge := tt.wantMinAge
			if wantAge == "" {
				wantAge = "0s"
			}
			if got := sonde["filter_min_process_age"]; got != wantAge {
				t.Errorf("filter_min_process_age = %v, want %s", got, wantAge)
			}
			if got := lookup(t, o.collector, "exporters", "otlp_grpc", "tls", "insecure"); got != tt.wantInsecure {
				t.Errorf("tls.insecure = %v, want %v", got, tt.wantInsecure)
			}
			wantEndpoint := tt.vals["otlp"].(map[string]any)["endpoint"]
			if got := lookup(t, o.collector, "exporters", "otlp_grpc", "endpoint"); got != wantEndpoint {
				t.Errorf("endpoint = %v, want %v", got, wantEndpoint)
			}
			var gotHeaders map[string]any
			if h, ok := lookup(t, o.collector, "exporters", "otlp_grpc").(map[string]any)["headers"]; ok {
				gotHeaders, _ = h.(map[string]any)
			}
			if diff := cmp.Diff(tt.wantHeaders, gotHeaders); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}

			// The DaemonSet sets K8S_NODE_NAME from the downward API.
			validateWithDistribution(t, o.collectorText, []string{"K8S_NODE_NAME=node-1"})
		})
	}
}

func checkRBAC(t *testing.T, o objects, serviceAccount string) {
	t.Helper()
	if o.clusterRole == nil || o.binding == nil {
		t.Fatal("no ClusterRole or ClusterRoleBinding")
	}
	read := []string{"get", "list", "watch"}
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes"}, Verbs: read},
		{APIGroups: []string{"apps"}, Resources: []string{"replicasets"}, Verbs: read},
	}
	if diff := cmp.Diff(want, o.clusterRole.Rules); diff != "" {
		t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
	}
	wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: o.clusterRole.Name}
	if diff := cmp.Diff(wantRef, o.binding.RoleRef); diff != "" {
		t.Errorf("roleRef (-want +got):\n%s", diff)
	}
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: serviceAccount, Namespace: namespace}}
	if diff := cmp.Diff(wantSubjects, o.binding.Subjects); diff != "" {
		t.Errorf("subjects (-want +got):\n%s", diff)
	}
}

func selectorSubset(labels, selector map[string]string) map[string]string {
	out := map[string]string{}
	for k := range selector {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}

func itoa(n int32) string {
	b, _ := yaml.Marshal(n)
	return strings.TrimSpace(string(b))
}

func TestRenderRejects(t *testing.T) {
	c := loadChart(t)
	tests := []struct {
		name    string
		vals    map[string]any
		wantErr string
	}{
		{"no endpoint", map[string]any{}, "otlp.endpoint is required"},
		{"unknown key", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "hostNetwork": true}, "hostNetwork"},
		{"rate not a number", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"samplesPerSecond": "fast"}}, "samplesPerSecond"},
		{"bad capability", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "extraCapabilities": []any{"cap_sys_admin"}}, "extraCapabilities"},
		{"bad duration", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"reporterInterval": "5 seconds"}}, "reporterInterval"},
		{"off-CPU threshold above 1", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"offCPUThreshold": 2}}, "offCPUThreshold"},
		{"off-CPU threshold not a number", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"offCPUThreshold": "all"}}, "offCPUThreshold"},
		{"filters with an unknown container mode", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"filters": map[string]any{"containers": "sometimes"}}}, "containers"},
		{"off-CPU minimum not a duration", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"offCPUMinDuration": "1 ms"}}, "offCPUMinDuration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := render(t, c, tt.vals)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("render error = %v, want one that mentions %q", err, tt.wantErr)
			}
		})
	}
}

func TestLint(t *testing.T) {
	lint := action.NewLint()
	lint.Strict = true
	lint.Namespace = namespace
	res := lint.Run([]string{chartDir}, map[string]any{"otlp": map[string]any{"endpoint": "collector:4317"}})
	if res.TotalChartsLinted != 1 {
		t.Errorf("linted %d charts, want 1", res.TotalChartsLinted)
	}
	for _, m := range res.Messages {
		t.Log(m)
	}
	if len(res.Errors) != 0 {
		t.Errorf("helm lint --strict: %v", res.Errors)
	}
}

// TestAgentConfig checks config/agent.yaml, which mirrors what the chart
// renders, with the distribution.
func TestAgentConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "config", "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	want := []any{"memory_limiter", "k8s_attributes", "resource_detection"}
	if diff := cmp.Diff(want, lookup(t, doc, "service", "pipelines", "profiles", "processors")); diff != "" {
		t.Errorf("agent.yaml processors (-want +got):\n%s", diff)
	}
	validateWithDistribution(t, string(b), []string{"OTLP_ENDPOINT=collector:4317", "K8S_NODE_NAME=node-1"})
}

// validateWithDistribution runs `otelcol-profiling validate` on config when
// SONDE_OTELCOL names a built distribution (make dist), so the check uses the
// very components builder-config.yaml lists.
func validateWithDistribution(t *testing.T, config string, env []string) {
	t.Helper()
	bin := os.Getenv("SONDE_OTELCOL")
	if bin == "" {
		t.Log("SONDE_OTELCOL not set: skipping validation with the built distribution")
		return
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "validate", "--config", path, "--feature-gates=service.profilesSupport")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%s validate: %v\n%s\nconfig:\n%s", bin, err, out, config)
	}
}
