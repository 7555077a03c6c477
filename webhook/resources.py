"""The one registry of vendor GPU resource names, and what each name counts.

Device plugins and fractional schedulers publish many names beside ``nvidia.com/gpu``: time-sliced
replicas (``nvidia.com/gpu.shared``), MIG and AMD partitions, Intel's monitoring resources that open
every GPU of a node, HAMi's and Volcano's memory and core shares. Only some of them are GPU counts.
This module says which, once, for every other module: ``policy.is_gpu`` (so caps and the quantity
rules never count MiB of GPU memory as GPUs), ``isolation`` (which containers hold a GPU of any
kind), and the checks below, which act on the names themselves.

A name the registry does not know is a counting GPU resource if the policy lists it (a custom
device plugin's ``example.com/gpu``): the registry only ever narrows ``policy.resources``.

Sources (see ``shared/notes/gpu-landscape-2026.md`` sections 3-4): NVIDIA k8s-device-plugin v0.20.0
README and ``internal/rm/rm.go`` (``.shared`` names, MIG names with ``+`` as ``.``); AMD device plugin
``-resource_naming_strategy mixed``; Intel GPU plugin v0.36.0; HAMi v2.10.0; Volcano vGPU; KEP-5004.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from webhook.field import FieldPath, Violation
from webhook.quantity import QuantityError, gpu_count, shown

if TYPE_CHECKING:  # policy imports this module for is_gpu; the checks only need its type
    from webhook.policy import Policy


class Kind(enum.Enum):
    DEVICE = "device"  # whole GPUs, or vGPUs, counted one by one
    SHARED = "shared"  # a time-sliced or MPS replica of a GPU: at most one per container
    PARTITION = "partition"  # a hardware slice: a MIG profile, an AMD compute/memory partition
    MEMORY = "memory"  # GPU memory (HAMi and Volcano: MiB; Intel's retired memory.max: bytes)
    CORES = "cores"  # a share of a GPU's compute
    PRIORITY = "priority"  # HAMi's task priority: no device at all
    MONITORING = "monitoring"  # access to every GPU of the node, for monitoring or management

    @property
    def counts(self) -> bool:
        """Whether a quantity of this kind is a number of devices (the unit caps count)."""
        return self in (Kind.DEVICE, Kind.SHARED, Kind.PARTITION)


@dataclass(frozen=True)
class VendorResource:
    pattern: str  # matched whole; RE2 (the apiserver's CEL) and Python's re read it alike
    kind: Kind
    vendor: str
    example: str
    percent: bool = False  # a percentage: 0-100
    scheduler: str = ""  # the fractional scheduler that serves it (hami, volcano): its pods set their own env

    def matches(self, name: str) -> bool:
        return _compiled(self.pattern).fullmatch(name) is not None


_MIG = r"nvidia\.com/mig-(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb(?:\.[a-z0-9]+)*"

# First match wins: the .shared forms come before the names they extend.
REGISTRY: tuple[VendorResource, ...] = (
    VendorResource(r"nvidia\.com/gpu", Kind.DEVICE, "nvidia", "nvidia.com/gpu"),
    VendorResource(r"nvidia\.com/gpu\.shared", Kind.SHARED, "nvidia", "nvidia.com/gpu.shared"),
    VendorResource(_MIG + r"\.shared", Kind.SHARED, "nvidia", "nvidia.com/mig-1g.5gb.shared"),
    VendorResource(_MIG, Kind.PARTITION, "nvidia", "nvidia.com/mig-1g.24gb.me.all"),
    VendorResource(r"management\.nvidia\.com/gpu", Kind.MONITORING, "nvidia", "management.nvidia.com/gpu"),
    VendorResource(r"amd\.com/gpu", Kind.DEVICE, "amd", "amd.com/gpu"),
    VendorResource(r"amd\.com/(?:spx|dpx|tpx|qpx|cpx)_nps(?:1|2|4)", Kind.PARTITION, "amd", "amd.com/cpx_nps4"),
    VendorResource(r"gpu\.intel\.com/(?:i915|xe)", Kind.DEVICE, "intel", "gpu.intel.com/i915"),
    VendorResource(r"gpu\.intel\.com/(?:i915_|xe_)?monitoring", Kind.MONITORING, "intel", "gpu.intel.com/monitoring"),
    # Intel's fractional resource manager, removed in v0.34.0; old clusters may still advertise them.
    VendorResource(r"gpu\.intel\.com/millicores", Kind.CORES, "intel", "gpu.intel.com/millicores"),
    VendorResource(r"gpu\.intel\.com/memory\.max", Kind.MEMORY, "intel", "gpu.intel.com/memory.max"),
    VendorResource(r"gpu\.intel\.com/tiles", Kind.CORES, "intel", "gpu.intel.com/tiles"),
    # HAMi: nvidia.com/gpu is its vGPU count; these give each vGPU its memory and cores.
    VendorResource(r"nvidia\.com/gpumem", Kind.MEMORY, "hami", "nvidia.com/gpumem", scheduler="hami"),
    VendorResource(
        r"nvidia\.com/gpumem-percentage", Kind.MEMORY, "hami", "nvidia.com/gpumem-percentage", True, "hami"
    ),
    VendorResource(r"nvidia\.com/gpucores", Kind.CORES, "hami", "nvidia.com/gpucores", True, "hami"),
    VendorResource(r"nvidia\.com/priority", Kind.PRIORITY, "hami", "nvidia.com/priority", scheduler="hami"),
    VendorResource(r"volcano\.sh/vgpu-number", Kind.DEVICE, "volcano", "volcano.sh/vgpu-number", scheduler="volcano"),
    VendorResource(r"volcano\.sh/vgpu-memory", Kind.MEMORY, "volcano", "volcano.sh/vgpu-memory", scheduler="volcano"),
    VendorResource(
        r"volcano\.sh/vgpu-memory-percentage", Kind.MEMORY, "volcano", "volcano.sh/vgpu-memory-percentage", True,
        "volcano",
    ),
    VendorResource(r"volcano\.sh/vgpu-cores", Kind.CORES, "volcano", "volcano.sh/vgpu-cores", True, "volcano"),
    # KEP-5004's implicit names, deviceclass.resource.kubernetes.io/<class>, are not here: whether one is a
    # GPU depends on the class (policy.dra.gpuClasses), which policy.is_gpu decides.
)

# Memory given in absolute units and as a percentage are one or the other, never both (HAMi refuses both).
EXCLUSIVE = (
    ("nvidia.com/gpumem", "nvidia.com/gpumem-percentage"),
    ("volcano.sh/vgpu-memory", "volcano.sh/vgpu-memory-percentage"),
)
# Volcano mounts no device without a vGPU count (volcano-sh/volcano#3867).
VOLCANO_COUNT = "volcano.sh/vgpu-number"

# KAI Scheduler / Run:ai fractions: pod annotations, with no GPU resource at all; the scheduler's binder
# sets NVIDIA_VISIBLE_DEVICES itself.
FRACTION_ANNOTATIONS = ("gpu-fraction", "gpu-memory", "gpu-fraction-num-devices")


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


@functools.lru_cache(maxsize=4096)  # names repeat across requests; bounded against hostile ones
def lookup(name: str) -> VendorResource | None:
    """The registry entry for a resource name, or None for a name no vendor here publishes."""
    return next((entry for entry in REGISTRY if entry.matches(name)), None)


def counts_gpus(name: str) -> bool:
    """Whether a quantity of ``name`` is a number of devices; names the registry does not know are."""
    entry = lookup(name)
    return entry is None or entry.kind.counts


def known(name: object) -> bool:
    return isinstance(name, str) and lookup(name) is not None


def cel_pattern() -> str:
    """One anchored regular expression for every registered name, as the chart's CEL ``matches`` reads it."""
    return "^(?:" + "|".join(entry.pattern for entry in REGISTRY) + ")$"


# --- checks on the names themselves ------------------------------------------------------------


Requested = tuple[str, str, Any, VendorResource]  # limits or requests, name, raw value, registry entry


def requested(container: Mapping[str, Any]) -> list[Requested]:
    """The container's registered names the checks below read (shared, a fractional scheduler's, monitoring)."""
    return [r for r in _requested(container) if r[3].kind in _READ or r[3].scheduler]


_READ = (Kind.SHARED, Kind.MONITORING)


def _requested(container: Mapping[str, Any]) -> Iterator[Requested]:
    """(limits or requests, name, raw value, entry) of every registered name in the container's limits, and in
    its requests where limits do not name it: the apiserver copies limits into requests, and one problem is
    told once (requests that differ from limits are refused by the apiserver itself)."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return
    limits = resources.get("limits")
    limits = limits if isinstance(limits, Mapping) else {}
    for section in ("limits", "requests"):
        values = resources.get(section)
        if not isinstance(values, Mapping):
            continue
        for name, raw in values.items():
            entry = lookup(name) if isinstance(name, str) else None
            if entry is not None and (section == "limits" or name not in limits):
                yield section, name, raw, entry


def _at(path: FieldPath, section: str, name: str) -> FieldPath:
    return path.child("resources").child(section).key(name)


def _count(raw: object) -> int | None:
    try:
        return gpu_count(raw)
    except QuantityError:
        return None  # not a count at all: the apiserver refuses it for Pods, the quantity rule where listed


def _label(container: Mapping[str, Any], path: FieldPath) -> str:
    name = container.get("name")
    return f'container "{name}"' if isinstance(name, str) and name else f"container {path}"


def check_vendor_resources(
    container: Mapping[str, Any], path: FieldPath, policy: Policy, trusted: bool = False
) -> list[Violation]:
    """The three checks below in one pass over the container's names (``rules`` calls this for each container);
    trusted pods may ask for monitoring resources."""
    found = requested(container)
    if not found:
        return []
    out = check_shared_gpus(container, path, policy, found)
    out.extend(check_fractional_request(container, path, policy, found))
    if not trusted:
        out.extend(check_monitoring_resources(container, path, policy, found))
    return out


def check_shared_gpus(
    container: Mapping[str, Any], path: FieldPath, policy: Policy, found: list[Requested] | None = None
) -> list[Violation]:
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
                    _at(path, section, name),
                    "shared-gpu-over-one",
                    f"{_label(container, path)}: {count} {name} asks for several replicas of a shared GPU, which "
                    "give no more compute than one (the kubelet refuses it with failRequestsGreaterThanOne); "
                    "ask for 1",
                    str(count),
                )
            )
    return out


def check_fractional_request(
    container: Mapping[str, Any], path: FieldPath, policy: Policy, found: list[Requested] | None = None
) -> list[Violation]:
    """HAMi and Volcano shares a scheduler can never place: a percentage outside 0-100, memory given both
    in MiB and as a percentage, Volcano memory or cores without a vGPU count. Such pods stay Pending."""
    if not policy.checks("fractional-gpu-request"):
        return []
    out: list[Violation] = []
    label = _label(container, path)
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
    container: Mapping[str, Any], path: FieldPath, policy: Policy, found: list[Requested] | None = None
) -> list[Violation]:
    """Resources that open every GPU of a node (Intel's *monitoring, management.nvidia.com/gpu): not for
    tenants. The caller skips trusted pods."""
    if not policy.checks("gpu-monitoring-resource"):
        return []
    return [
        Violation(
            _at(path, section, name),
            "gpu-monitoring-resource",
            f"{_label(container, path)}: {name} gives access to every GPU of the node; only trusted "
            "namespaces and service accounts (isolation.trusted) may ask for it",
            name,
        )
        for section, name, raw, entry in (requested(container) if found is None else found)
        if entry.kind is Kind.MONITORING and _count(raw) != 0
    ]
