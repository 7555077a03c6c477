"""Every key of the policy, described once: what it does and its default.

The CustomResourceDefinition of GPUPolicy (``webhook.core.policycrd``: what ``kubectl explain`` prints) and the key
table of docs/rules.md (``docs.gen``) both read :func:`description`, so the two say the same words.

A key's words come from :data:`WHAT`, keyed by its dotted path (``limits.perContainer``; ``[]`` for an item of a
list, ``gpuTaints[].key``), and its default from ``webhook.core.policyschema.DEFAULTS``. Two kinds of key are
described from other tables, so they need no entry here:

- a rule's setting (``checks.privilegedGpu``): the rule table (``webhook.core.catalog``) gives its rule id, what
  it refuses and its default;
- a namespace's override (``namespaces.*.limits.perPod``): the words of the policy's own key, for that namespace.

An entry here wins over both. A key of the schema that none of them describes is named by :func:`undescribed`,
which a test holds empty: a new key of ``webhook.core.policyschema.SCHEMA`` needs its words here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from webhook.core import catalog
from webhook.core.policyschema import DEFAULTS, SCHEMA

# Where a namespace's overrides sit in a key's path: "namespaces.*.limits" is namespace *'s "limits".
IN_NAMESPACE = "namespaces.*."

WHAT: dict[str, str] = {
    "platform": "The platform preset: `generic`, `gke`, `eks`, `aks` or `gpu-operator`. It sets "
                "`accelerator.nodeLabel` and `gpuTaints` to what that platform labels and taints its GPU nodes "
                "with; those keys written in the policy override it.",
    "resources": "The extended resources that are GPUs, each name with its domain (`nvidia.com/gpu`), globs "
                 "allowed (`gpu.intel.com/*`). Of the names a glob matches, only device counts are GPUs "
                 "(`nvidia.com/gpumem` is not). A pattern that matches `cpu` or `memory`, or has no domain, is "
                 "refused.",
    "accelerator": "The GPU model pods run on: the node label that names it, the annotation a pod may name it "
                   "with, the models allowed and the one injected.",
    "accelerator.nodeLabel": "The node label whose value names the GPU model; the rules read it in a pod's "
                             "nodeSelector and the mutation sets it. `platform` sets it for its platform.",
    "accelerator.annotation": "The pod annotation that may name the accelerator instead of a nodeSelector; one "
                              "that contradicts the nodeSelector is refused (rule `accelerator-conflict`).",
    "accelerator.allowed": "The accelerators (values of `accelerator.nodeLabel`) pods may select, by nodeSelector "
                           "or annotation; any other is refused (rule `accelerator-not-allowed`). Empty: any.",
    "accelerator.default": "The accelerator set as the nodeSelector of a GPU pod that names none. It must be in "
                           "`accelerator.allowed` when that is set. Empty: none is set.",
    "gpuTaints": "The taints of GPU nodes. With `tolerations: true` a GPU pod gets a toleration of each; with "
                 "none, one per GPU resource it uses. `platform` sets them for its platform.",
    "gpuTaints[].key": "The taint's key (`nvidia.com/gpu`). Required.",
    "gpuTaints[].value": "The taint's value. Absent: the toleration is `Exists`, whatever the value.",
    "gpuTaints[].effect": "The taint's effect: `NoSchedule`, `PreferNoSchedule` or `NoExecute`. Absent: every "
                          "effect.",
    "limits": "Caps on the GPUs of one resource: per container and per pod.",
    "limits.perContainer": "The most GPUs of one resource a container may ask for; more is refused (rule "
                           "`per-container-limit`). 0: no cap.",
    "limits.perPod": "The most GPUs of one resource a pod may ask for, counted as the scheduler counts them; more "
                     "is refused (rule `per-pod-limit`). 0: no cap.",
    "tolerations": "Whether the mutation adds a NoSchedule toleration to GPU pods: one per `gpuTaints` entry, "
                   "else one per GPU resource the pod uses.",
    "enforcement": "What a violation does: `deny` refuses the object, `warn` admits it and returns the violations "
                   "as warnings. The rules without a setting of their own follow it, and `warn` softens a rule "
                   "set to `deny` too.",
    "isolation": "Keeping GPUs out of containers that did not ask for them: the device variable hidden, the "
                 "runtime class set, and who the isolation rules trust.",
    "isolation.hideGpus": "`void` or `none`: the mutation sets `NVIDIA_VISIBLE_DEVICES` to that value in every "
                          "container with no GPU (`none`: no GPU, the driver's libraries still mounted), so an "
                          "image's own `all` shows it no GPU. `off`: it is not set.",
    "isolation.runtimeClass": "The `runtimeClassName` set on GPU pods that name none (`nvidia`, where the NVIDIA "
                              "runtime is not the default). Empty: none is set.",
    "isolation.platformNamespaces": "Where the platform's node agents run (GPU operators and device plugins, CNIs, "
                                    "storage): trusted as `isolation.trusted.namespaces` is, kept apart so that "
                                    "the policy's own trusted list does not drop them.",
    "isolation.tenantNamespaces": "The tenants' namespaces, by name or by a prefix followed by `*` (`*` alone: every "
                                  "namespace). There a tenant rule (`privileged-gpu`, `gpu-device-mount`, "
                                  "`visible-devices-without-gpu`, `cdi-annotation`...) refuses a pod that asks for no "
                                  "GPU; elsewhere it warns, saying so. A pod that asks for GPUs is refused anywhere.",
    "isolation.nvidiaRuntime": "When the NVIDIA runtime reads `NVIDIA_VISIBLE_DEVICES`: `legacy`, in every pod (it is "
                               "the nodes' default runtime, or CRI-O's hook); `cdi` (the GPU Operator's default from "
                               "v25.10), only in pods under a RuntimeClass `nvidia*`. The device-variable rules "
                               "follow it.",
    "isolation.trusted": "Who the isolation rules and the warnings about tenants' pods on GPU nodes leave alone: "
                         "namespaces and service accounts.",
    "isolation.trusted.namespaces": "Namespaces whose pods are trusted.",
    "isolation.trusted.serviceAccounts": "Service accounts whose pods are trusted, each `namespace/name`.",
    "checks": "The pod rules that have a setting of their own, each `deny`, `warn` or `off`.",
    "cluster": "The rules that check an object against what the cluster has (nodes, RuntimeClasses, "
               "DeviceClasses, claims), each `deny`, `warn` or `off`, and whether they run.",
    "cluster.enabled": "Whether the webhook watches Nodes, ResourceSlices, DeviceClasses, ResourceClaims, "
                       "ResourceClaimTemplates and RuntimeClasses and runs the `cluster` rules against them. A "
                       "policy file's takes a restart to switch; GPUPolicy/default's is followed live.",
    "dra": "Dynamic Resource Allocation: the device classes that are GPUs, those claims may name, where admin "
           "access is allowed, and the DRA rules, each `deny`, `warn` or `off`.",
    "dra.gpuClasses": "The device classes whose devices are GPUs (globs): they count toward `limits`, get the "
                      "accelerator selector and tolerations, and clash with a GPU in limits.",
    "dra.allowedDeviceClasses": "The device classes claims may name (globs); any other is refused (rule "
                                "`device-class-not-allowed`). Empty: any.",
    "dra.adminAccessNamespaces": "The namespaces (globs) where a claim may ask for `adminAccess: true` (rule "
                                 "`admin-access`). Empty: none.",
    "excludeNamespaces": "Namespaces no engine looks at: the chart's webhooks, the generated admission policies and "
                         "`gpu-webhook check` leave objects there alone.",
    "nativePolicies": "What `gpu-webhook admission-policies` needs beyond the rules: custom kinds, namespaces the "
                      "generated policies also leave alone, and how they read this policy.",
    "nativePolicies.customKinds": "Custom kinds with pod templates or resource blocks, for the generated policies, "
                                  "`gpu-webhook check` and the webhook. One with the group and resource of a known "
                                  "kind replaces it.",
    "nativePolicies.customKinds[].group": "The kind's API group (`example.com`). Required.",
    "nativePolicies.customKinds[].version": "The kind's API version. Absent or `*`: every version.",
    "nativePolicies.customKinds[].resource": "The kind's resource, the plural the apiserver serves (`trainjobs`). "
                                             "Required.",
    "nativePolicies.customKinds[].kind": "The kind (`TrainJob`), named in messages. Required with `resources`.",
    "nativePolicies.customKinds[].templates": "Where its pod templates (or bare pod specs) are: field names joined "
                                              "by `.`, `*` for every value of a map, `name[*]` for every item of "
                                              "a list (`spec.roles[*].template`).",
    "nativePolicies.customKinds[].resources": "Where its resource blocks (`{limits, requests}` an operator copies "
                                              "into its pods) are, written as `templates` are. The webhook and "
                                              "`check` read them; the generated policies leave the kind to the "
                                              "webhook.",
    "nativePolicies.excludeNamespaces": "Namespaces the generated policies also leave alone, beside "
                                        "`excludeNamespaces`.",
    "nativePolicies.params": "`live`: the generated policies read GPUPolicy/default through params, so an edit "
                             "reaches them without generating them again; `inline`: this policy's values are "
                             "written into their CEL.",
    "namespaces": "Overrides by namespace name: each key a namespace writes stands for the policy's key there; "
                  "a key it does not write is the policy's.",
    "namespaces.*.accelerator": "For this namespace, in place of the policy's `accelerator.allowed` and "
                                "`accelerator.default`: the models its pods may select and the one injected.",
    "namespaces.*.isolation": "For this namespace, in place of the policy's `isolation.hideGpus` and "
                              "`isolation.runtimeClass`.",
    "namespaces.*.cluster": "For this namespace, in place of the policy's: the settings of the `cluster` rules "
                            "(`cluster.enabled` is the policy's alone).",
    "namespaces.*.dra": "For this namespace, in place of the policy's `dra.allowedDeviceClasses`.",
}

_SETTING = "`deny` refuses the object, `warn` admits it with a warning, `off` turns the rule off."


def _rule_words(path: str) -> str | None:
    """What a rule's setting does, from the rule table: ``checks.privilegedGpu`` -> rule ``privileged-gpu``."""
    for rule in catalog.RULES.values():
        if rule.setting == path:
            return f"Rule `{rule.id}` finds: {rule.refuses}. {_SETTING}"
    return None


def what(path: str) -> str | None:
    """What the key at ``path`` does, without its default; None when nothing describes it."""
    if path == "namespaces":
        keys = ", ".join(f"`{key}`" for key in SCHEMA["properties"]["namespaces"]["additionalProperties"]["properties"])
        return f"{WHAT[path]} A namespace may write {keys}."
    if path in WHAT:
        return WHAT[path]
    if path.startswith(IN_NAMESPACE):
        words = what(path.removeprefix(IN_NAMESPACE))
        return f"For this namespace, in place of the policy's `{path.removeprefix(IN_NAMESPACE)}`. {words}" \
            if words else None
    return _rule_words(path)


def default(path: str) -> Any:
    """The built-in default of a key (``policyschema.DEFAULTS``), None when it has none of its own (a section, a
    list item's field); a namespace's key defaults to the policy's, which :func:`description` says in words."""
    value: Any = DEFAULTS
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return None if isinstance(value, Mapping) else value


def shown(value: Any) -> str:
    """A default as the descriptions write it: a word as it is (``deny``), anything else as JSON (``""``,
    ``[]``, ``0``, ``false``)."""
    if isinstance(value, str) and value and value.strip() == value and " " not in value:
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def description(path: str) -> str | None:
    """The words of the key at ``path`` (``limits.perContainer``, ``gpuTaints[].key``,
    ``namespaces.*.limits.perPod``): what it does, then its default; None when nothing describes it."""
    words = what(path)
    if words is None:
        return None
    if path.startswith(IN_NAMESPACE):
        return f"{words} Default: the policy's."
    value = default(path)
    return words if value is None else f"{words} Default: {shown(value)}."


def key_paths(schema: Mapping[str, Any] = SCHEMA, prefix: str = "") -> Iterator[str]:
    """Every key the policy's schema names, at every depth and in its order, as :func:`description` names it:
    ``[]`` for a list's items, ``*`` for the values of a map (a namespace's overrides)."""
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        yield path
        yield from key_paths(sub, f"{path}.")
        node = sub
        suffix = ""
        while isinstance(node.get("items"), Mapping):
            node, suffix = node["items"], suffix + "[]"
            yield from key_paths(node, f"{path}{suffix}.")
        extra = sub.get("additionalProperties")
        if isinstance(extra, Mapping):
            yield from key_paths(extra, f"{path}.*.")


def undescribed(schema: Mapping[str, Any] = SCHEMA) -> list[str]:
    """The keys of the schema that nothing describes: each needs its words in :data:`WHAT`."""
    return [path for path in key_paths(schema) if what(path) is None]


def unused(schema: Mapping[str, Any] = SCHEMA) -> list[str]:
    """The entries of :data:`WHAT` that name no key of the schema (a key renamed or removed)."""
    known = set(key_paths(schema))
    return [path for path in WHAT if path not in known]
