{{- define "specpilot.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "specpilot.labels" -}}
{{ include "specpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: specpilot
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "specpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "specpilot.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* Labels on every monitoring object: monitoring.labels plus kube-prometheus-stack's
`release` selector label when its release is named. */ -}}
{{- define "specpilot.monitoringLabels" -}}
{{- $labels := dict -}}
{{- with .Values.monitoring.prometheusRelease }}{{ $_ := set $labels "release" . }}{{ end -}}
{{- $labels = merge (deepCopy .Values.monitoring.labels) $labels -}}
{{- if $labels }}{{ toYaml $labels }}{{ end -}}
{{- end -}}

{{- define "specpilot.monitoringLabelsJson" -}}
{{- $labels := dict -}}
{{- with .Values.monitoring.prometheusRelease }}{{ $_ := set $labels "release" . }}{{ end -}}
{{- $labels = merge (deepCopy .Values.monitoring.labels) $labels -}}
{{- toJson $labels -}}
{{- end -}}

{{- /* URL prefixes the operator may query: prometheus.allowedUrls, else prometheus.url. */ -}}
{{- define "specpilot.prometheusAllow" -}}
{{- if .Values.prometheus.allowedUrls -}}
{{- join "," .Values.prometheus.allowedUrls -}}
{{- else -}}
{{- .Values.prometheus.url -}}
{{- end -}}
{{- end -}}

{{- /* The namespaced rules: what the operator does inside a namespace it serves. Shared by
the ClusterRole (cluster-wide mode) and the per-namespace Roles (namespaced mode). */ -}}
{{- define "specpilot.namespacedRules" -}}
# Watch SpecDeployments; kopf patches them (finalizer, last-handled annotation).
- apiGroups: [specpilot.io]
  resources: [specdeployments]
  verbs: [get, list, watch, patch]
# Status: phase, current config, observations, decisions, conditions, tuner state (written
# with a merge patch; read with the object).
- apiGroups: [specpilot.io]
  resources: [specdeployments/status]
  verbs: [patch]
# An Event for every decision, rollout and rollback (kopf and SpecPilot post core/v1 Events);
# a repeat of the same Event is read and its count patched.
- apiGroups: [""]
  resources: [events]
  verbs: [create, get, patch]
# Owned children, read by name and written (never listed or watched): engine Deployments
# (main and canary, deleted after a canary), the Service, sidecar ConfigMaps (immutable;
# listed by label to prune those no longer referenced).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, create, patch, delete]
# Engine pods, listed by label: readiness during a rollout and their /metrics when scraping.
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
# Prometheus Operator monitors, created only where their CRDs exist.
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors, servicemonitors]
  verbs: [get, create, patch]
{{- end -}}
