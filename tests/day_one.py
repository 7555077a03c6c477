"""Day one on a real cluster: what the platform installs, what tenants write, and the kinds users run.

Written for these tests from the shapes the projects document (not copied from their files):

- the NVIDIA GPU Operator's operands as the operator renders them in its namespace (driver, container toolkit,
  device plugin, GPU feature discovery, DCGM exporter, MIG manager, the validator and the CUDA validator pod it
  starts, Node Feature Discovery's worker, the DRA driver's kubelet plugin and the DCGM exporter's admin claim);
- the NVIDIA device plugin's static DaemonSets, in kube-system and in the plugin's own namespace;
- a calico-node-shaped DaemonSet in calico-system (privileged, tolerating every taint);
- tenants' objects the isolation rules exist for, and Kueue's LeaderWorkerSet sample shape with a GPU request and
  no limit;
- the kinds that keep GPUs outside a pod template (KServe, the NIM operator, the vLLM production stack, Kubeflow
  Trainer v2 and notebooks v2), right and wrong, and GPUs in a kind nothing knows.

Each case says what every engine must find on it, rule by rule, with the default policy: ``{rule: action}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPERATOR = "gpu-operator"
TENANT = "team-a"

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
EVERY_TAINT = [{"operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists", "effect": "NoExecute"}]


@dataclass
class Case:
    name: str
    namespace: str
    obj: dict[str, Any]
    expected: dict[str, str] = field(default_factory=dict)  # rule -> deny | warn

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def group(self) -> str:
        version = str(self.obj["apiVersion"])
        return version.split("/", 1)[0] if "/" in version else ""


def _ctr(name: str, privileged: bool = False, env: dict[str, str] | None = None, gpus: int = 0,
         mounts: list[tuple[str, str]] | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": f"registry.invalid/{name}:v1"}
    if privileged:
        c["securityContext"] = {"privileged": True}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if mounts:
        c["volumeMounts"] = [{"name": n, "mountPath": p} for n, p in mounts]
    c.update(extra)
    return c


def _host(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path}}


def daemonset(name: str, namespace: str, containers: list[dict[str, Any]], *, init: list[dict[str, Any]] = (),
              volumes: list[dict[str, Any]] = (), tolerations: list[dict[str, Any]] | None = None,
              annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"serviceAccountName": name, "containers": containers,
                           "tolerations": [GPU_TOLERATION] if tolerations is None else tolerations, **spec}
    if init:
        pod["initContainers"] = list(init)
    if volumes:
        pod["volumes"] = list(volumes)
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": annotations or {}}, "spec": pod}}}


def _pod(name: str, namespace: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}}, "spec": spec}


def operands(namespace: str = OPERATOR) -> list[Case]:
    """The GPU Operator's operands: privileged, the host's root mounted, every GPU visible, CDI, admin access."""
    node_critical = {"priorityClassName": "system-node-critical"}
    driver_validation = _ctr("driver-validation", privileged=True, env={"NVIDIA_VISIBLE_DEVICES": "all"},
                             mounts=[("host-root", "/host"), ("driver-install-dir", "/run/nvidia/driver")])
    toolkit_validation = _ctr("toolkit-validation", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    objects = [
        daemonset("nvidia-driver-daemonset", namespace,
                  [_ctr("nvidia-driver-ctr", privileged=True, mounts=[("run-nvidia", "/run/nvidia")])],
                  init=[_ctr("k8s-driver-manager", privileged=True)],
                  volumes=[_host("run-nvidia", "/run/nvidia"), _host("host-root", "/"), _host("dev-log", "/dev/log")],
                  hostPID=True, nodeSelector={"nvidia.com/gpu.deploy.driver": "true"}, **node_critical),
        daemonset("nvidia-container-toolkit-daemonset", namespace,
                  [_ctr("nvidia-container-toolkit-ctr", privileged=True,
                        env={"NVIDIA_VISIBLE_DEVICES": "void", "RUNTIME": "containerd"})],
                  init=[driver_validation],
                  volumes=[_host("host-root", "/"), _host("driver-install-dir", "/run/nvidia/driver"),
                           _host("containerd", "/run/containerd")],
                  hostPID=True, **node_critical),
        daemonset("nvidia-device-plugin-daemonset", namespace,
                  [_ctr("nvidia-device-plugin", privileged=True, env={"NVIDIA_VISIBLE_DEVICES": "all",
                                                                      "DEVICE_LIST_STRATEGY": "envvar"})],
                  init=[toolkit_validation], runtimeClassName="nvidia",
                  volumes=[_host("device-plugin", "/var/lib/kubelet/device-plugins"), _host("host-root", "/")],
                  **node_critical),
        daemonset("gpu-feature-discovery", namespace,
                  [_ctr("gpu-feature-discovery", privileged=True, env={"NVIDIA_VISIBLE_DEVICES": "all"})],
                  init=[toolkit_validation], runtimeClassName="nvidia",
                  volumes=[_host("output-dir", "/etc/kubernetes/node-feature-discovery/features.d"),
                           _host("host-sys", "/sys")], **node_critical),
        daemonset("nvidia-dcgm-exporter", namespace,
                  [_ctr("nvidia-dcgm-exporter", privileged=True, env={"NVIDIA_VISIBLE_DEVICES": "all"})],
                  init=[toolkit_validation], runtimeClassName="nvidia",
                  volumes=[_host("pod-gpu-resources", "/var/lib/kubelet/pod-resources")], **node_critical),
        daemonset("nvidia-mig-manager", namespace,
                  [_ctr("nvidia-mig-manager", privileged=True, env={"NVIDIA_VISIBLE_DEVICES": "all"})],
                  init=[toolkit_validation], runtimeClassName="nvidia", hostPID=True,
                  volumes=[_host("host-root", "/"), _host("host-sys", "/sys")], **node_critical),
        daemonset("nvidia-operator-validator", namespace, [_ctr("nvidia-operator-validator", privileged=True)],
                  init=[driver_validation, toolkit_validation,
                        _ctr("cuda-validation", privileged=True), _ctr("plugin-validation", privileged=True)],
                  runtimeClassName="nvidia",
                  volumes=[_host("host-root", "/"), _host("driver-install-dir", "/run/nvidia/driver"),
                           _host("run-nvidia", "/run/nvidia")],
                  **node_critical),
        daemonset("nvidia-operator-node-feature-discovery-worker", namespace,
                  [_ctr("worker", mounts=[("host-sys", "/host-sys")])],
                  volumes=[_host("host-sys", "/sys"), _host("host-boot", "/boot")]),
        # The validator starts these on its node: nodeName set, a GPU in an init container, CDI injection.
        _pod("nvidia-cuda-validator-x7k2p", namespace,
             {"nodeName": "gpu-node-1", "restartPolicy": "OnFailure", "runtimeClassName": "nvidia",
              "tolerations": [GPU_TOLERATION], "initContainers": [_ctr("cuda-validation", gpus=1)],
              "containers": [_ctr("nvidia-cuda-validator")]},
             annotations={"cdi.k8s.io/cuda-validation": "nvidia.com/gpu=all"}),
        _pod("nvidia-device-plugin-validator-q9w4t", namespace,
             {"nodeName": "gpu-node-1", "restartPolicy": "OnFailure", "runtimeClassName": "nvidia",
              "tolerations": [GPU_TOLERATION], "initContainers": [_ctr("plugin-validation", gpus=1)],
              "containers": [_ctr("nvidia-device-plugin-validator")]}),
        # DRA mode: the DRA driver's kubelet plugin, and the DCGM exporter's claim on every GPU of its node.
        daemonset("nvidia-dra-driver-gpu-kubelet-plugin", namespace,
                  [_ctr("gpus", privileged=True, env={"NVIDIA_VISIBLE_DEVICES": "all"}),
                   _ctr("compute-domains", privileged=True)],
                  volumes=[_host("plugins", "/var/lib/kubelet/plugins"), _host("driver-root", "/run/nvidia/driver"),
                           _host("cdi", "/var/run/cdi")]),
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "nvidia-dcgm-exporter-gpus", "namespace": namespace},
         "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
             "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True}}]}}}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpu-operator", "namespace": namespace},
         "spec": {"selector": {"matchLabels": {"app": "gpu-operator"}}, "template": {
             "metadata": {"labels": {"app": "gpu-operator"}},
             "spec": {"serviceAccountName": "gpu-operator", "containers": [_ctr("gpu-operator")],
                      "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                                       "effect": "NoSchedule"}]}}}},
    ]
    return [Case(f"operator/{o['kind']}/{o['metadata']['name']}", namespace, o) for o in objects]


def device_plugin(namespace: str) -> list[Case]:
    """The device plugin's static DaemonSets: plain, with the CPU manager's privileged variant, and with MPS."""
    plugin = [_ctr("nvidia-device-plugin-ctr", env={"FAIL_ON_INIT_ERROR": "false"},
                   mounts=[("device-plugin", "/var/lib/kubelet/device-plugins")],
                   securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}})]
    privileged = [_ctr("nvidia-device-plugin-ctr", privileged=True,
                       mounts=[("device-plugin", "/var/lib/kubelet/device-plugins")])]
    volumes = [_host("device-plugin", "/var/lib/kubelet/device-plugins")]
    objects = [
        daemonset("nvidia-device-plugin-daemonset", namespace, plugin, volumes=volumes,
                  tolerations=[GPU_TOLERATION], priorityClassName="system-node-critical"),
        daemonset("nvidia-device-plugin-privileged", namespace, privileged, volumes=volumes,
                  tolerations=[GPU_TOLERATION], priorityClassName="system-node-critical"),
        daemonset("nvidia-device-plugin-mps-control-daemon", namespace,
                  [_ctr("mps-control-daemon-ctr", privileged=True)], volumes=[_host("mps-root", "/run/nvidia/mps")],
                  tolerations=[GPU_TOLERATION], hostPID=True, nodeSelector={"nvidia.com/mps.capable": "true"}),
    ]
    return [Case(f"device-plugin/{namespace}/{o['metadata']['name']}", namespace, o) for o in objects]


def calico_node(namespace: str = "calico-system") -> Case:
    obj = daemonset("calico-node", namespace,
                    [_ctr("calico-node", privileged=True, mounts=[("lib-modules", "/lib/modules")])],
                    init=[_ctr("install-cni", privileged=True), _ctr("flexvol-driver", privileged=True)],
                    volumes=[_host("lib-modules", "/lib/modules"), _host("var-run-calico", "/var/run/calico"),
                             _host("cni-bin-dir", "/opt/cni/bin")],
                    tolerations=[*EVERY_TAINT, {"key": "CriticalAddonsOnly", "operator": "Exists"}],
                    hostNetwork=True, priorityClassName="system-node-critical")
    return Case(f"calico/{namespace}/calico-node", namespace, obj)


PLATFORM_NAMESPACES = (OPERATOR, "nvidia-device-plugin", "calico-system")


def platform() -> list[Case]:
    """What the platform installs: no finding at all with the default policy."""
    return [*operands(), *device_plugin("nvidia-device-plugin"), calico_node()]


def excluded() -> list[Case]:
    """The device plugin's DaemonSets in kube-system: every engine leaves the namespace alone."""
    return device_plugin("kube-system")


EVERY_TAINT_MESSAGE = "is privileged and its pod tolerates every taint: on a GPU node it sees every GPU"


def tenants() -> list[Case]:
    """What the isolation rules exist for, written by a tenant: refused (or warned) as ever."""
    agent = calico_node(TENANT)
    agent.obj["metadata"]["name"] = "my-agent"
    agent.name = "tenant/privileged-daemonset-tolerating-every-taint"
    agent.expected = {"privileged-gpu": "deny"}
    leaky = _pod("leaky", TENANT, {"containers": [_ctr("app", env={"NVIDIA_VISIBLE_DEVICES": "all"})]})
    devices = _pod("devices", TENANT, {"containers": [_ctr("app", gpus=1, mounts=[("dev", "/dev/nvidia0")])],
                                       "volumes": [_host("dev", "/dev/nvidia0")]})
    cdi = _pod("cdi", TENANT, {"containers": [_ctr("app")]}, annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"})
    admin = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "all-gpus",
                                                                                        "namespace": TENANT},
             "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                 "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True}}]}}}
    # Kueue's LeaderWorkerSet sample shape: the GPU requested, no limit.
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "vllm", "namespace": TENANT, "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": [
               {"name": "vllm-worker", "image": "vllm/vllm-openai:v0",
                "resources": {"requests": {"cpu": "2", "nvidia.com/gpu": "1"}}}]}}}}}
    return [
        agent,
        Case("tenant/visible-devices-all", TENANT, leaky, {"visible-devices-without-gpu": "deny"}),
        Case("tenant/device-hostpath", TENANT, devices, {"gpu-device-mount": "deny"}),
        Case("tenant/cdi-annotation", TENANT, cdi, {"cdi-annotation": "deny"}),
        Case("tenant/admin-claim", TENANT, admin, {"admin-access": "deny"}),
        Case("tenant/kueue-lws-request-without-limit", TENANT, lws, {"requests-without-limits": "deny"}),
    ]


def _isvc(component: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {"name": "llm", "namespace": TENANT}, "spec": {"predictor": component}}


def _kinds(gpu: Any, request: Any = None) -> list[tuple[str, dict[str, Any]]]:
    """Each kind that keeps GPUs in a resource block, with ``gpu`` as its limit (and ``request`` as its request)."""
    def block() -> dict[str, Any]:
        out: dict[str, Any] = {"limits": {"nvidia.com/gpu": gpu}}
        if request is not None:
            out["requests"] = {"nvidia.com/gpu": request}
        return out
    return [
        ("isvc-model", _isvc({"model": {"modelFormat": {"name": "huggingface"}, "resources": block()}})),
        ("isvc-framework", _isvc({"pytorch": {"storageUri": "pvc://models/x", "resources": block()}})),
        ("nimservice", {"apiVersion": "apps.nvidia.com/v1alpha1", "kind": "NIMService",
                        "metadata": {"name": "llama", "namespace": TENANT},
                        "spec": {"image": {"repository": "nvcr.invalid/nim/llama", "tag": "1"}, "resources": block()}}),
        ("vllmruntime", {"apiVersion": "production-stack.vllm.ai/v1alpha1", "kind": "VLLMRuntime",
                         "metadata": {"name": "opt", "namespace": TENANT},
                         "spec": {"model": {"modelURL": "facebook/opt-125m"},
                                  "deploymentConfig": {"replicas": 1, "resources": block()}}}),
        ("trainjob", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                      "metadata": {"name": "fine-tune", "namespace": TENANT},
                      "spec": {"runtimeRef": {"name": "torch-distributed"},
                               "trainer": {"numNodes": 2, "resourcesPerNode": block()}}}),
        ("workspacekind", {"apiVersion": "kubeflow.org/v1beta1", "kind": "WorkspaceKind",
                           "metadata": {"name": "jupyterlab"},
                           "spec": {"podTemplate": {"options": {"podConfig": {"default": "gpu", "values": [
                               {"id": "small-cpu", "spec": {"resources": {"requests": {"cpu": "1"}}}},
                               {"id": "gpu", "spec": {"resources": block()}}]}}}}}),
    ]


def kinds() -> list[Case]:
    """The kinds that keep GPUs outside a pod template: a fractional GPU refused, a whole one admitted, a request
    that differs from its limit refused; and GPUs where nothing reads them, warned."""
    cases = []
    for variant, (gpu, request), expected in (("fractional", ("500m", None), {"invalid-quantity": "deny"}),
                                               ("one-gpu", (1, None), {}),
                                               ("requests-differ", (2, 1), {"requests-differ": "deny"})):
        for name, obj in _kinds(gpu, request):
            obj["metadata"]["name"] = f"{name}-{variant}"
            cases.append(Case(f"kinds/{name}-{variant}", obj["metadata"].get("namespace", ""), obj, expected))
    unknown = {"apiVersion": "example.com/v1", "kind": "ModelServer", "metadata": {"name": "m", "namespace": TENANT},
               "spec": {"accelerators": {"limits": {"nvidia.com/gpu": "500m"}}}}
    queue = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "research"},
             "spec": {"weight": 1, "capability": {"cpu": "64", "nvidia.com/gpu": 8}}}
    nothing = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": TENANT},
               "data": {"gpus": "2"}}
    cases += [
        Case("unseen/unknown-kind", TENANT, unknown, {"unchecked-gpu": "warn"}),
        Case("unseen/volcano-queue", "", queue, {"unchecked-gpu": "warn"}),
        Case("unseen/configmap", TENANT, nothing),
    ]
    return cases


def corpus() -> list[Case]:
    return [*platform(), *tenants(), *kinds()]
