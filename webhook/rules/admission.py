"""Admission decisions: an AdmissionReview ``request`` and the policies in, a Response out.

These are the handlers the HTTP layer dispatches to and the functions ``check`` reuses;
they do no I/O, so every rule is testable with plain dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from webhook.core import review
from webhook.core.clusterview import ClusterView
from webhook.core.field import Violation
from webhook.core.podspecs import as_mapping, group_of
from webhook.core.policy import PolicySet
from webhook.core.review import Response
from webhook.rules.mutate import pod_patch
from webhook.rules.pods import violations

# (AdmissionReview request, policies in force, cluster view when cluster checks are on) -> Response
Handler = Callable[[Mapping[str, Any], PolicySet, ClusterView | None], Response]

CHECKED_OPERATIONS = ("CREATE", "UPDATE")


def _kind(request: Mapping[str, Any], obj: Mapping[str, Any]) -> tuple[str, str]:
    kind = request.get("kind")
    if isinstance(kind, Mapping) and isinstance(kind.get("kind"), str):
        return str(kind.get("group") or ""), kind["kind"]
    return group_of(obj.get("apiVersion")), str(obj.get("kind") or "")


def _namespace(request: Mapping[str, Any], obj: Mapping[str, Any]) -> str:
    namespace = request.get("namespace")
    if isinstance(namespace, str) and namespace:
        return namespace
    value = as_mapping(obj.get("metadata")).get("namespace")
    return value if isinstance(value, str) else ""


def object_name(request: Mapping[str, Any], obj: Mapping[str, Any]) -> str:
    """The name users know the object by; pods from a generateName have none yet."""
    metadata = as_mapping(obj.get("metadata"))
    for candidate in (request.get("name"), metadata.get("name")):
        if isinstance(candidate, str) and candidate:
            return candidate
    generate = metadata.get("generateName")
    return f"{generate}*" if isinstance(generate, str) and generate else "(unnamed)"


def describe(found: list[Violation]) -> str:
    """One message naming every violation by path, as the apiserver shows it to the user."""
    count = f"{len(found)} GPU violation{'s' if len(found) != 1 else ''}"
    return f"{count}: " + "; ".join(map(str, found))


# What a tenant rule's softened denial says, after its own words.
NOT_TENANT = "warn: not a tenant namespace (isolation.tenantNamespaces), and the pod asks for no GPU"


def judge(v: Violation, action: str, tenant: bool) -> tuple[Violation, str]:
    """A violation and its action: a tenant rule's denial of a pod that asks for no GPU, outside a tenant namespace,
    is a warning that says why (docs/isolation.md, "Who the rules are for")."""
    if action == "deny" and v.no_gpu and not tenant:
        return replace(v, message=f"{v.message}; {NOT_TENANT}"), "warn"
    return v, action


def decide(
    obj: Mapping[str, Any],
    group: str,
    kind: str,
    namespace: str,
    policies: PolicySet,
    view: ClusterView | None = None,
    old: Mapping[str, Any] | None = None,
) -> Response:
    """The validation decision for one object, shared by ``/validate`` and ``gpu-webhook check``.

    ``old`` is the object before an UPDATE; a violation it already had, about the same value at the same
    place (list items by name), is not held against the update. ``view`` is the cluster as the cluster-aware
    checks see it (nodes, DRA devices and classes, claims, RuntimeClasses), None when they are off.
    """
    policy = policies.for_namespace(namespace)
    tenant = policies.is_tenant(namespace)
    judged = [judge(v, policy.action(v.rule), tenant) for v in violations(obj, group, kind, policy, view, namespace)]
    judged = [(v, action) for v, action in judged if action != "off"]
    if old is not None:
        # An update is judged on what it changes: a pod admitted under an older policy must still
        # accept a label or a finalizer, or controllers stall on objects they did not write. What it
        # changes is held to the policy in force, so a violation made different (3 GPUs over the cap
        # made 64, one disallowed accelerator swapped for another) is no longer excused, while one that
        # only moved (a container inserted before it) still is.
        before = {v.subject for v in violations(old, group, kind, policy, view, namespace)}
        judged = [(v, action) for v, action in judged if v.subject not in before]
    if not judged:
        return review.allowed()
    found = tuple(v for v, _ in judged)
    actions = tuple(action for _, action in judged)
    denials = [v for v, action in judged if action == "deny"]
    warnings = [str(v) for v, action in judged if action == "warn"]
    if not denials:
        return review.allowed(warnings=warnings, violations=found, actions=actions)
    return review.denied(describe(denials), warnings=warnings, violations=found, actions=actions)


def validate(request: Mapping[str, Any], policies: PolicySet, view: ClusterView | None = None) -> Response:
    if request.get("operation") not in CHECKED_OPERATIONS:
        return review.allowed()
    obj = request.get("object")
    if not isinstance(obj, Mapping):
        return review.denied("request.object must be an object on CREATE and UPDATE")
    group, kind = _kind(request, obj)
    old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
    return decide(
        obj, group, kind, _namespace(request, obj), policies, view, old if isinstance(old, Mapping) else None
    )


def mutate(request: Mapping[str, Any], policies: PolicySet, view: ClusterView | None = None) -> Response:
    """Patches new Pods only; never denies, since invalid objects are ``/validate``'s to refuse."""
    obj = request.get("object")
    if request.get("operation") != "CREATE" or not isinstance(obj, Mapping):
        return review.allowed()
    if _kind(request, obj) != ("", "Pod"):
        return review.allowed()
    namespace = _namespace(request, obj)
    ops = pod_patch(obj, policies.for_namespace(namespace), view, namespace)
    return review.patched(ops) if ops else review.allowed()


def allow_all(request: Mapping[str, Any], policies: PolicySet, view: ClusterView | None = None) -> Response:
    """The no-op floor the benchmark measures beside the real handlers."""
    return review.allowed()
