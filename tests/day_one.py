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
# The one documented setting that makes the tenant rules deny in the tenants' namespaces (docs/isolation.md).
STRICT = "isolation: {tenantNamespaces: [team-*]}\n"

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
EVERY_TAINT = [{"operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists", "effect": "NoExecute"}]


@dataclass
class Case:
    name: str
    namespace: str
    obj: dict[str, Any]
    expected: dict[str, str] = field(default_factory=dict)  # rule -> deny | warn
    # the same under STRICT (isolation.tenantNamespaces names the tenants' namespaces); None: as ``expected``
    strict: dict[str, str] | None = None

    def expects(self, strict: bool) -> dict[str, str]:
        return self.expected if not strict or self.strict is None else self.strict

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


CONTROL_PLANE = [{"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"},
                 {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]
EVERYTHING = [{"operator": "Exists"}]


def _mounted(*volumes: tuple[str, str, str]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """(name, host path, mount path) each: the container's mounts and the pod's hostPath volumes."""
    return [(n, m) for n, _, m in volumes], [_host(n, h) for n, h, _ in volumes]


def agents() -> list[Case]:
    """Node agents that install outside the platform namespaces, each in the namespace its project documents (or,
    with none, in ``monitoring`` or ``datadog``), in the shape the projects document for their charts'
    defaults: privileged or not, what they mount from the host, what they tolerate. No agent is refused: where a
    tenant rule finds something, on a pod that asks for no GPU outside a tenant namespace, it warns.

    Written for these tests from the facts (namespaces, privilege, host paths, tolerations), not from the charts."""
    host_dev = ("dev", "/dev", "/host/dev")
    falco_mounts, falco_volumes = _mounted(host_dev, ("proc", "/proc", "/host/proc"), ("boot", "/boot", "/host/boot"),
                                           ("lib-modules", "/lib/modules", "/host/lib/modules"),
                                           ("usr", "/usr", "/host/usr"), ("etc", "/etc", "/host/etc"))
    sysdig_mounts, sysdig_volumes = _mounted(host_dev, ("proc", "/proc", "/host/proc"), ("run", "/run", "/host/run"),
                                             ("boot", "/boot", "/host/boot"), ("usr", "/usr", "/host/usr"))
    root_ro = ("root", "/", "/host/root")
    exporter_mounts, exporter_volumes = _mounted(("proc", "/proc", "/host/proc"), ("sys", "/sys", "/host/sys"), root_ro)
    datadog_mounts, datadog_volumes = _mounted(("procdir", "/proc", "/host/proc"),
                                               ("cgroups", "/sys/fs/cgroup", "/host/sys/fs/cgroup"), root_ro)
    caps = {"capabilities": {"add": ["SYS_ADMIN", "SYS_PTRACE", "NET_ADMIN"]}}
    lvm_mounts, lvm_volumes = _mounted(("device-dir", "/dev", "/dev"), ("plugin-dir", "/var/lib/kubelet/plugins/lvm",
                                                                        "/plugin"))
    objects: list[tuple[dict[str, Any], dict[str, str]]] = [
        (daemonset("falco", "falco", [_ctr("falco", privileged=True, mounts=falco_mounts)], volumes=falco_volumes,
                   tolerations=CONTROL_PLANE), {"gpu-device-mount": "warn"}),
        (daemonset("sysdig-agent", "sysdig-agent", [_ctr("sysdig", privileged=True, mounts=sysdig_mounts)],
                   init=[_ctr("sysdig-agent-kmodule", privileged=True, mounts=sysdig_mounts)],
                   volumes=sysdig_volumes, tolerations=CONTROL_PLANE, hostNetwork=True, hostPID=True),
         {"gpu-device-mount": "warn"}),
        (daemonset("dynakube-oneagent", "dynatrace",
                   [_ctr("dynatrace-oneagent", mounts=[("host-root", "/mnt/root")], securityContext=caps)],
                   volumes=[_host("host-root", "/")], tolerations=[], hostNetwork=True, hostPID=True), {}),
        (daemonset("prometheus-node-exporter", "monitoring",
                   [_ctr("node-exporter", mounts=exporter_mounts, securityContext={"readOnlyRootFilesystem": True})],
                   volumes=exporter_volumes, tolerations=[{"operator": "Exists", "effect": "NoSchedule"}],
                   hostNetwork=True, hostPID=True), {}),
        (daemonset("datadog", "datadog",
                   [_ctr("agent", env={"NVIDIA_VISIBLE_DEVICES": "all"}, mounts=datadog_mounts),
                    _ctr("system-probe", securityContext=caps, mounts=datadog_mounts[:2])],
                   volumes=datadog_volumes, tolerations=[], runtimeClassName="nvidia"),
         {"visible-devices-without-gpu": "warn", "runtime-class-without-gpu": "warn"}),
        (daemonset("openebs-lvm-localpv-node", "openebs",
                   [_ctr("csi-node-driver-registrar"), _ctr("openebs-lvm-plugin", privileged=True, mounts=lvm_mounts)],
                   volumes=lvm_volumes, tolerations=[], hostNetwork=True), {"gpu-device-mount": "warn"}),
        (daemonset("portworx", "portworx", [_ctr("portworx", privileged=True, mounts=[("dev", "/dev")])],
                   volumes=[_host("dev", "/dev")], tolerations=[], hostNetwork=True, hostPID=True),
         {"gpu-device-mount": "warn"}),
        (daemonset("rdma-shared-dp-ds", "nvidia-network-operator",
                   [_ctr("rdma-shared-dp", privileged=True, mounts=[("devs", "/dev/"), ("plugins",
                                                                                        "/var/lib/kubelet/")])],
                   volumes=[_host("devs", "/dev/"), _host("plugins", "/var/lib/kubelet/")],
                   tolerations=[*CONTROL_PLANE, GPU_TOLERATION], hostNetwork=True),
         {"privileged-gpu": "warn", "gpu-device-mount": "warn", "cpu-pod-on-gpu-nodes": "warn"}),
        (daemonset("mofed-ubuntu24.04-ds", "nvidia-network-operator",
                   [_ctr("mofed-container", privileged=True, mounts=[("ib", "/dev/infiniband"), ("etc", "/host/etc")])],
                   volumes=[_host("ib", "/dev/infiniband"), _host("etc", "/etc"), _host("modules", "/lib/modules")],
                   tolerations=[*CONTROL_PLANE, GPU_TOLERATION], hostNetwork=True, hostPID=True),
         {"privileged-gpu": "warn", "cpu-pod-on-gpu-nodes": "warn"}),
        (daemonset("kube-multus-ds", "kube-system",
                   [_ctr("kube-multus", privileged=True, mounts=[("hostroot", "/hostroot"), ("run", "/run")])],
                   volumes=[_host("hostroot", "/"), _host("run", "/run")], tolerations=EVERY_TAINT,
                   hostNetwork=True, hostPID=True), {}),
        (daemonset("node-problem-detector", "kube-system",
                   [_ctr("node-problem-detector", privileged=True,
                         mounts=[("kmsg", "/dev/kmsg"), ("log", "/var/log")])],
                   volumes=[_host("kmsg", "/dev/kmsg"), _host("log", "/var/log/")], tolerations=EVERY_TAINT), {}),
        (daemonset("cilium", "kube-system",
                   [_ctr("cilium-agent", securityContext={"capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN"]}},
                         mounts=[("bpf-maps", "/sys/fs/bpf")])],
                   init=[_ctr("mount-bpf-fs", privileged=True, mounts=[("bpf-maps", "/sys/fs/bpf")])],
                   volumes=[_host("bpf-maps", "/sys/fs/bpf"), _host("hostproc", "/proc")], tolerations=EVERYTHING,
                   hostNetwork=True), {}),
        (daemonset("istio-cni-node", "istio-system",
                   [_ctr("install-cni", securityContext={"privileged": False, "capabilities": {
                       "add": ["NET_ADMIN", "NET_RAW", "SYS_PTRACE", "SYS_ADMIN"]}},
                         mounts=[("cni-bin-dir", "/host/opt/cni/bin")])],
                   volumes=[_host("cni-bin-dir", "/opt/cni/bin"), _host("cni-netns-dir", "/var/run/netns")],
                   tolerations=[*EVERY_TAINT, {"key": "CriticalAddonsOnly", "operator": "Exists"}]), {}),
        (daemonset("linkerd-cni", "linkerd-cni",
                   [_ctr("install-cni", securityContext={"privileged": False},
                         mounts=[("cni-bin-dir", "/host/opt/cni/bin")])],
                   volumes=[_host("cni-bin-dir", "/opt/cni/bin"), _host("cni-net-dir", "/etc/cni/net.d")],
                   tolerations=EVERYTHING), {}),
    ]
    return [Case(f"agent/{o['metadata']['namespace']}/{o['metadata']['name']}", o["metadata"]["namespace"], o,
                 expected) for o, expected in objects]


AGENT_NAMESPACES = ("falco", "sysdig-agent", "dynatrace", "monitoring", "datadog", "openebs", "portworx",
                    "nvidia-network-operator", "istio-system", "linkerd-cni")


def agents_elsewhere(namespace: str = "observability") -> list[Case]:
    """The same agents installed into another namespace that is no tenant's (a chart's release namespace): found
    alike, never refused, whatever the rules find."""
    out = []
    for case in agents():
        obj = {**case.obj, "metadata": {**case.obj["metadata"], "namespace": namespace}}
        out.append(Case(f"agent-in-{namespace}/{case.obj['metadata']['name']}", namespace, obj))
    return out


def excluded() -> list[Case]:
    """The device plugin's DaemonSets, Multus, node-problem-detector and Cilium in kube-system: every engine leaves the
    namespace alone (``agents_elsewhere`` holds the agents to the rules in a namespace that is looked at)."""
    return [*device_plugin("kube-system"), *(c for c in agents() if c.namespace == "kube-system")]


EVERY_TAINT_MESSAGE = "is privileged and its pod tolerates every taint: on a GPU node it sees every GPU"


def tenants() -> list[Case]:
    """What the isolation rules exist for, written by a tenant: refused (or warned) as ever."""
    agent = calico_node(TENANT)
    agent.obj["metadata"]["name"] = "my-agent"
    agent.name = "tenant/privileged-daemonset-tolerating-every-taint"
    agent.expected = {"privileged-gpu": "warn"}
    agent.strict = {"privileged-gpu": "deny"}
    # A pod's own privileged container that tolerates every taint, and a CPU pod that names every GPU under the
    # NVIDIA runtime: the exploit shapes of a tenant, warned by default and refused where tenants are named.
    everywhere = _pod("everywhere", TENANT, {"containers": [_ctr("app", privileged=True)],
                                              "tolerations": [{"operator": "Exists"}]})
    runtime_leak = _pod("runtime-leak", TENANT, {"runtimeClassName": "nvidia", "containers": [
        _ctr("app", env={"NVIDIA_VISIBLE_DEVICES": "all"})]})
    leaky = _pod("leaky", TENANT, {"containers": [_ctr("app", env={"NVIDIA_VISIBLE_DEVICES": "all"})]})
    # The device nodes by hostPath: a privileged GPU container opens every one (refused, the pod asks for a GPU);
    # one that is not privileged opens none but its own (the device cgroup).
    devices = _pod("devices", TENANT, {"containers": [_ctr("app", gpus=1, privileged=True,
                                                           mounts=[("dev", "/dev/nvidia0")])],
                                       "volumes": [_host("dev", "/dev/nvidia0")]})
    unprivileged = _pod("dev-unprivileged", TENANT, {"containers": [_ctr("app", gpus=1, mounts=[("dev", "/dev")])],
                                                     "volumes": [_host("dev", "/dev")]})
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
        Case("tenant/privileged-pod-tolerating-every-taint", TENANT, everywhere, {"privileged-gpu": "warn"},
             {"privileged-gpu": "deny"}),
        Case("tenant/visible-devices-all-under-nvidia-runtime", TENANT, runtime_leak,
             {"visible-devices-without-gpu": "warn", "runtime-class-without-gpu": "warn"},
             {"visible-devices-without-gpu": "deny", "runtime-class-without-gpu": "warn"}),
        Case("tenant/visible-devices-all", TENANT, leaky, {"visible-devices-without-gpu": "warn"},
             {"visible-devices-without-gpu": "deny"}),
        Case("tenant/device-hostpath", TENANT, devices, {"privileged-gpu": "deny", "gpu-device-mount": "deny"}),
        Case("tenant/device-hostpath-unprivileged", TENANT, unprivileged),
        Case("tenant/cdi-annotation", TENANT, cdi, {"cdi-annotation": "warn"}, {"cdi-annotation": "deny"}),
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
        # its operator's own form: a count and the resource it counts, copied into requests and limits alike
        *([] if request is not None else [
            ("vllmruntime", {"apiVersion": "production-stack.vllm.ai/v1alpha1", "kind": "VLLMRuntime",
                             "metadata": {"name": "opt", "namespace": TENANT},
                             "spec": {"model": {"modelURL": "facebook/opt-125m"}, "deploymentConfig": {
                                 "replicas": 1, "resources": {"cpu": "5", "memory": "32Gi", "gpu": str(gpu),
                                                              "gpuType": "nvidia.com/gpu"}}}})]),
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
    return [*platform(), *(c for c in agents() if c.namespace != "kube-system"), *tenants(), *kinds()]
