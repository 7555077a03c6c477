"""The cluster's facts for the status writer (``serving.policystatus``): ``status.cluster`` of GPUPolicy/default.

The writer's process runs the cluster view's own list+watch (``kube.informer`` over the indices of
``core.cluster``) of the four kinds the summary is made of (Nodes, ResourceSlices, DeviceClasses,
RuntimeClasses; not the claims), only while it holds the Lease and the policy's ``cluster.enabled`` is on, keyed by
the policy's accelerator node label (a new label starts them again). :meth:`ClusterFacts.facts` recomputes the
summary (``core.clustersummary``) when an index really changed, at most once per ``every`` seconds, and after a
make that took ``t`` seconds of CPU not again for ``COST_SHARE * t`` seconds: under sustained churn the writer spends
at most a tenth of a core on it, whatever the cluster's size.

A kind that cannot be read leaves its sections out: one the apiserver does not serve (no DRA API) is listed
empty and counted unknown; one the pod may not read (403) never loads, and the summary is made without it once
every kind has answered or failed once. The sections left out are logged when they change
(``policy_status_cluster_partial``), not on every retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from webhook.core import clustersummary
from webhook.core.cluster import CLUSTER_KINDS, ClusterState
from webhook.core.policy import PolicySet
from webhook.kube.informer import Informer, Source
from webhook.telemetry import logs

KINDS = tuple(k for k in CLUSTER_KINDS if k.name in clustersummary.KINDS)
MAX_BACKOFF = 60.0  # a kind that fails (403) is tried again this often
COST_SHARE = 10.0  # after a make of t CPU seconds, none for COST_SHARE * t seconds (at most 1/10 of a core)


class ClusterFacts:
    """The informers of the summary's kinds and the summary made from them; ``start`` starts one informer's
    thread (tests run them over a fake source)."""

    def __init__(self, source: Source, every: float, start: bool = True,
                 cpu: Callable[[], float] = time.thread_time):
        self.source = source
        self.every = every
        self._cpu = cpu
        self._start = start
        self.state: ClusterState | None = None
        self.informers: list[Informer] = []
        self._reset()

    def _reset(self) -> None:
        self._facts: dict[str, Any] | None = None
        self._seen = -1  # the state's change count the facts were made from
        self._made_for: tuple[PolicySet, frozenset[str]] | None = None
        self._computed = float("-inf")
        self.gap = self.every  # the least time between two makes: every, or longer after a costly make
        self._absent: tuple[str, ...] = ()
        self.computations = 0

    def follow(self, policy: PolicySet | None) -> None:
        """Run the informers while ``policy`` turns cluster checks on (None: this replica does not write), for its
        node label; stop them otherwise."""
        label = policy.default.node_label if policy is not None and policy.default.cluster_enabled else None
        if self.state is not None and self.state.node_label == label:
            return
        if self.state is not None:
            self.stop()
        if label is None:
            return
        state = ClusterState(label)
        self.informers = [Informer(kind, self.source, state.indices[kind.name], max_backoff=MAX_BACKOFF)
                          for kind in KINDS]
        self.state = state
        if self._start:
            for informer in self.informers:
                informer.start()
        logs.event("policy_status_cluster_watching", node_label=label, kinds=[k.name for k in KINDS])

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        if self.state is not None:
            logs.event("policy_status_cluster_stopped")
        self.state, self.informers = None, []
        self._reset()

    def known(self) -> frozenset[str] | None:
        """The kinds read (listed and served); None while one has neither loaded nor failed yet."""
        if not self.informers or any(not (i.loaded or i.last_error) for i in self.informers):
            return None
        return frozenset(i.resource.name for i in self.informers if i.loaded and i.served)

    def facts(self, policy: PolicySet, now: float) -> dict[str, Any] | None:
        """The summary without its stamps; None until every kind answered (or failed) once. Made again when an
        index changed, the policy or the kinds read did, at most once per ``gap`` seconds."""
        state = self.state
        known = self.known()
        if state is None or known is None:
            return None
        fresh = self._facts is not None and state.changes == self._seen and self._made_for == (policy, known)
        if fresh or (self._facts is not None and now - self._computed < self.gap):
            return self._facts
        seen = state.changes  # a change during the build moves it again: made again next time
        started = self._cpu()
        self._facts = clustersummary.summarize(clustersummary.view_of(state, known), known,
                                               policy.default.is_gpu)
        self.gap = max(self.every, COST_SHARE * (self._cpu() - started))
        self._seen, self._made_for, self._computed = seen, (policy, known), now
        self.computations += 1
        self._log_absent(known)
        return self._facts

    def _log_absent(self, known: frozenset[str]) -> None:
        absent = tuple(s for s, kinds in clustersummary.SECTION_KINDS.items() if not kinds <= known)
        if absent == self._absent:
            return
        self._absent = absent
        if not absent:
            logs.event("policy_status_cluster_complete")
            return
        why = {i.resource.name: ("not served" if not i.served else i.last_error or "not listed")
               for i in self.informers if i.resource.name not in known}
        logs.event("policy_status_cluster_partial", logging.WARNING, absent=list(absent), kinds=why)

    @property
    def stale(self) -> bool:
        """An index changed since the facts were made."""
        return self.state is not None and self.state.changes != self._seen

    def seconds_until_due(self, now: float) -> float:
        return max(0.0, self._computed + self.gap - now)


def merge_patch(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: a key ``old`` has and ``new`` has not is
    null, maps are patched key by key, anything else is replaced whole."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    out: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key in old and isinstance(value, Mapping) and isinstance(old[key], Mapping):
            inner = merge_patch(old[key], value)
            if inner:
                out[key] = inner
        elif key not in old or old[key] != value:
            out[key] = value
    return out
