"""The CustomResourceDefinition of ``GPUPolicy``, its OpenAPI schema generated from the policy's JSON schema.

``spec`` is :data:`webhook.core.policyschema.SCHEMA` made structural (every node typed) and bounded, as the apiserver
wants a CRD's schema:

- ``enum`` of the settings: strings only (``deny``, ``warn``, ``off``). The policy file accepts a bare ``off``,
  which YAML 1.1 reads as false; the apiserver cannot take a string-or-false enum, so ``off`` is quoted there.
- ``additionalProperties: false``: dropped. A structural schema knows every field, so the apiserver prunes an
  unknown one, and kubectl's strict field validation (its default) refuses the request that carries it.
- ``uniqueItems``: ``x-kubernetes-list-type: set`` (the apiserver forbids ``uniqueItems``).
- ``anyOf`` of a custom kind, the resource patterns, the namespace names and the accelerator default: CEL rules
  (``x-kubernetes-validations``) with the words ``gpu-webhook`` says for the same problem.
- Every list has ``maxItems``, every map ``maxProperties``, every free string ``maxLength`` (:data:`BOUNDS`): the
  apiserver estimates each CEL rule's cost from them, and a policy stays far below an object's size limit.
- Every key has a ``description`` (what ``kubectl explain`` prints): the words of ``webhook.core.policykeys``, the
  ones docs/rules.md's key table shows.

What the schema cannot say the webhook still refuses when it loads the object, as it refuses a file.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from webhook.core import clustersummary, gpupolicy, policykeys
from webhook.core.policyschema import SCHEMA

# The bounds, chosen for the largest platform we know of with headroom: a list (resource patterns, taints,
# trusted namespaces and accounts, device classes, custom kinds, template paths) up to 256 items; up to 1000
# namespaces with overrides; the accelerator values (node label values) up to 63 characters, names up to 253, a
# qualified name (a resource, a label or annotation key: a 253-character prefix, '/', a 63-character name) up
# to 317, a template path up to 1024. A policy at every bound is well under etcd's 1.5 MiB.
MAX_ITEMS = 256
MAX_ACCELERATORS = 64
MAX_NAMESPACES = 1000
LABEL_VALUE = 63
NAME = 253
QUALIFIED_NAME = 317
PATH = 1024
BOUNDS = {"items": MAX_ITEMS, "accelerators": MAX_ACCELERATORS, "namespaces": MAX_NAMESPACES,
          "labelValue": LABEL_VALUE, "name": NAME, "qualifiedName": QUALIFIED_NAME, "path": PATH}

# Shorter strings by their pattern or place (the last key of their path; "*" stands for a list item).
_DNS_LABEL_LENGTH = {"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$": 63}
_BY_PLACE: dict[tuple[str, ...], int] = {
    ("accelerator", "allowed", "*"): LABEL_VALUE,
    ("accelerator", "default"): LABEL_VALUE,
    ("gpuTaints", "*", "value"): LABEL_VALUE,
    ("isolation", "runtimeClass"): NAME,
    ("templates", "*"): PATH,
    ("resources", "*"): QUALIFIED_NAME,
}

# The words of gpu-webhook's own messages for the problems CEL can express (webhook.core.policyfile).
NAMESPACE_NAME = "lowercase letters, digits and '-', at most 63"
_NAMESPACE_PATTERN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NO_DOMAIN = "has no domain (GPUs are extended resources such as nvidia.com/gpu)"
IN_BRACKETS = "has its domain's '/' only inside [...], so it may match cpu or memory: write the domain outside brackets"
# From the start, characters that are neither '[' nor '/', or whole [...] groups, then a '/'.
_DOMAIN_OUTSIDE_BRACKETS = r"^(?:[^\\[/]|\\[[^\\]]*\\])*/"
CUSTOM_KIND = "give templates (pod templates), or resources (resource blocks) with kind"
NOT_ALLOWED = "is not in the allowed list"

_ACCELERATOR_RULE = {
    "rule": "!has(self.allowed) || size(self.allowed) == 0 || !has(self.default) || self.default == ''"
            " || self.default in self.allowed",
    "messageExpression": f"\"'\" + self.default + \"' {NOT_ALLOWED} ['\" + self.allowed.join(\"', '\") + \"']\"",
    "fieldPath": ".default",
    "reason": "FieldValueInvalid",
}


def _namespace_accelerator_ok(n: str) -> str:
    """CEL: namespace ``n``'s accelerator default is in its allowed list, each inherited from the policy's when
    the namespace does not write it (as webhook.core.policyfile checks it)."""
    own = f"self.namespaces[{n}].accelerator"
    allowed = (f"(has({own}.allowed) ? {own}.allowed : has(self.accelerator) && has(self.accelerator.allowed)"
               " ? self.accelerator.allowed : [])")
    default = (f"(has({own}.default) ? {own}.default : has(self.accelerator) && has(self.accelerator.default)"
               " ? self.accelerator.default : '')")
    return f"(!has({own}) || size({allowed}) == 0 || {default} == '' || {default} in {allowed})"


_NAMESPACES_ACCELERATOR_RULE = {
    "rule": f"!has(self.namespaces) || self.namespaces.all(n, {_namespace_accelerator_ok('n')})",
    "message": f"a namespace's accelerator.default {NOT_ALLOWED} (its own accelerator.allowed, else the policy's)",
    "fieldPath": ".namespaces",
    "reason": "FieldValueInvalid",
}


def _string_length(node: Mapping[str, Any], place: tuple[str, ...]) -> int:
    for tail, length in _BY_PLACE.items():
        if place[-len(tail):] == tail:
            return length
    pattern = node.get("pattern", "")
    if pattern in _DNS_LABEL_LENGTH:
        return _DNS_LABEL_LENGTH[pattern]
    if pattern.startswith("^[a-z0-9](?:[-a-z0-9.]{0,251}"):
        return NAME
    return QUALIFIED_NAME


def _structural(node: Mapping[str, Any], place: tuple[str, ...]) -> dict[str, Any]:
    """One node of the policy's JSON schema as a structural, bounded OpenAPI v3 node."""
    out: dict[str, Any] = {}
    if "enum" in node:
        out["type"] = "string"
        out["enum"] = [value for value in node["enum"] if isinstance(value, str)]
        return out
    kind = node["type"]
    out["type"] = kind
    if kind == "object":
        if "properties" in node:
            out["properties"] = {name: _structural(sub, (*place, name)) for name, sub in node["properties"].items()}
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            out["additionalProperties"] = _structural(extra, (*place, "*"))
            out["maxProperties"] = MAX_NAMESPACES
        if "required" in node:
            out["required"] = list(node["required"])
    elif kind == "array":
        out["items"] = _structural(node["items"], (*place, "*"))
        if "minItems" in node:
            out["minItems"] = node["minItems"]
        out["maxItems"] = MAX_ACCELERATORS if place[-2:] == ("accelerator", "allowed") else MAX_ITEMS
        if node.get("uniqueItems"):
            out["x-kubernetes-list-type"] = "set"
    elif kind == "string":
        for key in ("minLength", "pattern"):
            if key in node:
                out[key] = node[key]
        out["maxLength"] = _string_length(node, place)
    elif kind == "integer":
        if "minimum" in node:
            out["minimum"] = node["minimum"]
    rules = _rules(node, place)
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def _rules(node: Mapping[str, Any], place: tuple[str, ...]) -> list[dict[str, Any]]:
    """The CEL rules of a node: what the JSON schema says in ways a CRD cannot, and the checks after it."""
    if "anyOf" in node:  # a custom kind's
        return [{"rule": "has(self.templates) || (has(self.resources) && has(self.kind))", "message": CUSTOM_KIND}]
    if place == ("resources", "*"):
        # A domain outside any [...]: a '/' inside one ('cp[u/]') lets the pattern match cpu, as fnmatch reads it.
        return [{"rule": f"self.matches('{_DOMAIN_OUTSIDE_BRACKETS}')",
                 "messageExpression": f"\"'\" + self + (self.contains('/') ? \"' {IN_BRACKETS}\" : "
                                      f"\"' {NO_DOMAIN}\")"}]
    if place == ("accelerator",):
        return [copy.deepcopy(_ACCELERATOR_RULE)]
    if place == ("namespaces",):
        return [{
            "rule": f"self.all(n, n.matches('{_NAMESPACE_PATTERN}') && size(n) <= 63)",
            "message": f"a key is not a namespace name ({NAMESPACE_NAME})",
            "reason": "FieldValueInvalid",
        }]
    if place == ():
        return [copy.deepcopy(_NAMESPACES_ACCELERATOR_RULE)]
    return []


def _off_keys(node: Mapping[str, Any]) -> dict[str, list[str]]:
    """section -> its keys whose setting may be a bare ``off`` (false), of one scope of the schema."""
    found: dict[str, list[str]] = {}
    for section, sub in node.get("properties", {}).items():
        keys = [key for key, leaf in sub.get("properties", {}).items() if False in leaf.get("enum", ())]
        if keys:
            found[section] = keys
    return found


# Where a policy may write a bare ``off`` (read as false): {section: [keys]} at the top level and per namespace.
OFF_KEYS = _off_keys(SCHEMA)
NAMESPACE_OFF_KEYS = _off_keys(SCHEMA["properties"]["namespaces"]["additionalProperties"])


def as_spec(document: Mapping[str, Any]) -> dict[str, Any]:
    """A policy document as a GPUPolicy's spec: every bare ``off`` (false) of a setting written ``"off"``."""
    spec = copy.deepcopy(dict(document))

    def quote(scope: Any, sections: Mapping[str, list[str]]) -> None:
        for section, keys in sections.items():
            values = scope.get(section) if isinstance(scope, dict) else None
            if not isinstance(values, dict):
                continue
            for key in keys:
                if values.get(key) is False:
                    values[key] = "off"

    quote(spec, OFF_KEYS)
    namespaces = spec.get("namespaces")
    for overlay in namespaces.values() if isinstance(namespaces, dict) else ():
        quote(overlay, NAMESPACE_OFF_KEYS)
    return spec


def chart_helper() -> str:
    """The chart's ``gpu-webhook.policySpec``: ``.Values.policy`` as a GPUPolicy's spec, YAML (as_spec in Go
    templates: Helm reads a bare ``off`` in values as false, the CRD wants the string)."""
    def lines(scope: str, sections: Mapping[str, list[str]]) -> list[str]:
        out = []
        for section, keys in sections.items():
            names = " ".join(f'"{key}"' for key in keys)
            out += [
                f'{{{{- $section := get {scope} "{section}" }}}}',
                '{{- if kindIs "map" $section }}',
                f"{{{{- range $key := list {names} }}}}",
                '{{- if and (kindIs "bool" (get $section $key)) (not (get $section $key)) }}'
                '{{- $_ := set $section $key "off" }}{{- end }}',
                "{{- end }}",
                "{{- end }}",
            ]
        return out

    body = [
        "{{- /* Generated by tests/chart/sync_schema.py from webhook.core.policycrd.chart_helper(): do not edit.",
        "values.policy as the spec of GPUPolicy/default: a bare `off` of a setting (YAML reads it as false) is",
        "written \"off\", which the CRD's schema wants; everything else as written. */}}",
        "{{- define \"gpu-webhook.policySpec\" -}}",
        "{{- $spec := deepCopy (.Values.policy | default dict) }}",
        *lines("$spec", OFF_KEYS),
        "{{- if kindIs \"map\" (get $spec \"namespaces\") }}",
        "{{- range $name, $overlay := (get $spec \"namespaces\") }}",
        "{{- if kindIs \"map\" $overlay }}",
        *lines("$overlay", NAMESPACE_OFF_KEYS),
        "{{- end }}",
        "{{- end }}",
        "{{- end }}",
        "{{- toYaml $spec }}",
        "{{- end }}",
    ]
    return "\n".join(body) + "\n"


def _described(node: dict[str, Any], prefix: str = "") -> None:
    """Each key under ``node`` given its description first (``webhook.core.policykeys``), at every depth: a list's
    items are ``[]`` of its path, a map's values ``*``."""
    properties = node.get("properties", {})
    for name, sub in properties.items():
        path = f"{prefix}{name}"
        words = policykeys.description(path)
        properties[name] = {"description": words, **sub} if words else sub
        _described(properties[name], f"{path}.")
        items, suffix = properties[name], ""
        while isinstance(items.get("items"), dict):
            items, suffix = items["items"], suffix + "[]"
            _described(items, f"{path}{suffix}.")
        if isinstance(properties[name].get("additionalProperties"), dict):
            _described(properties[name]["additionalProperties"], f"{path}.*.")


def spec_schema(schema: Mapping[str, Any] = SCHEMA) -> dict[str, Any]:
    """The OpenAPI v3 schema of a GPUPolicy's ``spec``: the policy's schema, structural, bounded and described."""
    out = _structural(schema, ())
    _described(out)
    return out


_CONDITION = {
    "type": "object",
    "required": ["type", "status", "lastTransitionTime", "reason", "message"],
    "properties": {
        "type": {"type": "string", "maxLength": 316,
                 "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                   "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
        "message": {"type": "string", "maxLength": 32768},
    },
}
_ENGINE = {
    "type": "object",
    "description": "What one engine enforces; fields beyond observedGeneration are the engine's own.",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {"observedGeneration": {"type": "integer", "format": "int64", "minimum": 0}},
}
STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "conditions": {
            "type": "array", "maxItems": 16, "items": _CONDITION,
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
        },
        "webhook": copy.deepcopy(_ENGINE),
        "native": copy.deepcopy(_ENGINE),
        "rules": {"type": "object", "description": "Which engine carries each rule, and why.",
                  "x-kubernetes-preserve-unknown-fields": True},
        "cluster": copy.deepcopy(clustersummary.SCHEMA),
    },
}

PRINTER_COLUMNS = [
    {"name": "Accepted", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Accepted")].status'},
    {"name": "Webhook", "type": "integer", "jsonPath": ".status.webhook.observedGeneration",
     "description": "The generation the webhook enforces"},
    {"name": "Native", "type": "integer", "jsonPath": ".status.native.observedGeneration",
     "description": "The generation the native admission policies enforce"},
    {"name": "Native-Policies", "type": "string", "jsonPath": '.status.conditions[?(@.type=="NativePolicies")].reason',
     "description": "Live, Inline, CompiledKeysChanged (generate them again) or NotInstalled"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


SPEC = ("The policy, in the policy file's format key for key. Every key is optional: one not written has its "
        "default. A bare off is read as false: write \"off\".")
STATUS = ("What the webhook made of the spec: whether it accepted it (condition Accepted), the generation each engine "
          "enforces, the state of the native admission policies (condition NativePolicies), which engine carries "
          "each rule, and the cluster's facts.")


def crd(annotations: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The CustomResourceDefinition ``gpupolicies.gpu-webhook.io``."""
    metadata: dict[str, Any] = {"name": f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}"}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": gpupolicy.GROUP,
            "scope": "Cluster",
            "names": {
                "kind": gpupolicy.KIND, "listKind": f"{gpupolicy.KIND}List", "plural": gpupolicy.PLURAL,
                "singular": gpupolicy.SINGULAR, "shortNames": ["gpupol"],
            },
            "versions": [{
                "name": gpupolicy.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "The gpu-webhook policy: spec is the policy file's format, key for key; the one "
                                   f"named {gpupolicy.NAME!r} is enforced.",
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {"description": SPEC, **spec_schema(), "default": {}},
                        "status": {"description": STATUS, **copy.deepcopy(STATUS_SCHEMA)},
                    },
                }},
            }],
        },
    }
