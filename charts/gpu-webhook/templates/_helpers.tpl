{{/*
Names, labels and the pieces shared by several templates.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "gpu-webhook.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified name of the release's objects: fullnameOverride, else "<release>-<chart>",
shortened to the release name when it already contains the chart name. 63 characters at most
(a DNS label: the Service is named so). Suffixed names (Secret, Issuer) are DNS subdomains.
*/}}
{{- define "gpu-webhook.fullname" -}}
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

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "gpu-webhook.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the webhook's pods; never change them after a release exists. */}}
{{- define "gpu-webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels on every object of the chart. */}}
{{- define "gpu-webhook.labels" -}}
helm.sh/chart: {{ include "gpu-webhook.chart" . }}
{{ include "gpu-webhook.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: admission-webhook
app.kubernetes.io/part-of: gpu-webhook
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
"true" when policy.cluster.enabled: the webhook then lists and watches Nodes, so it needs a
service-account token, read access to Nodes and (with networkPolicy.egress) a way to the apiserver.
*/}}
{{- define "gpu-webhook.clusterChecks" -}}
{{- $policy := .Values.policy | default dict }}
{{- $cluster := $policy.cluster | default dict }}
{{- if $cluster.enabled }}true{{ end }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "gpu-webhook.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-webhook.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] of the webhook image. */}}
{{- define "gpu-webhook.image" -}}
{{- $ref := .Values.image.repository }}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString }}
{{- if $tag }}
{{- $ref = printf "%s:%s" $ref $tag }}
{{- end }}
{{- if .Values.image.digest }}
{{- $ref = printf "%s@%s" $ref .Values.image.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{/* The Service's DNS names, in the order the serving certificate lists them. */}}
{{- define "gpu-webhook.dnsNames" -}}
{{- $svc := include "gpu-webhook.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- toJson (concat $names .Values.certs.extraDNSNames | uniq) }}
{{- end }}

{{/* The Secret holding tls.crt, tls.key and ca.crt, whatever certs.mode made it. */}}
{{- define "gpu-webhook.tlsSecretName" -}}
{{- if eq .Values.certs.mode "secret" }}
{{- required "certs.secret.name is required when certs.mode is \"secret\"" .Values.certs.secret.name }}
{{- else }}
{{- printf "%s-tls" (include "gpu-webhook.fullname" .) }}
{{- end }}
{{- end }}

{{/* The serving Certificate's name in cert-manager mode (the source of inject-ca-from). */}}
{{- define "gpu-webhook.servingCertificateName" -}}
{{- printf "%s-tls" (include "gpu-webhook.fullname" .) }}
{{- end }}

{{/*
The CA and serving certificate of certs.mode=helm, as JSON {"ca", "crt", "key"} (base64 PEM).
The Secret from an earlier release is reused when it holds all three, so `helm upgrade` keeps
the CA (and the caBundle) stable. The result is cached in .Values for the length of one render,
because the Secret and the two webhook configurations are separate templates and genCA would
otherwise make a different CA for each.
*/}}
{{- define "gpu-webhook.helmCerts" -}}
{{- if not (hasKey .Values "__gpuWebhookHelmCerts") }}
{{- $name := include "gpu-webhook.tlsSecretName" . }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name }}
{{- $data := dict }}
{{- if $existing }}
{{- $data = $existing.data | default dict }}
{{- end }}
{{- $certs := dict }}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") }}
{{- $certs = dict "ca" (index $data "ca.crt") "crt" (index $data "tls.crt") "key" (index $data "tls.key") }}
{{- else }}
{{- $fullname := include "gpu-webhook.fullname" . }}
{{- $days := int .Values.certs.helm.validityDays }}
{{- $ca := genCA (printf "%s-ca" $fullname) $days }}
{{- $dnsNames := include "gpu-webhook.dnsNames" . | fromJsonArray }}
{{- $cn := printf "%s.%s.svc" $fullname .Release.Namespace }}
{{- $cert := genSignedCert $cn .Values.certs.extraIPAddresses $dnsNames $days $ca }}
{{- $certs = dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) }}
{{- end }}
{{- $_ := set .Values "__gpuWebhookHelmCerts" $certs }}
{{- end }}
{{- toJson (index .Values "__gpuWebhookHelmCerts") }}
{{- end }}

{{/* The webhook configurations' caBundle (base64 PEM), or nothing when cert-manager injects it. */}}
{{- define "gpu-webhook.caBundle" -}}
{{- if eq .Values.certs.mode "helm" }}
{{- (include "gpu-webhook.helmCerts" . | fromJson).ca }}
{{- else if eq .Values.certs.mode "secret" }}
{{- $bundle := required "certs.secret.caBundle (base64 PEM of the CA that signed the serving certificate) is required when certs.mode is \"secret\"" .Values.certs.secret.caBundle }}
{{- if not (contains "-----BEGIN CERTIFICATE-----" (b64dec $bundle)) }}
{{- fail "certs.secret.caBundle must be the base64 encoding of PEM certificates (base64 -w0 ca.crt)" }}
{{- end }}
{{- $bundle }}
{{- end }}
{{- end }}

{{/*
The GPU resource name patterns: policy.resources, else the webhook's built-in defaults, and the implicit
extended resource name (deviceclass.resource.kubernetes.io/<class>) of every GPU device class
(policy.dra.gpuClasses, else the webhook's defaults), as webhook.core.policy.Policy.is_gpu reads them.
*/}}
{{- define "gpu-webhook.gpuResources" -}}
{{- $policy := .Values.policy | default dict }}
{{- $dra := $policy.dra | default dict }}
{{- $names := $policy.resources | default (list "nvidia.com/gpu" "amd.com/gpu" "gpu.intel.com/*" "nvidia.com/mig-*") }}
{{- $classes := $dra.gpuClasses | default (list "gpu.nvidia.com" "mig.nvidia.com" "vfio.gpu.nvidia.com" "gpu.amd.com" "gpu.intel.com") }}
{{- range $classes }}
{{- $names = append $names (printf "deviceclass.resource.kubernetes.io/%s" .) }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/*
A CEL test of one resource name `k` against the GPU patterns, with fnmatch's meaning (the
webhook matches with fnmatchcase): a name without wildcards is compared, a name whose only
wildcard is a trailing "*" is a prefix, anything else becomes an anchored RE2 regular expression.
*/}}
{{- define "gpu-webhook.celResourceTest" -}}
{{- $tests := list }}
{{- range (include "gpu-webhook.gpuResources" . | fromJsonArray) }}
{{- $pattern := toString . }}
{{- $prefix := trimSuffix "*" $pattern }}
{{- if not (regexMatch "[*?\\[]" $pattern) }}
{{- $tests = append $tests (printf "k == '%s'" (include "gpu-webhook.celString" $pattern)) }}
{{- else if and (hasSuffix "*" $pattern) (not (regexMatch "[*?\\[]" $prefix)) }}
{{- $tests = append $tests (printf "k.startsWith('%s')" (include "gpu-webhook.celString" $prefix)) }}
{{- else }}
{{- $re := regexQuoteMeta $pattern | replace "\\*" ".*" | replace "\\?" "." | replace "\\[!" "[^" | replace "\\[" "[" | replace "\\]" "]" }}
{{- $tests = append $tests (printf "k.matches('%s')" (include "gpu-webhook.celString" (printf "^%s$" $re))) }}
{{- end }}
{{- end }}
{{- join " || " $tests }}
{{- end }}

{{/* The body of a single-quoted CEL string literal. */}}
{{- define "gpu-webhook.celString" -}}
{{- . | replace "\\" "\\\\" | replace "'" "\\'" }}
{{- end }}

{{/*
The pod templates ({metadata, spec}) of the object, found by request.kind.kind the way the webhook finds
them: a Pod is its own template.
*/}}
{{- define "gpu-webhook.celPodTemplates" -}}
(request.kind.kind == 'Pod'
  ? [object]
  : request.kind.kind == 'PodTemplate'
    ? (has(object.template) ? [object.template] : [])
    : request.kind.kind == 'CronJob'
      ? (has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec)
          && has(object.spec.jobTemplate.spec.template) ? [object.spec.jobTemplate.spec.template] : [])
      : (has(object.spec) && has(object.spec.template) ? [object.spec.template] : [])
)
{{- end }}

{{/*
The matchConditions expression of one webhook; call with (dict "root" $ "hook" "validate"|"mutate").
Every field access is guarded by has(): an evaluation error would reject the request under
failurePolicy Fail. The pod spec itself is appended to its container list so that its pod-level
`resources` is tested by the same clause as the containers'. A pod spec with DRA claims
(spec.resourceClaims) is sent too: its GPUs are in ResourceClaims and templates the expression cannot see.

Both webhooks take a pod spec in which a container, an init container, an ephemeral container or the
pod-level `resources` names a GPU resource (policy.resources) in its limits or requests.
/validate also takes what the isolation rules need, and nothing more: any vendor GPU name of the
webhook's registry (time-sliced, MIG, HAMi, Volcano, Intel monitoring...), a container env entry named
NVIDIA_VISIBLE_DEVICES or NVIDIA_MIG_CONFIG_DEVICES, a privileged container, a mount into
nvidia-container-devices, a hostPath volume, runtimeClassName nvidia*, a CDI annotation.
/mutate also takes every pod of the namespaces where isolation.hideGpus applies.
*/}}
{{- define "gpu-webhook.matchExpression" -}}
{{- $gpu := include "gpu-webhook.celResourceTest" .root -}}
{{- if eq .hook "validate" }}
{{- $gpu = printf "%s || k.matches('%s')" $gpu (include "gpu-webhook.celString" (include "gpu-webhook.registryPattern" .root)) }}
{{- end }}
{{- $hidden := include "gpu-webhook.hideGpusCondition" .root | trim -}}
{{- if and (eq .hook "mutate") $hidden }}{{ $hidden }}
|| {{ end -}}
{{ include "gpu-webhook.celPodTemplates" . }}.exists(t, has(t.spec) && (
  ((has(t.spec.containers) ? t.spec.containers : [])
    + (has(t.spec.initContainers) ? t.spec.initContainers : [])
    + (has(t.spec.ephemeralContainers) ? t.spec.ephemeralContainers : [])
    + [t.spec]
  ).exists(c, (has(c.resources)
    && ((has(c.resources.limits) ? [c.resources.limits] : []) + (has(c.resources.requests) ? [c.resources.requests] : []))
      .exists(r, r.exists(k, {{ $gpu }})))
{{- if eq .hook "validate" }}
    || (has(c.env) && c.env.exists(e, has(e.name)
          && (e.name == 'NVIDIA_VISIBLE_DEVICES' || e.name == 'NVIDIA_MIG_CONFIG_DEVICES')))
    || (has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged == true)
    || (has(c.volumeMounts) && c.volumeMounts.exists(m, has(m.mountPath)
          && m.mountPath.contains('nvidia-container-devices')))
  )
  || (has(t.spec.volumes) && t.spec.volumes.exists(v, has(v.hostPath)))
  || (has(t.spec.runtimeClassName) && t.spec.runtimeClassName.startsWith('nvidia'))
  || (has(t.metadata) && has(t.metadata.annotations) && t.metadata.annotations.exists(k,
        k.startsWith('cdi.k8s.io/') || k.startsWith('nvidia.cdi.k8s.io')))
{{- else }}
  )
{{- end }}
  || (has(t.spec.resourceClaims) && size(t.spec.resourceClaims) > 0)
))
{{- end }}

{{/*
The namespaces where isolation.hideGpus applies, as a CEL test of request.namespace; empty when none.
On by default (policy.isolation.hideGpus void or none): every namespace but those whose overlay turns it
off. Off by default: the namespaces whose overlay turns it on.
*/}}
{{- define "gpu-webhook.hideGpusCondition" -}}
{{- $policy := .Values.policy | default dict }}
{{- $isolation := $policy.isolation | default dict }}
{{- $global := has (toString $isolation.hideGpus) (list "void" "none") }}
{{- $on := list }}
{{- $off := list }}
{{- range $ns, $overlay := ($policy.namespaces | default dict) }}
{{- $nsIsolation := ($overlay | default dict).isolation | default dict }}
{{- if hasKey $nsIsolation "hideGpus" }}
{{- if has (toString $nsIsolation.hideGpus) (list "void" "none") }}
{{- $on = append $on $ns }}
{{- else }}
{{- $off = append $off $ns }}
{{- end }}
{{- end }}
{{- end }}
{{- if $global }}
{{- if $off }}!(request.namespace in {{ include "gpu-webhook.celList" $off }}){{ else }}true{{ end }}
{{- else if $on }}request.namespace in {{ include "gpu-webhook.celList" $on }}
{{- end }}
{{- end }}

{{/* A CEL list of string literals. */}}
{{- define "gpu-webhook.celList" -}}
{{- $items := list }}
{{- range . }}
{{- $items = append $items (printf "'%s'" (include "gpu-webhook.celString" (toString .))) }}
{{- end }}
{{- printf "[%s]" (join ", " $items) }}
{{- end }}

{{/* Namespaces the webhooks never see: the system ones, the release's own, and webhook.excludeNamespaces. */}}
{{- define "gpu-webhook.excludedNamespaces" -}}
{{- toJson (concat (list "kube-system" "kube-node-lease" .Release.Namespace) .Values.webhook.excludeNamespaces | uniq) }}
{{- end }}

{{/*
clientConfig of one webhook; call with (dict "root" $ "path" "/validate").
*/}}
{{- define "gpu-webhook.clientConfig" -}}
{{- $root := .root }}
{{- if $root.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhook.url) .path | quote }}
{{- else }}
service:
  name: {{ include "gpu-webhook.fullname" $root }}
  namespace: {{ $root.Release.Namespace }}
  path: {{ .path }}
  port: {{ $root.Values.service.port }}
{{- end }}
{{- with include "gpu-webhook.caBundle" $root }}
caBundle: {{ . }}
{{- end }}
{{- end }}

{{/* Metadata annotations of both webhook configurations. */}}
{{- define "gpu-webhook.webhookAnnotations" -}}
{{- $annotations := dict }}
{{- if eq .Values.certs.mode "cert-manager" }}
{{- $_ := set $annotations "cert-manager.io/inject-ca-from" (printf "%s/%s" .Release.Namespace (include "gpu-webhook.servingCertificateName" .)) }}
{{- end }}
{{- $annotations = merge $annotations (.Values.webhook.annotations | default dict) }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Checks that the schema cannot express: fail the render with a clear message, never a pod that
exits 2 on start.
*/}}
{{- define "gpu-webhook.validate" -}}
{{- /*
The kubelet's grace period covers the preStop sleep and everything after SIGTERM: drainSeconds of
failing /readyz, then up to 20 s for requests in flight (the server's graceful timeout is
drainSeconds + 20). A shorter period SIGKILLs the server while it still answers the apiserver.
*/}}
{{- $grace := float64 .Values.terminationGracePeriodSeconds }}
{{- $needed := addf .Values.preStopSleepSeconds .Values.server.drainSeconds 20 }}
{{- if le $grace $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be greater than preStopSleepSeconds + server.drainSeconds + 20 (%v): after the preStop sleep the server fails /readyz for drainSeconds, then waits up to 20 s for requests in flight, and the kubelet kills it when the grace period ends" .Values.terminationGracePeriodSeconds $needed) }}
{{- end }}
{{- $policy := .Values.policy | default dict }}
{{- $global := $policy.accelerator | default dict }}
{{- $allowed := $global.allowed | default list }}
{{- $default := $global.default | default "" }}
{{- if and $default $allowed (not (has $default $allowed)) }}
{{- fail (printf "policy.accelerator.default %q is not in policy.accelerator.allowed %v" $default $allowed) }}
{{- end }}
{{- range $ns, $overlay := ($policy.namespaces | default dict) }}
{{- $acc := $overlay.accelerator | default dict }}
{{- $nsAllowed := hasKey $acc "allowed" | ternary $acc.allowed $allowed }}
{{- $nsDefault := hasKey $acc "default" | ternary $acc.default $default }}
{{- if and $nsDefault $nsAllowed (not (has $nsDefault $nsAllowed)) }}
{{- fail (printf "policy.namespaces.%s.accelerator.default %q is not in its allowed list %v" $ns $nsDefault $nsAllowed) }}
{{- end }}
{{- end }}
{{- if and .Values.server.clientCA.configMapName (not .Values.server.clientCA.key) }}
{{- fail "server.clientCA.key must name the ConfigMap key holding the CA" }}
{{- end }}
{{- $np := .Values.networkPolicy }}
{{- if and $np.enabled $np.egress.enabled (include "gpu-webhook.apiAccess" .) (not $np.egress.apiserver) }}
{{- fail "networkPolicy.egress.apiserver must list the apiserver's addresses (NetworkPolicyPeers, e.g. [{ipBlock: {cidr: 10.0.0.10/32}}]) when networkPolicy.egress.enabled and policy.cluster.enabled or audit.enabled: without them the node watch or the audit cannot reach the apiserver (and with cluster checks /readyz stays 503)" }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.server.port) }}
{{- fail (printf "metrics.port (%v) must differ from server.port: the plain-HTTP metrics port and the HTTPS admission port are separate listeners" .Values.metrics.port) }}
{{- end }}
{{- end }}
