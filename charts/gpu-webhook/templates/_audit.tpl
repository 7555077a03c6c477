{{/*
Helpers of the audit (audit.* values): the periodic audit in the server (audit.enabled) and the read-only
ClusterRole for running `gpu-webhook audit` by hand (audit.readerClusterRole.enabled).
*/}}

{{/* The Lease the replicas share so that one at a time audits. */}}
{{- define "gpu-webhook.auditLeaseName" -}}
{{- printf "%s-audit" (include "gpu-webhook.fullname" .) }}
{{- end }}

{{/*
"true" when the server calls the Kubernetes API and needs a service-account token: the cluster checks
(policy.cluster.enabled) watch Nodes, the periodic audit (audit.enabled) lists and writes reports, the policy
object (policyObject.enabled) is watched and its status written.
*/}}
{{- define "gpu-webhook.apiAccess" -}}
{{- $policy := .Values.policy | default dict }}
{{- $cluster := $policy.cluster | default dict }}
{{- if or $cluster.enabled .Values.audit.enabled (dig "enabled" true (.Values.policyObject | default dict)) }}true{{ end }}
{{- end }}

{{/*
RBAC rules to list every kind the audit reads: the built-in kinds that carry pod specs (the table in
webhook/podspecs.py) and webhook.customResources. (With the cluster checks on, the server reads Nodes
through rbac-nodes.yaml.)
*/}}
{{- define "gpu-webhook.auditListRules" -}}
- apiGroups: [""]
  resources: ["pods", "podtemplates", "replicationcontrollers"]
  verbs: ["list"]
- apiGroups: ["apps"]
  resources: ["deployments", "replicasets", "statefulsets", "daemonsets"]
  verbs: ["list"]
- apiGroups: ["batch"]
  resources: ["jobs", "cronjobs"]
  verbs: ["list"]
{{- range .Values.webhook.customResources }}
- apiGroups: {{ toJson .apiGroups }}
  resources: {{ toJson .resources }}
  verbs: ["list"]
{{- end }}
{{- end }}

{{/* The report API the periodic audit writes: group and the namespaced and cluster resources. */}}
{{- define "gpu-webhook.auditReportRule" -}}
{{- if eq .Values.audit.reportKind "wgpolicyk8s" }}
- apiGroups: ["wgpolicyk8s.io"]
  resources: ["policyreports", "clusterpolicyreports"]
{{- else }}
- apiGroups: ["openreports.io"]
  resources: ["reports", "clusterreports"]
{{- end }}
  verbs: ["get", "list", "create", "patch", "delete"]
{{- end }}

{{/* serve arguments of the periodic audit. */}}
{{- define "gpu-webhook.auditArgs" -}}
- --audit
- --audit-interval={{ .Values.audit.interval }}
- --audit-report-kind={{ .Values.audit.reportKind }}
- --audit-lease={{ .Release.Namespace }}/{{ include "gpu-webhook.auditLeaseName" . }}
{{- range (include "gpu-webhook.excludedNamespaces" . | fromJsonArray) }}
- --audit-exclude-namespace={{ . }}
{{- end }}
{{- /* Exactly the custom resources the webhook validates and the RBAC lets it list; none matches "". */}}
{{- $custom := list }}
{{- range .Values.webhook.customResources }}
{{- $entry := . }}
{{- range .apiGroups }}
{{- $group := . }}
{{- range $entry.resources }}
{{- $custom = append $custom (printf "%s/%s" $group .) }}
{{- end }}
{{- end }}
{{- end }}
{{- range ($custom | default (list "")) }}
- --audit-resource={{ . }}
{{- end }}
{{- end }}
