"""The policy in force: a namespace's Policy, the PolicySet of every namespace's, a checked document resolved.

A checked policy document (``webhook.core.policyfile`` checks it) is laid over the defaults and its platform's
preset (``webhook.core.policyschema``); each namespace it overrides, or trusts, gets a :class:`Policy` of its own.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.core import resources as registry
from webhook.core.kinds import CustomKind, custom_kinds
from webhook.core.policyschema import CHECK_SETTINGS, DEFAULTS, EXCLUDED_NAMESPACES, PLATFORM_TRUSTS, PLATFORMS

# Every DeviceClass is also an extended resource under this prefix (KEP-5004).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"

CLUSTER_RULES = frozenset(rule for rule, (section, _) in CHECK_SETTINGS.items() if section == "cluster")


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
    # isolation.nvidiaRuntime: legacy (the NVIDIA runtime reads NVIDIA_VISIBLE_DEVICES in every pod) or cdi (only
    # under a RuntimeClass nvidia*)
    nvidia_runtime: str = "legacy"
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
    # isolation.tenantNamespaces: names, `prefix*` globs, or `*`
    tenant_namespaces: tuple[str, ...] = ()

    def is_tenant(self, namespace: str | None) -> bool:
        """Whether ``namespace`` is a tenant's (``isolation.tenantNamespaces``): there a tenant rule denies a pod
        that asks for no GPU; elsewhere it warns."""
        if not namespace:
            return False
        return any(namespace.startswith(p[:-1]) if p.endswith("*") else namespace == p for p in self.tenant_namespaces)

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
        nvidia_runtime=isolation["nvidiaRuntime"],
        trusted=trusted,
        trusted_accounts=accounts,
        gpu_classes=tuple(document["dra"]["gpuClasses"]),
        allowed_device_classes=tuple(document["dra"]["allowedDeviceClasses"]),
        admin_access_namespaces=tuple(document["dra"]["adminAccessNamespaces"]),
        kinds=kinds,
    )


def resolve(document: Mapping[str, Any]) -> PolicySet:
    """A checked policy document resolved: the policy in force by default and in each namespace it overrides or
    trusts, the merged document, and the document as written."""
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
                     excluded=excluded, written=copy.deepcopy(dict(document)),
                     tenant_namespaces=tuple(merged["isolation"]["tenantNamespaces"]))

