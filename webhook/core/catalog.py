"""Every rule, defined once.

A rule's id is what its violations carry; its setting (``section.key``) is where a policy turns it to
``deny``, ``warn`` or ``off``; rules without a setting follow ``enforcement``. From this table come the
policy schema and defaults (``webhook.core.policyschema``), the hints for a key written in the wrong section, the
reference tables of the documentation, and the native admission policies (``webhook.native``), which
generate exactly the rules whose ``engine`` is ``native``. A test holds every id a check reports to this
table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Section = Literal["checks", "cluster", "dra"]



def page_url(page: str, docs_url: str) -> str:
    """The absolute address of a documentation page as MkDocs publishes it under ``docs_url`` (where the site
    is published, ending in ``/``): ``rules.md#what-is-checked`` -> ``docs_url`` + ``rules/#what-is-checked``
    (a directory per page; ``index.md`` is the root)."""
    path, _, anchor = page.partition("#")
    stem = path.removesuffix(".md")
    directory = "" if stem == "index" else f"{stem.removesuffix('/index')}/"
    return f"{docs_url}{directory}{'#' + anchor if anchor else ''}"
Engine = Literal["native", "webhook"]

# Why a rule stays with the webhook, for the reasons shared by several rules.
# The cluster's facts (GPUPolicy/default's status.cluster) hold aggregates of bounded size, never one entry per claim
# or device: what these rules read is not in them.
NEEDS_CLAIMS = (
    "reads the ResourceClaims and ResourceClaimTemplates of the pod's namespace, and the cluster's facts (aggregates, "
    "no object lists) hold none"
)
FOLLOWS_CLAIMS = "follows a pod's claims to the ResourceClaims and templates they name, which CEL cannot read"
CROSS_REPLICA = "compares the replicas of one workload kind by kind; not generated"
WALKS = "finds GPU quantities anywhere in an object by a walk, which CEL cannot do"


@dataclass(frozen=True, slots=True)
class Rule:
    id: str  # what violations carry: "privileged-gpu"
    section: Section | None  # where its setting lives; None: it follows `enforcement`
    key: str | None  # the setting's key in that section: "privilegedGpu"
    default: Literal["deny", "warn"]
    refuses: str  # what it refuses (or warns about), one line of Markdown
    reports: str  # where the violation is reported
    page: str  # the documentation page that explains it
    engine: Engine  # "native": generated as a ValidatingAdmissionPolicy too; "webhook": the webhook only
    why: str = ""  # for engine "webhook": why
    # A tenant rule (docs/isolation.md): where the pod asks for no GPU and the namespace is not one of
    # ``isolation.tenantNamespaces``, its denial is softened to a warning, which says so.
    tenant: bool = False

    @property
    def setting(self) -> str | None:
        """``checks.privilegedGpu``, or None for a rule that follows ``enforcement``."""
        return f"{self.section}.{self.key}" if self.section else None


_CHECKED = "rules.md#what-is-checked"
_MISTAKES = "pod-mistakes.md"
_CLUSTER = "pod-mistakes.md#checks-against-the-cluster"
_ISOLATION = "isolation.md"
_RUNTIME = "isolation.md#runtime-class"
_DRA = "dra.md#checks"

_ROWS: tuple[Rule, ...] = (
    # --- the pod-spec rules every policy enforces (enforcement: deny or warn) ---
    Rule("requests-without-limits", None, None, "deny", "GPUs requested without a limit",
         "`…resources.requests[<name>]`", _CHECKED, "native"),
    Rule("invalid-quantity", None, None, "deny",
         "a GPU count that is not a whole, non-negative number of sensible size (`500m`, `\"two\"`, `1e400`)",
         "the value's path", _CHECKED, "native"),
    Rule("requests-differ", None, None, "deny", "GPU requests that differ from limits",
         "`…resources.requests[<name>]`", _CHECKED, "native"),
    Rule("accelerator-not-allowed", None, None, "deny",
         "a nodeSelector or annotation accelerator outside `accelerator.allowed`",
         "`spec.nodeSelector[<label>]`, `metadata.annotations[<annotation>]`", _CHECKED, "native"),
    Rule("accelerator-conflict", None, None, "deny", "an accelerator annotation that contradicts the nodeSelector",
         "the annotation", _CHECKED, "native"),
    Rule("per-container-limit", None, None, "deny",
         "more GPUs of one resource in a container than `limits.perContainer`",
         "`…limits[<name>]`", _CHECKED, "native"),
    Rule("per-pod-limit", None, None, "deny",
         "more GPUs of one resource in a pod than `limits.perPod`, counted as the scheduler does", "the pod spec",
         _CHECKED, "native"),
    Rule("ephemeral-gpu", None, None, "deny", "GPUs in an ephemeral container", "that container's resources",
         _CHECKED, "native"),
    Rule("pod-level-gpu", None, None, "deny", "GPUs in pod-level `spec.resources`", "`spec.resources`", _CHECKED,
         "native"),
    Rule("structure", None, None, "deny", "odd shapes: `containers` not a list, `limits` not a mapping", "the field",
         _CHECKED, "native"),
    Rule("unchecked-gpu", "checks", "uncheckedGpu", "warn",
         "a GPU quantity in a place no rule reads: a kind whose pod templates or resource blocks are not registered",
         "the quantity's path", "rules.md#where-gpus-are-found", "webhook", WALKS),
    # --- checks.*: pod mistakes and GPU isolation ---
    Rule("cpu-pod-on-gpu-nodes", "checks", "cpuPodOnGpuNodes", "warn",
         "a pod with no GPU that tolerates a GPU taint or selects an accelerator", "the toleration or selector",
         _MISTAKES, "native"),
    Rule("mixed-gpu-and-mig", "checks", "mixedGpuAndMig", "warn",
         "one container asking for `nvidia.com/gpu` and `nvidia.com/mig-*` together", "the container's limits",
         _MISTAKES, "native"),
    Rule("init-container-gpus", "checks", "initContainerGpus", "warn",
         "GPUs in a plain init container: reserved for the pod's whole life", "the init container", _MISTAKES,
         "native"),
    Rule("process-count-mismatch", "checks", "processCountMismatch", "warn",
         "PyTorchJob `nprocPerNode` or Ray `num-gpus` (RayCluster, RayJob, RayService) not equal to the "
         "container's GPU limit",
         "the process count", _MISTAKES, "webhook", CROSS_REPLICA),
    Rule("replica-accelerator-mismatch", "checks", "replicaAcceleratorMismatch", "warn",
         "replicas of one PyTorchJob or Ray cluster (RayCluster, RayJob, RayService) on different accelerators",
         "the replica's selector",
         _MISTAKES, "webhook", CROSS_REPLICA),
    Rule("visible-devices-without-gpu", "checks", "visibleDevicesWithoutGpu", "deny",
         "a container with no GPU setting `NVIDIA_VISIBLE_DEVICES` or `NVIDIA_MIG_CONFIG_DEVICES`", "the env entry",
         _ISOLATION, "native", tenant=True),
    Rule("visible-devices-unread", "checks", "visibleDevicesUnread", "warn",
         "the same variables from `valueFrom` or an `envFrom`, which admission cannot read", "the env source",
         _ISOLATION, "native", tenant=True),
    Rule("privileged-gpu", "checks", "privilegedGpu", "deny",
         "a privileged container with or beside GPUs, or on GPU nodes", "`securityContext.privileged`",
         _ISOLATION, "native", tenant=True),
    Rule("host-pid-gpu", "checks", "hostPidGpu", "warn",
         "`hostPID: true` on a pod that uses GPUs", "`spec.hostPID`", _ISOLATION, "native"),
    Rule("gpu-device-mount", "checks", "gpuDeviceMount", "deny",
         "a hostPath of GPU device files (or `/dev`, `/`) that a privileged container mounts, or a mount of the "
         "device list", "the volume or mount", _ISOLATION,
         "native", tenant=True),
    Rule("cdi-annotation", "checks", "cdiAnnotation", "deny", "a CDI device annotation on the pod",
         "`metadata.annotations[<key>]`", _ISOLATION, "native", tenant=True),
    Rule("zero-gpu-limit", "checks", "zeroGpuLimit", "warn",
         "a GPU count of 0, which picks up GPU tolerations and lands on a GPU node without a GPU", "the value's path",
         _ISOLATION, "native"),
    Rule("runtime-class-without-gpu", "checks", "runtimeClassWithoutGpu", "warn",
         "`runtimeClassName: nvidia*` on a pod with no GPU", "`spec.runtimeClassName`", _ISOLATION, "native",
         tenant=True),
    Rule("shared-gpu-over-one", "checks", "sharedGpuOverOne", "deny",
         "more than 1 of a time-sliced or MPS replica per container", "the value's path", _ISOLATION, "native"),
    Rule("fractional-gpu-request", "checks", "fractionalGpuRequest", "deny",
         "HAMi and Volcano fractional requests that would stay Pending", "the value's path", _ISOLATION, "native"),
    Rule("gpu-monitoring-resource", "checks", "gpuMonitoringResource", "deny",
         "monitoring resources that give every GPU of the node", "the value's path", _ISOLATION, "native",
         tenant=True),
    # --- cluster.*: against what the cluster has (with cluster.enabled) ---
    Rule("unknown-accelerator", "cluster", "unknownAccelerator", "deny", "the pod's accelerator is on no node",
         "the pod spec", _CLUSTER, "native"),
    Rule("exceeds-node-capacity", "cluster", "exceedsNodeCapacity", "deny",
         "more GPUs than the largest node of that accelerator has", "the pod spec", _CLUSTER, "native"),
    Rule("unadvertised-resource", "cluster", "unadvertisedResource", "deny", "a GPU resource no node offers at all",
         "the pod spec", _CLUSTER, "native"),
    Rule("unknown-runtime-class", "cluster", "unknownRuntimeClass", "deny", "a GPU pod's RuntimeClass does not exist",
         "`spec.runtimeClassName`", _RUNTIME, "native"),
    Rule("runtime-class-conflict", "cluster", "runtimeClassConflict", "deny",
         "the RuntimeClass's `scheduling.nodeSelector` contradicts the pod's", "`spec.runtimeClassName`", _RUNTIME,
         "native"),
    Rule("unknown-device-class", "cluster", "unknownDeviceClass", "deny",
         "a claim names a DeviceClass that does not exist", "the request's `deviceClassName`", _DRA, "native"),
    Rule("exceeds-device-capacity", "cluster", "exceedsDeviceCapacity", "deny",
         "more devices of a class than any node has", "the request's count", _DRA, "native"),
    Rule("missing-claim-source", "cluster", "missingClaimSource", "warn",
         "a pod names a ResourceClaim or ResourceClaimTemplate that does not exist in its namespace",
         "`spec.resourceClaims[]`", _DRA, "webhook", NEEDS_CLAIMS),
    Rule("unknown-claim-request", "cluster", "unknownClaimRequest", "warn",
         "`resources.claims[].request` names no request of that claim", "the container's claim", _DRA, "webhook",
         NEEDS_CLAIMS),
    Rule("duplicate-extended-resource-name", "cluster", "duplicateExtendedResourceName", "warn",
         "a DeviceClass takes over another class's `extendedResourceName`", "`spec.extendedResourceName`", _DRA,
         "webhook", "compares the class with every other DeviceClass's extendedResourceName, which the cluster's "
         "facts do not hold"),
    Rule("generated-claim-reference", "cluster", "generatedClaimReference", "warn",
         "`resourceClaimName` names a claim generated for another pod", "`spec.resourceClaims[]`", _DRA, "webhook",
         NEEDS_CLAIMS),
    Rule("selector-matches-no-device", "cluster", "selectorMatchesNoDevice", "warn",
         "a request's selectors match none of its class's published devices", "the request's selectors", _DRA,
         "webhook", "evaluates the request's own CEL selectors on each published device, and the cluster's facts "
         "hold counts per class, not devices"),
    # --- dra.*: Dynamic Resource Allocation ---
    Rule("device-class-not-allowed", "dra", "deviceClassNotAllowed", "deny",
         "a device class outside `dra.allowedDeviceClasses` of the namespace", "the request's `deviceClassName`",
         _DRA, "native"),
    Rule("allocation-mode-all", "dra", "allocationModeAll", "deny",
         "`allocationMode: All`, unless the request has `adminAccess: true` (an admin-access allocation holds no "
         "device)", "the request's `allocationMode`", _DRA, "native"),
    Rule("admin-access", "dra", "adminAccess", "deny", "`adminAccess: true` outside `dra.adminAccessNamespaces`",
         "the request's `adminAccess`", _DRA, "native"),
    Rule("blanket-device-toleration", "dra", "blanketDeviceToleration", "warn",
         "a device toleration with no key and `Exists`, or any `NoExecute` one", "the toleration", _DRA, "native"),
    Rule("gpu-limit-and-claim", "dra", "gpuLimitAndClaim", "deny",
         "a container with a GPU in its limits that also references a claim on a GPU class", "the container's claim",
         _DRA, "webhook", FOLLOWS_CLAIMS),
    Rule("undeclared-claim", "dra", "undeclaredClaim", "deny", "`resources.claims[].name` not in `spec.resourceClaims`",
         "the container's claim", _DRA, "native"),
    Rule("claim-source", "dra", "claimSource", "deny",
         "a `spec.resourceClaims[]` entry with neither or both of its sources (one still under the pre-1.31 "
         "`source:` is told to move it up)", "`spec.resourceClaims[]`", _DRA,
         "native"),
    Rule("unused-claim", "dra", "unusedClaim", "warn", "a declared claim no container uses", "`spec.resourceClaims[]`",
         _DRA, "native"),
    Rule("node-name-with-gpus", "dra", "nodeNameWithGpus", "warn",
         "`spec.nodeName` with GPUs or claims, bypassing the scheduler", "`spec.nodeName`", _DRA, "native"),
)

RULES: Mapping[str, Rule] = MappingProxyType({rule.id: rule for rule in _ROWS})
# The tenant rules, whose denial of a pod that asks for no GPU holds only in a tenant namespace.
TENANT_RULES = frozenset(rule.id for rule in _ROWS if rule.tenant)
SECTIONS: tuple[Section, ...] = ("checks", "cluster", "dra")


def in_section(section: Section) -> tuple[Rule, ...]:
    """The rules whose setting lives in ``section``, in the table's order."""
    return tuple(rule for rule in _ROWS if rule.section == section)


def _consistent() -> None:
    ids = [rule.id for rule in _ROWS]
    keys = [rule.key for rule in _ROWS if rule.key]
    if len(set(ids)) != len(ids) or len(set(keys)) != len(keys):
        raise AssertionError("rule ids and setting keys are each defined once")
    for rule in _ROWS:
        if (rule.section is None) != (rule.key is None) or (rule.engine == "webhook") != bool(rule.why):
            raise AssertionError(f"{rule.id}: a setting has section and key; a webhook-only rule says why")


_consistent()
