"""``gpu-webhook admission-policies --apply`` and ``--delete``: the generated policies put into a cluster.

``--apply`` server-side applies every generated object (field manager ``gpu-webhook``, forced: this command
owns them), policies before their bindings, then prunes: every ValidatingAdmissionPolicy, MutatingAdmissionPolicy
or binding that carries the generator's labels (:data:`webhook.native.generate.LABELS`) and is no longer generated
is deleted, bindings before policies. ``--delete`` deletes every labelled object (the chart's ``pre-delete`` hook).

What is generated is chosen by discovery, as Kyverno and Gatekeeper choose: the apiserver's minor version and the
``admissionregistration.k8s.io`` versions and kinds it serves (``webhook.native.target.from_discovery``). A
MutatingAdmissionPolicy is applied at ``v1`` where served, else at ``v1beta1``, else not at all: mutation then stays
with the webhook, and stderr says so. A bad policy, missing credentials and an unreachable apiserver are one line
(exit 2). Nothing is pruned when an apply failed, so a half-applied set never loses the objects it still had.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from webhook.core import gpupolicy
from webhook.core.policy import PolicySet
from webhook.kube.client import ApiError, ConfigError, Kube, NotServed
from webhook.native import params
from webhook.native.generate import LABELS, Generated, generate
from webhook.native.target import GROUP, MUTATING_VERSIONS, Target
from webhook.serving.policystatus import DiscoveryError
from webhook.serving.policystatus import discover as discover_target

EXIT_OK, EXIT_FAILED = 0, 2
FIELD_MANAGER = "gpu-webhook"
GROUP_PATH = f"/apis/{GROUP}"
# The versions of the group a kind may be listed at, for the prune: v1 for all, v1beta1 for the mutating ones.
VERSIONS: dict[str, tuple[str, ...]] = {
    "ValidatingAdmissionPolicy": ("v1",),
    "MutatingAdmissionPolicy": MUTATING_VERSIONS,
    "ValidatingAdmissionPolicyBinding": ("v1",),
    "MutatingAdmissionPolicyBinding": MUTATING_VERSIONS,
}
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


def _path(kind: str, name: str | None = None, version: str = "v1") -> str:
    resource = RESOURCES.get(kind)
    if resource is None:
        raise ApplyError(f"the generator wrote a {kind}, which --apply does not know")
    return f"{GROUP_PATH}/{version}/{resource}" + (f"/{name}" if name else "")


def discover(kube: Kube) -> Target:
    """What the apiserver serves (``serving.policystatus.discover``, which the status writer also asks)."""
    try:
        return discover_target(kube)
    except DiscoveryError as exc:
        raise ApplyError(str(exc)) from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _labelled(kube: Kube, kind: str) -> list[tuple[str, str]]:
    """(version, name) of the ``kind`` objects that carry the generator's labels, at each version the kind may be
    served at; none where it is not served."""
    found: dict[str, str] = {}
    for version in VERSIONS[kind]:
        try:
            listing = kube.get(_path(kind, version=version), {"labelSelector": SELECTOR})
        except NotServed:
            continue
        except ApiError as exc:
            raise ApplyError(f"cannot list {RESOURCES[kind]}: {_one_line(exc)}") from None
        for item in listing.get("items") or []:
            found.setdefault(str(item["metadata"]["name"]), version)  # one object, whatever version lists it
    return sorted((version, name) for name, version in found.items())


def _delete(kube: Kube, kind: str, name: str, version: str = "v1") -> None:
    try:
        kube.delete(_path(kind, name, version))
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
        version = str(obj["apiVersion"]).rpartition("/")[2]
        path = _path(kind, name, version)
        try:
            kube.apply(path, obj, FIELD_MANAGER)
        except NotServed:
            raise ApplyError(f"the apiserver does not serve {RESOURCES[kind]} ({GROUP}/{version}), though discovery "
                             "said it does") from None
        except ApiError as exc:
            raise ApplyError(f"cannot apply {kind}/{name}: {_one_line(exc)}") from None
        wanted[kind].add(name)
        outcome.applied.append(f"{kind}/{name}")
    for kind in reversed(RESOURCES):
        for version, name in _labelled(kube, kind):
            if name not in wanted[kind]:
                _delete(kube, kind, name, version)
                outcome.pruned.append(f"{kind}/{name}")
    return outcome


def ensure_policy_object(kube: Kube, obj: Mapping[str, Any]) -> bool:
    """The policies generated live read GPUPolicy/default: its kind must be served, and the object is created from
    the policy when missing (True); an existing one is never changed, its spec being the platform team's."""
    try:
        kube.get(f"/apis/{gpupolicy.API_VERSION}")
    except NotServed:
        raise ApplyError(f"{gpupolicy.KIND} ({gpupolicy.API_VERSION}) is not served, and the policies generated with "
                         f"nativePolicies.params live read it: install its CustomResourceDefinition first "
                         f"(gpu-webhook admission-policies --crd | kubectl apply -f -), or set "
                         f"nativePolicies.params: inline") from None
    except ApiError as exc:
        raise ApplyError(f"cannot ask for {gpupolicy.API_VERSION}: {_one_line(exc)}") from None
    try:
        kube.get(f"{gpupolicy.PATH}/{gpupolicy.NAME}")
        return False
    except NotServed:
        pass
    except ApiError as exc:
        raise ApplyError(f"cannot read {gpupolicy.KIND}/{gpupolicy.NAME}: {_one_line(exc)}") from None
    try:
        kube.create(gpupolicy.PATH, obj)
    except ApiError as exc:
        if exc.status == 409:  # created meanwhile: it is someone's now
            return False
        raise ApplyError(f"cannot create {gpupolicy.KIND}/{gpupolicy.NAME}: {_one_line(exc)}") from None
    return True


def delete_all(kube: Kube) -> list[str]:
    """Delete every object the generator labelled, bindings first."""
    deleted = []
    for kind in reversed(RESOURCES):
        for version, name in _labelled(kube, kind):
            _delete(kube, kind, name, version)
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
        generated = generate(policies, discover(kube))
        if generated.policy_object is not None:
            seeded = ensure_policy_object(kube, generated.policy_object)
            print(f"created {gpupolicy.KIND}/{gpupolicy.NAME}" if seeded else
                  f"{gpupolicy.KIND}/{gpupolicy.NAME} exists: --apply leaves its spec to you "
                  f"(kubectl edit {gpupolicy.SINGULAR} {gpupolicy.NAME})", file=out)
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
    report(generated, err)
    return EXIT_OK


def report(generated: Generated, err: TextIO) -> None:
    """On stderr: which engine carries which half on this target, and what stays with the webhook and why."""
    print(f"generated for {generated.target.describe()}", file=err)
    if generated.policy_object is not None:
        print(f"read live from {gpupolicy.KIND}/{gpupolicy.NAME} (kubectl edit {gpupolicy.SINGULAR} "
              f"{gpupolicy.NAME}); compiled in, so generate again after changing them: {', '.join(params.COMPILED)}",
              file=err)
    for rule, why in generated.webhook_only:
        print(f"left to the webhook: {rule}: {why}", file=err)
