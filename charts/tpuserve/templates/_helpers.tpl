{{/* Names, labels and small shared fragments of the tpuserve chart. */}}

{{- define "tpuserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tpuserve.fullname" -}}
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

{{- define "tpuserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object the chart creates. */}}
{{- define "tpuserve.labels" -}}
helm.sh/chart: {{ include "tpuserve.chart" . }}
app.kubernetes.io/name: {{ include "tpuserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tpuserve.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "tpuserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on monitor and rule objects: chart labels plus monitoring.labels (e.g. release). */}}
{{- define "tpuserve.monitoringLabels" -}}
{{ include "tpuserve.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "tpuserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tpuserve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tpuserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* true when the operator watches a fixed list of namespaces (namespace-scoped mode). */}}
{{- define "tpuserve.namespaced" -}}
{{- if .Values.operator.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
The operator's RBAC rules, generated from tpuserve_operator/rbac.py into
files/operator-rbac-rules.yaml. Shape: `rules:` (namespaced resources: a ClusterRole in
cluster-wide mode, a Role per watched namespace in namespace-scoped mode) and optionally
`clusterRules:` (cluster-scoped resources, read-only, always a ClusterRole) and
`clusterWideRules:` (cluster-scoped, in the ClusterRole of cluster-wide mode only).
*/}}
{{- define "tpuserve.rbacRules" -}}
{{- $raw := .Files.Get "files/operator-rbac-rules.yaml" }}
{{- if not $raw }}
{{- fail "files/operator-rbac-rules.yaml is missing from the chart: regenerate it with `python -m tpuserve_operator.build.generate`" }}
{{- end }}
{{- $parsed := fromYaml $raw }}
{{- if hasKey $parsed "Error" }}
{{- fail (printf "files/operator-rbac-rules.yaml is not valid YAML: %s" $parsed.Error) }}
{{- end }}
{{- toYaml $parsed }}
{{- end }}

{{/* Monitor endpoint extras shared by the model-server and router PodMonitors. */}}
{{- /*
Interval, timeout and relabelings of a PodMonitor endpoint. Called with (dict "root" $ "sglang"
BOOL); with sglang true the endpoint scrapes SGLang and first restores the `sglang:` names that
SGLang 0.5.23's prometheus_client escapes to `sglang_` for Prometheus 2.x (client_python#1177).
The rule is sglang_tpu.metric_names.RESTORE_SGLANG_COLON; tests/chart checks this copy.
*/ -}}
{{- define "tpuserve.podMetricsEndpointExtras" -}}
{{- $values := .root.Values -}}
interval: {{ $values.monitoring.scrapeInterval }}
scrapeTimeout: {{ $values.monitoring.scrapeTimeout }}
{{- with $values.monitoring.relabelings }}
relabelings:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- if or .sglang $values.monitoring.metricRelabelings }}
metricRelabelings:
{{- if .sglang }}
  - sourceLabels: [__name__]
    regex: sglang_(.+)
    targetLabel: __name__
    replacement: sglang:${1}
{{- end }}
{{- with $values.monitoring.metricRelabelings }}
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/* The namespaceSelector for fleet monitors: the watched namespaces, or all of them. */}}
{{- define "tpuserve.monitorNamespaceSelector" -}}
namespaceSelector:
{{- if .Values.operator.watchNamespaces }}
  matchNames:
  {{- toYaml .Values.operator.watchNamespaces | nindent 4 }}
{{- else }}
  any: true
{{- end }}
{{- end }}

{{/*
Pod labels the operator sets on model-server pods, copied onto every scraped series
(`tpu-generation` -> `tpu_generation`); the recording rules aggregate by them.
*/}}
{{- define "tpuserve.podTargetLabels" -}}
- model
- tpu-generation
- tpu-topology
{{- end }}

{{/* The rule groups: generated file plus the price constants rendered from values.pricing. */}}
{{- define "tpuserve.ruleGroups" -}}
{{- $generated := fromYaml (.Files.Get "rules/tpuserve.rules.yaml") }}
{{- $groups := $generated.groups }}
{{- $alertLabels := .Values.monitoring.rules.alertLabels }}
{{- range $groups }}
{{- if $alertLabels }}
{{- range .rules }}
{{- if hasKey . "alert" }}
{{- $_ := set . "labels" (merge (deepCopy $alertLabels) (default dict .labels)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $prices := list }}
{{- $seen := dict }}
{{- range .Values.pricing }}
{{- if hasKey $seen .generation }}
{{- fail (printf "pricing: generation %q is listed twice; give one price per generation" .generation) }}
{{- end }}
{{- $_ := set $seen .generation true }}
{{- $prices = append $prices (dict "record" "tpuserve:tpu_chip_hour_price_usd" "expr" (printf "vector(%v)" .usdPerChipHour) "labels" (dict "tpu_generation" .generation "pricing" .pricing)) }}
{{- end }}
{{- if $prices }}
{{- $groups = append $groups (dict "name" "tpuserve.prices" "rules" $prices) }}
{{- end }}
{{- toYaml $groups }}
{{- end }}
