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

{{/* Processors of the profiles pipeline, in order, as a list. */}}
{{- define "sonde.processors" -}}
{{- $p := list "memory_limiter" }}
{{- if .Values.kubernetesAttributes.enabled }}{{ $p = append $p "k8s_attributes" }}{{ end }}
{{- if .Values.resourceDetection.enabled }}{{ $p = append $p "resource_detection" }}{{ end }}
{{- range .Values.extraProcessors }}{{ $p = append $p .name }}{{ end }}
{{- toJson $p }}
{{- end }}

{{/* The Collector configuration the agent runs. */}}
{{- define "sonde.config" -}}
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
      {{- toYaml . | nindent 6 }}
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
  {{- if .Values.resourceDetection.enabled }}
  resource_detection:
    detectors: {{ toJson .Values.resourceDetection.detectors }}
    timeout: {{ .Values.resourceDetection.timeout }}
    override: false
  {{- end }}
  {{- range .Values.extraProcessors }}
  {{ .name }}:
    {{- toYaml (default dict .config) | nindent 4 }}
  {{- end }}
exporters:
  otlp_grpc:
    endpoint: {{ required "otlp.endpoint is required: set it to the host:port of an OTLP/gRPC receiver, e.g. --set otlp.endpoint=collector.observability:4317" .Values.otlp.endpoint | quote }}
    compression: {{ .Values.otlp.compression }}
    timeout: {{ .Values.otlp.timeout }}
    tls:
      insecure: {{ .Values.otlp.insecure }}
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
  extensions: [health_check]
  pipelines:
    profiles:
      receivers: [sonde]
      processors: {{ include "sonde.processors" . }}
      exporters: [otlp_grpc]
{{- end }}
