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

The apiserver stores a policy at once but enforces it a moment later (each is compiled on its own, the large ones
in seconds). So ``--apply`` then waits, at most ``--wait`` seconds (120 by default; 0: do not wait), until the
apiserver enforces what it applied: a server-side dry-run create per generated policy in ``--probe-namespace``
(``default``), of an object that policy must refuse (or warn about, for a warn policy), and for the
MutatingAdmissionPolicy a GPU pod it must change (``webhook.native.probes`` chooses them with the webhook's own
decision). Policies whose probes were all refused by something else first (RBAC, the apiserver's own validation,
a custom kind not served) or that no candidate object breaks under the policy are named on stderr as not probed,
and not waited for. Exit 2, with one line naming them, when some policy never took effect.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from webhook.core import gpupolicy
from webhook.core.policy import PolicySet
from webhook.core.policyfile import PolicyError, parse_policy
from webhook.kube.client import ApiError, ConfigError, Kube, NotServed
from webhook.native import params
from webhook.native.generate import LABELS, Generated, generate
from webhook.native.probes import Probe, probes
from webhook.native.probes import outcome as probe_outcome
from webhook.native.target import GROUP, MUTATING_VERSIONS, Target
from webhook.serving.policystatus import DiscoveryError
from webhook.serving.policystatus import discover as discover_target

EXIT_OK, EXIT_FAILED = 0, 2
FIELD_MANAGER = "gpu-webhook"
# The default policy took 43-55 s to be enforced on a loaded 2-core bed, over 60 s under heavier load.
WAIT_SECONDS = 120.0
PROBE_NAMESPACE = "default"
PROBE_INTERVAL = 0.5
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
    return [(version, str(item["metadata"]["name"])) for version, item in _labelled_items(kube, kind)]


def _labelled_items(kube: Kube, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """(version, object) of the labelled ``kind`` objects, by name."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for version in VERSIONS[kind]:
        try:
            listing = kube.get(_path(kind, version=version), {"labelSelector": SELECTOR})
        except NotServed:
            continue
        except ApiError as exc:
            raise ApplyError(f"cannot list {RESOURCES[kind]}: {_one_line(exc)}") from None
        for item in listing.get("items") or []:
            found.setdefault(str(item["metadata"]["name"]), (version, item))  # one object, whatever lists it
    return [found[name] for name in sorted(found)]


def _delete(kube: Kube, kind: str, name: str, version: str = "v1") -> None:
    try:
        kube.delete(_path(kind, name, version))
    except NotServed:
        pass  # already gone
    except ApiError as exc:
        raise ApplyError(f"cannot delete {kind}/{name}: {_one_line(exc)}") from None


def _ordered(objects: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Policies before their bindings: a binding whose paramRef names GPUPolicy/default is authorized against its
    stored policy's paramKind (without it, against every kind), and a policy without a binding does nothing."""
    order = list(RESOURCES)
    return sorted(objects, key=lambda o: order.index(o["kind"]) if o["kind"] in order else len(order))


def apply(kube: Kube, objects: Iterable[Mapping[str, Any]], pruning: bool = True) -> Outcome:
    """Apply ``objects`` and (``pruning``) delete the labelled objects not among them."""
    outcome = Outcome()
    objects = list(objects)
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
        outcome.applied.append(f"{kind}/{name}")
    if pruning:
        outcome.pruned = prune(kube, objects)
    return outcome


def prune(kube: Kube, objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """Delete the labelled objects that are not among ``objects``, bindings first."""
    wanted: dict[str, set[str]] = {kind: set() for kind in RESOURCES}
    for obj in objects:
        wanted.setdefault(str(obj["kind"]), set()).add(str(obj["metadata"]["name"]))
    pruned = []
    for kind in reversed(RESOURCES):
        for version, name in _labelled(kube, kind):
            if name not in wanted[kind]:
                _delete(kube, kind, name, version)
                pruned.append(f"{kind}/{name}")
    return pruned


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


def resolver(kube: Kube) -> Callable[[Any], tuple[str, str] | None]:
    """How the apiserver serves a custom kind: (apiVersion, kind) at the group's preferred version that serves the
    resource (any version unless the kind names one), or None."""
    groups: dict[str, dict[str, Any] | None] = {}

    def resolve(kind: Any) -> tuple[str, str] | None:
        if kind.group not in groups:
            try:
                groups[kind.group] = kube.get(f"/apis/{kind.group}")
            except ApiError:
                groups[kind.group] = None
        group = groups[kind.group]
        if not group:
            return None
        versions = [str(v.get("version")) for v in group.get("versions") or []]
        preferred = str((group.get("preferredVersion") or {}).get("version") or "")
        for version in sorted(versions, key=lambda v: v != preferred):
            if kind.version not in ("*", version):
                continue
            try:
                listing = kube.get(f"/apis/{kind.group}/{version}")
            except ApiError:
                continue
            for resource in listing.get("resources") or []:
                if resource.get("name") == kind.resource and "create" in (resource.get("verbs") or []):
                    return f"{kind.group}/{version}", str(resource.get("kind"))
        return None

    return resolve


@dataclass
class Enforcement:
    enforced: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)  # never took effect within the wait
    unprobed: dict[str, str] = field(default_factory=dict)  # policy: why it has no probe
    seconds: float = 0.0


def _live_policy(kube: Kube, generated: Generated, policies: PolicySet) -> tuple[PolicySet, dict[str, str]]:
    """The policy the probes are chosen by, and {policy: why it is not probed}. Live, the policies that read
    GPUPolicy/default act only while it exists (parameterNotFoundAction Allow), by the values it holds: they are
    probed by its spec, and not at all while it is missing."""
    if generated.policy_object is None:
        return policies, {}
    reading = [str(o["metadata"]["name"]) for o in generated.objects
               if o["kind"].endswith("AdmissionPolicy") and (o.get("spec") or {}).get("paramKind")]
    try:
        stored = kube.get(f"{gpupolicy.PATH}/{gpupolicy.NAME}")
    except ApiError as exc:
        if exc.status != 404:
            raise ApplyError(f"cannot read {gpupolicy.KIND}/{gpupolicy.NAME}: {_one_line(exc)}") from None
        why = f"{gpupolicy.KIND}/{gpupolicy.NAME} does not exist; the policies that read it act once it does"
        return policies, dict.fromkeys(reading, why)
    try:
        return parse_policy(json.dumps(stored), f"{gpupolicy.KIND}/{gpupolicy.NAME}"), {}
    except PolicyError as exc:
        why = f"{gpupolicy.KIND}/{gpupolicy.NAME} is not a valid policy: {_one_line(exc)}"
        return policies, dict.fromkeys(reading, why)


def wait_enforced(kube: Kube, generated: Generated, policies: PolicySet, namespace: str = PROBE_NAMESPACE,
                  timeout: float = WAIT_SECONDS, interval: float = PROBE_INTERVAL) -> Enforcement:
    """Dry-run each policy's probe until the apiserver enforces every policy, or ``timeout`` seconds pass."""
    start = time.monotonic()
    result = Enforcement()
    if policies.excludes(namespace):
        result.unprobed = {str(o["metadata"]["name"]): f"the probe namespace {namespace} is excluded"
                           for o in generated.objects if not str(o["kind"]).endswith("Binding")}
        return result
    probed, without = _live_policy(kube, generated, policies)
    chosen = Generated([o for o in generated.objects if str(o["metadata"]["name"]) not in without], generated.target)
    pending, result.unprobed = probes(chosen, probed, namespace, resolver(kube))
    result.unprobed.update(without)
    deadline = start + timeout
    while pending:
        waiting: list[Probe] = []
        for probe in pending:
            while True:
                try:
                    status, answer, warnings = kube.dry_run(probe.path, probe.obj)
                except ApiError as exc:
                    raise ApplyError(f"cannot probe {probe.policy}: {_one_line(exc)}") from None
                seen = probe_outcome(probe, status, answer, warnings)
                if seen == "enforced":
                    result.enforced.append(probe.policy)
                elif seen == "waiting":
                    waiting.append(probe)
                elif not probe.give_up(seen.removeprefix("inconclusive: ")):
                    result.unprobed[probe.policy] = "; ".join(probe.passed)
                else:
                    continue  # the next candidate, at once
                break
        pending = waiting
        if pending and time.monotonic() + interval > deadline:
            result.late = sorted(p.policy for p in pending)
            break
        if pending:
            time.sleep(interval)
    result.seconds = time.monotonic() - start
    return result


def delete_all(kube: Kube) -> list[str]:
    """Delete every object the generator labelled, bindings first."""
    deleted = []
    for kind in reversed(RESOURCES):
        for version, name in _labelled(kube, kind):
            _delete(kube, kind, name, version)
            deleted.append(f"{kind}/{name}")
    return deleted


def run(policies: PolicySet | None, kubeconfig: str | None, delete: bool = False, out: TextIO | None = None,
        err: TextIO | None = None, wait: float = WAIT_SECONDS, probe_namespace: str = PROBE_NAMESPACE) -> int:
    """``--apply`` (``policies`` given) or ``--delete``: lines on ``out``, one line on ``err`` and 2 on failure.
    ``--apply`` then waits up to ``wait`` seconds until the apiserver enforces the policies (0: not at all)."""
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
        applied = apply(kube, generated.objects, pruning=False)
        for name in applied.applied:
            print(f"applied {name}", file=out)
        report(generated, err)
        enforcement = wait_enforced(kube, generated, policies, probe_namespace, wait) if wait > 0 else None
        # What the new objects replace goes only once they act: a policy of the old set may still be all that
        # holds a rule, until its successor is enforced.
        if enforcement is None or not enforcement.late:
            for name in prune(kube, generated.objects):
                print(f"pruned {name}", file=out)
    except ApplyError as exc:
        print(f"gpu-webhook: admission-policies: {exc}", file=err)
        return EXIT_FAILED
    finally:
        kube.close()
    if enforcement is None:
        return EXIT_OK
    for name, why in sorted(enforcement.unprobed.items()):
        print(f"not probed: {name}: {why}", file=err)
    if enforcement.late:
        print(f"gpu-webhook: admission-policies: stored but not enforced after {wait:g} s: "
              f"{', '.join(enforcement.late)}", file=err)
        return EXIT_FAILED
    print(f"enforced: {len(enforcement.enforced)} policies acted on their probes after {enforcement.seconds:.1f} s",
          file=out)
    return EXIT_OK


# The newest minor on which the live policies were seen to crash kube-apiserver (docs/native-policies.md, "Known
# issue"): "fatal error: concurrent map read and map write" in CEL evaluation, open upstream.
CRASHES_ON_PARAMS = 30


def report(generated: Generated, err: TextIO) -> None:
    """On stderr: which engine carries which half on this target, and what stays with the webhook and why."""
    print(f"generated for {generated.target.describe()}", file=err)
    if generated.policy_object is not None:
        print(f"read live from {gpupolicy.KIND}/{gpupolicy.NAME} (kubectl edit {gpupolicy.SINGULAR} "
              f"{gpupolicy.NAME}); compiled in, so generate again after changing them: {', '.join(params.COMPILED)}",
              file=err)
        if generated.target.minor <= CRASHES_ON_PARAMS:
            print(f"warning: kube-apiserver 1.{generated.target.minor} has been seen to crash evaluating policies that "
                  "read params (kubernetes/kubernetes issue 135757); nativePolicies.params: inline avoids it", file=err)
    for rule, why in generated.webhook_only:
        print(f"left to the webhook: {rule}: {why}", file=err)
