"""What the cluster's nodes offer, and the checks that refuse pods that could never schedule.

The index is plain data fed by Node objects (from a watch, or a file for ``check``); the
checks read an immutable :class:`NodeSummary`, so decisions stay pure and a lost watch only
makes the summary older, never missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.field import FieldPath, Violation
from webhook.podspecs import as_mapping
from webhook.policy import Policy
from webhook.quantity import QuantityError, gpu_count


@dataclass(frozen=True, slots=True)
class NodeInfo:
    accelerator: str | None
    extended: tuple[tuple[str, int], ...]  # allocatable extended resources (names with a "/"), whole counts


def node_info(node: Mapping[str, Any], node_label: str) -> NodeInfo:
    labels = as_mapping(as_mapping(node.get("metadata")).get("labels"))
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    extended = []
    for name, value in allocatable.items():
        if isinstance(name, str) and "/" in name:
            try:
                extended.append((name, gpu_count(value)))
            except QuantityError:
                continue
    accelerator = labels.get(node_label)
    return NodeInfo(accelerator if isinstance(accelerator, str) else None, tuple(sorted(extended)))


@dataclass(frozen=True)
class Capacity:
    nodes: int = 0
    largest: Mapping[str, int] = field(default_factory=dict)  # resource -> largest allocatable on one node


@dataclass(frozen=True)
class NodeSummary:
    """Counts and largest allocatable per accelerator value and over all nodes."""

    node_label: str
    total: Capacity
    by_accelerator: Mapping[str, Capacity]

    def describe(self) -> str:
        models = ", ".join(f"{a}: {c.nodes}" for a, c in sorted(self.by_accelerator.items())) or "none"
        return f"nodes by {self.node_label}: {models}"


def summarize(infos: Iterable[NodeInfo], node_label: str) -> NodeSummary:
    total_nodes = 0
    total: dict[str, int] = {}
    counts: dict[str, int] = {}
    largest: dict[str, dict[str, int]] = {}
    for info in infos:
        total_nodes += 1
        for name, n in info.extended:
            total[name] = max(total.get(name, 0), n)
        if info.accelerator is not None:
            counts[info.accelerator] = counts.get(info.accelerator, 0) + 1
            mine = largest.setdefault(info.accelerator, {})
            for name, n in info.extended:
                mine[name] = max(mine.get(name, 0), n)
    return NodeSummary(
        node_label,
        Capacity(total_nodes, total),
        {a: Capacity(counts[a], largest[a]) for a in counts},
    )


class NodeIndex:
    """Nodes by name, fed by list and watch events; readers get a cached immutable summary."""

    def __init__(self, node_label: str):
        self.node_label = node_label
        self._nodes: dict[str, NodeInfo] = {}
        self._lock = threading.Lock()
        self._summary: NodeSummary | None = None
        self.loaded = False
        self.last_sync = 0.0

    def __len__(self) -> int:
        return len(self._nodes)

    def replace(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        fresh = {str(as_mapping(n.get("metadata")).get("name")): node_info(n, self.node_label) for n in nodes}
        with self._lock:
            self._nodes = fresh
            self._summary = None
            self.loaded = True
        self.touch()

    def apply(self, event_type: str, node: Mapping[str, Any]) -> None:
        name = str(as_mapping(node.get("metadata")).get("name"))
        with self._lock:
            if event_type == "DELETED":
                changed = self._nodes.pop(name, None) is not None
            else:
                info = node_info(node, self.node_label)
                changed = self._nodes.get(name) != info  # heartbeats change nothing we index
                self._nodes[name] = info
            if changed:
                self._summary = None
        self.touch()

    def touch(self) -> None:
        self.last_sync = time.time()

    def summary(self) -> NodeSummary | None:
        if not self.loaded:
            return None
        with self._lock:
            if self._summary is None:
                self._summary = summarize(self._nodes.values(), self.node_label)
            return self._summary


def check_cluster(
    path: FieldPath, accelerator: str | None, totals: Mapping[str, int], summary: NodeSummary, policy: Policy
) -> list[Violation]:
    """The three cluster rules for one pod spec, each as the policy sets it."""
    out: list[Violation] = []
    pool = summary.total
    where = "all nodes"
    if accelerator is not None:
        matching = summary.by_accelerator.get(accelerator)
        if matching is None:
            if policy.checks("unknown-accelerator"):
                out.append(
                    Violation(
                        path,
                        "unknown-accelerator",
                        f"no node has {summary.node_label}={accelerator}, so the pod would stay "
                        f"Pending ({summary.describe()})",
                        accelerator,
                    )
                )
            return out
        pool = matching
        where = f"nodes with {summary.node_label}={accelerator}: {matching.nodes}"
    for name, wanted in sorted(totals.items()):
        if not wanted:
            continue
        if name not in summary.total.largest or summary.total.largest[name] == 0:
            if policy.checks("unadvertised-resource"):
                out.append(
                    Violation(
                        path, "unadvertised-resource", f"no node advertises {name} (nodes: {summary.total.nodes})", name
                    )
                )
            continue
        largest = pool.largest.get(name, 0)
        if wanted > largest and policy.checks("exceeds-node-capacity"):
            out.append(
                Violation(
                    path,
                    "exceeds-node-capacity",
                    f"the pod needs {wanted} {name} on one node; {where}, largest allocatable {name}: {largest}",
                    f"{wanted} {name}",
                )
            )
    return out
