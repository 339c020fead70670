{{/* The release's objects are named after the release, or the chart when they are the same. */}}
{{- define "amd-hsmp-exporter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "amd-hsmp-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "amd-hsmp-exporter.labels" -}}
{{ include "amd-hsmp-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
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

{{/* What both monitors set: the mixin selects job="amd_hsmp"; the node is the instance. */}}
{{- define "amd-hsmp-exporter.endpoint" -}}
port: http
path: /metrics
scheme: {{ include "amd-hsmp-exporter.scheme" .root }}
interval: {{ .monitor.interval }}
scrapeTimeout: {{ .monitor.scrapeTimeout }}
{{- with .monitor.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .monitor.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
relabelings:
  - action: replace
    targetLabel: job
    replacement: amd_hsmp
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: instance
{{- end -}}
