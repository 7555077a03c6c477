"""``gpu-webhook admission-policies --apply`` and ``--delete``: the generated policies put into a cluster.

``--apply`` server-side applies every generated object (field manager ``gpu-webhook``, forced: this command
owns them), policies before their bindings, then prunes: every ValidatingAdmissionPolicy, MutatingAdmissionPolicy
or binding that carries the generator's labels (:data:`webhook.native.generate.LABELS`) and is no longer generated
is deleted, bindings before policies. ``--delete`` deletes every labelled object (the chart's ``pre-delete`` hook).

A kind the apiserver does not serve (MutatingAdmissionPolicy before Kubernetes 1.36, or turned off) is named in
one line; so are a bad policy, missing credentials and an unreachable apiserver (exit 2). Nothing is pruned when an
apply failed, so a half-applied set never loses the objects it still had.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from webhook.core.policy import PolicySet
from webhook.kube.client import ApiError, ConfigError, Kube, NotServed
from webhook.native.generate import LABELS, generate

EXIT_OK, EXIT_FAILED = 0, 2
FIELD_MANAGER = "gpu-webhook"
GROUP_PATH = "/apis/admissionregistration.k8s.io/v1"
# Policies first (a binding names its policy), bindings first when deleting.
RESOURCES: dict[str, str] = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
}
SELECTOR = ",".join(f"{key}={value}" for key, value in sorted(LABELS.items()))


class ApplyError(Exception):
    """One line for the user: what could not be applied, listed or deleted, and why."""


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)


def _path(kind: str, name: str | None = None) -> str:
    resource = RESOURCES.get(kind)
    if resource is None:
        raise ApplyError(f"the generator wrote a {kind}, which --apply does not know")
    return f"{GROUP_PATH}/{resource}" + (f"/{name}" if name else "")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _labelled(kube: Kube, kind: str) -> list[str]:
    """Names of the ``kind`` objects that carry the generator's labels; none when the kind is not served."""
    try:
        listing = kube.get(_path(kind), {"labelSelector": SELECTOR})
    except NotServed:
        return []
    except ApiError as exc:
        raise ApplyError(f"cannot list {RESOURCES[kind]}: {_one_line(exc)}") from None
    return sorted(str(item["metadata"]["name"]) for item in listing.get("items") or [])


def _delete(kube: Kube, kind: str, name: str) -> None:
    try:
        kube.delete(_path(kind, name))
    except NotServed:
        pass  # already gone
    except ApiError as exc:
        raise ApplyError(f"cannot delete {kind}/{name}: {_one_line(exc)}") from None


def _ordered(objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    order = list(RESOURCES)
    return sorted(objects, key=lambda o: order.index(o["kind"]) if o["kind"] in order else len(order))


def apply(kube: Kube, objects: Iterable[Mapping[str, Any]]) -> Outcome:
    """Apply ``objects`` and prune the labelled objects not among them."""
    outcome = Outcome()
    wanted: dict[str, set[str]] = {kind: set() for kind in RESOURCES}
    for obj in _ordered(objects):
        kind, name = str(obj["kind"]), str(obj["metadata"]["name"])
        path = _path(kind, name)
        try:
            kube.apply(path, obj, FIELD_MANAGER)
        except NotServed:
            raise ApplyError(f"the apiserver does not serve {RESOURCES[kind]} (admissionregistration.k8s.io/v1; "
                             "MutatingAdmissionPolicy needs Kubernetes 1.36 or later)") from None
        except ApiError as exc:
            raise ApplyError(f"cannot apply {kind}/{name}: {_one_line(exc)}") from None
        wanted[kind].add(name)
        outcome.applied.append(f"{kind}/{name}")
    for kind in reversed(RESOURCES):
        for name in _labelled(kube, kind):
            if name not in wanted[kind]:
                _delete(kube, kind, name)
                outcome.pruned.append(f"{kind}/{name}")
    return outcome


def delete_all(kube: Kube) -> list[str]:
    """Delete every object the generator labelled, bindings first."""
    deleted = []
    for kind in reversed(RESOURCES):
        for name in _labelled(kube, kind):
            _delete(kube, kind, name)
            deleted.append(f"{kind}/{name}")
    return deleted


def run(policies: PolicySet | None, kubeconfig: str | None, delete: bool = False, out: TextIO | None = None,
        err: TextIO | None = None) -> int:
    """``--apply`` (``policies`` given) or ``--delete``: lines on ``out``, one line on ``err`` and 2 on failure."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        kube = Kube.connect(kubeconfig, timeout=30.0)
    except ConfigError as exc:
        print(f"gpu-webhook: admission-policies: {_one_line(exc)}", file=err)
        return EXIT_FAILED
    try:
        if delete:
            for name in delete_all(kube):
                print(f"deleted {name}", file=out)
            return EXIT_OK
        assert policies is not None
        generated = generate(policies)
        outcome = apply(kube, generated.objects)
    except ApplyError as exc:
        print(f"gpu-webhook: admission-policies: {exc}", file=err)
        return EXIT_FAILED
    finally:
        kube.close()
    for name in outcome.applied:
        print(f"applied {name}", file=out)
    for name in outcome.pruned:
        print(f"pruned {name}", file=out)
    for rule, why in generated.webhook_only:
        print(f"left to the webhook: {rule}: {why}", file=err)
    return EXIT_OK
