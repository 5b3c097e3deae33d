{{/*
Names and labels shared by every template.
*/}}

{{- define "semhealth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* release-chart, or the release alone when it already names the chart; 63 characters. */}}
{{- define "semhealth.fullname" -}}
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

{{/* The name of one component's objects: <fullname>-<component>, 63 characters. */}}
{{- define "semhealth.componentName" -}}
{{- printf "%s-%s" (include "semhealth.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component }}
{{- end }}

{{- define "semhealth.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "semhealth.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: semhealth
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "semhealth.selectorLabels" -}}
app.kubernetes.io/name: {{ include "semhealth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component: call with (dict "root" $ "component" "scorer"). */}}
{{- define "semhealth.componentLabels" -}}
{{ include "semhealth.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "semhealth.componentSelectorLabels" -}}
{{ include "semhealth.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "semhealth.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- include "semhealth.fullname" . }}
{{- else }}
{{- "default" }}
{{- end }}
{{- end }}

{{/* repository:tag of an image block. */}}
{{- define "semhealth.image" -}}
{{- printf "%s:%s" .repository (toString .tag) }}
{{- end }}

{{- define "semhealth.injectorName" -}}
{{- include "semhealth.componentName" (dict "root" . "component" "injector") }}
{{- end }}

{{- define "semhealth.scorerName" -}}
{{- include "semhealth.componentName" (dict "root" . "component" "scorer") }}
{{- end }}

{{/* The Secret with the webhook's serving certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "semhealth.injectorTLSSecret" -}}
{{- printf "%s-tls" (include "semhealth.injectorName" .) }}
{{- end }}

{{/* The scorer's address as sidecars dial it: service.namespace.svc:port. */}}
{{- define "semhealth.scorerAddress" -}}
{{- printf "%s.%s.svc:%d" (include "semhealth.scorerName" .) .Release.Namespace (int .Values.scorer.port) }}
{{- end }}

{{/* The namespaces that get the sidecar's ConfigMap. */}}
{{- define "semhealth.configNamespaces" -}}
{{- if .Values.sidecarConfig.namespaces }}
{{- toJson (uniq .Values.sidecarConfig.namespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
The Prometheus rule groups, as a YAML list: the default alerts exported by
`semhealth rules export --format prometheus` (files/prometheus-rules.yaml, committed) and the
recording rules (files/recording-rules.yaml). The files are read, never templated, so the
alerts' {{ $labels.x }} stay for Prometheus.
*/}}
{{- define "semhealth.ruleGroups" -}}
{{- $groups := list }}
{{- if .Values.prometheusRule.alerts }}
{{- $groups = concat $groups ((.Files.Get "files/prometheus-rules.yaml" | fromYaml).groups) }}
{{- end }}
{{- if .Values.prometheusRule.recordingRules }}
{{- range (.Files.Get "files/recording-rules.yaml" | fromYaml).groups }}
{{- $groups = append $groups (merge (dict "interval" $.Values.prometheusRule.interval) .) }}
{{- end }}
{{- end }}
{{- toYaml $groups }}
{{- end }}

{{/*
The webhook's TLS pair and CA, base64, as YAML (ca, cert, key), without cert-manager.

The Secret of an earlier release is reused when `lookup` finds it whole, so an upgrade keeps
the certificate the API server already trusts. Otherwise (install, or an offline render such
as `helm template`, where lookup finds nothing) a CA and a serving certificate for the
Service's DNS names are generated. The result is cached in the release's context, so the
Secret and the webhook's caBundle, rendered by different templates, always agree.
*/}}
{{- define "semhealth.injectorTLS" -}}
{{- $cache := .Values._semhealthTLSCache | default dict }}
{{- if not (hasKey .Values "_semhealthTLSCache") }}
{{- $_ := set .Values "_semhealthTLSCache" $cache }}
{{- end }}
{{- if not $cache.ca }}
{{- $secretName := include "semhealth.injectorTLSSecret" . }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $secretName }}
{{- $data := dig "data" dict ($existing | default dict) }}
{{- if and (index $data "tls.crt") (index $data "tls.key") (index $data "ca.crt") }}
{{- $_ := set $cache "ca" (index $data "ca.crt") }}
{{- $_ := set $cache "cert" (index $data "tls.crt") }}
{{- $_ := set $cache "key" (index $data "tls.key") }}
{{- else }}
{{- $service := include "semhealth.injectorName" . }}
{{- $days := int .Values.selfSignedCertificate.validityDays }}
{{- $ca := genCA (printf "%s-ca" $service) $days }}
{{- $names := list (printf "%s.%s.svc" $service .Release.Namespace) (printf "%s.%s.svc.cluster.local" $service .Release.Namespace) }}
{{- $cert := genSignedCert (first $names) nil $names $days $ca }}
{{- $_ := set $cache "ca" ($ca.Cert | b64enc) }}
{{- $_ := set $cache "cert" ($cert.Cert | b64enc) }}
{{- $_ := set $cache "key" ($cert.Key | b64enc) }}
{{- end }}
{{- end }}
{{- toYaml $cache }}
{{- end }}
