{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "sonde.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's resources. */}}
{{- define "sonde.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels that select the agent's pods; never change them after install. */}}
{{- define "sonde.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sonde.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "sonde.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sonde.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "sonde.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sonde.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: [registry/]repository(@digest|:tag). */}}
{{- define "sonde.image" -}}
{{- $registry := .Values.image.registry }}
{{- with .Values.global }}{{ with .image }}{{ with .registry }}{{ $registry = . }}{{ end }}{{ end }}{{ end }}
{{- $repo := .Values.image.repository }}
{{- if $registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* imagePullSecrets of the chart and of global.image.pullSecrets, as a list. */}}
{{- define "sonde.pullSecrets" -}}
{{- $s := .Values.imagePullSecrets | default list }}
{{- with .Values.global }}{{ with .image }}{{ with .pullSecrets }}{{ $s = concat $s . }}{{ end }}{{ end }}{{ end }}
{{- toJson $s }}
{{- end }}

{{/* Name of the ConfigMap the pods read. */}}
{{- define "sonde.configMapName" -}}
{{- .Values.configMap.existingName | default (include "sonde.fullname" .) }}
{{- end }}

{{/*
GOMEMLIMIT for a memory quantity (the container's limit): percentOfLimit of
it, in MiB, rounded down. Quantities with the suffixes Ki, Mi, Gi, Ti, k, M,
G, T or none are understood; anything else fails the rendering.
*/}}
{{- define "sonde.goMemLimit" -}}
{{- $q := toString .quantity }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q }}
{{- $unit := trimPrefix $num $q }}
{{- $scale := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 }}
{{- if or (not $num) (not (hasKey $scale $unit)) }}
{{- fail (printf "goMemLimit: cannot read the memory limit %q; write it as a number with Ki, Mi, Gi, k, M or G" $q) }}
{{- end }}
{{- $bytes := mulf (float64 $num) (get $scale $unit) }}
{{- printf "%dMiB" (int64 (divf (mulf $bytes (float64 .percent)) 104857600)) }}
{{- end }}

{{/* The receiver's filters from the chart's camelCase keys. */}}
{{- define "sonde.filters" -}}
{{- $keys := dict "includeExecutables" "include_executables" "excludeExecutables" "exclude_executables" "containers" "containers" "includeCgroups" "include_cgroups" "excludeCgroups" "exclude_cgroups" "includeIdle" "include_idle" "includeKernelThreads" "include_kernel_threads" }}
{{- $out := dict }}
{{- range $k, $v := . }}{{ $_ := set $out (get $keys $k) $v }}{{ end }}
{{- toYaml $out }}
{{- end }}

{{/* Processors of the profiles pipeline, in order, as a list. */}}
{{- define "sonde.processors" -}}
{{- $p := list "memory_limiter" }}
{{- if .Values.kubernetesAttributes.enabled }}{{ $p = append $p "k8s_attributes" }}{{ end }}
{{- if .Values.hostAttributes.enabled }}{{ $p = concat $p (list "transform/otel_resource_attributes" "resource/host") }}{{ end }}
{{- range .Values.extraProcessors }}{{ $p = append $p .name }}{{ end }}
{{- toJson $p }}
{{- end }}

{{/* The Collector configuration the agent runs: the rendered one with
.Values.config merged over it. */}}
{{- define "sonde.config" -}}
{{- $base := include "sonde.baseConfig" . | fromYaml }}
{{- if hasKey $base "Error" }}{{ fail (printf "rendered Collector configuration: %s" $base.Error) }}{{ end }}
{{- toYaml (mustMergeOverwrite $base (deepCopy (.Values.config | default dict))) }}
{{- end }}

{{/* The Collector configuration rendered from the values. */}}
{{- define "sonde.baseConfig" -}}
extensions:
  health_check:
    endpoint: 0.0.0.0:{{ .Values.healthCheckPort }}
receivers:
  sonde:
    samples_per_second: {{ .Values.profiling.samplesPerSecond }}
    reporter_interval: {{ .Values.profiling.reporterInterval }}
    off_cpu_threshold: {{ .Values.profiling.offCPUThreshold }}
    off_cpu_min_duration: {{ .Values.profiling.offCPUMinDuration }}
    filter_min_process_age: {{ .Values.profiling.filterMinProcessAge }}
    {{- with .Values.profiling.filters }}
    filters:
      {{- include "sonde.filters" . | nindent 6 }}
    {{- end }}
    # hostPID: the container's /proc lists every process on the node.
    procfs: /proc
processors:
  memory_limiter:
    check_interval: 1s
    limit_mib: {{ .Values.memoryLimiter.limitMiB }}
    spike_limit_mib: {{ .Values.memoryLimiter.spikeLimitMiB }}
  {{- if .Values.kubernetesAttributes.enabled }}
  k8s_attributes:
    auth_type: serviceAccount
    passthrough: false
    filter:
      node_from_env_var: K8S_NODE_NAME
    extract:
      metadata:
        - container.id
        - k8s.namespace.name
        - k8s.pod.name
        - k8s.pod.uid
        - k8s.node.name
        - k8s.container.name
        - k8s.deployment.name
        - k8s.statefulset.name
        - k8s.daemonset.name
        - k8s.cronjob.name
        - k8s.job.name
    pod_association:
      - sources:
          - from: resource_attribute
            name: container.id
  {{- end }}
  {{- if .Values.hostAttributes.enabled }}
  # OTEL_RESOURCE_ATTRIBUTES, then the node: what resource_detection's env and
  # system detectors gave. insert keeps a value already there.
  transform/otel_resource_attributes:
    error_mode: ignore
    profile_statements:
      - merge_maps(resource.attributes, ParseKeyValue("${env:OTEL_RESOURCE_ATTRIBUTES:-}", "=", ","), "insert") where "${env:OTEL_RESOURCE_ATTRIBUTES:-}" != ""
  resource/host:
    attributes:
      - {key: host.name, value: "${env:K8S_NODE_NAME}", action: insert}
      - {key: os.type, value: linux, action: insert}
  {{- end }}
  {{- range .Values.extraProcessors }}
  {{ .name }}:
    {{- toYaml (default dict .config) | nindent 4 }}
  {{- end }}
{{- if .Values.profileMetrics.enabled }}
connectors:
  profilemetrics:
    resource_attributes: {{ toJson .Values.profileMetrics.resourceAttributes }}
    max_series: {{ .Values.profileMetrics.maxSeries }}
    top_functions: {{ .Values.profileMetrics.topFunctions }}
    max_functions: {{ .Values.profileMetrics.maxFunctions }}
    expire_after: {{ .Values.profileMetrics.expireAfter }}
{{- end }}
exporters:
  {{- if .Values.profileMetrics.enabled }}
  prometheus:
    # The pod's own network: Prometheus scrapes the pod IP.
    endpoint: 0.0.0.0:{{ .Values.profileMetrics.port }}
  {{- end }}
  otlp_grpc:
    endpoint: {{ required "otlp.endpoint is required: set it to the host:port of an OTLP/gRPC receiver, e.g. --set otlp.endpoint=collector.observability:4317" .Values.otlp.endpoint | quote }}
    compression: {{ .Values.otlp.compression }}
    timeout: {{ .Values.otlp.timeout }}
    tls:
      insecure: {{ .Values.otlp.insecure }}
      {{- with .Values.otlp.tls }}
      {{- if .secretName }}
      {{- if .caKey }}
      ca_file: /etc/otelcol/tls/{{ .caKey }}
      {{- end }}
      {{- if .certKey }}
      cert_file: /etc/otelcol/tls/{{ .certKey }}
      key_file: /etc/otelcol/tls/{{ .keyKey }}
      {{- end }}
      {{- end }}
      {{- with .serverName }}
      server_name_override: {{ . | quote }}
      {{- end }}
      {{- if .insecureSkipVerify }}
      insecure_skip_verify: true
      {{- end }}
      {{- end }}
    {{- with .Values.otlp.headers }}
    headers:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    retry_on_failure:
      enabled: true
      initial_interval: 5s
      max_interval: 30s
      max_elapsed_time: 300s
    sending_queue:
      enabled: true
      num_consumers: 2
      queue_size: {{ .Values.otlp.queueSize }}
service:
  telemetry:
    logs:
      level: {{ .Values.logLevel }}
    metrics:
      {{- if .Values.metrics.enabled }}
      level: {{ .Values.metrics.level }}
      readers:
        - pull:
            exporter:
              prometheus:
                # The pod's own network: Prometheus scrapes the pod IP.
                host: 0.0.0.0
                port: {{ .Values.metrics.port }}
      {{- else }}
      level: none
      {{- end }}
  extensions: [health_check]
  pipelines:
    profiles:
      receivers: [sonde]
      processors: {{ include "sonde.processors" . }}
      exporters: {{ if .Values.profileMetrics.enabled }}[otlp_grpc, profilemetrics]{{ else }}[otlp_grpc]{{ end }}
    {{- if .Values.profileMetrics.enabled }}
    metrics/profiles:
      receivers: [profilemetrics]
      exporters: [prometheus]
    {{- end }}
{{- end }}

{{/* The pre-1.30 AppArmor annotation value of an appArmorProfile. */}}
{{- define "sonde.appArmorAnnotation" -}}
{{- if eq .type "Unconfined" }}unconfined
{{- else if eq .type "RuntimeDefault" }}runtime/default
{{- else }}localhost/{{ required "appArmorProfile.localhostProfile is required with type Localhost" .localhostProfile }}
{{- end }}
{{- end }}
