"""The policy file: its schema, its defaults, and the effective policy for a namespace.

Loading and validation live here and nowhere else; the server, the CLI and the tests all
call :func:`load_policy` or :func:`parse_policy`. A policy is refused as a whole, in one
:class:`PolicyError` naming every bad key (the schema's problems and every check after it, in the order the schema
lists the keys), so a typo never half-applies and a second one never waits for the first to be fixed.

Mapping keys are read as written: YAML 1.1 would turn a namespace ``2024:`` into a number and
``on:`` into ``True``, which no namespace name ever equals.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# jsonschema, PyYAML and difflib are imported where they are used: a serving process builds its policy without
# them (webhook.serving.policies checks the schema in a child process), and what it imports stays in every worker.
from webhook.core import catalog, gpupolicy
from webhook.core import resources as registry
from webhook.core.kinds import CustomKind, custom_kinds

# The namespaces every engine leaves alone by default: the control plane's own. The chart's webhooks also leave out
# their release's namespace and the namespaces its values add.
EXCLUDED_NAMESPACES = ("kube-system", "kube-node-lease")

# The namespaces where the platform's node agents install by their projects' documented defaults: the GPU stack
# (NVIDIA GPU Operator, on OpenShift too; the NVIDIA device plugin and DRA driver; Node Feature Discovery; the AMD
# GPU Operator; Intel's device plugins operator), CNIs (Calico's operator and its nodes, Flannel) and storage
# node plugins (Longhorn, Rook). docs/isolation.md says who the isolation rules are for and why by namespace.
PLATFORM_NAMESPACES = (
    "gpu-operator", "nvidia-gpu-operator", "nvidia-device-plugin", "nvidia-dra-driver-gpu", "node-feature-discovery",
    "kube-amd-gpu", "inteldeviceplugins-system",
    "calico-system", "tigera-operator", "kube-flannel",
    "longhorn-system", "rook-ceph",
)

DEFAULTS: dict[str, Any] = {
    "platform": "generic",
    "resources": ["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/*", "nvidia.com/mig-*"],
    "accelerator": {
        "nodeLabel": "accelerator",
        "annotation": "gpu-webhook/accelerator",
        "allowed": [],
        "default": "",
    },
    "gpuTaints": [],
    "limits": {"perContainer": 0, "perPod": 0},
    "tolerations": False,
    "enforcement": "deny",
    "isolation": {
        "hideGpus": "off",
        "runtimeClass": "",
        "trusted": {"namespaces": [], "serviceAccounts": []},
        # Where the platform's own node agents run (docs/isolation.md, "Who the rules are for"): trusted like
        # isolation.trusted, kept apart so that a policy's own trusted list does not drop them.
        "platformNamespaces": list(PLATFORM_NAMESPACES),
    },
    # Each rule's setting, from the rule table.
    "checks": {rule.key: rule.default for rule in catalog.in_section("checks")},
    "cluster": {"enabled": False, **{rule.key: rule.default for rule in catalog.in_section("cluster")}},
    "dra": {
        # Device classes whose devices are GPUs (globs): they count toward the caps, get the accelerator
        # selector and tolerations, and clash with a GPU in limits. The vendors' DRA drivers' classes.
        "gpuClasses": ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com"],
        "allowedDeviceClasses": [],
        "adminAccessNamespaces": [],
        **{rule.key: rule.default for rule in catalog.in_section("dra")},
    },
    # Namespaces no engine looks at: the chart's webhooks, the generated policies and `check` leave them alone.
    "excludeNamespaces": list(EXCLUDED_NAMESPACES),
    # For `gpu-webhook admission-policies` (webhook.native reads them): custom kinds with pod templates, and the
    # namespaces the generated policies leave alone beyond excludeNamespaces.
    "nativePolicies": {"customKinds": [], "excludeNamespaces": [], "params": "live"},
    "namespaces": {},
}
_DRA_LISTS = ("gpuClasses", "allowedDeviceClasses", "adminAccessNamespaces")

# What each platform labels and taints its GPU nodes with (shared/notes/gpu-landscape-2026.md section 5).
# `platform: gke` stands for these keys; keys written in the policy still override them.
PLATFORMS: dict[str, dict[str, Any]] = {
    "generic": {},
    # GKE labels the model and, when a GPU pool joins a cluster with other pools, taints nvidia.com/gpu=present
    # (older pools: true); no value here, so the toleration is Exists and covers both.
    "gke": {
        "accelerator": {"nodeLabel": "cloud.google.com/gke-accelerator"},
        "gpuTaints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    },
    # Karpenter's label; EKS taints nothing by itself, its GPU guide adds nvidia.com/gpu:NoSchedule.
    "eks": {
        "accelerator": {"nodeLabel": "karpenter.k8s.aws/instance-gpu-name"},
        "gpuTaints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    },
    # AKS names the vendor (nvidia), not the model; its GPU guide taints sku=gpu:NoSchedule.
    "aks": {
        "accelerator": {"nodeLabel": "kubernetes.azure.com/accelerator"},
        "gpuTaints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
    },
    # GPU Feature Discovery's product label (Tesla-T4, A100-SXM4-40GB); taints are the cluster's own.
    "gpu-operator": {"accelerator": {"nodeLabel": "nvidia.com/gpu.product"}},
}

# The namespaces a platform preset trusts whatever the policy's lists say: what the GPU Operator installs runs there.
PLATFORM_TRUSTS: dict[str, tuple[str, ...]] = {"gpu-operator": ("gpu-operator", "nvidia-gpu-operator")}

# Settings of the rules that have one, by the rule id their violations carry. Every other rule follows
# ``enforcement``; these have a setting of their own, which ``enforcement: warn`` still softens.
CHECK_SETTINGS = {rule.id: (rule.section, rule.key) for rule in catalog.RULES.values() if rule.section}

_ENFORCEMENT = {"enum": ["deny", "warn"]}
# YAML 1.1 reads a bare `off` as false; accept it rather than make every user quote it.
_SETTING = {"enum": ["deny", "warn", "off", False]}
_COUNT = {"type": "integer", "minimum": 0}
_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
_LIMITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"perContainer": _COUNT, "perPod": _COUNT},
}
_DNS_LABEL = "[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = "[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
# YAML 1.1 reads a bare `off` as false here too.
_HIDE_GPUS = {"enum": ["void", "none", "off", False]}
_RUNTIME_CLASS = {"type": "string", "pattern": f"^(?:{_DNS_SUBDOMAIN})?$"}
_CHECKS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {key: _SETTING for key in DEFAULTS["checks"]},
}
_CLUSTER_SETTINGS = {key: _SETTING for key in DEFAULTS["cluster"] if key != "enabled"}
_TAINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["key"],
    "properties": {
        "key": {"type": "string", "minLength": 1},
        "value": {"type": "string"},
        "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
    },
}

# The settings a namespace may override as they are, in the order both levels list them.
_PER_NAMESPACE = {"limits": _LIMITS, "tolerations": {"type": "boolean"}, "enforcement": _ENFORCEMENT}

# nativePolicies: what `gpu-webhook admission-policies` needs beyond the rules (webhook.native reads it). A
# template path is dot-separated field names, `*` for every value of a map, `name[*]` for every item of a list.
_TEMPLATE_PATH = {
    "type": "string",
    "pattern": r"^[A-Za-z0-9_-]+(?:\[\*\])?(?:\.(?:[A-Za-z0-9_-]+(?:\[\*\])?|\*))*$",
}
_NATIVE_POLICIES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "customKinds": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["group", "resource"],
                # pod templates, resource blocks ({limits, requests} an operator copies into its pods), or both;
                # check and the webhook know an object by its kind, so blocks need it
                "anyOf": [{"required": ["templates"]}, {"required": ["resources", "kind"]}],
                "properties": {
                    "group": {"type": "string", "pattern": f"^{_DNS_SUBDOMAIN}$"},
                    "version": {"type": "string", "pattern": "^(?:[a-z0-9]+|\\*)$"},
                    "resource": {"type": "string", "pattern": f"^{_DNS_LABEL}$"},
                    "kind": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$"},
                    "templates": {"type": "array", "minItems": 1, "items": _TEMPLATE_PATH},
                    "resources": {"type": "array", "minItems": 1, "items": _TEMPLATE_PATH},
                },
            },
        },
        "excludeNamespaces": {"type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}},
        # live: the generated policies read GPUPolicy/default through params; inline: its values written into them
        "params": {"enum": ["live", "inline"]},
    },
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "gpu-webhook policy",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "platform": {"enum": list(PLATFORMS)},
        "resources": {**_STRINGS, "minItems": 1},
        "accelerator": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "nodeLabel": {"type": "string", "minLength": 1},
                "annotation": {"type": "string", "minLength": 1},
                "allowed": _STRINGS,
                "default": {"type": "string"},
            },
        },
        "gpuTaints": {"type": "array", "items": _TAINT},
        **_PER_NAMESPACE,
        "isolation": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "hideGpus": _HIDE_GPUS,
                "runtimeClass": _RUNTIME_CLASS,
                "platformNamespaces": {
                    "type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}, "uniqueItems": True,
                },
                "trusted": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "namespaces": {"type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}},
                        "serviceAccounts": {
                            "type": "array",
                            "items": {"type": "string", "pattern": f"^{_DNS_LABEL}/{_DNS_SUBDOMAIN}$"},
                        },
                    },
                },
            },
        },
        "checks": _CHECKS,
        "cluster": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"enabled": {"type": "boolean"}, **_CLUSTER_SETTINGS},
        },
        "dra": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                **{key: _STRINGS for key in _DRA_LISTS},
                **{key: _SETTING for key in DEFAULTS["dra"] if key not in _DRA_LISTS},
            },
        },
        "excludeNamespaces": {"type": "array", "items": {"type": "string", "pattern": f"^{_DNS_LABEL}$"}},
        "nativePolicies": _NATIVE_POLICIES,
        "namespaces": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "accelerator": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"allowed": _STRINGS, "default": {"type": "string"}},
                    },
                    **_PER_NAMESPACE,
                    "isolation": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"hideGpus": _HIDE_GPUS, "runtimeClass": _RUNTIME_CLASS},
                    },
                    "checks": _CHECKS,
                    "cluster": {"type": "object", "additionalProperties": False, "properties": _CLUSTER_SETTINGS},
                    "dra": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"allowedDeviceClasses": _STRINGS},
                    },
                },
            },
        },
    },
}


# Native resources: never GPUs, and a pattern matching one would make cpu and memory count as GPUs.
_CORE_RESOURCES = {
    "cpu": "cpu", "memory": "memory", "ephemeral-storage": "ephemeral-storage", "storage": "storage",
    "pods": "pods", "hugepages-2Mi": "hugepages-*", "hugepages-1Gi": "hugepages-*",
}
# A namespace name is a DNS-1123 label; a key that is not one can never match a namespace.
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)


# Every DeviceClass is also an extended resource under this prefix (KEP-5004).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


@functools.cache
def _loader() -> type[Any]:
    """The YAML loader of policy files, made when the first file is read."""
    import yaml
    from yaml.constructor import ConstructorError

    class _Loader(yaml.SafeLoader):
        """YAML with every scalar mapping key kept as the text written, and duplicate keys refused.

        Keys a merge (``<<: *anchor``) brings in may be overridden, as YAML allows; keys written twice may not.
        """

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            written = {id(key_node) for key_node, _ in node.value}
            self.flatten_mapping(node)  # merge keys (<<) first, as SafeLoader does
            mapping: dict[Any, Any] = {}
            seen: set[Any] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else self.construct_object(key_node, deep)
                try:
                    duplicate = key in seen
                except TypeError:
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                    ) from None
                if id(key_node) in written:
                    seen.add(key)
                if duplicate:
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                mapping[key] = self.construct_object(value_node, deep)
            return mapping

    return _Loader


CLUSTER_RULES = frozenset(rule for rule, (section, _) in CHECK_SETTINGS.items() if section == "cluster")


class PolicyError(ValueError):
    """A policy that cannot be used; ``problems`` names each bad key."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid policy: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class Taint:
    """A taint GPU nodes carry; ``value`` and ``effect`` None match any."""

    key: str
    value: str | None = None
    effect: str | None = None

    def toleration(self) -> dict[str, str]:
        """The toleration a GPU pod needs: Exists when the value does not matter (GKE's present or true)."""
        out = {"key": self.key, "operator": "Exists"} if self.value is None else {
            "key": self.key, "operator": "Equal", "value": self.value}
        if self.effect is not None:
            out["effect"] = self.effect
        return out

    def tolerated_by(self, toleration: Mapping[str, Any]) -> bool:
        """Whether ``toleration`` tolerates this taint, as the scheduler matches them (a key-less Exists
        tolerates every taint)."""
        effect = toleration.get("effect")
        if effect not in (None, "") and self.effect is not None and effect != self.effect:
            return False
        key = toleration.get("key")
        operator = toleration.get("operator") or "Equal"
        if key in (None, ""):
            return operator == "Exists"
        if key != self.key:
            return False
        if operator == "Exists":
            return True
        return self.value is not None and toleration.get("value") == self.value


@dataclass(frozen=True)
class Policy:
    """The policy in force for one namespace, every override applied."""

    resources: tuple[str, ...]
    node_label: str
    annotation: str
    allowed: tuple[str, ...]
    default: str
    per_container: int
    per_pod: int
    tolerations: bool
    enforcement: str
    # rule id -> deny | warn | off, for the rules in CHECK_SETTINGS
    settings: Mapping[str, str] = field(default_factory=dict)
    cluster_enabled: bool = False
    platform: str = "generic"
    gpu_taints: tuple[Taint, ...] = ()
    hide_gpus: str = "off"  # void | none | off: NVIDIA_VISIBLE_DEVICES added to containers without GPUs
    runtime_class: str = ""  # injected into GPU pods that name none
    # isolation.trusted: the whole namespace, or pods running as these service accounts of it
    trusted: bool = False
    trusted_accounts: frozenset[str] = frozenset()
    gpu_classes: tuple[str, ...] = ()
    allowed_device_classes: tuple[str, ...] = ()
    admin_access_namespaces: tuple[str, ...] = ()
    # the registry of kinds with the policy's nativePolicies.customKinds: where resource blocks are
    kinds: tuple[CustomKind, ...] = ()
    _gpu_names: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def names_gpu(self, resource_name: str) -> bool:
        """Whether ``policy.resources`` lists the name, whatever it counts."""
        return any(fnmatch.fnmatchcase(resource_name, p) for p in self.resources)

    def is_gpu(self, resource_name: str) -> bool:
        """A GPU count: listed in ``resources`` and, by the vendor registry, a number of devices (HAMi's
        ``nvidia.com/gpumem`` under a ``nvidia.com/*`` pattern is MiB, not GPUs)."""
        # Resource names repeat across every request, so the answer is memoised.
        known = self._gpu_names.get(resource_name)
        if known is None:
            known = (self.names_gpu(resource_name) and registry.counts_gpus(resource_name)) or (
                resource_name.startswith(IMPLICIT_PREFIX) and self.is_gpu_class(resource_name[len(IMPLICIT_PREFIX):])
            )
            if len(self._gpu_names) < 4096:
                self._gpu_names[resource_name] = known
        return known

    def is_gpu_class(self, device_class: str) -> bool:
        return any(fnmatch.fnmatchcase(device_class, p) for p in self.gpu_classes)

    def device_class_allowed(self, device_class: str) -> bool:
        return not self.allowed_device_classes or any(
            fnmatch.fnmatchcase(device_class, p) for p in self.allowed_device_classes
        )

    def admin_access_allowed(self, namespace: str) -> bool:
        return any(fnmatch.fnmatchcase(namespace, p) for p in self.admin_access_namespaces)

    def accelerator_allowed(self, value: str) -> bool:
        return not self.allowed or value in self.allowed

    def injected_accelerator(self, annotated: object) -> str | None:
        """The accelerator mutation selects: the pod's annotation, else the default; None if not allowed."""
        value = annotated if isinstance(annotated, str) and annotated else self.default
        return value if value and self.accelerator_allowed(value) else None

    def trusts(self, spec: Mapping[str, Any]) -> bool:
        """Whether a pod spec runs trusted: in a trusted namespace, or as a trusted service account."""
        if self.trusted:
            return True
        if not self.trusted_accounts:
            return False
        account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
        return account in self.trusted_accounts

    def tolerates_gpu_taint(self, toleration: Mapping[str, Any]) -> bool:
        """A toleration with a key that lets a pod onto GPU nodes: a GPU resource name (the device plugin's
        and ExtendedResourceToleration's taint key) or one of ``gpuTaints``."""
        key = toleration.get("key")
        if not isinstance(key, str) or not key:
            return False
        return self.is_gpu(key) or registry.known(key) or any(t.tolerated_by(toleration) for t in self.gpu_taints)

    def action(self, rule: str) -> str:
        """deny, warn or off for a violation of ``rule`` in this namespace."""
        setting = self.settings.get(rule, "deny")
        if setting == "off" or (rule in CLUSTER_RULES and not self.cluster_enabled):
            return "off"
        return "warn" if self.enforcement == "warn" else setting

    def checks(self, rule: str) -> bool:
        return self.action(rule) != "off"


@dataclass(frozen=True)
class PolicySet:
    """The global policy and its per-namespace overlays, resolved once at load."""

    default: Policy
    by_namespace: Mapping[str, Policy]
    document: Mapping[str, Any]
    # excludeNamespaces: no engine looks at objects there
    excluded: frozenset[str] = frozenset(EXCLUDED_NAMESPACES)
    # the document as written, before defaults: what a GPUPolicy's spec holds
    written: Mapping[str, Any] = field(default_factory=dict)

    def excludes(self, namespace: str | None) -> bool:
        """Whether objects of ``namespace`` are left alone by every engine (``excludeNamespaces``)."""
        return bool(namespace) and namespace in self.excluded

    def for_namespace(self, namespace: str | None) -> Policy:
        return self.by_namespace.get(namespace or "", self.default)


def gpu_entries(resources: Mapping[str, Any], policy: Policy) -> dict[str, Any]:
    """The GPU entries of a resources map (limits or requests): names the policy counts as GPUs."""
    return {name: v for name, v in resources.items() if isinstance(name, str) and policy.is_gpu(name)}


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _written(value: object) -> str:
    """A value as it reads in YAML: ``true`` rather than Python's ``True``."""
    if isinstance(value, bool) or value is None:
        import yaml

        return yaml.safe_dump(value).removesuffix("\n...\n")
    if isinstance(value, str) and value and value == value.strip():
        return value
    return repr(value)


KeyPath = tuple[object, ...]  # a key's place in the policy: ("namespaces", "team-a", "limits", "perPod")


def _keys_of(schema: Mapping[str, Any], prefix: KeyPath = ()) -> tuple[KeyPath, ...]:
    """Every key the schema's objects name, each as its path: through nested objects, not into lists or maps of
    free names (a namespace's settings are a scope of their own)."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    return tuple(
        path for name, sub in properties.items() for path in (((*prefix, name),) + _keys_of(sub, (*prefix, name)))
    )


_OVERLAY = SCHEMA["properties"]["namespaces"]["additionalProperties"]
# The two scopes a key may be written in: the policy, and one namespace's overrides.
_TOP_KEYS = _keys_of(SCHEMA)
_OVERLAY_KEYS = _keys_of(_OVERLAY)


def _dotted(path: KeyPath) -> str:
    return ".".join(map(str, path))


def _unknown_key(key: object, at: KeyPath, known: list[str]) -> str:
    """An unknown key with where it lives when the schema has it elsewhere in the same scope (``'perContainer'
    (a setting of limits.*: write it as limits.perContainer)``), that it is no namespace's when only the top
    level has it, else the nearest spelling at this level or elsewhere (``'cpuPodOnGPUNodes' (did you mean
    'cpuPodOnGpuNodes'?)``)."""
    import difflib

    in_namespace = len(at) >= 2 and at[0] == "namespaces"
    scope: KeyPath = at[:2] if in_namespace else ()
    keys = _OVERLAY_KEYS if in_namespace else _TOP_KEYS
    here = at[len(scope):]
    elsewhere = [(*scope, *path) for path in keys if path[-1] == key and path[:-1] != here]
    if elsewhere:
        sections = " or ".join(f"{_dotted(p[:-1])}.*" if len(p) > 1 else "the top level" for p in elsewhere)
        return f"{key!r} (a setting of {sections}: write it as {' or '.join(map(_dotted, elsewhere))})"
    top_only = [path for path in _TOP_KEYS if path[-1] == key] if in_namespace else []
    if top_only:
        return f"{key!r} (not per namespace: {' or '.join(map(_dotted, top_only))} is set at the top level)"
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(str(key).lower(), list(by_lower), n=1)
    if close:
        return f"{key!r} (did you mean {by_lower[close[0]]!r}?)"
    by_lower_elsewhere = {str(path[-1]).lower(): path for path in reversed(keys)}  # the first of a name wins
    close = difflib.get_close_matches(str(key).lower(), list(by_lower_elsewhere), n=1)
    return f"{key!r} (did you mean {_dotted((*scope, *by_lower_elsewhere[close[0]]))}?)" if close else repr(key)


def _choices(options: list[object]) -> str:
    names = [o for o in options if isinstance(o, str)]  # False stands in for a bare off
    return ", ".join(names[:-1]) + f" or {names[-1]}"


def _schema_problems(document: object) -> list[tuple[KeyPath, str]]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    problems = []
    for error in validator.iter_errors(document):
        at = tuple(error.absolute_path)
        where = _dotted(at) or "(top level)"
        if error.validator == "additionalProperties":
            known = sorted(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - set(known), key=str)
            problem = f"{where}: unknown key(s) {', '.join(_unknown_key(k, at, known) for k in unknown)}"
        elif error.validator == "anyOf":  # a custom kind's: the one anyOf of the schema
            problem = f"{where}: give templates (pod templates), or resources (resource blocks) with kind"
        elif error.validator == "enum":
            problem = f"{where}: {_written(error.instance)} is not a setting (use {_choices(error.validator_value)})"
        else:
            problem = f"{where}: {error.message}"
        problems.append((at, problem))
    return problems


def _key_problems(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """Namespace keys that can never match a namespace (read as a number or boolean, or no DNS label)."""
    namespaces = document.get("namespaces")
    problems: list[tuple[KeyPath, str]] = []
    for key in namespaces if isinstance(namespaces, Mapping) else ():
        if isinstance(key, bool):
            spelled = "'on'/'yes'/'true'" if key else "'off'/'no'/'false'"
            problem = f"namespaces: key {key} (YAML read {spelled} as a boolean): quote it"
        elif not isinstance(key, str):
            kind = "a number" if isinstance(key, (int, float)) else f"a {type(key).__name__}"
            problem = f"namespaces: key {key!r} is {kind}, not a name: quote it"
        elif not _NAMESPACE.fullmatch(key):
            problem = f"namespaces: {key!r} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        else:
            continue
        problems.append((("namespaces", key), problem))
    return problems


def _resource_problems(patterns: object) -> list[tuple[KeyPath, str]]:
    """GPU resource patterns that would take native resources for GPUs, or could name no extended resource."""
    problems: list[tuple[KeyPath, str]] = []
    for i, pattern in enumerate(patterns if isinstance(patterns, list) else []):
        if not isinstance(pattern, str):
            continue  # the schema has said so
        core = sorted({label for name, label in _CORE_RESOURCES.items() if fnmatch.fnmatchcase(name, pattern)})
        if core:
            problem = f"resources[{i}]: {pattern!r} matches {', '.join(core)}, which are not GPUs"
            problems.append((("resources", i), problem))
        elif "/" not in pattern:
            problem = f"resources[{i}]: {pattern!r} has no domain (GPUs are extended resources such as nvidia.com/gpu)"
            problems.append((("resources", i), problem))
    return problems


def _accelerator_written(section: object) -> tuple[Mapping[str, Any], list[str] | None, str | None]:
    """An ``accelerator`` mapping as written, its allowed list and its default (the defaults where not written;
    None where the schema refuses the value)."""
    written = section if isinstance(section, Mapping) else {}
    allowed, default = written.get("allowed", []), written.get("default", "")
    usable = isinstance(allowed, list) and all(isinstance(a, str) for a in allowed)
    return written, allowed if usable else None, default if isinstance(default, str) else None


def _accelerator_problems(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """A default accelerator outside the allowed list, of the policy and of each namespace that writes either
    (one that writes neither has the policy's, named once).

    Read from the document as written, so it runs beside the schema's check; a value the schema refuses is
    not checked again (the schema names it)."""
    _, allowed, default = _accelerator_written(document.get("accelerator"))
    problems: list[tuple[KeyPath, str]] = []
    if allowed and default and default not in allowed:
        problem = f"accelerator.default: {default!r} is not in the allowed list {allowed}"
        problems.append((("accelerator", "default"), problem))
    namespaces = document.get("namespaces")
    for name, overlay in namespaces.items() if isinstance(namespaces, Mapping) else ():
        overlay_accelerator = overlay.get("accelerator") if isinstance(overlay, Mapping) else None
        written, own_allowed, own_default = _accelerator_written(overlay_accelerator)
        ns_allowed = own_allowed if "allowed" in written else allowed
        ns_default = own_default if "default" in written else default
        if not written or not ns_allowed or not ns_default or ns_default in ns_allowed:
            continue
        where = f"namespaces.{name}.accelerator"
        if "default" in written:
            inherited = "" if "allowed" in written else " (accelerator.allowed)"
            problem = f"{where}.default: {ns_default!r} is not in the allowed list {ns_allowed}{inherited}"
            problems.append((("namespaces", name, "accelerator", "default"), problem))
        else:
            problem = f"{where}.allowed: {ns_allowed} leaves out the default {ns_default!r} (accelerator.default)"
            problems.append((("namespaces", name, "accelerator", "allowed"), problem))
    return problems


def _place(path: KeyPath) -> tuple[tuple[int, int, str], ...]:
    """Where a problem at ``path`` goes in the list: keys in the order the schema (and the reference) lists
    them, then keys it does not know by name; namespace names by name; list items by index."""
    schema: Mapping[str, Any] = SCHEMA
    place = []
    for part in path:
        properties: Mapping[str, Any] = schema.get("properties", {})
        if isinstance(part, int) and not isinstance(part, bool) and "items" in schema:
            place.append((0, part, ""))
            schema = schema["items"]
        elif isinstance(part, str) and part in properties:
            place.append((0, list(properties).index(part), ""))
            schema = properties[part]
        else:
            place.append((1, 0, str(part)))
            extra = schema.get("additionalProperties")
            schema = extra if isinstance(extra, Mapping) else {}
    return tuple(place)


def _all_problems(document: object, *, schema_checked: bool = False) -> list[str]:
    """Every problem of a decoded policy document, each naming its key, in the order of their keys: the
    schema's (unless ``schema_checked``) and every check after it, on the policy and on each namespace."""
    problems = [] if schema_checked else _schema_problems(document)
    if isinstance(document, Mapping):
        problems += _key_problems(document)
        problems += _resource_problems(document.get("resources"))
        problems += _accelerator_problems(document)
    return [problem for _, problem in sorted(problems, key=lambda found: _place(found[0]))]


def _policy(document: Mapping[str, Any], trusted: bool = False, accounts: frozenset[str] = frozenset(),
            kinds: tuple[CustomKind, ...] = ()) -> Policy:
    accelerator = document["accelerator"]
    isolation = document["isolation"]
    return Policy(
        resources=tuple(document["resources"]),
        node_label=accelerator["nodeLabel"],
        annotation=accelerator["annotation"],
        allowed=tuple(accelerator["allowed"]),
        default=accelerator["default"],
        per_container=document["limits"]["perContainer"],
        per_pod=document["limits"]["perPod"],
        tolerations=document["tolerations"],
        enforcement=document["enforcement"],
        settings={rule: document[section][key] or "off" for rule, (section, key) in CHECK_SETTINGS.items()},
        cluster_enabled=document["cluster"]["enabled"],
        platform=document["platform"],
        gpu_taints=tuple(Taint(t["key"], t.get("value"), t.get("effect")) for t in document["gpuTaints"]),
        hide_gpus=isolation["hideGpus"] or "off",
        runtime_class=isolation["runtimeClass"],
        trusted=trusted,
        trusted_accounts=accounts,
        gpu_classes=tuple(document["dra"]["gpuClasses"]),
        allowed_device_classes=tuple(document["dra"]["allowedDeviceClasses"]),
        admin_access_namespaces=tuple(document["dra"]["adminAccessNamespaces"]),
        kinds=kinds,
    )


def build_policy(document: object, source: str = "policy", *, schema_checked: bool = False,
                 within: str = "") -> PolicySet:
    """Validate a decoded policy document (``None`` means all defaults) and resolve it. ``schema_checked``: the
    JSON schema has passed it already, in another process (every other check runs all the same). ``within``:
    where the policy lives in what was read (``spec`` of a GPUPolicy), named before each bad key."""
    if document is None:
        document = {}
    problems = _all_problems(document, schema_checked=schema_checked)
    if problems:
        raise PolicyError(source, [_within(problem, within) for problem in problems])
    assert isinstance(document, Mapping)
    # Defaults, then the platform's labels and taints, then what the policy writes.
    merged = _merge(_merge(DEFAULTS, PLATFORMS[document.get("platform", DEFAULTS["platform"])]), document)
    overlays = merged.pop("namespaces")
    trusted = merged["isolation"]["trusted"]
    accounts: dict[str, set[str]] = {}
    for entry in trusted["serviceAccounts"]:
        namespace, name = entry.split("/", 1)
        accounts.setdefault(namespace, set()).add(name)
    trusted_namespaces = {*trusted["namespaces"], *merged["isolation"]["platformNamespaces"],
                          *PLATFORM_TRUSTS.get(merged["platform"], ())}
    kinds = tuple(custom_kinds(merged))
    default = _policy(merged, kinds=kinds)
    by_namespace = {
        ns: _policy(_merge(merged, overlays.get(ns, {})), ns in trusted_namespaces, frozenset(accounts.get(ns, ())),
                    kinds)
        for ns in {*overlays, *trusted_namespaces, *accounts}
    }
    excluded = frozenset(merged["excludeNamespaces"])
    return PolicySet(default=default, by_namespace=by_namespace, document={**merged, "namespaces": overlays},
                     excluded=excluded, written=copy.deepcopy(dict(document)))


def _within(problem: str, prefix: str) -> str:
    """A problem naming its key under ``prefix``: ``limits.perPod: ...`` as ``spec.limits.perPod: ...``."""
    if not prefix:
        return problem
    top = "(top level): "
    return f"{prefix}: {problem[len(top):]}" if problem.startswith(top) else f"{prefix}.{problem}"


def _at(mark: Any, first_line: int) -> str:
    return f"line {mark.line + first_line + 1}, column {mark.column + 1}"


def yaml_error_line(exc: Exception, first_line: int = 0) -> str:
    """A YAML parser error as one line, ``(line N, column M)`` after each part instead of PyYAML's
    multi-line ``in "<unicode string>", line N, column M``; lines are counted after ``first_line``."""
    import yaml

    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())
    parts = []
    if exc.context:
        parts.append(exc.context + (f" ({_at(exc.context_mark, first_line)})" if exc.context_mark else ""))
    if exc.problem:
        parts.append(exc.problem + (f" ({_at(exc.problem_mark, first_line)})" if exc.problem_mark else ""))
    return " ".join(": ".join(parts).split())


def unwrap(document: object, source: str = "policy") -> tuple[object, str]:
    """A decoded document's policy and the prefix of its keys: a GPUPolicy's ``spec`` (keys named ``spec.*``,
    as the apiserver names them), else the document itself (no prefix). A document with ``apiVersion`` or
    ``kind`` (neither is a policy key) must be a whole GPUPolicy of this API version."""
    if not isinstance(document, Mapping) or ("apiVersion" not in document and "kind" not in document):
        return document, ""
    wanted = f"apiVersion {gpupolicy.API_VERSION} and kind {gpupolicy.KIND}"
    written = f"apiVersion {_written(document.get('apiVersion'))} and kind {_written(document.get('kind'))}"
    if document.get("apiVersion") != gpupolicy.API_VERSION or document.get("kind") != gpupolicy.KIND:
        raise PolicyError(source, [f"{written}: not a policy (a policy file, or a GPUPolicy with {wanted})"])
    if "spec" not in document:
        raise PolicyError(source, [f"a {gpupolicy.KIND} without spec: its spec is the policy (spec: {{}} for the "
                                   "defaults)"])
    return document["spec"], "spec"


def parse_policy(text: str, source: str = "policy", *, schema_checked: bool = False) -> PolicySet:
    """The policy in ``text``: a policy file, or a GPUPolicy (``gpu-webhook.io/v1alpha1``) whose spec is one;
    its problems name keys as written there (``spec.limits.perPod`` in a GPUPolicy)."""
    import yaml

    try:
        documents = [d for d in yaml.load_all(text, Loader=_loader()) if d is not None]  # keys as written
    except yaml.YAMLError as exc:
        raise PolicyError(source, [f"not valid YAML: {yaml_error_line(exc)}"]) from None
    if len(documents) > 1:
        raise PolicyError(source, [f"{len(documents)} YAML documents: give one policy (a policy file, or one "
                                   f"{gpupolicy.KIND})"])
    document, within = unwrap(documents[0] if documents else None, source)
    return build_policy(document, source, schema_checked=schema_checked, within=within)


def load_policy(path: str | Path | None) -> PolicySet:
    """The policy in ``path``, or the defaults when no file is given."""
    if path is None:
        return build_policy(None, "default policy")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(str(path), [f"cannot read: {exc}"]) from None
    return parse_policy(text, str(path))
