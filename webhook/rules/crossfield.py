"""Cross-field checks: GPU mistakes that are well-formed but waste or strand GPU nodes.

Each has its own ``checks.<name>: deny|warn|off`` setting in the policy, and each is skipped
entirely when off. Like every rule they are pure: an object in, violations out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.field import FieldPath, Violation
from webhook.core.kinds import RAY_CLUSTER_SPECS
from webhook.core.podspecs import PodSpecRef, as_mapping, container_label
from webhook.core.policy import Policy
from webhook.core.quantity import QuantityError, gpu_count


def _gpu_tolerations(spec: Mapping[str, Any], policy: Policy) -> list[tuple[int, str]]:
    """(index, key) of every toleration of a GPU node taint (a GPU resource name, or one of gpuTaints)."""
    tolerations = spec.get("tolerations")
    if not isinstance(tolerations, list):
        return []
    return [
        (i, t["key"]) for i, t in enumerate(tolerations) if isinstance(t, Mapping) and policy.tolerates_gpu_taint(t)
    ]


def check_cpu_pod_on_gpu_nodes(ref: PodSpecRef, policy: Policy) -> list[Violation]:
    """A pod with no GPUs that tolerates a GPU taint or selects an accelerator takes a GPU node's room."""
    if not policy.checks("cpu-pod-on-gpu-nodes"):
        return []
    out = []
    for i, key in _gpu_tolerations(ref.spec, policy):
        out.append(
            Violation(
                ref.path.child("tolerations").item(i, "key", key),
                "cpu-pod-on-gpu-nodes",
                f"the pod uses no GPU but tolerates the {key} taint, so it can land on a GPU node",
                key,
            )
        )
    selector = as_mapping(ref.spec.get("nodeSelector"))
    if policy.node_label in selector:
        out.append(
            Violation(
                ref.path.child("nodeSelector").key(policy.node_label),
                "cpu-pod-on-gpu-nodes",
                f"the pod uses no GPU but selects {policy.node_label}={selector[policy.node_label]}",
                str(selector[policy.node_label]),
            )
        )
    return out


def check_mixed_gpu_and_mig(
    container: Mapping[str, Any], path: FieldPath, names: set[str], policy: Policy
) -> list[Violation]:
    """Whole GPUs and MIG slices in one container: the device plugin's MIG strategy serves one or the other."""
    if not policy.checks("mixed-gpu-and-mig") or "nvidia.com/gpu" not in names:
        return []
    slices = sorted(n for n in names if n.startswith("nvidia.com/mig-"))
    if not slices:
        return []
    return [
        Violation(
            path.child("resources"),
            "mixed-gpu-and-mig",
            f"{container_label(container, path)} mixes nvidia.com/gpu with MIG slices ({', '.join(slices)})",
            ", ".join(slices),
        )
    ]


def check_init_container_gpus(
    path: FieldPath, counts: Mapping[str, int], sidecar: bool, policy: Policy
) -> list[Violation]:
    """A plain init container's GPUs are reserved for the whole pod although used only until it exits."""
    if sidecar or not any(counts.values()) or not policy.checks("init-container-gpus"):
        return []
    held = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()) if n)
    return [
        Violation(
            path.child("resources"),
            "init-container-gpus",
            f"an init container asks for GPUs ({held}); they stay reserved for the pod's lifetime",
            held,
        )
    ]


def _number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    # ASCII digits only ("²".isdigit() is true, and int() refuses it), and few enough to convert cheaply.
    digits = value.strip() if isinstance(value, str) else ""
    if digits.isascii() and digits.isdigit() and len(digits) <= 18:
        return int(digits)
    return None


def _gpu_limit(template: Mapping[str, Any], policy: Policy, prefer: str | None = None) -> tuple[int, int] | None:
    """(index, GPU limit) of the training container: the one named ``prefer``, else the first."""
    containers = as_mapping(template.get("spec")).get("containers")
    if not isinstance(containers, list) or not containers:
        return None
    index = next((i for i, c in enumerate(containers) if as_mapping(c).get("name") == prefer), 0)
    limits = as_mapping(as_mapping(as_mapping(containers[index]).get("resources")).get("limits"))
    total = 0
    for name, value in limits.items():
        if isinstance(name, str) and policy.is_gpu(name):
            try:
                total += gpu_count(value)
            except QuantityError:
                return None  # reported by the quantity rule already
    return index, total


# The kinds whose replicas the two replica checks compare (process counts, accelerators): PyTorchJobs and every kind
# with a RayCluster spec (core.podspecs.RAY_CLUSTER_SPECS). Nothing else can make them fire, so hybrid mode sends
# only these to the webhook for them (webhook.native.hybrid).
PYTORCHJOB = ("kubeflow.org", "PyTorchJob")
REPLICA_KINDS = (PYTORCHJOB, *RAY_CLUSTER_SPECS)


def _ray_cluster(obj: Mapping[str, Any], group: str, kind: str) -> tuple[Mapping[str, Any], FieldPath] | None:
    """The RayCluster spec of a Ray kind and its path (``spec``, ``spec.rayClusterSpec``, ...); None for other kinds."""
    fields = RAY_CLUSTER_SPECS.get((group, kind))
    if fields is None:
        return None
    spec: Mapping[str, Any] = obj
    path = FieldPath()
    for name in fields:
        spec = as_mapping(spec.get(name))
        path = path.child(name)
    return spec, path


def check_process_count(obj: Mapping[str, Any], group: str, kind: str, policy: Policy) -> list[Violation]:
    """One training process per GPU is the norm; a mismatch idles GPUs or oversubscribes them."""
    if not policy.checks("process-count-mismatch"):
        return []
    spec = as_mapping(obj.get("spec"))
    out: list[Violation] = []
    if (group, kind) == PYTORCHJOB:
        # torchrun starts nprocPerNode processes on every node of the job, the Master's as well as the Workers'.
        replicas = as_mapping(spec.get("pytorchReplicaSpecs"))
        for role in ("Master", "Worker"):
            found = _gpu_limit(as_mapping(as_mapping(replicas.get(role)).get("template")), policy, prefer="pytorch")
            for path, value in (
                (FieldPath("spec").child("nprocPerNode"), spec.get("nprocPerNode")),
                (
                    FieldPath("spec").child("elasticPolicy").child("nProcPerNode"),
                    as_mapping(spec.get("elasticPolicy")).get("nProcPerNode"),
                ),
            ):
                procs = _number(value)
                if procs is not None and found and found[1] and procs != found[1]:
                    out.append(
                        Violation(
                            path,
                            "process-count-mismatch",
                            f"{procs} processes per node but the {role} container has {found[1]} GPUs",
                            f"{procs} != {found[1]}" if role == "Worker" else f"{role}: {procs} != {found[1]}",
                        )
                    )
    cluster = _ray_cluster(obj, group, kind)
    if cluster is not None:
        out.extend(_ray_process_counts(*cluster, policy))
    return out


def _ray_process_counts(spec: Mapping[str, Any], at: FieldPath, policy: Policy) -> list[Violation]:
    """``num-gpus`` of the RayCluster spec ``spec`` (at ``at``) against each group's GPU limit."""
    out: list[Violation] = []
    # The head node is a Ray node too: told num-gpus=N, Ray schedules N GPUs' worth of tasks on it.
    head = as_mapping(spec.get("headGroupSpec"))
    declared = _number(as_mapping(head.get("rayStartParams")).get("num-gpus"))
    found = _gpu_limit(as_mapping(head.get("template")), policy)
    if declared is not None and found and declared != found[1]:
        out.append(
            Violation(
                at.child("headGroupSpec").child("rayStartParams").key("num-gpus"),
                "process-count-mismatch",
                f"the Ray head is told num-gpus={declared} but its container's GPU limit is {found[1]}",
                f"head: {declared} != {found[1]}",
            )
        )
    groups = spec.get("workerGroupSpecs")
    for i, worker_group in enumerate(groups if isinstance(groups, list) else []):
        params = as_mapping(as_mapping(worker_group).get("rayStartParams"))
        declared = _number(params.get("num-gpus"))
        found = _gpu_limit(as_mapping(as_mapping(worker_group).get("template")), policy)
        if declared is not None and found and declared != found[1]:
            group_path = at.child("workerGroupSpecs").item(i, "groupName", as_mapping(worker_group).get("groupName"))
            out.append(
                Violation(
                    group_path.child("rayStartParams").key("num-gpus"),
                    "process-count-mismatch",
                    f"Ray is told num-gpus={declared} but the container's GPU limit is {found[1]}",
                    f"{declared} != {found[1]}",
                )
            )
    return out


def check_replica_accelerators(
    accelerators: list[tuple[PodSpecRef, str]], group: str, kind: str, policy: Policy
) -> list[Violation]:
    """Replicas of one job on different GPU models run at the pace of the slowest."""
    if (group, kind) not in REPLICA_KINDS:
        return []
    fields = RAY_CLUSTER_SPECS.get((group, kind))
    if fields is not None:
        # Only the cluster's nodes are its replicas: a RayJob's submitter pod is no Ray node.
        under = ".".join(fields) + "."
        accelerators = [(ref, a) for ref, a in accelerators if ref.path.text.startswith(under)]
    if not policy.checks("replica-accelerator-mismatch") or len({a for _, a in accelerators}) < 2:
        return []
    listed = ", ".join(f"{ref.path}: {a}" for ref, a in accelerators)
    return [
        Violation(
            ref.path.child("nodeSelector").key(policy.node_label),
            "replica-accelerator-mismatch",
            f"replicas of one job ask for different accelerators ({listed})",
            f"{a} != {accelerators[0][1]}",
        )
        for ref, a in accelerators[1:]
        if a != accelerators[0][1]
    ]
