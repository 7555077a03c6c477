"""The policy read live from a GPUPolicy (``serve --policy-object NAME``), kept current by a list+watch.

Each serving process lists and watches ``/apis/gpu-webhook.io/v1alpha1/gpupolicies`` with the field selector
``metadata.name=NAME`` (``kube.informer``'s loop over a :class:`~webhook.kube.informer.KubeSource`), and this
module is what that loop feeds: :class:`PolicyObject`, a sink with the policy in force.

A new spec is checked as a policy file is (``serving.policies``: its schema in a short-lived child, then
``parse_policy(..., schema_checked=True)``) and swapped in whole; a spec the check refuses is logged, counted
(``gpu_webhook_reloads{what="policy",result="failure"}``) and leaves the last good policy in force. A change of
the object that leaves its spec as it was (a status write, a label) checks nothing. The object missing at the
first list: the fallback is served (the ``--policy`` file, else the built-in defaults) and that is reported;
deleted later: the last good policy stays, reported the same way (a log line, ``gpu_webhook_policy_object_present``
0). ``gpu_webhook_policy_generation`` is the ``metadata.generation`` whose spec is in force (0: the fallback).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from webhook.core import gpupolicy
from webhook.core.cluster import ClusterKind
from webhook.core.policy import PolicySet
from webhook.core.policyfile import PolicyError, parse_policy
from webhook.serving import policies
from webhook.telemetry import logs, metrics

# What the informer lists and watches (its name labels its log lines and gauges).
RESOURCE = ClusterKind(gpupolicy.PLURAL, gpupolicy.KIND, gpupolicy.PATH)


def field_selector(name: str) -> str:
    return f"metadata.name={name}"


def spec_text(obj: Mapping[str, Any]) -> str:
    """A GPUPolicy's spec as policy text (JSON is YAML); an object without one is the defaults' ``{}``."""
    spec = obj.get("spec")
    return orjson.dumps(spec if spec is not None else {}, option=orjson.OPT_SORT_KEYS).decode("utf-8")


def check_spec(text: str, source: str) -> PolicySet:
    """The policy of a spec, checked as a policy file is; :class:`PolicyError` naming every problem."""
    problems = policies.problems_in_child(text, source)
    if problems:
        raise PolicyError(source, problems)
    return parse_policy(text, source, schema_checked=True)


def generation_of(obj: Mapping[str, Any]) -> int:
    value = (obj.get("metadata") or {}).get("generation")
    return value if isinstance(value, int) else 0


@dataclass(frozen=True)
class Snapshot:
    """What one process knows of the object, taken at once (the status writer reads this)."""

    listed: bool
    present: bool
    generation: int  # metadata.generation of the object as last seen (0: none)
    enforced: int  # the generation whose spec is in force (0: the fallback)
    problems: tuple[str, ...]  # why the spec of ``refused`` was refused; () when the last spec checked passed
    refused: int  # the generation refused last (0: none)
    obj: Mapping[str, Any] | None = field(default=None, compare=False)


class PolicyObject:
    """The informer's sink for GPUPolicy/``name``: the policy in force, the last good one kept.

    ``value`` is what decisions read: the object's last good policy, else ``fallback()``. ``on_swap`` is told of
    every policy swapped in (the worker logs a change of ``cluster.enabled``, which takes a restart);
    ``on_change`` of every event (the status writer wakes on it). ``publish`` sets the metrics and logs what
    happens (the workers do; the status process, which runs the same checks, neither counts nor says it twice)."""

    def __init__(
        self,
        name: str,
        fallback: Callable[[], PolicySet],
        check: Callable[[str, str], PolicySet] = check_spec,
        publish: bool = True,
        on_swap: Callable[[PolicySet], None] = lambda policy: None,
        on_change: Callable[[], None] = lambda: None,
        fallback_name: str = "the built-in defaults",
    ):
        self.name = name
        self._fallback = fallback
        self._check = check
        self.publish = publish
        self.on_swap = on_swap
        self.on_change = on_change
        self.fallback_name = fallback_name
        self.policy: PolicySet | None = None  # the object's last good policy
        self.listed = False
        self.present = False
        self.generation = 0
        self.enforced = 0
        self.problems: tuple[str, ...] = ()
        self.refused = 0
        self.obj: Mapping[str, Any] | None = None
        self._checked: str | None = None  # the spec text checked last, accepted or not
        self._lock = threading.Lock()
        self._publish()

    @property
    def value(self) -> PolicySet:
        policy = self.policy
        return policy if policy is not None else self._fallback()

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(self.listed, self.present, self.generation, self.enforced, self.problems, self.refused,
                            self.obj)

    # -- the informer's Sink ----------------------------------------------------------------------------

    def replace(self, objects: list[Mapping[str, Any]]) -> None:
        mine = [o for o in objects if (o.get("metadata") or {}).get("name") == self.name]
        if mine:
            self._update(mine[0])
        else:
            self._missing()
        first = not self.listed
        self.listed = True
        if first and self.publish:
            logs.event("policy_object_listed", name=self.name, present=self.present, enforced=self.enforced,
                       serving=self._serving())
        self._publish()
        self.on_change()

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") != self.name:
            return
        if event_type == "DELETED":
            self._missing()
        else:
            self._update(obj)
        self._publish()
        self.on_change()

    def __len__(self) -> int:
        return 1 if self.present else 0

    # -- the state machine ------------------------------------------------------------------------------

    def _serving(self) -> str:
        if self.policy is not None:
            return f"{gpupolicy.KIND}/{self.name} generation {self.enforced}"
        return self.fallback_name

    def _update(self, obj: Mapping[str, Any]) -> None:
        generation = generation_of(obj)
        text = spec_text(obj)
        with self._lock:
            self.obj = obj
            self.generation = generation
            if not self.present and self.listed and self.publish:
                logs.event("policy_object_found", name=self.name, generation=generation)
            self.present = True
        if text == self._checked:
            with self._lock:  # the same spec: a status write, metadata, or the object made again as it was
                if not self.problems and self.policy is not None:
                    self.enforced = generation
                elif self.problems:
                    self.refused = generation
            return
        source = f"{gpupolicy.KIND}/{self.name} generation {generation}"
        try:
            policy = self._check(text, source)
        except PolicyError as exc:
            with self._lock:
                self._checked = text
                self.problems = tuple(exc.problems) or (str(exc),)
                self.refused = generation
            if self.publish:
                logs.event("reload_failed", logging.ERROR, what="policy", source=source, error=str(exc),
                           using=self._serving())
                metrics.safely(metrics.record_reload, "policy", False)
            return
        with self._lock:
            self._checked = text
            self.policy = policy
            self.enforced = generation
            self.problems = ()
            self.refused = 0
        if self.publish:
            logs.event("reloaded", what="policy", source=source)
            metrics.safely(metrics.record_reload, "policy", True)
        self.on_swap(policy)

    def _missing(self) -> None:
        with self._lock:
            was = self.present or not self.listed
            self.present = False
            self.obj = None
            self.generation = 0
        if was and self.publish:
            logs.event("policy_object_missing", logging.WARNING, name=self.name, serving=self._serving(),
                       hint=f"kubectl get {gpupolicy.PLURAL}.{gpupolicy.GROUP} {self.name}")

    def _publish(self) -> None:
        if not self.publish:
            return

        def record() -> None:
            metrics.POLICY_OBJECT_PRESENT.set(1 if self.present and self.listed else 0)
            metrics.POLICY_GENERATION.set(self.enforced)

        metrics.safely(record)


@dataclass(frozen=True)
class StatusSettings:
    """The status writer's settings (``serving.policystatus``), here so that the server builds its command line
    without importing the writer, whose imports (the generator) no worker needs."""

    name: str = gpupolicy.NAME
    lease_namespace: str = "default"
    lease_name: str = "gpu-webhook-status"
    kubeconfig: str | None = None
    policy_file: str | None = None
    interval: float = 2.0  # at most one status write per this many seconds
    cluster_interval: float = 2.0  # status.cluster: made and written at most once per this many seconds (more
    # after a costly make: serving.clusterfacts.COST_SHARE)
    lease_seconds: int = 15  # a writer gone is replaced within this

    def command(self) -> list[str]:
        return [sys.executable, "-m", "webhook.serving.policystatus", json.dumps(asdict(self))]

    @classmethod
    def from_json(cls, text: str) -> StatusSettings:
        return cls(**json.loads(text))
