{{/* The chart's name, cut to Kubernetes' 63 characters. */}}
{{- define "composer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name for every object. */}}
{{- define "composer.fullname" -}}
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

{{- define "composer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "composer.labels" -}}
helm.sh/chart: {{ include "composer.chart" . }}
{{ include "composer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "composer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "composer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one role: include "composer.componentLabels" (list $ "coordinator") */}}
{{- define "composer.componentLabels" -}}
{{ include "composer.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "composer.componentSelectorLabels" -}}
{{ include "composer.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "composer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "composer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "composer.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
An environment variable from a referenced Secret:
include "composer.secretEnv" (list "COMPOSER_API_TOKEN" .Values.secrets.apiToken "secrets.apiToken")
*/}}
{{- define "composer.secretEnv" -}}
{{- $name := index . 0 }}
{{- $ref := index . 1 }}
{{- $path := index . 2 -}}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "%s.existingSecret: the name of an existing Secret holding %s (the chart creates none)" $path $name) $ref.existingSecret | quote }}
      key: {{ required (printf "%s.key: the key of %s in that Secret" $path $name) $ref.key | quote }}
{{- end }}

{{/* The URL workers report to: the coordinators' Service. */}}
{{- define "composer.coordinatorUrl" -}}
{{- printf "http://%s-coordinator.%s.svc:%v" (include "composer.fullname" .) .Release.Namespace .Values.coordinator.service.port }}
{{- end }}
