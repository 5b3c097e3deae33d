{{/*
The canary gates' PromQL, shared by the Argo Rollouts AnalysisTemplate and the Flagger
MetricTemplates. The same comparison as the exported CanaryRelevanceDrop,
CanaryAnswerRelevanceDrop and CanaryValidityDrop rules (tests/helm/test_canary_templates.py
checks it against `semhealth rules export`), with the controller's variant values in place
of canary/stable, the alert's `< -tolerance` left to the controller, and min() over routes:
one number, the worst route's relative change (-0.1 is 10 % below stable). A route with
fewer than minSamples on either side is left out; with none left the query returns nothing.

Call with (dict "signal" "context-relevance" "canary" SEL "stable" SEL "window" W "min" N),
where SEL is the selector body after variant (`variant="..."` and any extra matchers).
*/}}

{{- define "semhealth.canary.signals" -}}
context-relevance: semantic_health_context_relevance_score
answer-relevance: semantic_health_answer_relevance_score
validity: semantic_health_outputs_total
{{- end }}

{{/* The signals turned on in values, in a fixed order: name -> series. */}}
{{- define "semhealth.canary.enabledSignals" -}}
{{- $on := .Values.canary.signals }}
{{- $all := include "semhealth.canary.signals" . | fromYaml }}
{{- $out := dict }}
{{- if $on.contextRelevance }}{{ $_ := set $out "context-relevance" (get $all "context-relevance") }}{{ end }}
{{- if $on.answerRelevance }}{{ $_ := set $out "answer-relevance" (get $all "answer-relevance") }}{{ end }}
{{- if $on.validity }}{{ $_ := set $out "validity" (get $all "validity") }}{{ end }}
{{- toYaml $out }}
{{- end }}

{{- define "semhealth.canary.query" -}}
{{- $series := get (include "semhealth.canary.signals" . | fromYaml) .signal }}
{{- $c := .canary }}{{ $s := .stable }}{{ $w := .window }}{{ $n := .min }}
{{- if eq .signal "validity" }}
{{- $ratio := "(sum by (route) (rate(%s{result=\"valid\", %s}[%s])) or (0 * sum by (route) (rate(%s{%s}[%s])))) / sum by (route) (rate(%s{%s}[%s]))" }}
{{- $canary := printf $ratio $series $c $w $series $c $w $series $c $w }}
{{- $stable := printf $ratio $series $s $w $series $s $w $series $s $w }}
{{- printf "min((((%s) / (%s) - 1) and on (route) (sum by (route) (increase(%s{%s}[%s])) >= %v) and on (route) (sum by (route) (increase(%s{%s}[%s])) >= %v)))" $canary $stable $series $c $w $n $series $s $w $n }}
{{- else }}
{{- $p50 := "histogram_quantile(0.5, sum by (le, route) (rate(%s_bucket{%s}[%s])))" }}
{{- $canary := printf $p50 $series $c $w }}
{{- $stable := printf $p50 $series $s $w }}
{{- printf "min(((%s / %s - 1) and on (route) (sum by (route) (increase(%s_count{%s}[%s])) >= %v) and on (route) (sum by (route) (increase(%s_count{%s}[%s])) >= %v)))" $canary $stable $series $c $w $n $series $s $w $n }}
{{- end }}
{{- end }}
