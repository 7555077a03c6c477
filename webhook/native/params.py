"""The policy read live: the CEL that reads a value of GPUPolicy/default through the ``params`` variable.

With ``nativePolicies.params: live`` (the default) the generated policies name ``GPUPolicy`` as their
``paramKind`` and their bindings name the object ``default``; a value is read from the object's spec at each
admission, the namespace's override first (``spec.namespaces[<namespace>]``), then the policy's own key, then the
built-in default. So an edit reaches the native engine within a watch delay and an override may loosen as well as
tighten. Optional reads (``.?``, ``[?]``, ``orValue``) make an absent key the default, never an error.

What the policies read live is :data:`LIVE`. The rest of the policy is compiled into the CEL, in both modes: which
names are GPUs and where the rules look (:data:`COMPILED`); the hard quantity rules (:data:`SEED`) are also compiled,
into policies without params, so that they hold while the object is missing. ``compiled_digest`` names the compiled
part, so whoever reads the object can tell when the generated policies must be generated again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from webhook.core import gpupolicy
from webhook.core.clustersummary import FRESH_FOR
from webhook.core.policyschema import CHECK_SETTINGS, DEFAULTS, PLATFORM_TRUSTS
from webhook.native.celtext import boolean, lit, lits

PARAM_KIND = {"apiVersion": gpupolicy.API_VERSION, "kind": gpupolicy.KIND}
# Allow: with the object missing a policy that reads it is skipped; the seed policies still hold.
PARAM_REF = {"name": gpupolicy.NAME, "parameterNotFoundAction": "Allow"}

SPEC = "params.?spec"
OVERRIDE = f"{SPEC}.?namespaces[?request.namespace]"

# The hard rules: quantities, requests and limits, as the apiserver itself holds Pods to them. They never read the
# object, so they are generated into policies of their own without params.
SEED = ("requests-without-limits", "invalid-quantity", "requests-differ", "structure", "ephemeral-gpu",
        "pod-level-gpu")

# The keys compiled into the CEL (and into the seed policies' bindings): what a GPU is and where the rules look.
COMPILED = ("platform", "resources", "accelerator.nodeLabel", "accelerator.annotation", "gpuTaints",
            "isolation.nvidiaRuntime",
            "dra.gpuClasses", "dra.allowedDeviceClasses", "dra.adminAccessNamespaces", "excludeNamespaces",
            "nativePolicies", "cluster.enabled", "enforcement (the seed policies' bindings)")


def _default(path: str) -> Any:
    value: Any = DEFAULTS
    for key in path.split("."):
        value = value[key]
    return value


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return boolean(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return lit(value)
    return lits(value)


def _read(base: str, path: str) -> str:
    return base + "".join(f".?{key}" for key in path.split("."))


def top(path: str, default: str | None = None) -> str:
    """The policy's own ``path`` (dot-separated), else ``default`` (CEL; the built-in default when None)."""
    fallback = _render(_default(path)) if default is None else default
    return f"{_read(SPEC, path)}.orValue({fallback})"


def value(path: str) -> str:
    """``path`` in force in the request's namespace: the namespace's override, the policy's, the default."""
    return f"{_read(OVERRIDE, path)}.orValue({top(path)})"


# The values a namespace may override, by the name the builders use.
LIVE = {
    "allowed": "accelerator.allowed",
    "default": "accelerator.default",
    "perContainer": "limits.perContainer",
    "perPod": "limits.perPod",
    "tolerations": "tolerations",
    "enforcement": "enforcement",
    "hideGpus": "isolation.hideGpus",
    "runtimeClass": "isolation.runtimeClass",
}


# The variable the request namespace's overrides are read into, for the rules' settings.
NAMESPACE_VARIABLE = "namespace_policy"
# The variable each value is read into, once per admission (matchConditions read the expression itself).
VARIABLES = {
    "allowed": "allowed_accelerators",
    "default": "default_accelerator",
    "perContainer": "per_container_cap",
    "perPod": "per_pod_cap",
    "tolerations": "add_tolerations",
    "enforcement": "enforcement",
    "hideGpus": "hide_gpus",
    "runtimeClass": "runtime_class",
}


def of(name: str) -> str:
    """The variable holding value ``name`` (:data:`LIVE`)."""
    return f"variables.{VARIABLES[name]}"


def expression(name: str) -> str:
    """Value ``name`` typed as its default is (``params`` is dynamic, and some targets' type checks refuse a dynamic
    branch beside a string one)."""
    text = value(LIVE[name])
    default = _default(LIVE[name])
    if isinstance(default, str):
        return f"string({text})"
    if isinstance(default, int) and not isinstance(default, bool):
        return f"int({text})"
    return text


# --- the cluster's facts (status.cluster) ------------------------------------------------------------------------
# CEL has no clock: the summary's age is judged against the request's time, as the apiserver wrote it into the object
# before admission: creationTimestamp on CREATE, the newest managedFields time on UPDATE. The facts count when that
# time is within FRESH_FOR seconds of writtenAt, either way (no managedFields time at or after the write, as on an
# update that changed no managed field, is no clock). Otherwise, or with no summary, they read as empty.
MANAGED_TIMES = ("(has(object.metadata.managedFields) ? object.metadata.managedFields.filter(entry, "
                 "has(entry.time)).map(entry, timestamp(entry.time)) : [])")
REQUEST_TIMES = f"request.operation == 'CREATE' ? [timestamp(object.metadata.creationTimestamp)] : {MANAGED_TIMES}"
# A MutatingAdmissionPolicy runs before the apiserver sets creationTimestamp, but after it has written the request's
# managedFields entry, with its time.
MUTATING_REQUEST_TIMES = MANAGED_TIMES
FACTS = "variables.cluster_facts"
FACTS_EXPRESSION = (f"[params.?status.?cluster.orValue({{}})].map(facts, has(facts.writtenAt) && "
                    f"variables.request_times.all(moment, moment - timestamp(facts.writtenAt) <= "
                    f"duration('{FRESH_FOR}s')) && variables.request_times.exists(moment, "
                    f"timestamp(facts.writtenAt) - moment <= duration('{FRESH_FOR}s')) ? facts : {{}})[0]")


# What a matchCondition reads of the facts (it has no variables): the param itself, fresh or not. A trigger may fire
# where its rule finds nothing, never the other way round (webhook.native.cluster).
PARAM_FACTS = "params.?status.?cluster"


def unknown_fact(value: str, section: str) -> str:
    """``value`` is not a key of the facts' ``section`` (or the param has none), read as a matchCondition can."""
    return f"!({value} in {PARAM_FACTS}.?{section}.orValue({{}}))"


def facts_section(name: str) -> str:
    """Whether the facts hold section ``name`` whole (present, and not cut at its bound)."""
    return f"{lit(name)} in {FACTS} && !({lit(name)} in {FACTS}.?truncated.orValue([]))"


def variables(texts: list[str], platform: str, mutating: bool = False) -> list[tuple[str, str]]:
    """The value variables the CEL ``texts`` read, in :data:`LIVE`'s order; the trusted namespace test too; the
    cluster's facts, judged by the request's time as a validating or (``mutating``) a mutating policy sees it."""
    read = " ".join(texts)
    out = [(variable, expression(name)) for name, variable in VARIABLES.items() if f"variables.{variable}" in read]
    if f"variables.{NAMESPACE_VARIABLE}" in read:
        out.insert(0, (NAMESPACE_VARIABLE, f"{OVERRIDE}.orValue({{}})"))
    if "variables.trusted_namespace" in read:
        out.append(("trusted_namespace", trusted(None, platform)))
    if f"variables.{TENANT_VARIABLE}" in read:
        out.append((TENANT_VARIABLE, tenant_namespace(top("isolation.tenantNamespaces"))))
    if FACTS in read:
        out += [("request_times", MUTATING_REQUEST_TIMES if mutating else REQUEST_TIMES),
                ("cluster_facts", FACTS_EXPRESSION)]
    return out


def setting(rule: str) -> str:
    """The rule's own setting (deny, warn or off) in the request's namespace; deny for a rule without one."""
    if rule not in CHECK_SETTINGS:
        return "'deny'"
    section, key = CHECK_SETTINGS[rule]
    path = f"{section}.{key}"
    return f"{_read(f'variables.{NAMESPACE_VARIABLE}', path)}.orValue({top(path)})"


def gate(rule: str, action: str) -> str:
    """Whether ``rule`` is ``action`` (deny or warn) in the request's namespace, ``enforcement: warn`` softening a
    deny (``Policy.action``)."""
    warned = f"{of('enforcement')} == 'warn'"
    if rule not in CHECK_SETTINGS:
        return f"!({warned})" if action == "deny" else f"({warned})"
    own = setting(rule)
    if action == "deny":
        return f"(!({warned}) && {own} == 'deny')"
    return f"{own} in ({warned} ? ['warn', 'deny'] : ['warn'])"


# The variable that says whether the request's namespace is a tenant's (isolation.tenantNamespaces).
TENANT_VARIABLE = "tenant_namespace"


def tenant_namespace(patterns: str) -> str:
    """``PolicySet.is_tenant`` of the request's namespace, against the CEL list of ``patterns`` (names, ``prefix*``)."""
    return (f"{patterns}.exists(pattern, pattern.endsWith('*') ? "
            f"request.namespace.startsWith(pattern.substring(0, size(pattern) - 1)) : request.namespace == pattern)")


def trusted_pod(account: str) -> str:
    """A pod that runs trusted: its namespace (the variable), or its service account (``account``: its CEL)."""
    return (f"(variables.trusted_namespace || (request.namespace + '/' + {account}) in "
            f"{top('isolation.trusted.serviceAccounts')})")


def trusted(account: str | None, platform: str) -> str:
    """``Policy.trusts``: the namespace is trusted (``isolation.trusted.namespaces``, ``platformNamespaces``, the
    platform preset's), or the pod runs as a trusted service account ``namespace/name`` (``account``: its CEL)."""
    tests = [f"request.namespace in {top('isolation.trusted.namespaces')}",
             f"request.namespace in {top('isolation.platformNamespaces')}"]
    if PLATFORM_TRUSTS.get(platform):
        tests.append(f"request.namespace in {lits(PLATFORM_TRUSTS[platform])}")
    if account is not None:
        tests.append(f"(request.namespace + '/' + {account}) in {top('isolation.trusted.serviceAccounts')}")
    return "(" + " || ".join(tests) + ")"


def _at(document: Mapping[str, Any], path: str) -> Any:
    value: Any = document
    for key in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def compiled_digest(document: Mapping[str, Any]) -> str:
    """A digest of the compiled keys of a resolved policy document (``PolicySet.document``), with each namespace's
    ``enforcement``: the generated policies carry it, and a live object whose digest differs needs them generated
    again."""
    keys = {path: _at(document, path) for path in COMPILED if " " not in path}
    keys["enforcement"] = [_at(document, "enforcement"),
                           sorted((ns, o.get("enforcement")) for ns, o in (document.get("namespaces") or {}).items()
                                  if isinstance(o, Mapping) and "enforcement" in o)]
    text = json.dumps(keys, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
