package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/Masterminds/semver/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.yaml.in/yaml/v3"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/strvals"
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
	configMap      *corev1.ConfigMap // nil with configMap.existingName
	serviceAccount *corev1.ServiceAccount
	clusterRole    *rbacv1.ClusterRole
	binding        *rbacv1.ClusterRoleBinding
	service        *corev1.Service
	// The prometheus-operator kinds, as parsed YAML (no Go types here).
	serviceMonitor, podMonitor map[string]any
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

// render renders the chart for Kubernetes 1.31, as `helm template
// --kube-version 1.31` would.
func render(t *testing.T, c *chart.Chart, vals map[string]any) (map[string]string, error) {
	t.Helper()
	return helmTemplate(t, c, vals, "v1.31.0")
}

// helmTemplate renders the chart as `helm template` does: a client-only
// dry-run install, with values merged over values.yaml and checked against
// values.schema.json, and the default capabilities unless kubeVersion is set.
// It returns the manifest by template file.
func helmTemplate(t *testing.T, c *chart.Chart, vals map[string]any, kubeVersion string) (map[string]string, error) {
	t.Helper()
	in := action.NewInstall(&action.Configuration{})
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.ReleaseName, in.Namespace = release, namespace
	if kubeVersion != "" {
		kv, err := chartutil.ParseKubeVersion(kubeVersion)
		if err != nil {
			t.Fatal(err)
		}
		in.KubeVersion = kv
	}
	rel, err := in.RunWithContext(t.Context(), c, vals)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for name, doc := range releaseutil.SplitManifests(rel.Manifest) {
		files[name] = doc
	}
	return files, nil
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
			case "Service":
				o.service = new(corev1.Service)
				dst = o.service
			case "ServiceMonitor", "PodMonitor":
				if meta.APIVersion != "monitoring.coreos.com/v1" {
					t.Fatalf("%s: %s has apiVersion %s, want monitoring.coreos.com/v1", name, meta.Kind, meta.APIVersion)
				}
				var m map[string]any
				if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if meta.Kind == "ServiceMonitor" {
					o.serviceMonitor = m
				} else {
					o.podMonitor = m
				}
				continue
			default:
				t.Fatalf("%s: unexpected kind %s", name, meta.Kind)
			}
			if err := sigsyaml.UnmarshalStrict([]byte(doc), dst); err != nil {
				t.Fatalf("%s: strict decode of %s: %v\n%s", name, meta.Kind, err, doc)
			}
		}
	}
	if o.daemonSet == nil {
		t.Fatalf("rendering lacks the DaemonSet: %v", names)
	}
	if o.configMap != nil {
		o.collectorText = o.configMap.Data["config.yaml"]
		if err := yaml.Unmarshal([]byte(o.collectorText), &o.collector); err != nil {
			t.Fatalf("collector config: %v\n%s", err, o.collectorText)
		}
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
			wantProcessors: []any{"memory_limiter", "k8s_attributes", "transform/otel_resource_attributes", "resource/host"},
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
					"filters": map[string]any{"containers": "only", "excludeExecutables": []any{"pause"},
						"includeCgroups": []any{"/kubepods"}, "includeKernelThreads": true}},
				"kernel":               map[string]any{"before511": true},
				"extraCapabilities":    []any{"SYSLOG"},
				"kubernetesAttributes": map[string]any{"enabled": false},
				"hostAttributes":       map[string]any{"enabled": false},
				"rbac":                 map[string]any{"create": false},
				"extraProcessors": []any{
					map[string]any{"name": "memory_limiter/second", "config": map[string]any{"check_interval": "2s", "limit_mib": 100}},
				},
				"extraEnv": []any{map[string]any{"name": "OTLP_TOKEN", "valueFrom": map[string]any{
					"secretKeyRef": map[string]any{"name": "otlp", "key": "token"}}}},
			},
			wantCaps:       append(slices.Clone(minimal), "SYS_RESOURCE", "SYSLOG"),
			wantProcessors: []any{"memory_limiter", "memory_limiter/second"},
			wantInsecure:   true,
			wantHeaders:    map[string]any{"x-scope-orgid": "tenant-1", "authorization": "Bearer ${env:OTLP_TOKEN}"},
			wantImage:      "ghcr.io/sonde-dev/otelcol-profiling:9.9.9",
			wantSamples:    99,
			wantOffCPU:     []any{0.05, "1ms"},
			wantFilters: map[string]any{"containers": "only", "exclude_executables": []any{"pause"},
				"include_cgroups": []any{"/kubepods"}, "include_kernel_threads": true},
			wantMinAge: "30s",
		},
		{
			// The processors users reach for: resource and transform are in
			// the distribution and support profiles; validation with the
			// built distribution parses the OTTL statements.
			name: "resource and transform processors",
			vals: map[string]any{
				"otlp": endpoint(),
				"extraProcessors": []any{
					map[string]any{"name": "resource", "config": map[string]any{"attributes": []any{
						map[string]any{"key": "k8s.cluster.name", "value": "prod-eu-1", "action": "upsert"},
						map[string]any{"key": "process.executable.path", "action": "delete"},
					}}},
					map[string]any{"name": "transform/env", "config": map[string]any{
						"error_mode": "ignore",
						"profile_statements": []any{
							`set(resource.attributes["deployment.environment.name"], "production") where resource.attributes["k8s.namespace.name"] == "prod"`,
						},
					}},
				},
			},
			wantCaps:       minimal,
			wantProcessors: []any{"memory_limiter", "k8s_attributes", "transform/otel_resource_attributes", "resource/host", "resource", "transform/env"},
			wantRBAC:       true,
			wantImage:      "ghcr.io/sonde-dev/otelcol-profiling:" + c.Metadata.AppVersion,
			wantSamples:    19,
			wantOffCPU:     []any{0, "0s"},
		},
		{
			name: "privileged",
			vals: map[string]any{
				"otlp":   map[string]any{"endpoint": "collector:4317"},
				"kernel": map[string]any{"privileged": true},
			},
			wantPrivileged: true,
			wantProcessors: []any{"memory_limiter", "k8s_attributes", "transform/otel_resource_attributes", "resource/host"},
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
			// The read-only root leaves the agent a writable /tmp on the
			// node's disk, bounded, for its spilled symbol data.
			if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
				return v.Name == "tmp" && v.EmptyDir != nil && v.EmptyDir.Medium == "" && v.EmptyDir.SizeLimit != nil
			}) || !slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == "tmp" && m.MountPath == "/tmp" && !m.ReadOnly
			}) {
				t.Errorf("no disk-backed emptyDir with a size limit at /tmp: volumes %v, mounts %v", pod.Volumes, ctr.VolumeMounts)
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

			// Mounts: the configuration, read-only, and /tmp, an emptyDir
			// (checked above); no host paths.
			for _, m := range ctr.VolumeMounts {
				if !m.ReadOnly && m.Name != "tmp" {
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
			if got, want := ctr.Resources.Requests.Memory(), resource.MustParse("192Mi"); got.Cmp(want) != 0 {
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
		{"filters in the receiver's snake_case", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"filters": map[string]any{"exclude_executables": []any{"pause"}}}}, "exclude_executables"},
		{"off-CPU threshold string above 1", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "profiling": map[string]any{"offCPUThreshold": "1.5"}}, "offCPUThreshold"},
		{"client certificate without its key", map[string]any{"otlp": map[string]any{"endpoint": "x:4317", "tls": map[string]any{"secretName": "otlp-tls", "certKey": "tls.crt"}}}, "otlp.tls.certKey needs otlp.tls.keyKey"},
		{"client certificate without a Secret", map[string]any{"otlp": map[string]any{"endpoint": "x:4317", "tls": map[string]any{"certKey": "tls.crt", "keyKey": "tls.key"}}}, "otlp.tls.certKey needs otlp.tls.secretName"},
		{"TLS files with plaintext", map[string]any{"otlp": map[string]any{"endpoint": "x:4317", "insecure": true, "tls": map[string]any{"secretName": "otlp-tls"}}}, "otlp.insecure=true"},
		{"memory limit GOMEMLIMIT cannot read", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "resources": map[string]any{"limits": map[string]any{"memory": "half"}}}, "cannot read the memory limit"},
		{"unknown log level", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "logLevel": "verbose"}, "logLevel"},
		{"metrics port out of range", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "metrics": map[string]any{"port": 70000}}, "metrics"},
		// resource_detection left the distribution; its values went with it.
		{"the removed resourceDetection", map[string]any{"otlp": map[string]any{"endpoint": "x:4317"}, "resourceDetection": map[string]any{"enabled": true}}, "resourceDetection"},
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
	want := []any{"memory_limiter", "k8s_attributes", "transform/otel_resource_attributes", "resource/host"}
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

// endpoint is the one value every rendering needs.
func endpoint() map[string]any {
	return map[string]any{"endpoint": "collector.observability:4317"}
}

// container returns the agent's container of a rendering.
func container(t *testing.T, o objects) corev1.Container {
	t.Helper()
	if n := len(o.daemonSet.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers, want 1", n)
	}
	return o.daemonSet.Spec.Template.Spec.Containers[0]
}

func envValue(ctr corev1.Container, name string) (string, bool) {
	for _, e := range ctr.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// TestRenderOptions renders each option of the chart on its own and checks
// the objects and the Collector configuration it produces; every
// configuration is also validated by the built distribution.
func TestRenderOptions(t *testing.T) {
	c := loadChart(t)
	tests := []struct {
		name  string
		vals  map[string]any
		check func(t *testing.T, o objects)
	}{
		{
			name: "metrics on by default, on every address of the pod",
			vals: map[string]any{"otlp": endpoint()},
			check: func(t *testing.T, o objects) {
				ctr := container(t, o)
				if !slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 8888 }) {
					t.Errorf("ports %v lack metrics 8888", ctr.Ports)
				}
				want := []any{map[string]any{"pull": map[string]any{"exporter": map[string]any{
					"prometheus": map[string]any{"host": "0.0.0.0", "port": 8888}}}}}
				if diff := cmp.Diff(want, lookup(t, o.collector, "service", "telemetry", "metrics", "readers")); diff != "" {
					t.Errorf("telemetry metrics readers (-want +got):\n%s", diff)
				}
				if o.service != nil || o.serviceMonitor != nil || o.podMonitor != nil {
					t.Error("a Service, ServiceMonitor or PodMonitor rendered by default")
				}
			},
		},
		{
			name: "metrics off",
			vals: map[string]any{"otlp": endpoint(), "metrics": map[string]any{"enabled": false,
				"serviceMonitor": map[string]any{"enabled": true}, "podMonitor": map[string]any{"enabled": true}}},
			check: func(t *testing.T, o objects) {
				if got := lookup(t, o.collector, "service", "telemetry", "metrics", "level"); got != "none" {
					t.Errorf("telemetry metrics level = %v, want none", got)
				}
				if slices.ContainsFunc(container(t, o).Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" }) {
					t.Error("a metrics port with metrics disabled")
				}
				if o.service != nil || o.serviceMonitor != nil || o.podMonitor != nil {
					t.Error("monitors rendered with metrics disabled")
				}
			},
		},
		{
			name: "profile metrics with both monitors",
			vals: map[string]any{"otlp": endpoint(),
				"profileMetrics": map[string]any{"enabled": true, "maxSeries": 500, "topFunctions": 10},
				"metrics":        map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "podMonitor": map[string]any{"enabled": true}}},
			check: func(t *testing.T, o objects) {
				if !slices.ContainsFunc(container(t, o).Ports, func(p corev1.ContainerPort) bool { return p.Name == "profile-metrics" && p.ContainerPort == 9464 }) {
					t.Errorf("ports %v lack profile-metrics 9464", container(t, o).Ports)
				}
				if got := lookup(t, o.collector, "exporters", "prometheus", "endpoint"); got != "0.0.0.0:9464" {
					t.Errorf("prometheus exporter endpoint = %v", got)
				}
				want := map[string]any{"resource_attributes": []any{"process.executable.name", "service.name", "container.id"},
					"max_series": 500, "top_functions": 10, "max_functions": 1000, "expire_after": "10m"}
				if diff := cmp.Diff(want, lookup(t, o.collector, "connectors", "profilemetrics")); diff != "" {
					t.Errorf("profilemetrics connector (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]any{"otlp_grpc", "profilemetrics"}, lookup(t, o.collector, "service", "pipelines", "profiles", "exporters")); diff != "" {
					t.Errorf("profiles exporters (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(map[string]any{"receivers": []any{"profilemetrics"}, "exporters": []any{"prometheus"}},
					lookup(t, o.collector, "service", "pipelines", "metrics/profiles")); diff != "" {
					t.Errorf("metrics/profiles pipeline (-want +got):\n%s", diff)
				}
				if o.service == nil || len(o.service.Spec.Ports) != 2 || o.service.Spec.Ports[1].Name != "profile-metrics" ||
					o.service.Spec.Ports[1].Port != 9464 || o.service.Spec.Ports[1].TargetPort.String() != "profile-metrics" {
					t.Errorf("service = %+v, want a second port profile-metrics 9464", o.service)
				}
				for name, m := range map[string]map[string]any{"ServiceMonitor": o.serviceMonitor, "PodMonitor": o.podMonitor} {
					if m == nil {
						t.Fatalf("no %s", name)
					}
					key := "endpoints"
					if name == "PodMonitor" {
						key = "podMetricsEndpoints"
					}
					eps, _ := lookup(t, m, "spec", key).([]any)
					var ports []any
					for _, e := range eps {
						ports = append(ports, e.(map[string]any)["port"])
					}
					if diff := cmp.Diff([]any{"metrics", "profile-metrics"}, ports); diff != "" {
						t.Errorf("%s endpoints' ports (-want +got):\n%s", name, diff)
					}
				}
			},
		},
		{
			name: "ServiceMonitor on another port",
			vals: map[string]any{"otlp": endpoint(), "metrics": map[string]any{"port": 9464, "level": "detailed",
				"serviceMonitor": map[string]any{"enabled": true, "interval": "15s", "labels": map[string]any{"release": "prom"},
					"metricRelabelings": []any{map[string]any{"action": "drop", "regex": "otelcol_process_.*", "sourceLabels": []any{"__name__"}}}}}},
			check: func(t *testing.T, o objects) {
				if o.service == nil || o.serviceMonitor == nil {
					t.Fatal("no Service or ServiceMonitor")
				}
				if o.service.Spec.ClusterIP != "None" || len(o.service.Spec.Ports) != 1 ||
					o.service.Spec.Ports[0].Port != 9464 || o.service.Spec.Ports[0].TargetPort.String() != "metrics" {
					t.Errorf("service spec = %+v, want headless, port 9464 to metrics", o.service.Spec)
				}
				if diff := cmp.Diff(o.daemonSet.Spec.Selector.MatchLabels, o.service.Spec.Selector); diff != "" {
					t.Errorf("Service selector is not the pods' (-want +got):\n%s", diff)
				}
				sm := o.serviceMonitor
				if got := lookup(t, sm, "metadata", "labels").(map[string]any)["release"]; got != "prom" {
					t.Errorf("ServiceMonitor label release = %v, want prom", got)
				}
				sel := lookup(t, sm, "spec", "selector", "matchLabels").(map[string]any)
				for k, v := range o.service.Labels {
					if sv, ok := sel[k]; ok && sv != v {
						t.Errorf("ServiceMonitor selects %s=%v, the Service has %s", k, sv, v)
					}
				}
				if len(sel) == 0 {
					t.Error("ServiceMonitor selects nothing")
				}
				eps := lookup(t, sm, "spec", "endpoints").([]any)
				ep := eps[0].(map[string]any)
				if ep["port"] != "metrics" || ep["interval"] != "15s" || ep["metricRelabelings"] == nil {
					t.Errorf("ServiceMonitor endpoint = %v", ep)
				}
				if got := lookup(t, o.collector, "service", "telemetry", "metrics", "level"); got != "detailed" {
					t.Errorf("telemetry metrics level = %v, want detailed", got)
				}
				readers := lookup(t, o.collector, "service", "telemetry", "metrics", "readers").([]any)
				prom := readers[0].(map[string]any)["pull"].(map[string]any)["exporter"].(map[string]any)["prometheus"].(map[string]any)
				if prom["port"] != 9464 {
					t.Errorf("prometheus reader port = %v, want 9464", prom["port"])
				}
				if !slices.ContainsFunc(container(t, o).Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9464 }) {
					t.Error("no container port metrics 9464")
				}
			},
		},
		{
			name: "PodMonitor",
			vals: map[string]any{"otlp": endpoint(), "metrics": map[string]any{"podMonitor": map[string]any{"enabled": true, "scrapeTimeout": "10s"}}},
			check: func(t *testing.T, o objects) {
				if o.podMonitor == nil || o.serviceMonitor != nil || o.service != nil {
					t.Fatalf("podMonitor %v, serviceMonitor %v, service %v: want only the PodMonitor", o.podMonitor != nil, o.serviceMonitor != nil, o.service != nil)
				}
				sel := lookup(t, o.podMonitor, "spec", "selector", "matchLabels").(map[string]any)
				for k, v := range sel {
					if o.daemonSet.Spec.Template.Labels[k] != v {
						t.Errorf("PodMonitor selects %s=%v, pods have %q", k, v, o.daemonSet.Spec.Template.Labels[k])
					}
				}
				ep := lookup(t, o.podMonitor, "spec", "podMetricsEndpoints").([]any)[0].(map[string]any)
				if ep["port"] != "metrics" || ep["scrapeTimeout"] != "10s" {
					t.Errorf("PodMonitor endpoint = %v", ep)
				}
				if got := lookup(t, o.podMonitor, "spec", "namespaceSelector", "matchNames"); !cmp.Equal(got, []any{namespace}) {
					t.Errorf("PodMonitor namespaces = %v", got)
				}
			},
		},
		{
			name: "config override merges",
			vals: map[string]any{"otlp": endpoint(), "config": map[string]any{
				"receivers": map[string]any{"sonde": map[string]any{"include_env_vars": []any{"APP_VERSION"}}},
				"exporters": map[string]any{"debug": map[string]any{"verbosity": "basic"}},
				"service": map[string]any{"pipelines": map[string]any{
					"profiles/debug": map[string]any{"receivers": []any{"sonde"}, "exporters": []any{"debug"}}}},
			}},
			check: func(t *testing.T, o objects) {
				if got := lookup(t, o.collector, "receivers", "sonde", "include_env_vars"); !cmp.Equal(got, []any{"APP_VERSION"}) {
					t.Errorf("include_env_vars = %v", got)
				}
				// The rendered keys next to the override stay.
				if got := lookup(t, o.collector, "receivers", "sonde", "samples_per_second"); got != 19 {
					t.Errorf("samples_per_second = %v, want 19 kept", got)
				}
				lookup(t, o.collector, "exporters", "otlp_grpc")
				lookup(t, o.collector, "service", "pipelines", "profiles", "exporters")
				lookup(t, o.collector, "service", "pipelines", "profiles/debug", "exporters")
			},
		},
		{
			name: "existing ConfigMap",
			vals: map[string]any{"otlp": endpoint(), "configMap": map[string]any{"existingName": "my-otelcol"}},
			check: func(t *testing.T, o objects) {
				if o.configMap != nil {
					t.Error("a ConfigMap rendered next to configMap.existingName")
				}
				pod := o.daemonSet.Spec.Template.Spec
				if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
					return v.Name == "config" && v.ConfigMap != nil && v.ConfigMap.Name == "my-otelcol"
				}) {
					t.Errorf("volumes %v do not mount ConfigMap my-otelcol", pod.Volumes)
				}
				if _, ok := o.daemonSet.Spec.Template.Annotations["checksum/config"]; ok {
					t.Error("checksum/config of a configuration the chart does not render")
				}
			},
		},
		{
			name: "TLS with a client certificate from a Secret",
			vals: map[string]any{"otlp": map[string]any{"endpoint": "collector.example:4317", "tls": map[string]any{
				"secretName": "otlp-client", "caKey": "ca.pem", "certKey": "client.pem", "keyKey": "client-key.pem", "serverName": "collector.internal"}}},
			check: func(t *testing.T, o objects) {
				want := map[string]any{"insecure": false, "ca_file": "/etc/otelcol/tls/ca.pem", "cert_file": "/etc/otelcol/tls/client.pem",
					"key_file": "/etc/otelcol/tls/client-key.pem", "server_name_override": "collector.internal"}
				if diff := cmp.Diff(want, lookup(t, o.collector, "exporters", "otlp_grpc", "tls")); diff != "" {
					t.Errorf("exporter tls (-want +got):\n%s", diff)
				}
				pod := o.daemonSet.Spec.Template.Spec
				if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
					return v.Name == "otlp-tls" && v.Secret != nil && v.Secret.SecretName == "otlp-client"
				}) {
					t.Errorf("volumes %v lack Secret otlp-client", pod.Volumes)
				}
				if !slices.ContainsFunc(container(t, o).VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "otlp-tls" && m.MountPath == "/etc/otelcol/tls" && m.ReadOnly
				}) {
					t.Errorf("mounts %v lack otlp-tls at /etc/otelcol/tls", container(t, o).VolumeMounts)
				}
			},
		},
		{
			name: "TLS CA only",
			vals: map[string]any{"otlp": map[string]any{"endpoint": "collector.example:4317", "tls": map[string]any{"secretName": "otlp-ca"}}},
			check: func(t *testing.T, o objects) {
				want := map[string]any{"insecure": false, "ca_file": "/etc/otelcol/tls/ca.crt"}
				if diff := cmp.Diff(want, lookup(t, o.collector, "exporters", "otlp_grpc", "tls")); diff != "" {
					t.Errorf("exporter tls (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "envFrom, extra args, volumes and mounts",
			vals: map[string]any{"otlp": endpoint(),
				"envFrom":           []any{map[string]any{"secretRef": map[string]any{"name": "otlp-auth"}}},
				"extraArgs":         []any{"--set=service.telemetry.logs.encoding=json"},
				"extraVolumes":      []any{map[string]any{"name": "debug", "hostPath": map[string]any{"path": "/usr/lib/debug"}}},
				"extraVolumeMounts": []any{map[string]any{"name": "debug", "mountPath": "/usr/lib/debug", "readOnly": true}},
			},
			check: func(t *testing.T, o objects) {
				ctr := container(t, o)
				if len(ctr.EnvFrom) != 1 || ctr.EnvFrom[0].SecretRef == nil || ctr.EnvFrom[0].SecretRef.Name != "otlp-auth" {
					t.Errorf("envFrom = %+v", ctr.EnvFrom)
				}
				wantArgs := []string{"--config=/etc/otelcol/config.yaml", "--feature-gates=service.profilesSupport", "--set=service.telemetry.logs.encoding=json"}
				if diff := cmp.Diff(wantArgs, ctr.Args); diff != "" {
					t.Errorf("args (-want +got):\n%s", diff)
				}
				pod := o.daemonSet.Spec.Template.Spec
				if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "debug" && v.HostPath != nil }) {
					t.Errorf("volumes %v lack debug", pod.Volumes)
				}
				if !slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "debug" && m.MountPath == "/usr/lib/debug" }) {
					t.Errorf("mounts %v lack debug", ctr.VolumeMounts)
				}
			},
		},
		{
			name: "GOMEMLIMIT from the default limit",
			vals: map[string]any{"otlp": endpoint()},
			check: func(t *testing.T, o objects) {
				// 80 % of 512Mi is 409.6 MiB.
				if got, ok := envValue(container(t, o), "GOMEMLIMIT"); got != "409MiB" {
					t.Errorf("GOMEMLIMIT = %q (set %v), want 409MiB", got, ok)
				}
			},
		},
		{
			name: "GOMEMLIMIT from a limit in G at 90 percent",
			vals: map[string]any{"otlp": endpoint(), "goMemLimit": map[string]any{"percentOfLimit": 90},
				"resources": map[string]any{"limits": map[string]any{"memory": "1G"}}},
			check: func(t *testing.T, o objects) {
				// 0.9 × 10^9 bytes = 858.3 MiB.
				if got, _ := envValue(container(t, o), "GOMEMLIMIT"); got != "858MiB" {
					t.Errorf("GOMEMLIMIT = %q, want 858MiB", got)
				}
			},
		},
		{
			name: "no GOMEMLIMIT without a memory limit",
			vals: map[string]any{"otlp": endpoint(), "resources": map[string]any{"limits": nil}},
			check: func(t *testing.T, o objects) {
				if got, ok := envValue(container(t, o), "GOMEMLIMIT"); ok {
					t.Errorf("GOMEMLIMIT = %q without a memory limit", got)
				}
			},
		},
		{
			name: "log level",
			vals: map[string]any{"otlp": endpoint(), "logLevel": "debug"},
			check: func(t *testing.T, o objects) {
				if got := lookup(t, o.collector, "service", "telemetry", "logs", "level"); got != "debug" {
					t.Errorf("logs level = %v, want debug", got)
				}
			},
		},
		{
			name: "image by digest from a global registry",
			vals: map[string]any{"otlp": endpoint(),
				"global":           map[string]any{"image": map[string]any{"registry": "mirror.example:5000", "pullSecrets": []any{map[string]any{"name": "mirror"}}}},
				"image":            map[string]any{"digest": "sha256:" + strings.Repeat("ab", 32)},
				"imagePullSecrets": []any{map[string]any{"name": "own"}}},
			check: func(t *testing.T, o objects) {
				want := "mirror.example:5000/ghcr.io/sonde-dev/otelcol-profiling@sha256:" + strings.Repeat("ab", 32)
				if got := container(t, o).Image; got != want {
					t.Errorf("image = %q, want %q", got, want)
				}
				wantSecrets := []corev1.LocalObjectReference{{Name: "own"}, {Name: "mirror"}}
				if diff := cmp.Diff(wantSecrets, o.daemonSet.Spec.Template.Spec.ImagePullSecrets); diff != "" {
					t.Errorf("imagePullSecrets (-want +got):\n%s", diff)
				}
			},
		},
		{
			// What resource_detection's env and system detectors gave,
			// rendered as config/agent.yaml has it: host.name is the node's
			// name, and nothing replaces a value a profile already carries.
			name: "host attributes as in config/agent.yaml",
			vals: map[string]any{"otlp": endpoint()},
			check: func(t *testing.T, o objects) {
				b, err := os.ReadFile(filepath.Join("..", "config", "agent.yaml"))
				if err != nil {
					t.Fatal(err)
				}
				var agent map[string]any
				if err := yaml.Unmarshal(b, &agent); err != nil {
					t.Fatal(err)
				}
				for _, p := range []string{"transform/otel_resource_attributes", "resource/host"} {
					if diff := cmp.Diff(lookup(t, agent, "processors", p), lookup(t, o.collector, "processors", p)); diff != "" {
						t.Errorf("processor %s (-agent.yaml +chart):\n%s", p, diff)
					}
				}
				want := []any{
					map[string]any{"key": "host.name", "value": "${env:K8S_NODE_NAME}", "action": "insert"},
					map[string]any{"key": "os.type", "value": "linux", "action": "insert"},
				}
				if diff := cmp.Diff(want, lookup(t, o.collector, "processors", "resource/host", "attributes")); diff != "" {
					t.Errorf("resource/host attributes (-want +got):\n%s", diff)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, err := render(t, c, tt.vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			o := decode(t, files)
			tt.check(t, o)
			if o.configMap != nil {
				validateWithDistribution(t, o.collectorText, []string{"K8S_NODE_NAME=node-1"})
			}
		})
	}
}

// TestSetFlags renders values given as `helm --set` gives them: strvals
// turns numbers it cannot read as integers (0.01) into strings.
func TestSetFlags(t *testing.T) {
	c := loadChart(t)
	vals := map[string]any{}
	for _, s := range []string{
		"otlp.endpoint=collector:4317",
		"profiling.offCPUThreshold=0.01",
		"profiling.samplesPerSecond=99",
		"memoryLimiter.limitMiB=300",
		"otlp.queueSize=500",
		"metrics.port=9090",
		"goMemLimit.percentOfLimit=75",
		"profiling.filters.includeKernelThreads=true",
	} {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	if _, ok := vals["profiling"].(map[string]any)["offCPUThreshold"].(string); !ok {
		t.Fatalf("strvals gave offCPUThreshold as %T; this test expects the string --set passes", vals["profiling"].(map[string]any)["offCPUThreshold"])
	}
	files, err := render(t, c, vals)
	if err != nil {
		t.Fatalf("render with --set values: %v", err)
	}
	o := decode(t, files)
	for _, tc := range []struct {
		path []string
		want any
	}{
		{[]string{"receivers", "sonde", "off_cpu_threshold"}, 0.01},
		{[]string{"receivers", "sonde", "samples_per_second"}, 99},
		{[]string{"receivers", "sonde", "filters", "include_kernel_threads"}, true},
		{[]string{"processors", "memory_limiter", "limit_mib"}, 300},
		{[]string{"exporters", "otlp_grpc", "sending_queue", "queue_size"}, 500},
	} {
		if got := lookup(t, o.collector, tc.path...); got != tc.want {
			t.Errorf("%s = %v (%T), want %v", strings.Join(tc.path, "."), got, got, tc.want)
		}
	}
	// 75 % of 512Mi.
	if got, _ := envValue(container(t, o), "GOMEMLIMIT"); got != "384MiB" {
		t.Errorf("GOMEMLIMIT = %q, want 384MiB", got)
	}
	validateWithDistribution(t, o.collectorText, []string{"K8S_NODE_NAME=node-1"})
}

// TestKubeVersions renders as `helm template` does without --kube-version,
// and for clusters before and after AppArmor became a securityContext field
// (1.30): the chart declares no kubeVersion and sets AppArmor the way the
// cluster understands.
func TestKubeVersions(t *testing.T) {
	c := loadChart(t)
	if c.Metadata.KubeVersion != "" {
		t.Errorf("Chart.yaml kubeVersion = %q: helm template without --kube-version would refuse older defaults", c.Metadata.KubeVersion)
	}
	const annotation = "container.apparmor.security.beta.kubernetes.io/otelcol-profiling"
	for _, tc := range []struct {
		name, kube string
		wantField  bool
	}{
		{"helm template default", "", semver.MustParse(chartutil.DefaultCapabilities.KubeVersion.Version).Minor() >= 30},
		{"1.29", "v1.29.4", false},
		{"1.30", "v1.30.0", true},
		{"1.33", "v1.33.1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := helmTemplate(t, c, map[string]any{"otlp": endpoint()}, tc.kube)
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			o := decode(t, files)
			sc := container(t, o).SecurityContext
			gotField := sc != nil && sc.AppArmorProfile != nil && sc.AppArmorProfile.Type == corev1.AppArmorProfileTypeUnconfined
			gotAnnotation := o.daemonSet.Spec.Template.Annotations[annotation]
			if tc.wantField {
				if !gotField || gotAnnotation != "" {
					t.Errorf("appArmorProfile field %v, annotation %q: want the field only", gotField, gotAnnotation)
				}
			} else if gotField || gotAnnotation != "unconfined" {
				t.Errorf("appArmorProfile field %v, annotation %q: want the annotation unconfined only", gotField, gotAnnotation)
			}
		})
	}
}

// TestSubchart renders the chart as a dependency of a parent chart whose
// values carry global: keys, as an umbrella chart does.
func TestSubchart(t *testing.T) {
	sub := loadChart(t)
	parent := &chart.Chart{
		Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "platform", Version: "1.0.0",
			Dependencies: []*chart.Dependency{{Name: "sonde", Version: sub.Metadata.Version}}},
		Values: map[string]any{
			"global": map[string]any{"clusterName": "prod-1", "storageClass": "fast",
				"image": map[string]any{"registry": "mirror.example"}},
		},
	}
	parent.AddDependency(sub)
	vals := map[string]any{"sonde": map[string]any{"otlp": endpoint(), "profiling": map[string]any{"samplesPerSecond": 49}}}
	files, err := helmTemplate(t, parent, vals, "")
	if err != nil {
		t.Fatalf("helm template of a parent chart with global values: %v", err)
	}
	o := decode(t, files)
	if got := lookup(t, o.collector, "receivers", "sonde", "samples_per_second"); got != 49 {
		t.Errorf("samples_per_second = %v, want the parent's 49", got)
	}
	if got, want := container(t, o).Image, "mirror.example/ghcr.io/sonde-dev/otelcol-profiling:"+sub.Metadata.AppVersion; got != want {
		t.Errorf("image = %q, want %q from global.image.registry", got, want)
	}
	if !strings.HasPrefix(o.daemonSet.Name, release) {
		t.Errorf("DaemonSet %q is not named after the release", o.daemonSet.Name)
	}
}

// TestArchitectureAffinity: by default the DaemonSet goes only to nodes of
// an architecture the image index has; an affinity of the user's is merged
// with it, and affinity=null removes it.
func TestArchitectureAffinity(t *testing.T) {
	c := loadChart(t)
	archTerm := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
		Key: "kubernetes.io/arch", Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64", "arm64"},
	}}}}
	antiAffinity := map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{
		"topologyKey":   "kubernetes.io/hostname",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "other-agent"}},
	}}}
	tests := []struct {
		name      string
		affinity  any // the affinity value; absent when nil and !null
		null      bool
		wantTerms []corev1.NodeSelectorTerm
		wantAnti  bool
	}{
		{name: "defaults", wantTerms: archTerm},
		{name: "pod anti-affinity of the user's", affinity: map[string]any{"podAntiAffinity": antiAffinity}, wantTerms: archTerm, wantAnti: true},
		{name: "null", null: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vals := map[string]any{"otlp": endpoint()}
			if tt.affinity != nil || tt.null {
				vals["affinity"] = tt.affinity
			}
			files, err := render(t, c, vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			aff := decode(t, files).daemonSet.Spec.Template.Spec.Affinity
			var terms []corev1.NodeSelectorTerm
			if aff != nil && aff.NodeAffinity != nil && aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
				terms = aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			}
			if diff := cmp.Diff(tt.wantTerms, terms); diff != "" {
				t.Errorf("required node selector terms (-want +got):\n%s", diff)
			}
			if gotAnti := aff != nil && aff.PodAntiAffinity != nil; gotAnti != tt.wantAnti {
				t.Errorf("pod anti-affinity rendered: %v, want %v", gotAnti, tt.wantAnti)
			}
			if tt.null && aff != nil {
				t.Errorf("affinity=null renders %+v", aff)
			}
		})
	}
}
