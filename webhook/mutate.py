"""Mutation: the Pod a GPU workload should have been, as a JSONPatch.

Work happens on a deep copy and the patch is the diff (``jsonpatch.make_patch``), so no
path is built by hand and "nothing to change" is an empty patch. Every step only fills in
what is absent, which makes a second pass a no-op (the apiserver may reinvoke us).
Odd shapes are left untouched for ``/validate`` to report.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch

from webhook.policy import Policy
from webhook.rules import CONTAINER_LISTS, gpu_entries


def _containers(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for list_name in CONTAINER_LISTS[:2]:  # ephemeral containers may not hold GPUs at all
        items = spec.get(list_name)
        if isinstance(items, list):
            found.extend(c for c in items if isinstance(c, dict))
    return found


def default_requests(spec: dict[str, Any], policy: Policy) -> set[str]:
    """Copy GPU limits into absent requests; return every GPU resource the pod names."""
    used: set[str] = set()
    for container in _containers(spec):
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        limits, requests = resources.get("limits"), resources.get("requests")
        limits = gpu_entries(limits, policy) if isinstance(limits, Mapping) else {}
        if requests is not None and not isinstance(requests, dict):
            continue
        used.update(limits)
        used.update(gpu_entries(requests or {}, policy))
        missing = {name: value for name, value in limits.items() if name not in (requests or {})}
        if missing:
            resources["requests"] = {**(requests or {}), **missing}
    return used


def _affinity_names_label(spec: Mapping[str, Any], label: str) -> bool:
    try:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        return any(expr.get("key") == label for term in terms for expr in (term.get("matchExpressions") or []))
    except (KeyError, TypeError, AttributeError):
        return False


def inject_accelerator(pod: dict[str, Any], policy: Policy) -> None:
    """nodeSelector[label] from the annotation, else the namespace/global default; never overriding."""
    spec = pod["spec"]
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    annotated = annotations.get(policy.annotation) if isinstance(annotations, Mapping) else None
    value = annotated if isinstance(annotated, str) and annotated else policy.default
    if not value or not policy.accelerator_allowed(value):
        return
    selector = spec.get("nodeSelector")
    if selector is not None and (not isinstance(selector, dict) or policy.node_label in selector):
        return
    if _affinity_names_label(spec, policy.node_label):
        return
    spec["nodeSelector"] = {**(selector or {}), policy.node_label: value}


def _tolerated(tolerations: list[Any], key: str) -> bool:
    for t in tolerations:
        if not isinstance(t, Mapping) or t.get("effect") not in (None, "", "NoSchedule"):
            continue
        if t.get("operator") == "Exists" and t.get("key") in (None, "", key):
            return True
    return False


def add_tolerations(spec: dict[str, Any], resources: set[str]) -> None:
    tolerations = spec.get("tolerations")
    if tolerations is None:
        tolerations = []
    if not isinstance(tolerations, list):
        return
    added = [
        {"key": name, "operator": "Exists", "effect": "NoSchedule"}
        for name in sorted(resources)
        if not _tolerated(tolerations, name)
    ]
    if added:
        spec["tolerations"] = tolerations + added


def mutated_pod(pod: Mapping[str, Any], policy: Policy) -> dict[str, Any]:
    """The pod with GPU defaults applied (a copy; ``pod`` is not touched)."""
    result = copy.deepcopy(dict(pod))
    spec = result.get("spec")
    if not isinstance(spec, dict):
        return result
    used = default_requests(spec, policy)
    if used:
        inject_accelerator(result, policy)
        if policy.tolerations:
            add_tolerations(spec, used)
    return result


def pod_patch(pod: Mapping[str, Any], policy: Policy) -> list[dict[str, Any]]:
    """RFC 6902 operations that turn ``pod`` into :func:`mutated_pod`; empty when nothing changes."""
    return list(jsonpatch.make_patch(pod, mutated_pod(pod, policy)))
