{{/*
Chart name, truncated to 63 characters (the label-value limit).
*/}}
{{- define "gangshare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Object-name prefix. Component suffixes (-operator, -scheduler, ...) are at most 17 characters,
so the prefix is cut to 46 to keep every name a valid 63-character DNS label.
*/}}
{{- define "gangshare.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 46 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gangshare.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable across upgrades (a Deployment's selector is immutable).
*/}}
{{- define "gangshare.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gangshare.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Standard labels of every object.
*/}}
{{- define "gangshare.labels" -}}
helm.sh/chart: {{ include "gangshare.chart" . }}
{{ include "gangshare.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gangshare
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Per-component labels: call with (dict "ctx" $ "component" "operator").
*/}}
{{- define "gangshare.componentLabels" -}}
{{ include "gangshare.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gangshare.componentSelectorLabels" -}}
{{ include "gangshare.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
The gangshare image; the tag defaults to the chart's appVersion.
*/}}
{{- define "gangshare.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "gangshare.operatorServiceAccount" -}}
{{- printf "%s-operator" (include "gangshare.fullname" .) }}
{{- end }}

{{- define "gangshare.schedulerServiceAccount" -}}
{{- printf "%s-scheduler" (include "gangshare.fullname" .) }}
{{- end }}

{{- define "gangshare.agentServiceAccount" -}}
{{- printf "%s-agent" (include "gangshare.fullname" .) }}
{{- end }}

{{/*
The node agent's namespace: agent.namespace, or the release namespace.
*/}}
{{- define "gangshare.agentNamespace" -}}
{{- default .Release.Namespace .Values.agent.namespace }}
{{- end }}

{{/*
The shared /tmp emptyDir that lets every container keep a read-only root file system.
*/}}
{{- define "gangshare.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{- define "gangshare.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/*
A CEL list literal of strings, written as crds/ policies write theirs: ['a', 'b']. The values
schema keeps quotes and backslashes out of the strings.
*/}}
{{- define "gangshare.celStrings" -}}
[{{ range $i, $s := . }}{{ if $i }}, {{ end }}'{{ $s }}'{{ end }}]
{{- end }}
