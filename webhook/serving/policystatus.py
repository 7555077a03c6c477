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
- ``NativePolicies``: whether the generated admission policies enforce this object as it is: ``True``, reason
  ``Live``, when their bindings read it through ``params`` and the digest of its compiled keys
  (``params.compiled_digest`` of the policy in force) equals their annotation ``gpu-webhook.io/compiled-keys``;
  ``False`` with reason ``CompiledKeysChanged`` when it differs (the policies must be generated again), ``Inline``
  when they hold values written in when they were generated, ``NotInstalled`` when there are none. The gauge
  ``gpu_webhook_native_policies_stale`` is 1 while the reason is ``CompiledKeysChanged``, and
  ``gpu_webhook_native_policy_generation`` is ``status.native.observedGeneration`` (both 0 in the replicas that do
  not hold the Lease).
- ``rules``: which engine carries which rule on this cluster (discovered as ``admission-policies --apply``
  discovers it), from the policy in force: ``native`` (rule ids) and ``webhook`` (name and why).
- ``cluster``: while the policy's ``cluster.enabled`` is on, the cluster's facts (``core.clustersummary``: the
  accelerator models, extended resources, RuntimeClasses and DeviceClasses with their devices), made from the
  cluster view's informers, which the holder of the Lease alone runs (``serving.clusterfacts``); written, with
  ``writtenAt`` and ``writer`` (the Lease holder), only when a fact differs from what the object holds (the
  stamps are not compared), at most once per ``cluster_interval`` seconds (2; longer after a costly make), as a
  merge patch that removes the keys gone (a model no node has any more). Removed when ``cluster.enabled`` is turned off.
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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from webhook.core import clustersummary, gpupolicy
from webhook.core.policy import PolicySet
from webhook.core.policyfile import PolicyError, build_policy
from webhook.kube.client import ApiError, ConfigError, Kube, NotServed
from webhook.kube.informer import Informer, KubeSource
from webhook.kube.lease import Lease
from webhook.native import params
from webhook.native.generate import COMPILED_ANNOTATION, LABELS, left_to_webhook
from webhook.native.rules import native_rules
from webhook.native.target import GROUP, MUTATING_VERSIONS, Target, TargetError, from_discovery, parse_minor
from webhook.serving import policies
from webhook.serving.clusterfacts import ClusterFacts, merge_patch
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
_KEEP: Any = object()  # status.cluster as it is


# -- what the status says (pure) ------------------------------------------------------------------------


def meta_time(t: float) -> str:
    """A metav1.Time: RFC 3339, seconds."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def written_at(summary: Any) -> float:
    """``writtenAt`` of a written ``status.cluster`` as seconds since the epoch; -inf when absent or unreadable."""
    text = summary.get("writtenAt") if isinstance(summary, Mapping) else None
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return float("-inf")


def facts_condition(summary: Any, enabled: bool, generation: int, now: float,
                    previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``ClusterFacts``: whether the generated policies act on ``status.cluster`` now (it is at most
    ``clustersummary.FRESH_FOR`` seconds old)."""
    fresh, beat = clustersummary.FRESH_FOR, clustersummary.HEARTBEAT
    if not enabled:
        return condition("ClusterFacts", "False", "Disabled", "cluster.enabled is off: no facts are written",
                         generation, now, previous)
    at = written_at(summary)
    if at == float("-inf"):
        return condition("ClusterFacts", "False", "Missing",
                         "status.cluster is not written yet: the native cluster rules refuse nothing",
                         generation, now, previous)
    if now - at > fresh:
        return condition("ClusterFacts", "False", "Stale",
                         f"status.cluster was written at {meta_time(at)}, over {fresh} s ago: the native cluster "
                         "rules refuse nothing until it is written again", generation, now, previous)
    return condition("ClusterFacts", "True", "Current",
                     f"status.cluster is stamped at least every {beat} s; the native cluster rules act on it while "
                     f"it is at most {fresh} s old", generation, now, previous)


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


# The NativePolicies condition's reasons.
LIVE, INLINE, COMPILED_KEYS_CHANGED, NOT_INSTALLED = "Live", "Inline", "CompiledKeysChanged", "NotInstalled"
REGENERATE = "run helm upgrade, or gpu-webhook admission-policies --apply"


@dataclass(frozen=True)
class NativeState:
    """What the generated admission policies enforce, from their bindings: the NativePolicies condition and
    ``status.native.observedGeneration`` (None: absent)."""

    reason: str
    message: str
    observed: int | None

    @property
    def status(self) -> str:
        return "True" if self.reason == LIVE else "False"

    @property
    def stale(self) -> bool:
        return self.reason == COMPILED_KEYS_CHANGED


def _annotation(obj: Mapping[str, Any], name: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(name)
    return value if isinstance(value, str) else None


def compiled_keys() -> str:
    """The compiled keys, for a message."""
    return ", ".join(params.COMPILED)


def native_state(bindings: Sequence[Mapping[str, Any]], generation: int, policy: PolicySet) -> NativeState:
    """The state of the generated policies whose ``bindings`` are these, for the object at ``generation`` whose
    policy in force is ``policy``."""
    if not bindings:
        return NativeState(NOT_INSTALLED, "no generated ValidatingAdmissionPolicyBindings "
                           f"({COMPONENT_SELECTOR}): the webhook alone enforces this policy", None)
    if not any((b.get("spec") or {}).get("paramRef") for b in bindings):
        found = [int(v) for b in bindings if (v := _annotation(b, POLICY_GENERATION_ANNOTATION)) and v.isdigit()]
        since = f"generation {min(found)}" if found else "the values of the last helm upgrade or --apply"
        return NativeState(INLINE, f"the native policies hold the values written into them from {since} "
                           "(nativePolicies.params: inline): an edit of this object reaches the webhook only until "
                           f"they are generated again ({REGENERATE})", min(found) if found else None)
    digests = {d for b in bindings if (d := _annotation(b, COMPILED_ANNOTATION))}
    wanted = params.compiled_digest(policy.document)
    if digests and digests != {wanted}:
        return NativeState(COMPILED_KEYS_CHANGED, "the native policies read this object live, but the keys compiled "
                           f"into them changed since they were generated ({compiled_keys()}): they still hold the "
                           f"old values of those keys; {REGENERATE}", generation)
    checked = "" if digests else " (their compiled keys are not recorded: not checked)"
    return NativeState(LIVE, f"the native policies read generation {generation} live{checked}", generation)


def desired_status(current: Mapping[str, Any], snap: Snapshot, rules: Mapping[str, Any] | None,
                   native: NativeState | None, now: float) -> dict[str, Any]:
    """The status to write over ``current``: the keys this writer owns, other conditions kept. ``native`` None: the
    bindings could not be read, and what the status says of them stays as it is."""
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
    mine = [accepted]
    if native is not None:
        mine.append(condition("NativePolicies", native.status, native.reason, native.message, snap.generation, now,
                              previous))
    types = {c["type"] for c in mine}
    out: dict[str, Any] = {
        "conditions": [*mine, *(c for c in previous if c.get("type") not in types)],
        "webhook": {"observedGeneration": snap.enforced},
        "rules": dict(rules) if rules is not None else None,
    }
    if native is not None:
        out["native"] = {"observedGeneration": native.observed} if native.observed is not None else None
    return out


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
                 clock: Callable[[], float] = time.time, facts: ClusterFacts | None = None):
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
        self._native: tuple[int, PolicySet, float, NativeState | None] | None = None  # generation, policy, when, value
        self._rules_for: tuple[PolicySet, Target, dict[str, Any]] | None = None
        self.facts = facts
        self.cluster_written = float("-inf")
        self.wake = threading.Event()
        self.stop = threading.Event()

    @property
    def path(self) -> str:
        return f"{gpupolicy.PATH}/{self.settings.name}/status"

    def _renew_every(self) -> float:
        return max(1.0, self.settings.lease_seconds / 3)

    def step(self, now: float) -> float:
        """One turn: hold the Lease, write when needed; the seconds until the next turn is due."""
        self._record_age(now)
        if not self.holding:
            if not self.lease.acquire(now):
                return self._renew_every()
            self.holding, self.renewed = True, now
            logs.event("policy_status_lease_acquired", lease=f"{self.lease.namespace}/{self.lease.name}",
                       identity=self.lease.identity)
        elif now - self.renewed >= self._renew_every():
            if not self.lease.renew(now):
                self.holding = False
                self._set_native(None)  # the new holder says
                if self.facts is not None:
                    self.facts.follow(None)  # and watches the cluster
                logs.event("policy_status_lease_lost", logging.WARNING, identity=self.lease.identity)
                return 1.0
            self.renewed = now
        until_renew = max(0.1, self.renewed + self._renew_every() - now)
        snap = self.obj.snapshot()
        if self.facts is not None and snap.listed:
            self.facts.follow(self.obj.value)
        if not (snap.listed and snap.present and snap.obj is not None):
            return until_renew
        current = snap.obj.get("status") or {}
        native = self._native_state(snap.generation, now)
        if native is not None:
            self._set_native(native)
        desired = desired_status(current, snap, self._rules(now), native, now)
        cluster, cluster_wait, stamp_only = self._cluster(current.get("cluster"), now)
        until_renew = min(until_renew, cluster_wait)
        if self.facts is not None:
            after = current.get("cluster") if cluster is _KEEP else cluster
            facts = facts_condition(after, self.obj.value.default.cluster_enabled, snap.generation, now,
                                    current.get("conditions") or [])
            desired["conditions"] = [facts, *(c for c in desired["conditions"] if c.get("type") != "ClusterFacts")]
        if not changed(current, desired) and cluster is _KEEP:
            return until_renew
        if now - self.last_write < self.settings.interval:
            return min(until_renew, self.settings.interval - (now - self.last_write))
        self.last_write = now
        version = (snap.obj.get("metadata") or {}).get("resourceVersion")
        status = dict(desired)
        if cluster is not _KEEP:
            status["cluster"] = merge_patch(current.get("cluster"), cluster)
        try:
            self.kube.request("PATCH", self.path, None,
                              {"metadata": {"resourceVersion": version}, "status": status}, MERGE_PATCH)
        except ApiError as exc:
            metrics.safely(lambda: metrics.POLICY_STATUS_WRITES.labels(result="failure").inc())
            if exc.status in (404, 409):  # gone, or changed since we read it: the watch brings the news
                return min(until_renew, self.settings.interval)
            raise
        metrics.safely(lambda: metrics.POLICY_STATUS_WRITES.labels(result="success").inc())
        if cluster is not _KEEP and not stamp_only:
            self.cluster_written = now
        logs.event("policy_status_written", name=self.settings.name, generation=snap.generation,
                   accepted=not snap.problems, enforced=snap.enforced, cluster=cluster is not _KEEP)
        return min(until_renew, self.settings.interval)

    def _cluster(self, written: Any, now: float) -> tuple[Any, float, bool]:
        """What to write of ``status.cluster`` over ``written``: ``_KEEP``, None (remove it) or the summary with
        its stamps; the seconds until a pending write of it is due (or a long while); whether only its stamps are
        new (a stamp does not hold back the next change of a fact: the 10 s bound is on the facts)."""
        idle = 60.0
        if self.facts is None:
            return _KEEP, idle, False
        policy = self.obj.value
        if not policy.default.cluster_enabled:
            return (None if written is not None else _KEEP), idle, False
        facts = self.facts.facts(policy, now)
        if facts is None:
            return _KEEP, 1.0, False  # the informers are loading
        stamped = {**facts, "writtenAt": meta_time(now), "writer": self.lease.identity}
        if facts == clustersummary.facts_of(written):
            # Unchanged: stamped again once HEARTBEAT has passed, so that the policies can tell it is current.
            beat = written_at(written) + clustersummary.HEARTBEAT - now
            if beat > 0:
                due = max(0.1, self.facts.seconds_until_due(now)) if self.facts.stale else idle
                return _KEEP, min(beat, due), False
            return stamped, idle, True
        wait = self.cluster_written + self.settings.cluster_interval - now
        if wait > 0:
            return _KEEP, wait, False
        return stamped, idle, False

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

    def _native_state(self, generation: int, now: float) -> NativeState | None:
        policy = self.obj.value
        cached = self._native
        if cached is not None and cached[0] == generation and cached[1] is policy and now - cached[2] < NATIVE_EVERY:
            return cached[3]
        value: NativeState | None
        try:
            listing = self.kube.get(BINDINGS_PATH, {"labelSelector": COMPONENT_SELECTOR})
            value = native_state(listing.get("items") or [], generation, policy)
        except NotServed:
            value = native_state([], generation, policy)
        except ApiError as exc:
            logs.event("policy_status_bindings_failed", logging.WARNING, error=str(exc)[:300])
            value = cached[3] if cached is not None else None
        self._native = (generation, policy, now, value)
        return value

    def _record_age(self, now: float) -> None:
        """``gpu_webhook_cluster_facts_age_seconds`` and ``..._stale`` from the object as this replica sees it."""
        snap = self.obj.snapshot()
        if not (snap.listed and snap.present and snap.obj is not None):
            return
        at = written_at((snap.obj.get("status") or {}).get("cluster"))
        enabled = self.obj.value.default.cluster_enabled

        def record() -> None:
            metrics.CLUSTER_FACTS_AGE.set(max(0.0, now - at) if at != float("-inf") else -1)
            metrics.CLUSTER_FACTS_STALE.set(1 if enabled and now - at > clustersummary.FRESH_FOR else 0)

        metrics.safely(record)

    @staticmethod
    def _set_native(native: NativeState | None) -> None:
        def record() -> None:
            metrics.NATIVE_POLICIES_STALE.set(1 if native is not None and native.stale else 0)
            metrics.NATIVE_POLICY_GENERATION.set(native.observed or 0 if native is not None else 0)

        metrics.safely(record)

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
        if self.facts is not None:
            self.facts.stop()
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
    # The cluster's facts over a client of their own: their four watches fill its pool.
    facts = ClusterFacts(KubeSource(settings.kubeconfig), settings.cluster_interval)
    writer = StatusWriter(kube, settings, obj, lease, facts=facts)
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
