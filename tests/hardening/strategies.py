"""Hypothesis strategies: pod specs and objects shaped like manifests, with odd values mixed in at every
level, the policies they are judged under, and AdmissionReview envelopes around them."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from tests.manifests import admission_request, pytorch_job, ray_cluster, workload
from webhook.core.policy import PolicySet
from webhook.core.policyfile import parse_policy

GPU_NAMES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "nvidia.com/mig-1g.5gb")
# Vendor names no default policy pattern lists: time-sliced replicas, HAMi shares, Intel monitoring.
VENDOR_NAMES = ("nvidia.com/gpu.shared", "nvidia.com/gpumem", "nvidia.com/gpucores", "gpu.intel.com/monitoring")
OTHER_NAMES = ("cpu", "memory", "example.com/widget", *VENDOR_NAMES)
ACCELERATORS = ("nvidia-l4", "nvidia-t4", "nvidia-a100")
ANNOTATION = "gpu-webhook/accelerator"
NAMESPACES = ("default", "research")

# Policies the properties hold under; each is a valid policy file.
POLICY_TEXTS = {
    "defaults": "",
    "strict": (
        "accelerator: {allowed: [nvidia-l4, nvidia-t4], default: nvidia-l4}\n"
        "tolerations: true\n"
        "limits: {perContainer: 4, perPod: 6}\n"
        "checks: {cpuPodOnGpuNodes: deny, initContainerGpus: deny, processCountMismatch: deny,"
        " replicaAcceleratorMismatch: deny}\n"
    ),
    "warn": "enforcement: warn\naccelerator: {default: nvidia-a100}\ntolerations: true\nlimits: {perPod: 2}\n",
    "namespaced": (
        "accelerator: {default: nvidia-t4}\n"
        "namespaces: {research: {enforcement: warn, tolerations: true, accelerator: {default: nvidia-l4}}}\n"
        "checks: {mixedGpuAndMig: warn, cpuPodOnGpuNodes: off}\n"
    ),
    "isolating": (
        "platform: aks\ntolerations: true\naccelerator: {default: nvidia-l4}\n"
        "isolation: {runtimeClass: nvidia, trusted: {serviceAccounts: [research/dcgm]}}\n"
        "namespaces: {research: {isolation: {hideGpus: void}}}\n"
        "checks: {visibleDevicesUnread: deny, zeroGpuLimit: deny, runtimeClassWithoutGpu: deny}\n"
    ),
}
POLICIES: dict[str, PolicySet] = {name: parse_policy(text, name) for name, text in POLICY_TEXTS.items()}
policy_names = st.sampled_from(sorted(POLICIES))
namespaces = st.sampled_from(NAMESPACES)

odd = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=4), st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 2), max_size=2),
)
quantity = st.one_of(
    st.integers(-2, 9),
    st.sampled_from([
        "0", "1", "2", "4", "8", "16", "500m", "1000m", "2000m", "1.5", "0.5", "-1", "two", "1e3", "1e0",
        "1Ki", "1k", "", " 1", "NaN", "+1", ".5", "1.", "0x1", "1_0",
    ]),
    st.floats(min_value=-2, max_value=10, allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
resource_map = st.dictionaries(st.sampled_from(GPU_NAMES + OTHER_NAMES), quantity, max_size=3)
# What most GPU pods look like: whole-number GPU limits, requests absent or for other resources only.
usual_resources = st.fixed_dictionaries(
    {"limits": st.dictionaries(st.sampled_from(GPU_NAMES), st.one_of(st.integers(0, 4), st.sampled_from(["1", "2"])),
                               min_size=1, max_size=2)},
    optional={"requests": st.dictionaries(st.sampled_from(OTHER_NAMES), st.sampled_from(["1", "500m"]), max_size=1)},
)
resources = st.one_of(
    usual_resources,
    usual_resources,
    st.fixed_dictionaries({}, optional={"limits": st.one_of(resource_map, resource_map, odd),
                                        "requests": st.one_of(resource_map, resource_map, odd)}),
    st.fixed_dictionaries({}, optional={"limits": resource_map, "requests": resource_map}),
    odd,
)
_names = st.sampled_from(["main", "sidecar", "pytorch", "x"])
env_item = st.fixed_dictionaries(
    {"name": st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "CUDA_VISIBLE_DEVICES", "A"])},
    optional={"value": st.one_of(st.sampled_from(["all", "void", "none", "", "0", "GPU-1"]), odd),
              "valueFrom": st.just({"configMapKeyRef": {"name": "c", "key": "k"}})},
)
isolation_fields = {
    "restartPolicy": st.just("Always"),
    "env": st.one_of(st.lists(env_item, max_size=2), odd),
    "envFrom": st.lists(st.fixed_dictionaries({"configMapRef": st.just({"name": "c"})},
                                              optional={"prefix": st.sampled_from(["", "APP_", "NVIDIA_"])}),
                        max_size=1),
    "securityContext": st.one_of(st.fixed_dictionaries({"privileged": st.booleans()}), odd),
    "volumeMounts": st.lists(st.fixed_dictionaries(
        {"name": st.just("v"), "mountPath": st.sampled_from(["/data", "/var/run/nvidia-container-devices/all"])}),
        max_size=1),
}
container = st.one_of(
    st.fixed_dictionaries({"name": _names, "image": st.just("busybox"), "resources": usual_resources},
                          optional=isolation_fields),
    st.fixed_dictionaries({"name": _names, "image": st.just("busybox"), "resources": resources},
                          optional=isolation_fields),
    st.fixed_dictionaries({"name": _names, "image": st.just("busybox")}, optional=isolation_fields),
)
toleration = st.fixed_dictionaries(
    {},
    optional={"key": st.sampled_from((*GPU_NAMES, "other", "sku")), "operator": st.sampled_from(["Exists", "Equal"]),
              "value": st.sampled_from(["gpu", "present"]), "effect": st.sampled_from(["NoSchedule", "NoExecute", ""])},
)
accelerator_value = st.one_of(st.sampled_from(ACCELERATORS), st.just(""), odd)
node_selector = st.dictionaries(st.sampled_from(["accelerator", "zone"]), accelerator_value, max_size=2)
affinity = st.builds(
    lambda key: {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": ["nvidia-l4"]}]}]}}},
    st.sampled_from(["accelerator", "zone"]),
)
pod_spec = st.fixed_dictionaries(
    {"containers": st.one_of(st.lists(container, min_size=1, max_size=3), st.lists(container, min_size=1, max_size=3),
                             odd)},
    optional={
        "initContainers": st.lists(container, max_size=2),
        "ephemeralContainers": st.lists(container, max_size=1),
        "nodeSelector": st.one_of(node_selector, node_selector, odd),
        "tolerations": st.one_of(st.lists(toleration, max_size=2), odd),
        "affinity": affinity,
        "resources": resources,
        "runtimeClassName": st.one_of(st.sampled_from(["nvidia", "kata", ""]), odd),
        "serviceAccountName": st.sampled_from(["default", "dcgm"]),
        "volumes": st.lists(st.fixed_dictionaries(
            {"name": st.just("h"),
             "hostPath": st.fixed_dictionaries({"path": st.sampled_from(["/dev/nvidia0", "/tmp"])})}),
            max_size=1),
    },
)
annotations = st.dictionaries(
    st.sampled_from([ANNOTATION, "other", "cdi.k8s.io/gpu", "gpu-fraction"]), accelerator_value, max_size=2
)
metadata = st.fixed_dictionaries(
    {"name": st.sampled_from(["p", "q", "r"])},
    optional={"annotations": st.one_of(annotations, annotations, odd)},
)


def _pod(meta: dict, spec: dict) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


pods = st.builds(_pod, metadata, pod_spec)

WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicationController",
                  "PodTemplate")


def _pytorch(master: dict, worker: dict, procs: object) -> dict:
    job = pytorch_job(master, worker)
    if procs is not None:
        job["spec"]["nprocPerNode"] = procs
    return job


def _ray(head: dict, workers: list[dict], gpus: object) -> dict:
    cluster = ray_cluster(head, workers)
    if gpus is not None:
        for group in cluster["spec"]["workerGroupSpecs"]:
            group["rayStartParams"]["num-gpus"] = gpus
    return cluster


objects = st.one_of(
    pods,
    st.builds(lambda kind, p: workload(kind, copy.deepcopy(p)), st.sampled_from(WORKLOAD_KINDS), pods),
    st.builds(_pytorch, pods, pods, st.one_of(st.none(), st.integers(0, 4), st.sampled_from(["2", "auto"]))),
    st.builds(_ray, pods, st.lists(pods, min_size=1, max_size=2),
              st.one_of(st.none(), st.integers(0, 4), st.just("1"))),
)

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)


def _request(obj: Any, operation: str, namespace: Any, kind: Any, drop: list[str], uid: str) -> dict:
    request = admission_request(obj if isinstance(obj, dict) else {"kind": "Pod"}, operation=operation, uid=uid)
    request["object"] = obj
    request["namespace"] = namespace
    if kind is not None:
        request["kind"] = kind
    for key in drop:
        request.pop(key, None)
    return request


requests = st.builds(
    _request,
    st.one_of(objects, objects, json_values),
    st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH", ""]),
    st.one_of(namespaces, st.just(""), odd),
    st.one_of(st.none(), odd, st.fixed_dictionaries({"group": st.sampled_from(["", "apps", "ray.io"]),
                                                     "version": st.just("v1"),
                                                     "kind": st.sampled_from(["Pod", "Deployment", "RayCluster"])})),
    st.lists(st.sampled_from(["kind", "namespace", "operation", "object", "resource", "userInfo"]),
             max_size=2, unique=True),
    st.uuids().map(str),
)


def reviews(version: str = "admission.k8s.io/v1") -> st.SearchStrategy[dict]:
    return st.builds(lambda r: {"apiVersion": version, "kind": "AdmissionReview", "request": r}, requests)
