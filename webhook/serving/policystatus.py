"""GPUPolicy/NAME's status, written by one replica: ``python -m webhook.serving.policystatus SETTINGS``.

The gunicorn master starts this process beside its workers (as it starts the audit's) when it serves with
``--policy-object``, restarts it when it exits, and stops it before them. A process, not a thread of a worker:
the workers' event loops decide admissions and a status write would share their GIL; the master forks workers,
which a thread in it would not survive safely. It dies with the pod: it stops when the master that started it
is gone. Across replicas a coordination.k8s.io Lease (``webhook.kube.lease``, ``--status-lease``) elects the one
that writes; the others watch and wait to take over.

It runs the workers' own machinery on the object (``serving.policyobject``: the same list+watch, the same check
of each spec, the same fallback), so it reaches what each worker reaches, and writes, with a JSON merge patch of
the status subresource, only when what it would write differs from the object's status, at most once per
``interval`` seconds:

- ``conditions``: ``Accepted`` (``True``; ``False`` with the problems of the spec refused, the last good policy
  still in force), in the shape of a metav1.Condition; conditions of other types are kept as they are.
- ``status.webhook.observedGeneration``: the generation whose spec the webhook enforces (0: the fallback).
- ``status.native.observedGeneration``: when the generated ValidatingAdmissionPolicyBindings exist, the generation the
  native policies enforce: ``metadata.generation`` when they read the object live (a ``paramRef``), else the
  generation they were generated from (annotation ``gpu-webhook.io/policy-generation``); absent otherwise.
- ``rules``: which engine carries which rule on this cluster (discovered as ``admission-policies --apply``
  discovers it), from the policy in force: ``native`` (rule ids) and ``webhook`` (name and why).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from webhook.core import gpupolicy
from webhook.core.policy import PolicyError, PolicySet, build_policy
from webhook.kube.client import ApiError, ConfigError, Kube, NotServed
from webhook.kube.informer import Informer, KubeSource
from webhook.kube.lease import Lease
from webhook.native.generate import LABELS, left_to_webhook
from webhook.native.rules import native_rules
from webhook.native.target import GROUP, MUTATING_VERSIONS, Target, TargetError, from_discovery, parse_minor
from webhook.serving import policies
from webhook.serving.policyobject import RESOURCE, PolicyObject, Snapshot, StatusSettings, field_selector
from webhook.telemetry import logs, metrics

MERGE_PATCH = "application/merge-patch+json"
# The generated policies' own annotation: the policy generation they were generated from (inline mode).
POLICY_GENERATION_ANNOTATION = "gpu-webhook.io/policy-generation"
COMPONENT_SELECTOR = f"app.kubernetes.io/component={LABELS['app.kubernetes.io/component']}"
BINDINGS_PATH = f"/apis/{GROUP}/v1/validatingadmissionpolicybindings"
MAX_MESSAGE = 32768  # metav1.Condition's message limit
NATIVE_EVERY = 30.0  # the bindings are listed at most this often, and when the generation changes
DISCOVER_EVERY = 600.0


# -- what the status says (pure) ------------------------------------------------------------------------


def meta_time(t: float) -> str:
    """A metav1.Time: RFC 3339, seconds."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: str, reason: str, message: str, generation: int, now: float,
              previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A metav1.Condition; its lastTransitionTime is the previous one's while ``status`` stays what it was."""
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == status else None
    return {"type": type_, "status": status, "reason": reason, "message": message[:MAX_MESSAGE],
            "lastTransitionTime": since or meta_time(now), "observedGeneration": generation}


def rules_status(policy: PolicySet, target: Target) -> dict[str, Any]:
    """Which engine carries which rule on ``target`` under ``policy``: the webhook's view, as
    ``admission-policies`` reports it."""
    left = left_to_webhook(policy, target)
    names = {name for name, _ in left}
    return {
        "target": target.describe(),
        "native": [rule.id for rule in native_rules() if rule.id not in names],
        "webhook": [{"name": name, "reason": why} for name, why in left],
    }


def native_generation(bindings: Sequence[Mapping[str, Any]], generation: int) -> int | None:
    """The generation the generated policies enforce, from their bindings; None when there are none."""
    if not bindings:
        return None
    if any((b.get("spec") or {}).get("paramRef") for b in bindings):
        return generation  # they read the object live
    found = []
    for binding in bindings:
        value = ((binding.get("metadata") or {}).get("annotations") or {}).get(POLICY_GENERATION_ANNOTATION)
        if isinstance(value, str) and value.isdigit():
            found.append(int(value))
    return min(found) if found else None


def desired_status(current: Mapping[str, Any], snap: Snapshot, rules: Mapping[str, Any] | None,
                   native: int | None, now: float) -> dict[str, Any]:
    """The status to write over ``current``: the keys this writer owns, other conditions kept."""
    previous = list(current.get("conditions") or [])
    if snap.problems:
        serving = f"generation {snap.enforced}" if snap.enforced else "its fallback policy"
        accepted = condition(
            "Accepted", "False", "Invalid",
            f"refused: {'; '.join(snap.problems)}; the webhook keeps enforcing {serving}", snap.generation, now,
            previous,
        )
    else:
        accepted = condition("Accepted", "True", "Valid", f"the webhook enforces generation {snap.enforced}",
                             snap.generation, now, previous)
    return {
        "conditions": [accepted, *(c for c in previous if c.get("type") != "Accepted")],
        "webhook": {"observedGeneration": snap.enforced},
        "native": {"observedGeneration": native} if native is not None else None,
        "rules": dict(rules) if rules is not None else None,
    }


def _pruned(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def changed(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether writing ``desired`` would change ``current`` (a None in ``desired`` removes that key)."""
    return any(_pruned(value) != _pruned(current.get(key)) for key, value in desired.items())


# -- what the cluster serves ---------------------------------------------------------------------------


class DiscoveryError(Exception):
    """One line: the apiserver's version or admission APIs could not be read."""


def discover(kube: Kube) -> Target:
    """What the apiserver serves: its minor version (``/version``) and the kinds of each version of the
    admission-registration group (a version it does not serve is skipped, never an error)."""
    try:
        version = kube.get("/version")
        minor = parse_minor(f"1.{str(version.get('minor', '')).rstrip('+')}")
    except (ApiError, TargetError) as exc:
        raise DiscoveryError(f"cannot read the apiserver's version: {_one_line(exc)}") from None
    served: dict[str, set[str]] = {}
    for group_version in ("v1", *MUTATING_VERSIONS[1:]):
        try:
            listing = kube.get(f"/apis/{GROUP}/{group_version}")
        except NotServed:
            continue
        except ApiError as exc:
            raise DiscoveryError(f"cannot discover {GROUP}/{group_version}: {_one_line(exc)}") from None
        served[group_version] = {str(r.get("kind")) for r in listing.get("resources") or [] if "/" not in r["name"]}
    return from_discovery(minor, served)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


# -- the writer ----------------------------------------------------------------------------------------


class StatusWriter:
    """Holds the Lease and writes the status when it changes; ``step`` is one turn, tested with fakes."""

    def __init__(self, kube: Kube, settings: StatusSettings, obj: PolicyObject, lease: Lease,
                 clock: Callable[[], float] = time.time):
        self.kube = kube
        self.settings = settings
        self.obj = obj
        self.lease = lease
        self.clock = clock
        self.holding = False
        self.renewed = 0.0
        self.last_write = float("-inf")
        self.target: Target | None = None
        self.discovered = float("-inf")
        self._native: tuple[int, float, int | None] | None = None  # generation, when, value
        self._rules_for: tuple[PolicySet, Target, dict[str, Any]] | None = None
        self.wake = threading.Event()
        self.stop = threading.Event()

    @property
    def path(self) -> str:
        return f"{gpupolicy.PATH}/{self.settings.name}/status"

    def _renew_every(self) -> float:
        return max(1.0, self.settings.lease_seconds / 3)

    def step(self, now: float) -> float:
        """One turn: hold the Lease, write when needed; the seconds until the next turn is due."""
        if not self.holding:
            if not self.lease.acquire(now):
                return self._renew_every()
            self.holding, self.renewed = True, now
            logs.event("policy_status_lease_acquired", lease=f"{self.lease.namespace}/{self.lease.name}",
                       identity=self.lease.identity)
        elif now - self.renewed >= self._renew_every():
            if not self.lease.renew(now):
                self.holding = False
                logs.event("policy_status_lease_lost", logging.WARNING, identity=self.lease.identity)
                return 1.0
            self.renewed = now
        until_renew = max(0.1, self.renewed + self._renew_every() - now)
        snap = self.obj.snapshot()
        if not (snap.listed and snap.present and snap.obj is not None):
            return until_renew
        current = snap.obj.get("status") or {}
        desired = desired_status(current, snap, self._rules(now), self._native_generation(snap.generation, now), now)
        if not changed(current, desired):
            return until_renew
        if now - self.last_write < self.settings.interval:
            return min(until_renew, self.settings.interval - (now - self.last_write))
        self.last_write = now
        version = (snap.obj.get("metadata") or {}).get("resourceVersion")
        try:
            self.kube.request("PATCH", self.path, None,
                              {"metadata": {"resourceVersion": version}, "status": desired}, MERGE_PATCH)
        except ApiError as exc:
            metrics.safely(lambda: metrics.POLICY_STATUS_WRITES.labels(result="failure").inc())
            if exc.status in (404, 409):  # gone, or changed since we read it: the watch brings the news
                return min(until_renew, self.settings.interval)
            raise
        metrics.safely(lambda: metrics.POLICY_STATUS_WRITES.labels(result="success").inc())
        logs.event("policy_status_written", name=self.settings.name, generation=snap.generation,
                   accepted=not snap.problems, enforced=snap.enforced)
        return min(until_renew, self.settings.interval)

    def _rules(self, now: float) -> dict[str, Any] | None:
        if self.target is None and now - self.discovered >= DISCOVER_EVERY:
            self.discovered = now
            try:
                self.target = discover(self.kube)
            except (DiscoveryError, TargetError, ApiError) as exc:
                logs.event("policy_status_discovery_failed", logging.WARNING, error=str(exc)[:300])
        if self.target is None:
            return None
        policy = self.obj.value
        if self._rules_for is None or self._rules_for[0] is not policy or self._rules_for[1] != self.target:
            self._rules_for = (policy, self.target, rules_status(policy, self.target))
        return self._rules_for[2]

    def _native_generation(self, generation: int, now: float) -> int | None:
        cached = self._native
        if cached is not None and cached[0] == generation and now - cached[1] < NATIVE_EVERY:
            return cached[2]
        try:
            listing = self.kube.get(BINDINGS_PATH, {"labelSelector": COMPONENT_SELECTOR})
            value = native_generation(listing.get("items") or [], generation)
        except NotServed:
            value = None
        except ApiError as exc:
            logs.event("policy_status_bindings_failed", logging.WARNING, error=str(exc)[:300])
            value = cached[2] if cached is not None else None
        self._native = (generation, now, value)
        return value

    def run(self, parent: int | None = None) -> None:
        backoff = 1.0
        while not self.stop.is_set():
            if parent is not None and os.getppid() != parent:
                break  # the server that started us is gone
            self.wake.clear()
            try:
                delay = self.step(self.clock())
                backoff = 1.0
            except ApiError as exc:
                logs.event("policy_status_failed", logging.WARNING, error=str(exc)[:300], retry_in=backoff)
                delay, backoff = backoff, min(backoff * 2, 30.0)
            self.wake.wait(min(delay, 2.0))
        if self.holding:
            try:
                self.lease.release(self.clock(), finished=False)
            except ApiError:
                pass
            self.holding = False


def _fallback(policy_file: str | None) -> PolicySet:
    try:
        return policies.load(policy_file)
    except PolicyError as exc:
        logs.event("policy_status_fallback_invalid", logging.ERROR, error=str(exc)[:500])
        return build_policy(None, "default policy", schema_checked=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logs.configure()
    settings = StatusSettings.from_json(argv[0])
    parent = os.getppid()
    try:
        kube = Kube.connect(settings.kubeconfig)
    except ConfigError as exc:
        logs.event("policy_status_unavailable", logging.ERROR, error=str(exc))
        return 2
    fallback = _fallback(settings.policy_file)
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    lease = Lease(kube, settings.lease_namespace, settings.lease_name, identity, settings.lease_seconds)
    wake = threading.Event()
    obj = PolicyObject(settings.name, lambda: fallback, publish=False, on_change=wake.set)
    writer = StatusWriter(kube, settings, obj, lease)
    writer.wake = wake
    source = KubeSource(settings.kubeconfig, kube=kube, field_selector=field_selector(settings.name))
    informer = Informer(RESOURCE, source, obj, max_backoff=10.0)
    informer.start()

    def stop(*_: Any) -> None:
        writer.stop.set()
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    logs.event("policy_status_started", identity=identity, name=settings.name,
               lease=f"{settings.lease_namespace}/{settings.lease_name}")
    try:
        writer.run(parent)
    except Exception:
        logs.event("policy_status_crashed", logging.ERROR, exc_info=True)
        return 1
    informer.stop()
    logs.event("policy_status_stopped", identity=identity)
    return 0


if __name__ == "__main__":
    sys.exit(main())
