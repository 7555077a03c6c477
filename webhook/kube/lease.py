"""A coordination.k8s.io/v1 Lease: one holder at a time, and the time the last holder finished its work.

The periodic audit takes the Lease for the length of one run and gives it back with the time it finished
(an annotation), so every replica knows when the next run is due, whoever ran the last one, and nobody
writes to the apiserver between runs. A holder renews while it works; a holder that stops renewing (its pod
gone) loses the Lease once ``leaseDurationSeconds`` have passed. Every change is a PUT with the
resourceVersion read, so two replicas racing for it cannot both win (409 Conflict for the loser).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from webhook.kube.client import ApiError, Kube

FINISHED = "gpu-webhook.io/audit-finished"
FINISHED_BY = "gpu-webhook.io/audit-finished-by"


def micro_time(t: float) -> str:
    """A MicroTime, as Lease timestamps are written."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class LeaseState:
    holder: str | None
    renewed: float | None
    duration: int
    finished: float | None
    finished_by: str | None
    body: dict[str, Any]

    @classmethod
    def of(cls, body: dict[str, Any]) -> LeaseState:
        spec = body.get("spec") or {}
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        duration = spec.get("leaseDurationSeconds")
        return cls(
            holder=spec.get("holderIdentity") or None,
            renewed=parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime")),
            duration=duration if isinstance(duration, int) else 0,
            finished=parse_time(annotations.get(FINISHED)),
            finished_by=annotations.get(FINISHED_BY),
            body=body,
        )

    def held_by_another(self, identity: str, now: float) -> bool:
        if not self.holder or self.holder == identity:
            return False
        return self.renewed is not None and self.renewed + self.duration > now


class Lease:
    def __init__(self, kube: Kube, namespace: str, name: str, identity: str, duration: int = 60):
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self._body: dict[str, Any] | None = None  # as last written by us

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def read(self) -> LeaseState | None:
        try:
            return LeaseState.of(self.kube.get(self.path))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def acquire(self, now: float) -> bool:
        """Take the Lease unless another live holder has it; False when another replica won."""
        state = self.read()
        if state is not None and state.held_by_another(self.identity, now):
            return False
        stamp = micro_time(now)
        try:
            body: dict[str, Any]
            if state is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                             "acquireTime": stamp, "renewTime": stamp, "leaseTransitions": 0},
                }
                self._body = self.kube.create(
                    f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases", body
                )
            else:
                body = copy.deepcopy(state.body)
                spec = body.setdefault("spec", {})
                if state.holder not in (None, self.identity):  # taken over from a holder that went away
                    spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
                spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.duration,
                            acquireTime=stamp, renewTime=stamp)
                self._body = self.kube.replace(self.path, body)
        except ApiError as exc:
            if exc.status in (409, 422):  # someone else created or changed it first
                return False
            raise
        return True

    def renew(self, now: float) -> bool:
        """Extend our hold; False when the Lease is no longer ours."""
        for _ in range(2):
            if self._body is None:
                return False
            body = copy.deepcopy(self._body)
            body.setdefault("spec", {})["renewTime"] = micro_time(now)
            try:
                self._body = self.kube.replace(self.path, body)
                return True
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
            state = self.read()  # changed under us: is it still ours (someone touched an annotation)?
            self._body = state.body if state is not None and state.holder == self.identity else None
        return False

    def release(self, now: float, finished: bool) -> None:
        """Give the Lease back; with ``finished``, record that a run ended now."""
        state = self.read()
        if state is None or state.holder != self.identity:
            self._body = None
            return
        body = copy.deepcopy(state.body)
        spec = body.setdefault("spec", {})
        spec["holderIdentity"] = None
        spec["renewTime"] = micro_time(now)
        if finished:
            annotations = body.setdefault("metadata", {}).setdefault("annotations", {})
            annotations[FINISHED] = micro_time(now)
            annotations[FINISHED_BY] = self.identity
        try:
            self.kube.replace(self.path, body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
        self._body = None
