"""The one registry of vendor GPU resource names, and what each name counts.

Device plugins and fractional schedulers publish many names beside ``nvidia.com/gpu``: time-sliced
replicas (``nvidia.com/gpu.shared``), MIG and AMD partitions, Intel's monitoring resources that open
every GPU of a node, HAMi's and Volcano's memory and core shares. Only some of them are GPU counts.
This module says which, once, for every other module: ``policy.is_gpu`` (so caps and the quantity
rules never count MiB of GPU memory as GPUs), ``isolation`` (which containers hold a GPU of any
kind), and ``webhook.rules.sharing``, whose checks act on the names themselves.

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
from dataclasses import dataclass


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


# --- how a container reaches GPUs without asking for a resource (the isolation rules and their CEL) ---

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MIG_CONFIG_DEVICES = "NVIDIA_MIG_CONFIG_DEVICES"
DEVICE_VARIABLES = (VISIBLE_DEVICES, MIG_CONFIG_DEVICES)
# The toolkit's "no GPU" values: void (or empty) behaves as runc; none gives no GPU but the driver's libraries.
NO_DEVICES = ("", "void", "none")
# Host device nodes: NVIDIA (/dev/nvidia0, nvidiactl, nvidia-uvm, nvidia-caps/…), DRM (Intel, AMD), AMD KFD.
DEVICE_DIRECTORIES = ("/dev/dri", "/dev/kfd")
NVIDIA_DEVICE_PREFIX = "/dev/nvidia"
# The device plugin's volume-mounts strategy: the runtime injects the GPUs named by mounts here.
DEVICE_LIST_DIRECTORIES = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
# Annotation keys containerd/CRI-O and NVIDIA's NRI plugin read CDI device names from.
CDI_PREFIXES = ("cdi.k8s.io/", "nvidia.cdi.k8s.io/")
CDI_KEYS = ("nvidia.cdi.k8s.io",)
NVIDIA_RUNTIME_PREFIX = "nvidia"
