"""Checks on the vendor resource names themselves: a shared GPU asked for more than once, a fractional
scheduler's share written as a GPU count, and monitoring resources that open every GPU of a node. The
names come from the registry, ``webhook.core.resources``."""

from __future__ import annotations

from typing import Any

from webhook.core.field import FieldPath, Violation
from webhook.core.podspecs import Container
from webhook.core.policy import Policy
from webhook.core.quantity import QuantityError, gpu_count, shown
from webhook.core.resources import EXCLUSIVE, VOLCANO_COUNT, Kind, VendorResource, lookup

Requested = tuple[str, str, Any, VendorResource]  # limits or requests, name, raw value, registry entry


_READ = (Kind.SHARED, Kind.MONITORING)


def requested(container: Container) -> list[Requested]:
    """(limits or requests, name, raw value, entry) of the registered names the checks below read (shared, a
    fractional scheduler's, monitoring) in the container's limits, and in its requests where limits do not name
    them: the apiserver copies limits into requests, and one problem is told once (requests that differ from
    limits are refused by the apiserver itself)."""
    found: list[Requested] = []
    limits = container.limits
    for section, values in (("limits", limits), ("requests", container.requests)):
        for name, raw in values.items():
            entry = lookup(name) if isinstance(name, str) else None
            if entry is not None and (entry.kind in _READ or entry.scheduler):
                if section == "limits" or name not in limits:
                    found.append((section, name, raw, entry))
    return found


def _at(path: FieldPath, section: str, name: str) -> FieldPath:
    return path.child("resources").child(section).key(name)


def _count(raw: object) -> int | None:
    try:
        return gpu_count(raw)
    except QuantityError:
        return None  # not a count at all: the apiserver refuses it for Pods, the quantity rule where listed


def check_vendor_resources(container: Container, policy: Policy, trusted: bool = False) -> list[Violation]:
    """The three checks below in one pass over the container's names (``pods`` calls this for each container);
    trusted pods may ask for monitoring resources."""
    found = requested(container)
    if not found:
        return []
    out = check_shared_gpus(container, policy, found)
    out.extend(check_fractional_request(container, policy, found))
    if not trusted:
        out.extend(check_monitoring_resources(container, policy, found))
    return out


def check_shared_gpus(container: Container, policy: Policy, found: list[Requested] | None = None) -> list[Violation]:
    """A time-sliced or MPS replica above 1 per container: the device plugin's failRequestsGreaterThanOne,
    at admission instead of a kubelet UnexpectedAdmissionError on a pod already scheduled."""
    if not policy.checks("shared-gpu-over-one"):
        return []
    out = []
    for section, name, raw, entry in requested(container) if found is None else found:
        count = _count(raw) if entry.kind is Kind.SHARED else None
        if count is not None and count > 1:
            out.append(
                Violation(
                    _at(container.path, section, name),
                    "shared-gpu-over-one",
                    f"{container.label}: {count} {name} asks for several replicas of a shared GPU, which "
                    "give no more compute than one (the kubelet refuses it with failRequestsGreaterThanOne); "
                    "ask for 1",
                    str(count),
                )
            )
    return out


def check_fractional_request(
    container: Container, policy: Policy, found: list[Requested] | None = None
) -> list[Violation]:
    """HAMi and Volcano shares a scheduler can never place: a percentage outside 0-100, memory given both
    in MiB and as a percentage, Volcano memory or cores without a vGPU count. Such pods stay Pending."""
    if not policy.checks("fractional-gpu-request"):
        return []
    out: list[Violation] = []
    path, label = container.path, container.label
    seen: set[str] = set()
    for section, name, raw, entry in requested(container) if found is None else found:
        if not entry.scheduler:
            continue
        seen.add(name)
        if not entry.percent:
            continue
        count = _count(raw)
        if count is None or count > 100:
            out.append(
                Violation(_at(path, section, name), "fractional-gpu-request",
                          f"{label}: {name} is a percentage, 0 to 100, not {shown(raw)}", shown(raw))
            )
    for absolute, percentage in EXCLUSIVE:
        if absolute in seen and percentage in seen:
            out.append(
                Violation(
                    path.child("resources"),
                    "fractional-gpu-request",
                    f"{label}: {absolute} and {percentage} both size the GPU memory; set one of them",
                    f"{absolute} + {percentage}",
                )
            )
    volcano = sorted(n for n in seen if n.startswith("volcano.sh/vgpu-") and n != VOLCANO_COUNT)
    if volcano and VOLCANO_COUNT not in seen:
        out.append(
            Violation(
                path.child("resources"),
                "fractional-gpu-request",
                f"{label}: {', '.join(volcano)} without {VOLCANO_COUNT}: Volcano mounts no GPU without a vGPU count",
                ", ".join(volcano),
            )
        )
    return out


def check_monitoring_resources(
    container: Container, policy: Policy, found: list[Requested] | None = None
) -> list[Violation]:
    """Resources that open every GPU of a node (Intel's *monitoring, management.nvidia.com/gpu): not for
    tenants. The caller skips trusted pods."""
    if not policy.checks("gpu-monitoring-resource"):
        return []
    return [
        Violation(
            _at(container.path, section, name),
            "gpu-monitoring-resource",
            f"{container.label}: {name} gives access to every GPU of the node; only trusted "
            "namespaces and service accounts (isolation.trusted) may ask for it",
            name,
        )
        for section, name, raw, entry in (requested(container) if found is None else found)
        if entry.kind is Kind.MONITORING and _count(raw) != 0
    ]
