"""Checks on the vendor resource names themselves: a shared GPU asked for more than once, a fractional
scheduler's share written as a GPU count, and monitoring resources that open every GPU of a node. The
names come from the registry, ``webhook.core.resources``."""

from __future__ import annotations

from webhook.core.field import FieldPath, Violation
from webhook.core.podspecs import Container
from webhook.core.policy import Policy
from webhook.core.quantity import shown
from webhook.core.resources import EXCLUSIVE, VOLCANO_COUNT, Kind
from webhook.rules.context import Named

_READ = (Kind.SHARED, Kind.MONITORING)


def requested(container: Container, names: tuple[Named, ...]) -> list[Named]:
    """The registered names the checks below read (shared, a fractional scheduler's, monitoring) among the
    container's ``names``: in its limits, and in its requests where limits do not name them (the apiserver
    copies limits into requests, and one problem is told once; requests that differ from limits are refused by
    the apiserver itself)."""
    return [
        n for n in names
        if n.entry is not None and (n.entry.kind in _READ or n.entry.scheduler)
        and (n.section == "limits" or n.name not in container.limits)
    ]


def _at(container: Container, section: str, name: str) -> FieldPath:
    return container.resources_path.child(section).key(name)


def check_vendor_resources(
    container: Container, names: tuple[Named, ...], policy: Policy, trusted: bool = False
) -> list[Violation]:
    """The three checks below in one pass over the container's ``names`` (``pods`` calls this for each
    container); trusted pods may ask for monitoring resources."""
    found = requested(container, names)
    if not found:
        return []
    out = check_shared_gpus(container, found, policy)
    out.extend(check_fractional_request(container, found, policy))
    if not trusted:
        out.extend(check_monitoring_resources(container, found, policy))
    return out


def check_shared_gpus(container: Container, found: list[Named], policy: Policy) -> list[Violation]:
    """A time-sliced or MPS replica above 1 per container: the device plugin's failRequestsGreaterThanOne,
    at admission instead of a kubelet UnexpectedAdmissionError on a pod already scheduled. (A value that is no
    count: the apiserver refuses it for Pods, the quantity rule where listed.)"""
    if not policy.checks("shared-gpu-over-one"):
        return []
    out = []
    for n in found:
        if n.entry is not None and n.entry.kind is Kind.SHARED and n.number is not None and n.number > 1:
            out.append(
                Violation(
                    _at(container, n.section, n.name),
                    "shared-gpu-over-one",
                    f"{container.label}: {n.number} {n.name} asks for several replicas of a shared GPU, which "
                    "give no more compute than one (the kubelet refuses it with failRequestsGreaterThanOne); "
                    "ask for 1",
                    str(n.number),
                )
            )
    return out


def check_fractional_request(container: Container, found: list[Named], policy: Policy) -> list[Violation]:
    """HAMi and Volcano shares a scheduler can never place: a percentage outside 0-100, memory given both
    in MiB and as a percentage, Volcano memory or cores without a vGPU count. Such pods stay Pending."""
    if not policy.checks("fractional-gpu-request"):
        return []
    out: list[Violation] = []
    seen: set[str] = set()
    for n in found:
        if n.entry is None or not n.entry.scheduler:
            continue
        seen.add(n.name)
        if n.entry.percent and (n.number is None or n.number > 100):
            out.append(
                Violation(_at(container, n.section, n.name), "fractional-gpu-request",
                          f"{container.label}: {n.name} is a percentage, 0 to 100, not {shown(n.raw)}", shown(n.raw))
            )
    for absolute, percentage in EXCLUSIVE:
        if absolute in seen and percentage in seen:
            out.append(
                Violation(
                    container.resources_path,
                    "fractional-gpu-request",
                    f"{container.label}: {absolute} and {percentage} both size the GPU memory; set one of them",
                    f"{absolute} + {percentage}",
                )
            )
    volcano = sorted(n for n in seen if n.startswith("volcano.sh/vgpu-") and n != VOLCANO_COUNT)
    if volcano and VOLCANO_COUNT not in seen:
        out.append(
            Violation(
                container.resources_path,
                "fractional-gpu-request",
                f"{container.label}: {', '.join(volcano)} without {VOLCANO_COUNT}: Volcano mounts no GPU without a "
                "vGPU count",
                ", ".join(volcano),
            )
        )
    return out


def check_monitoring_resources(container: Container, found: list[Named], policy: Policy) -> list[Violation]:
    """Resources that open every GPU of a node (Intel's *monitoring, management.nvidia.com/gpu): not for
    tenants. The caller skips trusted pods."""
    if not policy.checks("gpu-monitoring-resource"):
        return []
    return [
        Violation(
            _at(container, n.section, n.name),
            "gpu-monitoring-resource",
            f"{container.label}: {n.name} gives access to every GPU of the node; only trusted "
            "namespaces and service accounts (isolation.trusted) may ask for it",
            n.name,
        )
        for n in found
        if n.entry is not None and n.entry.kind is Kind.MONITORING and n.number != 0
    ]
