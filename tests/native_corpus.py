"""The corpus the generated admission policies are held to: pod specs (quantity spellings as strings and numbers,
caps, accelerators, isolation cases, the pod's own DRA fields, odd shapes) placed in Pods, built-in workloads and
the custom kinds the policies know (PyTorchJob, TFJob, RayCluster, RayJob, RayService, JobSet, LeaderWorkerSet, and a
kind the policy adds), ResourceClaims and ResourceClaimTemplates, under a policy with per-namespace overrides.

Shared by the unit tier (tests/test_native_eval.py: the apiserver's CEL packages, in seconds) and the e2e
differential (tests/e2e/test_native_policies.py: a real kube-apiserver of each version).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from webhook.core.clusterview import ClusterView
from webhook.core.podspecs import group_of
from webhook.core.policy import PolicySet
from webhook.native.generate import Generated
from webhook.native.rules import CUSTOM_ONLY
from webhook.rules import admission

NS, RESEARCH, LAB, OPEN, HIDE, TRUSTED, ADMIN, RUNTIME = (
    "np-default", "np-research", "np-lab", "np-open", "np-hide", "np-trusted", "np-admin", "np-runtime")
NAMESPACES = (NS, RESEARCH, LAB, OPEN, HIDE, TRUSTED, ADMIN, RUNTIME)

POLICY = f"""\
accelerator:
  allowed: [nvidia-tesla-p100, nvidia-tesla-k80, nvidia-l4]
  default: nvidia-tesla-k80
limits: {{perContainer: 4, perPod: 6}}
tolerations: true
isolation:
  trusted: {{namespaces: [{TRUSTED}], serviceAccounts: [{LAB}/dcgm, {NS}/dcgm]}}
checks: {{initContainerGpus: deny, cpuPodOnGpuNodes: warn}}
dra:
  allowedDeviceClasses: [gpu.nvidia.com, "mig.*"]
  adminAccessNamespaces: [{ADMIN}]
nativePolicies:
  customKinds:
  - {{group: example.com, resource: trainjobs, kind: TrainJob, templates: ["spec.roles[*].template", "spec.launcher"]}}
namespaces:
  {RESEARCH}: {{accelerator: {{default: nvidia-l4}}, limits: {{perPod: 8}}}}
  {LAB}: {{enforcement: warn}}
  {OPEN}: {{checks: {{privilegedGpu: "off", gpuDeviceMount: warn}}, dra: {{allowedDeviceClasses: []}}}}
  {HIDE}: {{isolation: {{hideGpus: void}}}}
  {RUNTIME}: {{isolation: {{runtimeClass: nvidia}}}}
"""


# --- the corpus ------------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    namespace: str
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.obj["kind"]


def ctr(name: str = "main", limits: dict | None = None, requests: dict | None = None, **extra: Any) -> dict:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    if resources:
        c["resources"] = resources
    c.update(extra)
    return c


def gpu(n: Any = 1, name: str = "main", resource: str = "nvidia.com/gpu", **extra: Any) -> dict:
    return ctr(name, limits={resource: n}, **extra)


def spec(*containers: dict, **fields: Any) -> dict:
    return {"containers": list(containers), **fields}


# Pod specs: (case name, spec, annotations). Each goes into several kinds below.
def pod_specs() -> list[tuple[str, dict, dict]]:
    cases: list[tuple[str, dict, dict]] = []

    def add(name: str, s: dict, annotations: dict | None = None) -> None:
        cases.append((name, s, annotations or {}))

    # Caps: 4 per container, 6 per pod (8 in np-research), counted as the scheduler does.
    add("one-gpu", spec(gpu(1)))
    add("four-gpus", spec(gpu(4)))
    add("five-gpus", spec(gpu(5)))
    add("three-plus-three", spec(gpu(3, "a"), gpu(3, "b")))
    add("four-plus-three", spec(gpu(4, "a"), gpu(3, "b")))
    add("sidecar-adds", spec(gpu(4, "a"), initContainers=[gpu(3, "side", restartPolicy="Always")]))
    add("init-peak", spec(gpu(1, "a"), initContainers=[gpu(2, "side", restartPolicy="Always"), gpu(4, "warm")]))
    add("requests-equal", spec(ctr("a", limits={"nvidia.com/gpu": 2}, requests={"nvidia.com/gpu": 2})))
    # Accelerators.
    add("annotation-allowed", spec(gpu(1)), {"gpu-webhook/accelerator": "nvidia-l4"})
    add("annotation-not-allowed", spec(gpu(1)), {"gpu-webhook/accelerator": "nvidia-a100"})
    add("annotation-empty", spec(gpu(1)), {"gpu-webhook/accelerator": ""})
    add("selector-allowed", spec(gpu(1), nodeSelector={"accelerator": "nvidia-tesla-p100"}))
    add("selector-not-allowed", spec(gpu(1), nodeSelector={"accelerator": "nvidia-h100"}))
    add("annotation-conflicts", spec(gpu(1), nodeSelector={"accelerator": "nvidia-tesla-p100"}),
        {"gpu-webhook/accelerator": "nvidia-l4"})
    add("cpu-selects-accelerator", spec(ctr(), nodeSelector={"accelerator": "nvidia-h100"}))
    add("cpu-tolerates-gpu", spec(ctr(), tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]))
    # Isolation.
    add("visible-all", spec(gpu(1, "a"), ctr("b", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])))
    add("visible-void", spec(ctr("b", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])))
    add("visible-empty", spec(ctr("b", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}])))
    add("visible-index", spec(ctr("b", env=[{"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "0"}])))
    add("visible-on-gpu", spec(gpu(1, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])))
    add("visible-from-configmap", spec(ctr("b", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {
        "configMapKeyRef": {"name": "cm", "key": "k"}}}])))
    add("env-from-secret", spec(ctr("b", envFrom=[{"secretRef": {"name": "s"}}])))
    add("env-from-prefixed", spec(ctr("b", envFrom=[{"prefix": "APP_", "configMapRef": {"name": "cm"}}])))
    add("privileged-gpu", spec(gpu(1, securityContext={"privileged": True})))
    add("host-pid-gpu", spec(gpu(1), hostPID=True))
    add("host-pid-cpu", spec(ctr("b"), hostPID=True))
    add("privileged-beside-gpu", spec(gpu(1, "a"), ctr("b", securityContext={"privileged": True})))
    add("privileged-tolerates", spec(ctr("b", securityContext={"privileged": True}),
                                     tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists",
                                                   "effect": "NoSchedule"}]))
    add("privileged-selects", spec(ctr("b", securityContext={"privileged": True}),
                                   nodeSelector={"accelerator": "nvidia-l4"}))
    add("privileged-cpu", spec(ctr("b", securityContext={"privileged": True})))
    add("privileged-dcgm", spec(ctr("b", securityContext={"privileged": True}), serviceAccountName="dcgm",
                                tolerations=[{"operator": "Exists"}]))
    for i, path in enumerate(["/dev/nvidia0", "/dev/../dev/nvidia0", "//dev", "/dev/dri/card0", "/var/lib/data",
                              "/home/user/../../dev/kfd", "/dev/nvidia-caps/", "/opt/dev/nvidia0", "/"]):
        # mounted by a privileged GPU container: only a privileged one can open a device through a hostPath, and
        # one that asks for a GPU is refused in any namespace (the apiserver refuses the '..' paths itself)
        add(f"host-path-{i}", spec(gpu(1, "b", securityContext={"privileged": True},
                                       volumeMounts=[{"name": "h", "mountPath": "/h"}]),
                                   volumes=[{"name": "h", "hostPath": {"path": path}}]))
    device_list = [{"name": "e", "mountPath": "/var/run/nvidia-container-devices/all"}]
    add("device-list-mount", spec(gpu(1, volumeMounts=device_list),
                                  volumes=[{"name": "e", "emptyDir": {}}]))
    add("cdi-annotation", spec(ctr()), {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"})
    add("cdi-management", spec(ctr()), {"nvidia.cdi.k8s.io/x": "management.nvidia.com/gpu=all"})
    add("monitoring", spec(ctr(limits={"gpu.intel.com/monitoring": 1})))
    add("monitoring-zero", spec(ctr(limits={"gpu.intel.com/monitoring": 0})))
    add("zero-gpu", spec(gpu(0)))
    add("shared-two", spec(gpu(2, resource="nvidia.com/gpu.shared")))
    add("shared-one", spec(gpu(1, resource="nvidia.com/gpu.shared")))
    add("hami-percent", spec(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150})))
    add("hami-both", spec(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000,
                                      "nvidia.com/gpumem-percentage": 50})))
    add("volcano-no-count", spec(ctr(limits={"volcano.sh/vgpu-memory": 1024})))
    add("hami-cpu-visible", spec(ctr(limits={"nvidia.com/gpumem": 1000},
                                     env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])))
    add("kai-fraction", spec(ctr(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])), {"gpu-fraction": "0.5"})
    add("runtime-nvidia-cpu", spec(ctr(), runtimeClassName="nvidia"))
    add("mixed-gpu-mig", spec(ctr(limits={"nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb": 1})))
    add("init-gpu", spec(gpu(1, "a"), initContainers=[gpu(1, "warm")]))
    # The pod's own DRA fields.
    add("claims-declared", spec(ctr(resources={"claims": [{"name": "g"}]}),
                                resourceClaims=[{"name": "g", "resourceClaimTemplateName": "t"}]))
    add("claims-unused", spec(ctr(), resourceClaims=[{"name": "g", "resourceClaimTemplateName": "t"}]))
    add("node-name-gpu", spec(gpu(1), nodeName="n1"))
    return cases


# Quantity spellings: values in limits (and requests) as users write them, strings and JSON numbers.
SPELLINGS: list[tuple[str, Any, Any]] = [
    ("str-1", "1", None), ("int-1", 1, None), ("milli-1000", "1000m", None), ("str-half", "0.5", None),
    ("float-half", 0.5, None), ("exp-2", "2e0", None), ("float-2", 2.0, None), ("milli-2000", "2000m", None),
    ("ki", "1Ki", None), ("exa", "1Ei", None), ("neg", "-1", None), ("plus", "+2", None), ("dot", "1.", None),
    ("word", "two", None), ("empty", "", None), ("bool", True, None), ("null", None, None), ("e400", "1e400", None),
    ("zero", "0", None), ("tiny", "1.0000000001", None), ("e7", 10000000, None), ("milli-1500", "1500m", None),
    ("req-equal", "2", "2000m"), ("req-differ", 2, 1), ("req-half", 1, "0.5"), ("req-only", None, "1"),
    ("req-only-int", None, 2), ("long", "1" * 70, None), ("e-minus", "1e-3", None), ("exp-big", "1e65", None),
    ("envsubst", "${GPUS}", None), ("envsubst-bare", "$GPUS", None), ("helm", "{{ .Values.gpus }}", None),
    ("placeholder-and-more", "${GPUS}x", None),
]


def spelled(value: Any, request: Any) -> dict:
    limits = None if value is None and request is not None else {"nvidia.com/gpu": value}
    requests = None if request is None else {"nvidia.com/gpu": request}
    return spec(ctr("main", limits=limits, requests=requests))


# --- the kinds the specs go into ---------------------------------------------------------------------------------


def template(s: dict, annotations: dict, labels: dict | None = None) -> dict:
    metadata: dict[str, Any] = {}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    return {"metadata": metadata, "spec": copy.deepcopy(s)}


def as_pod(name: str, s: dict, annotations: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **({"annotations": annotations} if annotations
                                                                               else {})}, "spec": copy.deepcopy(s)}


def as_deployment(name: str, s: dict, annotations: dict) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, "template": template(s, annotations, {"app": name})}}


def as_cronjob(name: str, s: dict, annotations: dict) -> dict:
    t = template(s, annotations)
    t["spec"]["restartPolicy"] = "Never"
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name},
            "spec": {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": t}}}}


def as_pytorchjob(name: str, s: dict, annotations: dict) -> dict:
    master = template(spec(ctr("pytorch")), {})
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": master},
                                             "Worker": {"replicas": 2, "template": template(s, annotations)}}}}


def as_tfjob(name: str, s: dict, annotations: dict) -> dict:
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": name},
            "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": template(s, annotations)}}}}


def as_raycluster(name: str, s: dict, annotations: dict) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template(spec(ctr("head")), {})},
                     "workerGroupSpecs": [
                         {"groupName": "small", "rayStartParams": {}, "template": template(spec(ctr("w")), {})},
                         {"groupName": "gpu", "rayStartParams": {}, "template": template(s, annotations)}]}}


def as_rayjob(name: str, s: dict, annotations: dict) -> dict:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name},
            "spec": {"entrypoint": "python x.py", "rayClusterSpec": {
                "headGroupSpec": {"template": template(s, annotations)}, "workerGroupSpecs": []}}}


def as_rayservice(name: str, s: dict, annotations: dict) -> dict:
    """The spec in a worker group told num-gpus=1 of the RayCluster a RayService embeds: where its first container's
    GPU limit is not 1, the webhook-only process-count-mismatch fires too, which the native policies leave alone."""
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
            "spec": {"serveConfigV2": "applications: []\n", "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": template(spec(ctr("head")), {})},
                "workerGroupSpecs": [{"groupName": "gpu", "rayStartParams": {"num-gpus": "1"},
                                      "template": template(s, annotations)}]}}}


def as_jobset(name: str, s: dict, annotations: dict) -> dict:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {
                "parallelism": 2, "template": template(s, annotations)}}}]}}


def as_trainjob(name: str, s: dict, annotations: dict) -> dict:
    """A kind no one knows but the policy (nativePolicies.customKinds): roles[*].template and a bare launcher spec."""
    return {"apiVersion": "example.com/v1", "kind": "TrainJob", "metadata": {"name": name},
            "spec": {"launcher": spec(ctr("launch")), "roles": [
                {"name": "ps", "template": template(spec(ctr("ps")), {})},
                {"name": "worker", "template": template(s, annotations)}]}}


def as_lws(name: str, s: dict, annotations: dict) -> dict:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": name},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": template(spec(ctr("l")), {}),
                                                              "workerTemplate": template(s, annotations)}}}


# Which kinds each pod spec goes into: every spec into a Pod and a PyTorchJob, and in turn into one more kind.
ROTATION = (as_deployment, as_raycluster, as_jobset, as_cronjob, as_lws, as_tfjob, as_rayjob, as_trainjob)


def claim(name: str, *requests: dict, template_of: bool = False) -> dict:
    spec_ = {"devices": {"requests": list(requests)}}
    if template_of:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
                "spec": {"spec": spec_}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec_}


def exactly(name: str = "gpu", device_class: str = "gpu.nvidia.com", **fields: Any) -> dict:
    return {"name": name, "exactly": {"deviceClassName": device_class, **fields}}


def claim_cases() -> list[Case]:
    cases = []
    requests: list[tuple[str, list[dict]]] = [
        ("allowed", [exactly()]),
        ("mig-glob", [exactly(device_class="mig.nvidia.com")]),
        ("class-not-allowed", [exactly(device_class="gpu.example.com")]),
        ("all-devices", [exactly(allocationMode="All")]),
        ("count-four", [exactly(count=4)]),
        ("count-eight", [exactly(count=8)]),
        ("count-eight-other-class", [exactly(device_class="fpga.example.com", count=8)]),
        ("admin-access", [exactly(adminAccess=True)]),
        ("blanket-toleration", [exactly(tolerations=[{"operator": "Exists"}])]),
        ("no-execute", [exactly(tolerations=[{"key": "drain", "operator": "Exists", "effect": "NoExecute"}])]),
        ("first-available", [{"name": "any", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 8},
            {"name": "other", "deviceClassName": "gpu.example.com"}]}]),
        ("two-requests", [exactly("a"), exactly("b", device_class="gpu.example.com", allocationMode="All")]),
        ("admin-all-devices", [exactly(allocationMode="All", adminAccess=True)]),
    ]
    for name, reqs in requests:
        for template_of in (False, True):
            kind = "rct" if template_of else "rc"
            for namespace in (NS, OPEN, ADMIN, LAB):
                if namespace in (OPEN, ADMIN, LAB) and name not in ("class-not-allowed", "admin-access",
                                                                   "two-requests", "all-devices",
                                                                   "admin-all-devices"):
                    continue
                cases.append(Case(f"{kind}-{name}", namespace, claim(f"{kind}-{name}", *reqs, template_of=template_of)))
    return cases


def corpus() -> list[Case]:
    cases: list[Case] = []
    for n, (name, s, meta) in enumerate(pod_specs()):
        kinds = (as_pod, as_pytorchjob, ROTATION[n % len(ROTATION)])
        for wrap in kinds:
            obj = wrap(f"{name}-{wrap.__name__[3:]}".replace("_", ""), s, meta)
            cases.append(Case(obj["metadata"]["name"], NS, obj))
    for n, (name, value, request) in enumerate(SPELLINGS):
        s = spelled(value, request)
        for wrap in (as_pod, as_pytorchjob, ROTATION[n % len(ROTATION)]):
            obj = wrap(f"q-{name}-{wrap.__name__[3:]}".replace("_", ""), s, {})
            cases.append(Case(obj["metadata"]["name"], NS, obj))
    # The same few specs in the namespaces that override the policy.
    chosen = {"five-gpus", "four-plus-three", "privileged-gpu", "host-pid-gpu", "host-path-0", "selector-allowed",
              "visible-all", "init-peak", "zero-gpu", "annotation-not-allowed"}
    for name, s, meta in pod_specs():
        if name not in chosen:
            continue
        for namespace in (RESEARCH, LAB, OPEN, TRUSTED):
            for wrap in (as_pod, as_raycluster):
                obj = wrap(f"{name}-{wrap.__name__[3:]}", s, meta)
                cases.append(Case(obj["metadata"]["name"], namespace, obj))
    # The same few specs in the RayCluster a RayService embeds (a block of its own: the cases above stay as they were).
    for name, s, meta in pod_specs():
        if name in chosen:
            obj = as_rayservice(f"{name}-rayservice", s, meta)
            cases.append(Case(obj["metadata"]["name"], NS, obj))
    # Odd shapes only custom resources can have.
    odd = [
        ("resources-string", spec(ctr("a", resources="lots"))),
        ("limits-list", spec(ctr("a", resources={"limits": [1]}))),
        ("init-not-list", spec(gpu(1), initContainers="none")),
        ("init-item-string", spec(gpu(1), initContainers=["warm"])),
        ("annotation-number", spec(gpu(1))),
        ("selector-number", spec(gpu(1), nodeSelector={"accelerator": 7})),
        ("claims-both", spec(ctr(resources={"claims": [{"name": "g"}]}), resourceClaims=[
            {"name": "g", "resourceClaimName": "c", "resourceClaimTemplateName": "t"}])),
        ("claims-undeclared", spec(ctr(resources={"claims": [{"name": "x"}]}))),
        ("claims-old-source", spec(ctr(resources={"claims": [{"name": "g"}]}), resourceClaims=[
            {"name": "g", "source": {"resourceClaimTemplateName": "t"}}])),
        ("claims-source-empty", spec(ctr(resources={"claims": [{"name": "g"}]}), resourceClaims=[
            {"name": "g", "source": {"resourceClaimName": ""}}])),
        ("pod-level-gpu", spec(ctr(), resources={"limits": {"nvidia.com/gpu": 1}})),
        ("ephemeral-gpu", spec(ctr(), ephemeralContainers=[gpu(1, "debug")])),
        ("host-pid-string", spec(gpu(1), hostPID="true")),
    ]
    for name, s in odd:
        meta = {"gpu-webhook/accelerator": 5} if name == "annotation-number" else {}
        for wrap in (as_pytorchjob, as_raycluster):
            obj = wrap(f"odd-{name}-{wrap.__name__[3:]}", s, meta)
            cases.append(Case(obj["metadata"]["name"], NS, obj))
    return cases + claim_cases()


# Pods for the mutation: what /mutate changes (selector, tolerations, hideGpus) and what it must leave alone.
def mutation_pods() -> list[Case]:
    specs = [
        ("gpu", spec(gpu(1)), {}),
        ("gpu-annotated", spec(gpu(1)), {"gpu-webhook/accelerator": "nvidia-l4"}),
        ("gpu-annotation-not-allowed", spec(gpu(1)), {"gpu-webhook/accelerator": "nvidia-a100"}),
        ("gpu-selector-other-key", spec(gpu(1), nodeSelector={"zone": "a"}), {}),
        ("gpu-selector-own", spec(gpu(1), nodeSelector={"accelerator": "nvidia-l4"}), {}),
        ("gpu-affinity", spec(gpu(1), affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "accelerator", "operator": "In",
                                                         "values": ["nvidia-l4"]}]}]}}}), {}),
        ("gpu-tolerated", spec(gpu(1), tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]), {}),
        ("gpu-other-toleration", spec(gpu(1), tolerations=[{"key": "x", "operator": "Exists"}]), {}),
        ("gpu-two-resources", spec(gpu(1, "a"), gpu(1, "b", resource="amd.com/gpu")), {}),
        ("gpu-zero", spec(gpu(0)), {}),
        ("gpu-init", spec(ctr("a"), initContainers=[gpu(1, "warm")]), {}),
        ("cpu", spec(ctr("a"), ctr("b")), {}),
        ("cpu-env", spec(ctr("a", env=[{"name": "X", "value": "1"}])), {}),
        ("cpu-visible-void", spec(ctr("a", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])), {}),
        ("mixed", spec(gpu(2, "train"), ctr("side"), initContainers=[ctr("init")]), {}),
        ("hami", spec(ctr("a", limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}), ctr("b")), {}),
        ("kai", spec(ctr("a"), ctr("b")), {"gpu-fraction": "0.5"}),
        ("dcgm", spec(ctr("a"), serviceAccountName="dcgm"), {}),
        ("shared", spec(gpu(1, resource="nvidia.com/gpu.shared"), ctr("b")), {}),
    ]
    cases = []
    for namespace in (NS, RESEARCH, HIDE, TRUSTED, LAB):
        for name, s, meta in specs:
            cases.append(Case(f"m-{name}", namespace, as_pod(f"m-{name}", s, meta)))
    return cases


# --- the comparison ---------------------------------------------------------------------------------------------

BUILTIN = ("Pod", "Deployment", "CronJob")


@dataclass
class Seen:
    """What the native engine answered for one case, however it was asked (celeval or a real apiserver)."""

    allowed: bool
    message: str
    warnings: list[str]
    decoded: dict[str, Any] | None = None  # the object as the apiserver decoded it, where known
    by_apiserver: bool = False  # refused before admission, by the apiserver's own validation
    errors: list[str] = field(default_factory=list)  # expressions that did not evaluate


@dataclass
class Differences:
    verdicts: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    admitted: int = 0
    refused: int = 0
    warned: int = 0
    skipped: int = 0

    def __bool__(self) -> bool:
        return bool(self.verdicts or self.words)

    def summary(self, what: str, cases: int) -> str:
        return (f"{what}: {cases} objects, {self.admitted} admitted ({self.warned} warned), {self.refused} refused, "
                f"{self.skipped} left to the webhook; {len(self.verdicts)} verdicts and {len(self.words)} words "
                f"differ")

    def details(self, limit: int = 30) -> str:
        return "\n".join((self.verdicts + self.words)[:limit])


def compare(policies: PolicySet, generated: Generated, cases: Sequence[Case], seen: Sequence[Seen],
            view: ClusterView | None = None) -> Differences:
    """Each case's native answer against ``webhook.rules.admission.decide`` on the object as the apiserver decoded
    it (with the cluster ``view``, if given), for the rules the generated policies carry natively: the same verdict,
    every denial's and every warning's words (for built-in kinds the path: their values are the apiserver's
    canonical ones, "1e400" is "10e399")."""
    native = set(generated.native)
    claims = any(o["metadata"]["name"].startswith("gpu-webhook-claims-") for o in generated.objects)
    out = Differences()
    for case, answer in zip(cases, seen, strict=True):
        if case.kind.startswith("ResourceClaim") and not claims:
            out.skipped += 1  # resource.k8s.io/v1 is not served: the claims stay with the webhook
            continue
        obj = answer.decoded or case.obj
        expected = admission.decide(obj, group_of(case.obj["apiVersion"]), case.kind, case.namespace, policies, view)
        builtin = case.kind in BUILTIN
        where = f"{case.namespace}/{case.kind}/{case.name}"
        if answer.by_apiserver:
            # Refused before admission by the apiserver's own validation: the webhook must refuse it too.
            out.refused += 1
            if expected.allowed:
                out.verdicts.append(f"{where}: the apiserver refuses ({answer.message[:200]!r}), the webhook admits")
            continue
        carried = [(v, a) for v, a in zip(expected.violations, expected.actions, strict=True)
                   if v.rule in native and not (builtin and v.rule in CUSTOM_ONLY)]
        denied = [v for v, a in carried if a == "deny"]
        warned = [v for v, a in carried if a == "warn"]
        out.admitted += answer.allowed
        out.refused += not answer.allowed
        out.warned += bool(answer.allowed and answer.warnings)
        if answer.allowed == bool(denied) or answer.errors:
            out.verdicts.append(f"{where}: native {answer.allowed} {answer.message[:200]!r} {answer.errors[:1]}, "
                                f"webhook {[str(v) for v in denied][:2]}")
            continue
        warnings = " ".join(answer.warnings)
        for violation in denied:
            said = f"{violation.path}: " if builtin else str(violation)
            if said not in answer.message:
                out.words.append(f"{where}: {said!r} not in {answer.message!r}")
        for violation in warned:
            said = f"{violation.path}: " if builtin else str(violation)
            if said not in warnings:
                out.words.append(f"{where}: no warning {said!r} in {warnings!r}")
    return out


def mutation_differences(policies: PolicySet, cases: Sequence[Case], answers: Sequence[Any],
                         view: ClusterView | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """Each case's Pod as the MutatingAdmissionPolicy left it (celeval's answers) against the webhook's own patch
    (``admission.mutate``, with the cluster ``view`` if given): the differences, and the pod specs the policy gave."""
    differ, specs = [], []
    for case, answer in zip(cases, answers, strict=True):
        seen = answer.decoded or case.obj
        request = {"uid": "u", "operation": "CREATE", "namespace": case.namespace,
                   "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": seen}
        expected = jsonpatch.apply_patch(seen, list(admission.mutate(request, policies, view).patch))
        got = answer.mutated or seen
        specs.append(got["spec"])
        if expected["spec"] != got["spec"] or answer.errors:
            differ.append(f"{case.namespace}/{case.name}: {answer.errors} expected {expected['spec']} "
                          f"got {got['spec']}")
    return differ, specs
