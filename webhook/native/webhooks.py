"""The matchConditions of the chart's webhooks (validate, mutate, dra), as CEL built from the rules' triggers.

The chart's webhook configurations send the webhook only the objects a rule can speak about. What "can speak about"
means is the rules' own business, so the CEL is written here, from the same registry of triggers the native
policies' matchConditions come from (:data:`webhook.native.registry.REGISTRY`), and the chart renders it from
generated helpers (``_webhooks.tpl``, written by ``tests/chart/sync_schema.py`` with :func:`template`).
What depends on values the chart reads at install time (the policy's GPU names, hideGpus per namespace, the node
label and GPU taints, whether cpuPodOnGpuNodes is on) is a parameter: the chart fills in data, never CEL.

The validating webhook takes a pod template that uses a GPU (a GPU or vendor name in its resources, a fractional
scheduler's annotation, DRA claims) or that carries a trigger of a rule the webhook applies to pods without GPUs too
(:data:`ANY_POD`); the mutating webhook takes a pod that uses a GPU the policy counts, or any pod where hideGpus
applies. ``tests/test_webhook_conditions.py`` holds them to the rules: whatever draws a violation, a warning or a
patch from ``webhook.rules.admission`` is sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from webhook.core.policy import PolicySet
from webhook.core.policyfile import parse_policy
from webhook.core.policyschema import CHECK_SETTINGS, DEFAULTS, PLATFORMS
from webhook.core.resources import FRACTION_ANNOTATIONS, cel_pattern
from webhook.native.celtext import GLOB_META, RE2_SPECIAL, every_policy, glob_to_regex
from webhook.native.rules import BUILDERS, trigger_expression
from webhook.native.snippets import Ctx

# The prefix of a DRA device class's implicit extended resource name (Policy.is_gpu counts it).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
# The tokens of a glob, in order: a bracket expression ([seq], [!seq], "]" first is literal), or one character.
GLOB_TOKENS = r"\[!?\]?[^\]]*\]|(?s:.)"
# The characters escaped inside a bracket expression (celtext.RE2_SPECIAL: all of RE2's special ones).
BRACKET_SPECIAL = "\\[]^"
# The webhook's rules that speak only of a template that uses a GPU (GpuUse.any, a GPU or vendor name): their
# triggers are subsumed by the "uses a GPU" test.
GPU_ONLY = frozenset({
    "invalid-quantity", "requests-without-limits", "requests-differ", "per-container-limit", "per-pod-limit",
    "accelerator-not-allowed", "accelerator-conflict", "structure", "ephemeral-gpu", "pod-level-gpu",
    "mixed-gpu-and-mig", "init-container-gpus", "zero-gpu-limit", "host-pid-gpu",
    "shared-gpu-over-one", "fractional-gpu-request", "gpu-monitoring-resource", "node-name-with-gpus",
    "unknown-accelerator", "unknown-runtime-class", "runtime-class-conflict", "exceeds-node-capacity",
    "unadvertised-resource",
})
# The rules with a clause of their own, whose CEL reads the policy's node label and GPU taints.
OWN_CLAUSE = frozenset({"cpu-pod-on-gpu-nodes"})
# The rules whose triggers alone do not call the webhook: visible-devices-unread warns about env sources admission
# cannot read (envFrom), and a CPU pod's envFrom is no reason to make it depend on the webhook; on a pod sent for
# another reason (a GPU, the device variable) it still warns, and in hybrid mode the native policies carry it.
UNSENT = frozenset({"visible-devices-unread"})
# The rest: a rule the webhook applies to any pod, its triggers sent as the native policies write them.
ANY_POD = tuple(r for r, entry in BUILDERS.items() if entry.pods and r not in GPU_ONLY | OWN_CLAUSE | UNSENT)

# Placeholders of the parameters (filled in by the chart's generated helpers, or by the functions below).
GPU, HIDDEN, LABELS, TAINTS = "__GPU__", "__HIDDEN__", "__LABELS__", "__TAINTS__"

POD_TEMPLATES = """(request.kind.kind == 'Pod'
  ? [object]
  : request.kind.kind == 'PodTemplate'
    ? (has(object.template) ? [object.template] : [])
    : request.kind.kind == 'CronJob'
      ? (has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec)
          && has(object.spec.jobTemplate.spec.template) ? [object.spec.jobTemplate.spec.template] : [])
      : (has(object.spec) && has(object.spec.template) ? [object.spec.template] : [])
)"""

DRA_CONDITION = """request.kind.kind == 'DeviceClass'
  ? has(object.spec) && has(object.spec.extendedResourceName)
  : request.kind.kind == 'ResourceClaimTemplate'
    ? has(object.spec) && has(object.spec.spec) && has(object.spec.spec.devices)
        && has(object.spec.spec.devices.requests)
    : has(object.spec) && has(object.spec.devices) && has(object.spec.devices.requests)"""


# --- CEL text of the chart's values ----------------------------------------------------------------------------

CEL_STRING_ESCAPES = (("\\", "\\\\"), ("'", "\\'"))


def cel_string(text: str) -> str:
    """The body of a single-quoted CEL string literal."""
    for old, new in CEL_STRING_ESCAPES:
        text = text.replace(old, new)
    return text


def cel_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{cel_string(i)}'" for i in items) + "]"


def glob_regex(glob: str) -> str:
    """``celtext.glob_to_regex``, token by token as the chart's generated converter computes it."""
    out = []
    for token in re.findall(GLOB_TOKENS, glob):
        if token == "*":
            out.append(".*")
        elif token == "?":
            out.append(".")
        elif len(token) > 1:
            body = token[1:-1]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            escaped = "".join("\\" + c if c in BRACKET_SPECIAL else c for c in body)
            out.append(f"[{'^' if negate else ''}{escaped}]")
        else:
            out.append("\\" + token if token in RE2_SPECIAL else token)
    text = "".join(out)
    if text != glob_to_regex(glob):  # one meaning for the webhook, the native policies and the chart
        raise AssertionError(f"{glob!r}: {text!r} != {glob_to_regex(glob)!r}")
    return text


def resource_test(patterns: Sequence[str]) -> str:
    """A CEL test of one resource name ``name`` against the GPU patterns, with fnmatch's meaning: a name without
    wildcards is compared, a name whose only wildcard is a trailing "*" is a prefix, anything else is a regex."""
    tests = []
    for pattern in patterns:
        prefix = pattern[:-1] if pattern.endswith("*") else pattern
        if not any(c in pattern for c in GLOB_META):
            tests.append(f"name == '{cel_string(pattern)}'")
        elif pattern.endswith("*") and not any(c in prefix for c in GLOB_META):
            tests.append(f"name.startsWith('{cel_string(prefix)}')")
        else:
            tests.append(f"name.matches('{cel_string('^' + glob_regex(pattern) + '$')}')")
    return " || ".join(tests)


def gpu_patterns(policies: PolicySet) -> list[str]:
    """The GPU resource patterns (``policy.resources``) and the implicit name of every GPU device class."""
    p = policies.default
    return [*p.resources, *(IMPLICIT_PREFIX + c for c in p.gpu_classes)]


def hidden_condition(policies: PolicySet) -> str:
    """The namespaces where hideGpus applies, as a CEL test of request.namespace; empty when none."""
    overlays = sorted(policies.document.get("namespaces") or {})
    hides = {ns: policies.for_namespace(ns).hide_gpus != "off" for ns in overlays}
    if policies.default.hide_gpus != "off":
        off = [ns for ns in overlays if not hides[ns]]
        return f"!(request.namespace in {cel_list(off)})" if off else "true"
    on = [ns for ns in overlays if hides[ns]]
    return f"request.namespace in {cel_list(on)}" if on else ""


def node_labels(policies: PolicySet) -> list[str]:
    return [policies.default.node_label]


def taint_keys(policies: PolicySet) -> list[str]:
    return sorted({t.key for t in policies.default.gpu_taints})


def checks_on(policies: PolicySet, rules: Iterable[str]) -> bool:
    """One of ``rules`` is on in the policy or a namespace; always, when the policy is read live
    (``nativePolicies.params``, not inline): an edit may turn one on without the chart."""
    if (policies.document.get("nativePolicies") or {}).get("params", "live") != "inline":
        return True
    return any(p.checks(rule) for p in every_policy(policies) for rule in rules)


# --- the expressions -------------------------------------------------------------------------------------------

def any_pod_triggers() -> str:
    """The triggers of the rules the webhook applies to any pod (on a template ``pod`` with a spec). They read no
    policy value (tests/test_webhook_conditions.py checks it), so the default policy writes them."""
    return trigger_expression(Ctx(parse_policy("{}")), list(ANY_POD))


def _uses_gpu(names: str) -> str:
    """Template ``pod`` names a GPU (``names``, a test of ``name``) in a container's or its own resources."""
    return f"""((has(pod.spec.containers) ? pod.spec.containers : [])
    + (has(pod.spec.initContainers) ? pod.spec.initContainers : [])
    + (has(pod.spec.ephemeralContainers) ? pod.spec.ephemeralContainers : [])
    + [pod.spec]
  ).exists(container, has(container.resources)
    && ((has(container.resources.limits) ? [container.resources.limits] : [])
          + (has(container.resources.requests) ? [container.resources.requests] : []))
      .exists(section, section.exists(name, {names})))"""


CLAIMS = "(has(pod.spec.resourceClaims) && size(pod.spec.resourceClaims) > 0)"
FRACTION = ("(has(pod.metadata) && has(pod.metadata.annotations) && pod.metadata.annotations.exists(key, "
            f"key in {cel_list(FRACTION_ANNOTATIONS)}))")
# cpu-pod-on-gpu-nodes (Policy.tolerates_gpu_taint, the node label in nodeSelector), on a pod without GPUs.
GPU_NODES = (f"(has(pod.spec.tolerations) && pod.spec.tolerations.exists(toleration, has(toleration.key) && "
             f"([toleration.key].exists(name, {GPU} || "
             f"name.matches('{cel_string(cel_pattern())}')) || toleration.key in {TAINTS})))\n"
             f"  || (has(pod.spec.nodeSelector) && pod.spec.nodeSelector.exists(key, key in {LABELS}))")


def validate_expression(gpu: str = GPU, gpu_nodes: bool = True) -> str:
    """``gpu-or-isolation``: a template that uses a GPU, or that carries a trigger of a rule the webhook applies to
    any pod (and, while cpuPodOnGpuNodes is on, tolerates a GPU taint or selects the accelerator label)."""
    names = f"{gpu} || name.matches('{cel_string(cel_pattern())}')"
    clauses = [_uses_gpu(names), FRACTION, CLAIMS, any_pod_triggers()]
    if gpu_nodes:
        clauses.append(GPU_NODES.replace(GPU, gpu))
    body = "\n  || ".join(clauses)
    return f"{POD_TEMPLATES}.exists(pod, has(pod.spec) && (\n  {body}\n))"


def mutate_expression(gpu: str = GPU, hidden: str = "") -> str:
    """``gpu-or-hidden-namespace``: a pod that uses a GPU the policy counts (or claims), or any pod where hideGpus
    applies."""
    head = f"{hidden}\n|| " if hidden else ""
    return f"{head}{POD_TEMPLATES}.exists(pod, has(pod.spec) && (\n  {_uses_gpu(gpu)}\n  || {CLAIMS}\n))"


def fill(text: str, *, labels: Sequence[str] = (), taints: Sequence[str] = ()) -> str:
    return text.replace(LABELS, cel_list(labels)).replace(TAINTS, cel_list(taints))


def expressions(policies: PolicySet) -> dict[str, str]:
    """The webhook-only conditions for a policy, as the chart renders them: hook -> CEL."""
    gpu = resource_test(gpu_patterns(policies))
    return {
        "validate": fill(validate_expression(gpu, checks_on(policies, OWN_CLAUSE)), labels=node_labels(policies),
                         taints=taint_keys(policies)),
        "mutate": mutate_expression(gpu, hidden_condition(policies)),
        "dra": DRA_CONDITION,
    }


# --- the chart's generated helpers (_webhooks.tpl) -----------------------------------------------------------

DEFAULT_RESOURCES: list[str] = list(DEFAULTS["resources"])
DEFAULT_GPU_CLASSES: list[str] = list(DEFAULTS["dra"]["gpuClasses"])
DEFAULT_PLATFORM: str = DEFAULTS["platform"]
HIDE_VALUES = ("void", "none")  # hideGpus on (off, or YAML's false, leaves it off)
OFF_VALUES = ("off", "false")  # a check's setting that turns it off (a bare `off` is YAML false)

HEADER = """{{- /*
Generated by tests/chart/sync_schema.py from webhook.native.webhooks (the rules' triggers and the webhook's
defaults); do not edit. The webhooks' matchConditions: the CEL is the code's, the chart fills in its values.
*/}}
"""


def _q(text: str) -> str:
    """A Go template string literal."""
    return json.dumps(text)


def _helm_list(items: Iterable[str]) -> str:
    return "(list " + " ".join(_q(i) for i in items) + ")" if items else "list"


def _define(name: str, body: str) -> str:
    return f'{{{{- define "gpu-webhook.webhooks.{name}" -}}}}\n{body}\n{{{{- end }}}}\n'


def _checked(text: str) -> str:
    if "{{" in text or "}}" in text:
        raise ValueError("CEL text with a Go template delimiter")
    return text


def _placeholders(text: str) -> str:
    return (_checked(text).replace(GPU, "{{ .gpu }}").replace(LABELS, "{{ .labels }}")
            .replace(TAINTS, "{{ .taints }}").replace(HIDDEN, "{{ .hidden }}"))


def template() -> str:
    """``charts/gpu-webhook/templates/_webhooks.tpl``."""
    meta = "[" + "".join("\\" + c for c in GLOB_META) + "]"
    platform_labels = {name: p.get("accelerator", {}).get("nodeLabel", DEFAULTS["accelerator"]["nodeLabel"])
                       for name, p in PLATFORMS.items()}
    platform_taints = {name: [t["key"] for t in p.get("gpuTaints", DEFAULTS["gpuTaints"])]
                       for name, p in PLATFORMS.items()}
    own_keys = sorted(k for r in OWN_CLAUSE if (k := CHECK_SETTINGS[r][1]))
    default_off = [k for k in own_keys if str(DEFAULTS["checks"].get(k)) in OFF_VALUES]
    parts = [HEADER]
    parts.append(_define("celString", (
        "{{- /* The body of a single-quoted CEL string literal. */}}\n{{- . "
        + " ".join(f"| replace {_q(a)} {_q(b)}" for a, b in CEL_STRING_ESCAPES) + " }}")))
    parts.append(_define("celList", (
        "{{- /* A CEL list of string literals. */}}\n{{- $items := list }}\n{{- range . }}\n"
        '{{- $items = append $items (printf "\'%s\'" (include "gpu-webhook.webhooks.celString" (toString .))) }}\n'
        "{{- end }}\n"
        '{{- printf "[%s]" (join ", " $items) }}')))
    parts.append(_define("gpuResources", (
        "{{- /* policy.resources (else the webhook's defaults) and the implicit extended resource name of every GPU\n"
        "device class (policy.dra.gpuClasses, else the webhook's defaults), as Policy.is_gpu reads them; JSON. */}}\n"
        "{{- $policy := .Values.policy | default dict }}\n"
        "{{- $dra := $policy.dra | default dict }}\n"
        f"{{{{- $names := hasKey $policy \"resources\" | ternary $policy.resources "
        f"{_helm_list(DEFAULT_RESOURCES)} }}}}\n"
        f"{{{{- $classes := hasKey $dra \"gpuClasses\" | ternary $dra.gpuClasses "
        f"{_helm_list(DEFAULT_GPU_CLASSES)} }}}}\n"
        "{{- range $classes }}\n"
        f"{{{{- $names = append $names (printf \"%s%s\" {_q(IMPLICIT_PREFIX)} .) }}}}\n"
        "{{- end }}\n"
        "{{- toJson $names }}")))
    parts.append(_define("globRegex", (
        "{{- /* webhook.native.celtext.glob_to_regex: fnmatch's glob as RE2, token by token. */}}\n"
        '{{- $out := "" }}\n'
        f"{{{{- range (regexFindAll {_q(GLOB_TOKENS)} (toString .) -1) }}}}\n"
        '{{- if eq . "*" }}{{ $out = print $out ".*" }}\n'
        '{{- else if eq . "?" }}{{ $out = print $out "." }}\n'
        '{{- else if and (hasPrefix "[" .) (gt (len .) 1) }}\n'
        '{{- $body := trimSuffix "]" (trimPrefix "[" .) }}\n'
        '{{- $negate := hasPrefix "!" $body }}\n'
        '{{- if $negate }}{{ $body = trimPrefix "!" $body }}{{ end }}\n'
        f'{{{{- $out = print $out "[" (ternary "^" "" $negate) (regexReplaceAll '
        f'{_q("[" + "".join(chr(92) + c for c in BRACKET_SPECIAL) + "]")} $body {_q(chr(92) + "${0}")}) "]" }}}}\n'
        "{{- else }}{{ $out = print $out (regexQuoteMeta .) }}\n"
        "{{- end }}\n"
        "{{- end }}\n"
        "{{- $out }}")))
    parts.append(_define("resourceTest", (
        "{{- /* The CEL test of a resource name name against the GPU patterns (webhooks.resource_test). */}}\n"
        "{{- $tests := list }}\n"
        '{{- range (include "gpu-webhook.webhooks.gpuResources" . | fromJsonArray) }}\n'
        "{{- $pattern := toString . }}\n"
        '{{- $prefix := trimSuffix "*" $pattern }}\n'
        f"{{{{- if not (regexMatch {_q(meta)} $pattern) }}}}\n"
        '{{- $tests = append $tests (printf "name == \'%s\'" (include "gpu-webhook.webhooks.celString" $pattern)) }}\n'
        f'{{{{- else if and (hasSuffix "*" $pattern) (not (regexMatch {_q(meta)} $prefix)) }}}}\n'
        '{{- $tests = append $tests (printf "name.startsWith(\'%s\')" '
        '(include "gpu-webhook.webhooks.celString" $prefix)) }}\n'
        "{{- else }}\n"
        '{{- $re := printf "^%s$" (include "gpu-webhook.webhooks.globRegex" $pattern) }}\n'
        '{{- $tests = append $tests (printf "name.matches(\'%s\')" (include "gpu-webhook.webhooks.celString" $re)) }}\n'
        "{{- end }}\n"
        "{{- end }}\n"
        '{{- join " || " $tests }}')))
    hide = _helm_list(HIDE_VALUES)
    parts.append(_define("hidden", (
        "{{- /* The namespaces where isolation.hideGpus applies, as a CEL test of request.namespace; empty when\n"
        "none (webhooks.hidden_condition). */}}\n"
        "{{- $policy := .Values.policy | default dict }}\n"
        "{{- $isolation := $policy.isolation | default dict }}\n"
        f"{{{{- $global := has (toString $isolation.hideGpus) {hide} }}}}\n"
        "{{- $on := list }}\n{{- $off := list }}\n"
        "{{- range $ns, $overlay := ($policy.namespaces | default dict) }}\n"
        "{{- $nsIsolation := ($overlay | default dict).isolation | default dict }}\n"
        '{{- if hasKey $nsIsolation "hideGpus" }}\n'
        f"{{{{- if has (toString $nsIsolation.hideGpus) {hide} }}}}{{{{ $on = append $on $ns }}}}"
        "{{ else }}{{ $off = append $off $ns }}{{ end }}\n"
        "{{- end }}\n{{- end }}\n"
        "{{- if $global }}\n"
        '{{- if $off }}!(request.namespace in {{ include "gpu-webhook.webhooks.celList" $off }})'
        '{{ else }}true{{ end }}\n'
        '{{- else if $on }}request.namespace in {{ include "gpu-webhook.webhooks.celList" $on }}\n'
        "{{- end }}")))
    parts.append(_define("isOff", (
        "{{- /* A check's setting that turns it off (a bare `off` in YAML is false). */}}\n"
        f"{{{{- if has (toString .) {_helm_list(OFF_VALUES)} }}}}true{{{{ end }}}}")))
    parts.append(_define("checksOn", (
        "{{- /* \"true\" while one of the checks.* keys (call with (dict \"root\" $ \"keys\" <list>)) is on in the\n"
        "policy or a namespace (webhooks.checks_on). */}}\n"
        "{{- $policy := .root.Values.policy | default dict }}\n"
        "{{- $global := $policy.checks | default dict }}\n"
        f"{{{{- $defaultOff := {_helm_list(default_off)} }}}}\n"
        "{{- $on := ne ((($policy.nativePolicies | default dict).params) | default \"live\") \"inline\" }}\n"
        "{{- range $key := .keys }}\n"
        "{{- if hasKey $global $key }}{{ if not (include \"gpu-webhook.webhooks.isOff\" (get $global $key)) }}"
        "{{ $on = true }}{{ end }}\n"
        "{{- else if not (has $key $defaultOff) }}{{ $on = true }}{{ end }}\n"
        "{{- range $ns, $overlay := ($policy.namespaces | default dict) }}\n"
        "{{- $checks := ($overlay | default dict).checks | default dict }}\n"
        "{{- if and (hasKey $checks $key) (not (include \"gpu-webhook.webhooks.isOff\" (get $checks $key))) }}"
        "{{ $on = true }}{{ end }}\n"
        "{{- end }}\n{{- end }}\n"
        "{{- if $on }}true{{ end }}")))
    parts.append(_define("nodeLabels", (
        "{{- /* The accelerator node label (policy.accelerator.nodeLabel, else the platform's), as JSON. */}}\n"
        "{{- $policy := .Values.policy | default dict }}\n"
        f"{{{{- $platforms := {_q(json.dumps(platform_labels))} | fromJson }}}}\n"
        f"{{{{- $platform := $policy.platform | default {_q(DEFAULT_PLATFORM)} }}}}\n"
        "{{- $accelerator := $policy.accelerator | default dict }}\n"
        "{{- toJson (list ($accelerator.nodeLabel | default (get $platforms $platform))) }}")))
    parts.append(_define("taintKeys", (
        "{{- /* The keys of the GPU taints (policy.gpuTaints, else the platform's), sorted, as JSON. */}}\n"
        "{{- $policy := .Values.policy | default dict }}\n"
        f"{{{{- $platforms := {_q(json.dumps(platform_taints))} | fromJson }}}}\n"
        f"{{{{- $platform := $policy.platform | default {_q(DEFAULT_PLATFORM)} }}}}\n"
        "{{- $keys := get $platforms $platform }}\n"
        '{{- if hasKey $policy "gpuTaints" }}{{ $keys = list }}{{ range $policy.gpuTaints }}'
        "{{ $keys = append $keys .key }}{{ end }}{{ end }}\n"
        "{{- toJson ($keys | uniq | sortAlpha) }}")))
    validate = {on: _placeholders(validate_expression(GPU, on)) for on in (True, False)}
    mutate = {bool(h): _placeholders(mutate_expression(GPU, HIDDEN if h else "")) for h in (True, False)}
    parts.append(_define("condition", (
        "{{- /* The expression of a webhook's first matchCondition: call with (dict \"root\" $ \"hook\"\n"
        "\"validate\"|\"mutate\"|\"dra\") (webhooks.expressions). */}}\n"
        "{{- $root := .root }}\n"
        '{{- $args := dict "gpu" (include "gpu-webhook.webhooks.resourceTest" $root) }}\n'
        '{{- if eq .hook "dra" }}\n'
        f"{_checked(DRA_CONDITION)}\n"
        '{{- else if eq .hook "validate" }}\n'
        '{{- $_ := set $args "labels" (include "gpu-webhook.webhooks.celList" '
        '(include "gpu-webhook.webhooks.nodeLabels" $root | fromJsonArray)) }}\n'
        '{{- $_ := set $args "taints" (include "gpu-webhook.webhooks.celList" '
        '(include "gpu-webhook.webhooks.taintKeys" $root | fromJsonArray)) }}\n'
        f'{{{{- if include "gpu-webhook.webhooks.checksOn" (dict "root" $root "keys" {_helm_list(own_keys)}) }}}}\n'
        "{{- with $args }}\n"
        f"{validate[True]}\n"
        "{{- end }}\n"
        "{{- else }}\n"
        "{{- with $args }}\n"
        f"{validate[False]}\n"
        "{{- end }}\n"
        "{{- end }}\n"
        "{{- else }}\n"
        '{{- $_ := set $args "hidden" (include "gpu-webhook.webhooks.hidden" $root | trim) }}\n'
        "{{- with $args }}\n"
        "{{- if .hidden }}\n"
        f"{mutate[True]}\n"
        "{{- else }}\n"
        f"{mutate[False]}\n"
        "{{- end }}\n"
        "{{- end }}\n"
        "{{- end }}")))
    return "\n".join(parts)


__all__ = ["ANY_POD", "DRA_CONDITION", "GPU_ONLY", "OWN_CLAUSE", "POD_TEMPLATES", "UNSENT", "any_pod_triggers",
           "cel_list", "cel_string", "checks_on", "expressions", "glob_regex", "gpu_patterns", "hidden_condition",
           "mutate_expression", "node_labels", "resource_test", "taint_keys", "template", "validate_expression"]
