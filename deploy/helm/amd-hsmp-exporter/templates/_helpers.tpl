{{/* The chart's name, or nameOverride. */}}
{{- define "amd-hsmp-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's objects are named fullnameOverride, or after the release, followed by the
chart's name unless the release's name contains it. */}}
{{- define "amd-hsmp-exporter.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "amd-hsmp-exporter.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The namespace of every object: namespaceOverride, or the release's. */}}
{{- define "amd-hsmp-exporter.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "amd-hsmp-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "amd-hsmp-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "amd-hsmp-exporter.labels" -}}
{{ include "amd-hsmp-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "amd-hsmp-exporter.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "amd-hsmp-exporter.scheme" -}}
{{- if .Values.web.tls }}https{{ else }}http{{ end -}}
{{- end -}}

{{/* The label NFD puts on the nodes with the HSMP driver loaded (nodeFeatureRule). */}}
{{- define "amd-hsmp-exporter.nodeSelector" -}}
{{- $selector := deepCopy .Values.nodeSelector -}}
{{- if dig "nodeFeatureRule" "enabled" false .Values.AsMap -}}
{{- $_ := set $selector .Values.nodeFeatureRule.label "true" -}}
{{- end -}}
{{- with $selector }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* `env` of both containers: a map {NAME: value} or a list of EnvVar objects. */}}
{{- define "amd-hsmp-exporter.env" -}}
{{- if kindIs "map" .Values.env -}}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end -}}
{{- else -}}
{{ toYaml .Values.env }}
{{- end -}}
{{- end -}}

{{/* The monitors' metadata and the parts of their spec they share: the namespace they are in
(monitor.namespace, or the chart's) and the one of the pods they select (the chart's). */}}
{{- define "amd-hsmp-exporter.monitorSpec" -}}
{{- $m := .monitor -}}
{{- with $m.jobLabel }}
jobLabel: {{ . }}
{{- end }}
{{- with $m.podTargetLabels }}
podTargetLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.sampleLimit }}
sampleLimit: {{ . }}
{{- end }}
{{- if dig "attachMetadata" "node" false $m }}
attachMetadata:
  node: true
{{- end }}
namespaceSelector:
  matchNames: [{{ include "amd-hsmp-exporter.namespace" .root }}]
selector:
  matchLabels:
    {{- include "amd-hsmp-exporter.selectorLabels" .root | nindent 4 }}
{{- end -}}

{{/* What both monitors' endpoints set: the mixin selects job="amd_hsmp" (unless jobLabel names
another source); instance is the node's name or node_exporter's `<node IP>:port`, to join
node_exporter's series under kube-prometheus or kube-prometheus-stack. */}}
{{- define "amd-hsmp-exporter.endpoint" -}}
{{- $m := .monitor -}}
port: http
path: /metrics
scheme: {{ include "amd-hsmp-exporter.scheme" .root }}
interval: {{ $m.interval }}
scrapeTimeout: {{ $m.scrapeTimeout }}
{{- if $m.honorLabels }}
honorLabels: true
{{- end }}
{{- with $m.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  {{- if not $m.jobLabel }}
  - action: replace
    targetLabel: job
    replacement: amd_hsmp
  {{- end }}
  {{- if eq (dig "instanceLabel" "nodeName" $m) "nodeIP" }}
  # node_exporter's instance under kube-prometheus-stack: <node IP>:port ([IPv6]:port).
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_host_ip]
    regex: "([^:]+)"
    targetLabel: instance
    replacement: "${1}:{{ $m.nodeExporterPort }}"
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_host_ip]
    regex: "(.*:.*)"
    targetLabel: instance
    replacement: "[${1}]:{{ $m.nodeExporterPort }}"
  {{- else }}
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: instance
  {{- end }}
  {{- with $m.relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $m.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The job the mixin's rules, alerts and dashboards select: `jobSelector`, else its earlier
name `prometheusRule.selector` (accepted for one release), else the mixin's own
(files/mixin_config.yaml). Read with a fallback: `helm upgrade --reuse-values` from a chart
without the key has none. */}}
{{- define "amd-hsmp-exporter.jobSelector" -}}
{{- $earlier := dig "prometheusRule" "selector" "" .Values.AsMap -}}
{{- dig "jobSelector" "" .Values.AsMap | default $earlier | default (.Files.Get "files/mixin_config.yaml" | fromYaml).selector -}}
{{- end -}}
