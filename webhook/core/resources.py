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
``-resource_naming_strategy mixed``; Intel GPU plugin v0.36.0; HAMi v2.10.0; Volcano vGPU; KEP-5004. The other
vendors' names: HAMi v2.10.0 (commit 4707fb02), ``Project-HAMi/HAMi/charts/hami/values.yaml``, the device
configuration in ``Project-HAMi/HAMi/charts/hami/templates/scheduler/device-configmap.yaml``, HAMi's ``examples/``
and ``pkg/device/<vendor>/`` (units, percentages); HAMi v2.7.0 for Iluvatar's earlier names; Volcano (commit
ed72c7c8, after v1.16.0-alpha.1) ``pkg/scheduler/api/devices/`` and
``volcano-sh/volcano/docs/user-guide/how_to_use_vnpu.md``; Huawei's Ascend/ascend-for-volcano
``internal/vnpu/modulev310p/type.go`` and ``modulev910/type.go`` (static vNPU names). docs/rules.md lists them.
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
    # Volcano's older GPU sharing (gpushare): GPU memory, and whole GPUs beside it.
    VendorResource(r"volcano\.sh/gpu-number", Kind.DEVICE, "volcano", "volcano.sh/gpu-number", scheduler="volcano"),
    VendorResource(r"volcano\.sh/gpu-memory", Kind.MEMORY, "volcano", "volcano.sh/gpu-memory", scheduler="volcano"),
    # The other vendors HAMi schedules (HAMi v2.10.0: Project-HAMi/HAMi/charts/hami/values.yaml and the chart's
    # templates/scheduler/device-configmap.yaml; units from pkg/device/<vendor>/). scheduler="hami"
    # marks the names only HAMi's device plugins publish; whole-device names their vendors' plugins publish,
    # which HAMi and Volcano also place, name no scheduler. docs/rules.md has the table with every source.
    # AMD under HAMi: amd.com/gpu is the count; memory in MiB, cores 1-100 %.
    VendorResource(r"amd\.com/gpumem", Kind.MEMORY, "amd", "amd.com/gpumem", scheduler="hami"),
    VendorResource(r"amd\.com/gpucores", Kind.CORES, "amd", "amd.com/gpucores", True, "hami"),
    # Iluvatar: one vGPU count, memory and cores per chip model (iluvatar.ai/BI-V100-vgpu, .vMem in 256 MiB
    # units, .vCore in % of the GPU); before HAMi v2.8.0 one set for every model (iluvatar.ai/vgpu, ...).
    VendorResource(r"iluvatar\.ai/[A-Za-z0-9][A-Za-z0-9-]*-vgpu", Kind.DEVICE, "iluvatar", "iluvatar.ai/BI-V100-vgpu",
                   scheduler="hami"),
    VendorResource(r"iluvatar\.ai/[A-Za-z0-9][A-Za-z0-9-]*\.vMem", Kind.MEMORY, "iluvatar", "iluvatar.ai/BI-V100.vMem",
                   scheduler="hami"),
    VendorResource(r"iluvatar\.ai/[A-Za-z0-9][A-Za-z0-9-]*\.vCore", Kind.CORES, "iluvatar", "iluvatar.ai/BI-V100.vCore",
                   True, "hami"),
    VendorResource(r"iluvatar\.ai/vgpu", Kind.DEVICE, "iluvatar", "iluvatar.ai/vgpu", scheduler="hami"),
    VendorResource(r"iluvatar\.ai/vcuda-memory", Kind.MEMORY, "iluvatar", "iluvatar.ai/vcuda-memory", scheduler="hami"),
    VendorResource(r"iluvatar\.ai/vcuda-core", Kind.CORES, "iluvatar", "iluvatar.ai/vcuda-core", True, "hami"),
    # MetaX: whole GPUs (metax-tech.com/gpu, MetaX's own plugin), sGPUs with cores in % and memory in GiB.
    VendorResource(r"metax-tech\.com/gpu", Kind.DEVICE, "metax", "metax-tech.com/gpu"),
    VendorResource(r"metax-tech\.com/sgpu", Kind.DEVICE, "metax", "metax-tech.com/sgpu", scheduler="hami"),
    VendorResource(r"metax-tech\.com/vcore", Kind.CORES, "metax", "metax-tech.com/vcore", True, "hami"),
    VendorResource(r"metax-tech\.com/vmemory", Kind.MEMORY, "metax", "metax-tech.com/vmemory", scheduler="hami"),
    # Moore Threads: memory in 512 MiB units, cores out of 16 per GPU (not a percentage).
    VendorResource(r"mthreads\.com/vgpu", Kind.DEVICE, "mthreads", "mthreads.com/vgpu", scheduler="hami"),
    VendorResource(r"mthreads\.com/sgpu-memory", Kind.MEMORY, "mthreads", "mthreads.com/sgpu-memory", scheduler="hami"),
    VendorResource(r"mthreads\.com/sgpu-core", Kind.CORES, "mthreads", "mthreads.com/sgpu-core", scheduler="hami"),
    # Hygon DCU: memory in MiB, cores in %.
    VendorResource(r"hygon\.com/dcunum", Kind.DEVICE, "hygon", "hygon.com/dcunum", scheduler="hami"),
    VendorResource(r"hygon\.com/dcumem", Kind.MEMORY, "hygon", "hygon.com/dcumem", scheduler="hami"),
    VendorResource(r"hygon\.com/dcucores", Kind.CORES, "hygon", "hygon.com/dcucores", True, "hami"),
    # Cambricon MLU: memory in 256 MiB units, cores in %; "mlu" becomes the model (mlu370) when Cambricon's
    # plugin runs with --enable-device-type.
    VendorResource(r"cambricon\.com/vmlu", Kind.DEVICE, "cambricon", "cambricon.com/vmlu", scheduler="hami"),
    VendorResource(r"cambricon\.com/[a-z0-9]+\.smlu\.vmemory", Kind.MEMORY, "cambricon",
                   "cambricon.com/mlu370.smlu.vmemory", scheduler="hami"),
    VendorResource(r"cambricon\.com/[a-z0-9]+\.smlu\.vcore", Kind.CORES, "cambricon", "cambricon.com/mlu.smlu.vcore",
                   True, "hami"),
    # Huawei Ascend NPUs: whole NPUs (Volcano's Ascend910, Ascend310, Ascend310P) and HAMi's vNPU counts per
    # model (Ascend910B3, Ascend910B4-1), memory in MiB, cores in % (hami-core mode); static vNPU templates
    # (Ascend310P-2c.1cpu) are hardware slices; Volcano's dynamic vNPU asks for AI cores (huawei.com/npu-core).
    VendorResource(r"huawei\.com/Ascend[0-9]+[A-Za-z]?[0-9]*(?:-[0-9]+)?", Kind.DEVICE, "ascend",
                   "huawei.com/Ascend910B4-1"),
    VendorResource(r"huawei\.com/Ascend[0-9]+[A-Za-z]?[0-9]*(?:-[0-9]+)?-memory", Kind.MEMORY, "ascend",
                   "huawei.com/Ascend910B3-memory", scheduler="hami"),
    VendorResource(r"huawei\.com/Ascend[0-9]+[A-Za-z]?[0-9]*(?:-[0-9]+)?-core", Kind.CORES, "ascend",
                   "huawei.com/Ascend910C-core", True, "hami"),
    VendorResource(r"huawei\.com/Ascend[0-9]+[A-Za-z]?-[0-9]+c(?:\.[a-z0-9]+)*", Kind.PARTITION, "ascend",
                   "huawei.com/Ascend310P-2c.1cpu"),
    VendorResource(r"huawei\.com/npu-core", Kind.CORES, "ascend", "huawei.com/npu-core", scheduler="volcano"),
    # Enflame GCU: whole GCUs; a DRS slice whose quantity is the profile size (3 = a 3g slice of one GCU, no
    # count of devices); or memory in MiB and cores in % that HAMi turns into a profile.
    VendorResource(r"enflame\.com/gcu", Kind.DEVICE, "enflame", "enflame.com/gcu"),
    VendorResource(r"enflame\.com/drs-gcu", Kind.CORES, "enflame", "enflame.com/drs-gcu", scheduler="hami"),
    VendorResource(r"enflame\.com/gcu-memory", Kind.MEMORY, "enflame", "enflame.com/gcu-memory", scheduler="hami"),
    VendorResource(r"enflame\.com/gcu-core", Kind.CORES, "enflame", "enflame.com/gcu-core", True, "hami"),
    # Kunlunxin XPU: whole XPUs, vXPUs with memory in MiB.
    VendorResource(r"kunlunxin\.com/xpu", Kind.DEVICE, "kunlunxin", "kunlunxin.com/xpu"),
    VendorResource(r"kunlunxin\.com/vxpu", Kind.DEVICE, "kunlunxin", "kunlunxin.com/vxpu", scheduler="hami"),
    VendorResource(r"kunlunxin\.com/vxpu-memory", Kind.MEMORY, "kunlunxin", "kunlunxin.com/vxpu-memory",
                   scheduler="hami"),
    # Biren, Vastai, AWS Neuron: whole devices (a NeuronCore is a slice of a Neuron device, given whole).
    VendorResource(r"birentech\.com/gpu", Kind.DEVICE, "biren", "birentech.com/gpu"),
    VendorResource(r"vastaitech\.com/va", Kind.DEVICE, "vastai", "vastaitech.com/va"),
    VendorResource(r"aws\.amazon\.com/neuron", Kind.DEVICE, "aws", "aws.amazon.com/neuron"),
    VendorResource(r"aws\.amazon\.com/neuroncore", Kind.PARTITION, "aws", "aws.amazon.com/neuroncore"),
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
