"""Cluster-aware capacity rules for one pod spec: pods that could never be scheduled.

Capacity comes from the cluster view (``webhook.core.clusterview``): device-plugin allocatable and DRA devices
together, so a GPU published only in ResourceSlices is not taken for missing.
"""

from __future__ import annotations

from collections.abc import Mapping

from webhook.core.clusterview import NodeSummary
from webhook.core.field import FieldPath, Violation
from webhook.core.policy import Policy


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
                        f"Pending (values of {summary.node_label} on the nodes: {len(summary.by_accelerator)})",
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
                        path,
                        "unadvertised-resource",
                        f"no node advertises {name} in allocatable or through a DeviceClass",
                        name,
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
