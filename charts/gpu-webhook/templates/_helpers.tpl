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

{{/*
The webhook image: repository@digest when image.digest is set (the tag is then ignored), else
repository:tag (tag defaulting to the chart's appVersion). image.repository has no default: a made-up
name would leave the pods in ImagePullBackOff and, with failurePolicy Fail, every GPU pod creation failing.
*/}}
{{- define "gpu-webhook.image" -}}
{{- $repository := required "image.repository is required: the registry repository your nodes pull the gpu-webhook image from (helm install ... --set image.repository=<your registry>/gpu-webhook)" .Values.image.repository | toString }}
{{- if regexMatch "\\s" $repository }}
{{- fail (printf "image.repository %q must not contain white space" $repository) }}
{{- end }}
{{- if contains "@" $repository }}
{{- fail (printf "image.repository %q must not carry a digest: give the repository alone and the digest in image.digest" $repository) }}
{{- end }}
{{- if regexMatch ":[^/]*$" $repository }}
{{- fail (printf "image.repository %q must not carry a tag: give the repository alone and the tag in image.tag (a registry port, host:5000/name, is fine)" $repository) }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
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

{{/* The Secret holding the generated CA and its key in certs.mode=helm; never mounted into the pods. */}}
{{- define "gpu-webhook.helmCASecretName" -}}
{{- printf "%s-helm-ca" (include "gpu-webhook.fullname" .) }}
{{- end }}

{{/*
The Secret .name of the release namespace as the cluster has it, as JSON: {} when there is none, and always
with `helm template` (no cluster). Call with (dict "root" $ "name" "...").
*/}}
{{- define "gpu-webhook.existingSecret" -}}
{{- toJson (lookup "v1" "Secret" .root.Release.Namespace .name | default dict) }}
{{- end }}

{{/* The first PEM certificate of a base64 bundle, base64 encoded again; empty when it holds none. */}}
{{- define "gpu-webhook.firstCertificate" -}}
{{- $pem := regexFind "(?s)-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----" (b64dec (toString .)) }}
{{- if $pem }}{{ printf "%s\n" $pem | b64enc }}{{ end }}
{{- end }}

{{/*
The CA and serving certificate of certs.mode=helm, as JSON: "ca" (the caBundle), "crt", "key" (the serving
pair), "caCrt", "caKey" (the CA), "notAfter", "caNotAfter" (RFC 3339, UTC) and "names" (a hash of the
certificate's DNS names and IP addresses); certificates and keys are base64 PEM.

What an earlier release stored is looked up and kept, unless:
- the CA (Secret <fullname>-helm-ca, with its key) is missing, unreadable or has less than
  certs.helm.validityDays left: a new CA, and so a new serving certificate. The caBundle is then the new CA
  followed by the previous one (the first certificate of the old bundle), so pods that still serve the old
  certificate until the kubelet syncs the new Secret into them stay trusted;
- the serving certificate is missing, has less than certs.helm.renewBeforeDays left, or was issued for other
  names or addresses: a new one from the same CA, and the caBundle does not change.
The dates live in annotations on the Secrets (gpu-webhook.io/not-after), since templates cannot read a
certificate; a Secret without them (made by an older chart) counts as expired.
The result is cached in .Values for the length of one render: the Secrets, the webhook configurations and
the notes are separate templates, and genCA would otherwise make a different CA for each.
*/}}
{{- define "gpu-webhook.helmCerts" -}}
{{- if not (hasKey .Values "__gpuWebhookHelmCerts") }}
{{- $h := .Values.certs.helm }}
{{- $rfc3339 := "2006-01-02T15:04:05Z07:00" }}
{{- $day := 86400 }}
{{- $now := now }}
{{- $fullname := include "gpu-webhook.fullname" . }}
{{- $dnsNames := include "gpu-webhook.dnsNames" . | fromJsonArray }}
{{- $ips := .Values.certs.extraIPAddresses | default list }}
{{- $names := toJson (dict "dns" $dnsNames "ip" $ips) | sha256sum }}
{{- $tlsSecret := include "gpu-webhook.existingSecret" (dict "root" . "name" (include "gpu-webhook.tlsSecretName" .)) | fromJson }}
{{- $caSecret := include "gpu-webhook.existingSecret" (dict "root" . "name" (include "gpu-webhook.helmCASecretName" .)) | fromJson }}
{{- $tls := $tlsSecret.data | default dict }}
{{- $tlsNotes := ($tlsSecret.metadata | default dict).annotations | default dict }}
{{- $caData := $caSecret.data | default dict }}
{{- $caNotes := ($caSecret.metadata | default dict).annotations | default dict }}
{{- $out := dict "names" $names }}
{{- /* The CA. */}}
{{- $caCrt := index $caData "tls.crt" | default "" }}
{{- $caKey := index $caData "tls.key" | default "" }}
{{- $caNotAfter := index $caNotes "gpu-webhook.io/not-after" | default "" }}
{{- $caLeft := sub (toDate $rfc3339 $caNotAfter).Unix $now.Unix }}
{{- $renewCA := or (not (include "gpu-webhook.firstCertificate" $caCrt)) (not (contains "PRIVATE KEY" (b64dec $caKey))) (lt $caLeft (mul $h.validityDays $day)) }}
{{- $ca := dict }}
{{- if $renewCA }}
{{- $ca = genCA (printf "%s-ca" $fullname) (int $h.caValidityDays) }}
{{- $_ := set $out "caCrt" ($ca.Cert | b64enc) }}
{{- $_ := set $out "caKey" ($ca.Key | b64enc) }}
{{- $_ := set $out "caNotAfter" (dateInZone $rfc3339 (dateModify (printf "+%dh" (mul $h.caValidityDays 24)) $now) "UTC") }}
{{- $previous := include "gpu-webhook.firstCertificate" (index $tls "ca.crt" | default "") }}
{{- $_ := set $out "ca" (printf "%s%s" $ca.Cert (b64dec $previous) | b64enc) }}
{{- else }}
{{- $ca = buildCustomCert $caCrt $caKey }}
{{- $_ := set $out "caCrt" $caCrt }}
{{- $_ := set $out "caKey" $caKey }}
{{- $_ := set $out "caNotAfter" $caNotAfter }}
{{- /* The bundle stays as stored while it leads with this CA (it may still hold the previous one). */}}
{{- $bundle := index $tls "ca.crt" | default "" }}
{{- $first := include "gpu-webhook.firstCertificate" $bundle }}
{{- if and $first (eq (b64dec $first | trim) (b64dec $caCrt | trim)) }}
{{- $_ := set $out "ca" $bundle }}
{{- else }}
{{- $_ := set $out "ca" $caCrt }}
{{- end }}
{{- end }}
{{- /* The serving certificate. */}}
{{- $notAfter := index $tlsNotes "gpu-webhook.io/not-after" | default "" }}
{{- $left := sub (toDate $rfc3339 $notAfter).Unix $now.Unix }}
{{- $renew := or $renewCA (not (index $tls "tls.crt")) (not (index $tls "tls.key")) }}
{{- $renew = or $renew (ne (index $tlsNotes "gpu-webhook.io/names" | default "") $names) (lt $left (mul $h.renewBeforeDays $day)) }}
{{- if $renew }}
{{- $cn := printf "%s.%s.svc" $fullname .Release.Namespace }}
{{- $cert := genSignedCert $cn $ips $dnsNames (int $h.validityDays) $ca }}
{{- $_ := set $out "crt" ($cert.Cert | b64enc) }}
{{- $_ := set $out "key" ($cert.Key | b64enc) }}
{{- $_ := set $out "notAfter" (dateInZone $rfc3339 (dateModify (printf "+%dh" (mul $h.validityDays 24)) $now) "UTC") }}
{{- else }}
{{- $_ := set $out "crt" (index $tls "tls.crt") }}
{{- $_ := set $out "key" (index $tls "tls.key") }}
{{- $_ := set $out "notAfter" $notAfter }}
{{- end }}
{{- $_ := set .Values "__gpuWebhookHelmCerts" $out }}
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
Namespaces the webhooks never see: the policy's excludeNamespaces (the webhook's default, kube-system and
kube-node-lease, when the policy names none), the release's own, and webhook.excludeNamespaces.
*/}}
{{- define "gpu-webhook.excludedNamespaces" -}}
{{- $policy := .Values.policy | default dict }}
{{- $excluded := include "gpu-webhook.native.excludeNamespaces" . | fromJsonArray }}
{{- if hasKey $policy "excludeNamespaces" }}{{ $excluded = $policy.excludeNamespaces | default list }}{{ end }}
{{- toJson (concat $excluded (list .Release.Namespace) .Values.webhook.excludeNamespaces | uniq) }}
{{- end }}

{{/*
The custom resources the custom-resource webhook is sent: every custom kind of the webhook's registry of kinds,
the policy's nativePolicies.customKinds, and webhook.customResources; as a JSON list of webhook rules.
*/}}
{{- define "gpu-webhook.customResourceRules" -}}
{{- $rules := list }}
{{- range (include "gpu-webhook.native.registryResources" . | fromJsonArray) }}
{{- $rules = append $rules (dict "apiGroups" .apiGroups "apiVersions" (list "*") "resources" .resources "scope" "*") }}
{{- end }}
{{- $policy := .Values.policy | default dict }}
{{- range (($policy.nativePolicies | default dict).customKinds | default list) }}
{{- $rules = append $rules (dict "apiGroups" (list .group) "apiVersions" (list (.version | default "*")) "resources" (list .resource) "scope" "*") }}
{{- end }}
{{- range .Values.webhook.customResources }}
{{- $rules = append $rules (dict "apiGroups" .apiGroups "apiVersions" .apiVersions "resources" .resources "scope" (.scope | default "*") "operations" .operations) }}
{{- end }}
{{- toJson $rules }}
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
{{- fail "networkPolicy.egress.apiserver must list the apiserver's addresses (NetworkPolicyPeers, e.g. [{ipBlock: {cidr: 10.0.0.10/32}}]) when networkPolicy.egress.enabled and policyObject.enabled, policy.cluster.enabled or audit.enabled: without them the policy object's watch, the node watch or the audit cannot reach the apiserver (and until the policy object is listed, or with cluster checks, /readyz stays 503)" }}
{{- end }}
{{- $h := .Values.certs.helm }}
{{- if and (eq .Values.certs.mode "helm") (ge (int $h.renewBeforeDays) (int $h.validityDays)) }}
{{- fail (printf "certs.helm.renewBeforeDays (%v) must be less than certs.helm.validityDays (%v): otherwise every helm upgrade would renew the serving certificate" $h.renewBeforeDays $h.validityDays) }}
{{- end }}
{{- if and (eq .Values.certs.mode "helm") (le (int $h.caValidityDays) (int $h.validityDays)) }}
{{- fail (printf "certs.helm.caValidityDays (%v) must be greater than certs.helm.validityDays (%v): a serving certificate must not outlive its CA" $h.caValidityDays $h.validityDays) }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.server.port) }}
{{- fail (printf "metrics.port (%v) must differ from server.port: the plain-HTTP metrics port and the HTTPS admission port are separate listeners" .Values.metrics.port) }}
{{- end }}
{{- end }}

{{/* Labels of the admission-policies hook objects: the chart's, with their own component. */}}
{{- define "gpu-webhook.policiesLabels" -}}
{{- include "gpu-webhook.labels" . | replace "app.kubernetes.io/component: admission-webhook" "app.kubernetes.io/component: admission-policies-job" }}
{{- end }}

{{/*
The webhooks' failurePolicy (call with (dict "root" $ "hook" "mutate"|"validate")). Outside hybrid mode:
webhook.failurePolicy. In hybrid mode the validating webhooks default to Ignore: the native policies hold every
rule CEL carries, so while the webhook is down only what it alone checks (the cluster-aware and replica checks)
goes unchecked, and `audit` reports it later. The mutating webhook, where it still carries the mutation (no
MutatingAdmissionPolicy served), defaults to Fail: a GPU pod admitted without its accelerator selector may land
on the wrong GPU model and a CPU pod without hideGpus sees the node's GPUs, silently, while a refused pod is
retried by its controller. admissionPolicies.webhookFailurePolicy and .mutatingWebhookFailurePolicy override.
*/}}
{{- define "gpu-webhook.failurePolicy" -}}
{{- $root := .root }}
{{- $hybrid := $root.Values.admissionPolicies }}
{{- if not $hybrid.enabled }}
{{- $root.Values.webhook.failurePolicy }}
{{- else if eq .hook "mutate" }}
{{- $hybrid.mutatingWebhookFailurePolicy | default (ternary "Ignore" "Fail" (eq (include "gpu-webhook.native.mutationEngine" $root) "native")) }}
{{- else }}
{{- $hybrid.webhookFailurePolicy | default "Ignore" }}
{{- end }}
{{- end }}

{{/*
Whole seconds, rounded up, in a Go duration of the form values.schema.json allows for audit.interval (1h, 30m,
1h30m, 90s, 1.5h, 500ms).
*/}}
{{- define "gpu-webhook.durationSeconds" -}}
{{- $units := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 }}
{{- $total := 0.0 }}
{{- range regexFindAll "[0-9.]+(ms|h|m|s)" . -1 }}
{{- $number := regexFind "^[0-9.]+" . | float64 }}
{{- $total = addf $total (mulf $number (get $units (regexReplaceAll "^[0-9.]+" . ""))) }}
{{- end }}
{{- ceil $total | int }}
{{- end }}

{{/*
crd.install, true when not set: `helm upgrade --reuse-values` from a chart without the value keeps the old
values, which have no crd section.
*/}}
{{- define "gpu-webhook.crdInstall" -}}
{{- if dig "install" true (.Values.crd | default dict) }}true{{ end }}
{{- end }}
