"""GPU isolation rules, as a table: a manifest, a policy, a namespace, and the violations it must produce.

Each line reads as the spec: which container sees GPUs it was not given, and at which field path.
"""

from __future__ import annotations

import pytest

from tests.manifests import container, found, pod, runtime_class_view, workload
from webhook.core.policyfile import parse_policy
from webhook.rules.admission import decide

GPU = "nvidia.com/gpu"
NVD = "NVIDIA_VISIBLE_DEVICES"
DEFAULT = parse_policy("{}")
TRUSTING = parse_policy("isolation: {trusted: {namespaces: [gpu-operator], serviceAccounts: [monitoring/dcgm]}}")
HIDING = parse_policy("isolation: {hideGpus: void}")
AKS = parse_policy("platform: aks")
CLUSTER = parse_policy("cluster: {enabled: true}")
INJECTING = parse_policy("cluster: {enabled: true}\nisolation: {runtimeClass: nvidia}")
WITH_DEFAULT = parse_policy("cluster: {enabled: true}\naccelerator: {default: nvidia-l4}")
CDI = parse_policy("isolation: {nvidiaRuntime: cdi}")
CDI_INJECTING = parse_policy("isolation: {nvidiaRuntime: cdi, runtimeClass: nvidia}")
TENANTS = parse_policy("isolation: {tenantNamespaces: [default]}")

C0 = "spec.containers[0]"
C1 = "spec.containers[1]"
E0 = f"{C0}.env[0].value"


def env(name=NVD, value="all", **item):
    return [{"name": name, "value": value, **item}] if value is not None else [{"name": name, **item}]


def cpu(name="main", **extra):
    return container(name, **extra)


def gpu(name="main", n=1, **extra):
    return container(name, limits={GPU: n}, **extra)


PRIVILEGED = {"securityContext": {"privileged": True}}


def host_path(path):
    return [{"name": "dev", "hostPath": {"path": path}}]


def mounting(path, name="agent", **extra):
    """A privileged container that mounts the ``host_path`` volume: only such a one can open a device through it."""
    return cpu(name, volumeMounts=[{"name": "dev", "mountPath": "/host"}], **PRIVILEGED, **extra)


def mounted_path(path):
    """A pod whose privileged container mounts the host's ``path``."""
    return pod(mounting(path), volumes=host_path(path))


def mount(path):
    return [{"name": "v", "mountPath": path}]


# (id, object, policy, namespace, expected (path, rule) set)
CASES = [
    # --- NVIDIA_VISIBLE_DEVICES on containers that hold no GPU
    ("a CPU pod asking for all GPUs by env", pod(cpu(env=env())), DEFAULT, "default",
     {(E0, "visible-devices-without-gpu")}),
    ("a CPU pod naming GPU 0", pod(cpu(env=env(value="0"))), DEFAULT, "default", {(E0, "visible-devices-without-gpu")}),
    ("a CPU pod naming a GPU UUID", pod(cpu(env=env(value="GPU-8f2c"))), DEFAULT, "default",
     {(E0, "visible-devices-without-gpu")}),
    ("NVIDIA_MIG_CONFIG_DEVICES=all", pod(cpu(env=env("NVIDIA_MIG_CONFIG_DEVICES"))), DEFAULT, "default",
     {(E0, "visible-devices-without-gpu")}),
    ("void is fine", pod(cpu(env=env(value="void"))), DEFAULT, "default", set()),
    ("none is fine", pod(cpu(env=env(value="none"))), DEFAULT, "default", set()),
    ("empty is fine (as void)", pod(cpu(env=env(value=""))), DEFAULT, "default", set()),
    ("no value at all is empty", pod(cpu(env=env(value=None))), DEFAULT, "default", set()),
    ("NONE is no keyword of the runtime", pod(cpu(env=env(value="NONE"))), DEFAULT, "default",
     {(E0, "visible-devices-without-gpu")}),
    ("CUDA_VISIBLE_DEVICES is the application's business", pod(cpu(env=env("CUDA_VISIBLE_DEVICES"))), DEFAULT,
     "default", set()),
    ("the variable after others", pod(cpu(env=[{"name": "A", "value": "1"}, *env()])), DEFAULT, "default",
     {(f"{C0}.env[1].value", "visible-devices-without-gpu")}),
    ("a GPU container may set it", pod(gpu(env=env())), DEFAULT, "default", set()),
    ("a CPU sidecar of a GPU container may not", pod(gpu(), cpu("sidecar", env=env())), DEFAULT, "default",
     {(f"{C1}.env[0].value", "visible-devices-without-gpu")}),
    ("a CPU init container", pod(gpu(), initContainers=[cpu("init", env=env(value="0,1"))]), DEFAULT, "default",
     {("spec.initContainers[0].env[0].value", "visible-devices-without-gpu")}),
    ("a GPU limit of 0 is no GPU", pod(gpu(n=0, env=env())), DEFAULT, "default",
     {(E0, "visible-devices-without-gpu"), (f"{C0}.resources.limits[{GPU}]", "zero-gpu-limit")}),
    ("a DRA claim is a GPU", pod(cpu(env=env(), resources={"claims": [{"name": "gpu"}]}),
                                resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
     DEFAULT, "default", set()),
    ("a time-sliced replica is a GPU", pod(cpu(env=env(), resources={"limits": {"nvidia.com/gpu.shared": 1}})),
     DEFAULT, "default", set()),
    ("an AMD partition is a GPU", pod(cpu(env=env(), resources={"limits": {"amd.com/cpx_nps4": 1}})),
     DEFAULT, "default", set()),
    ("HAMi memory alone is a GPU (HAMi adds the count)",
     pod(cpu(env=env(), resources={"limits": {"nvidia.com/gpumem": 3000}})), DEFAULT, "default", set()),
    ("a CPU container of a HAMi pod: HAMi's binder sets the variable",
     pod(container("gpu", limits={"nvidia.com/gpumem": 3000}), cpu("side", env=env())), DEFAULT, "default", set()),
    ("a KAI/Run:ai fraction annotation", pod(cpu(env=env()), annotations={"gpu-fraction": "0.5"}), DEFAULT,
     "default", set()),
    ("a Volcano vGPU", pod(cpu(env=env(), resources={"limits": {"volcano.sh/vgpu-number": 1}})), DEFAULT,
     "default", set()),
    ("in a Deployment's template",
     workload("Deployment", pod(cpu(env=env()))), DEFAULT, "default",
     {("spec.template.spec.containers[0].env[0].value", "visible-devices-without-gpu")}),
    ("off per namespace", pod(cpu(env=env())),
     parse_policy("namespaces: {lab: {checks: {visibleDevicesWithoutGpu: off}}}"), "lab", set()),
    ("a trusted namespace (the GPU Operator's DCGM exporter)", pod(cpu(env=env())), TRUSTING, "gpu-operator", set()),
    ("a trusted service account", pod(cpu(env=env()), serviceAccountName="dcgm"), TRUSTING, "monitoring", set()),
    ("the same account name in another namespace is not trusted", pod(cpu(env=env()), serviceAccountName="dcgm"),
     TRUSTING, "team-a", {(E0, "visible-devices-without-gpu")}),
    ("another account in the trusted account's namespace is not trusted", pod(cpu(env=env())), TRUSTING,
     "monitoring", {(E0, "visible-devices-without-gpu")}),
    # --- what admission cannot read
    ("valueFrom a ConfigMap", pod(cpu(env=env(value=None, valueFrom={"configMapKeyRef": {"name": "c", "key": "k"}}))),
     DEFAULT, "default", {(f"{C0}.env[0].valueFrom", "visible-devices-unread")}),
    ("envFrom a ConfigMap", pod(cpu(envFrom=[{"configMapRef": {"name": "settings"}}])), DEFAULT, "default",
     {(f"{C0}.envFrom[0]", "visible-devices-unread")}),
    ("envFrom with a prefix no device variable has", pod(cpu(envFrom=[{"prefix": "APP_", "secretRef": {"name": "s"}}])),
     DEFAULT, "default", set()),
    ("envFrom with a prefix that could still make it",
     pod(cpu(envFrom=[{"prefix": "NVIDIA_", "secretRef": {"name": "s"}}])),
     DEFAULT, "default", {(f"{C0}.envFrom[0]", "visible-devices-unread")}),
    ("envFrom, but env says void (env wins)",
     pod(cpu(env=env(value="void"), envFrom=[{"configMapRef": {"name": "settings"}}])), DEFAULT, "default", set()),
    ("envFrom where hideGpus sets the variable in env", pod(cpu(envFrom=[{"configMapRef": {"name": "settings"}}])),
     HIDING, "default", set()),
    ("envFrom on a GPU container", pod(gpu(envFrom=[{"configMapRef": {"name": "settings"}}])), DEFAULT, "default",
     set()),
    # --- hostPID
    ("hostPID on a GPU pod", pod(gpu(), hostPID=True), DEFAULT, "default", {("spec.hostPID", "host-pid-gpu")}),
    ("hostPID on a GPU pod of a trusted service account", pod(gpu(), hostPID=True, serviceAccountName="dcgm"),
     TRUSTING, "monitoring", set()),
    ("hostPID on a CPU pod", pod(cpu(), hostPID=True), DEFAULT, "default", set()),
    ("hostPID false on a GPU pod", pod(gpu(), hostPID=False), DEFAULT, "default", set()),
    ("hostPID as a string is no hostPID", pod(gpu(), hostPID="true"), DEFAULT, "default", set()),
    # --- privileged
    ("a privileged GPU container", pod(gpu(**PRIVILEGED)), DEFAULT, "default",
     {(f"{C0}.securityContext.privileged", "privileged-gpu")}),
    ("a privileged CPU sidecar beside a GPU container", pod(gpu(), cpu("side", **PRIVILEGED)), DEFAULT, "default",
     {(f"{C1}.securityContext.privileged", "privileged-gpu")}),
    ("a privileged CPU pod selecting an accelerator",
     pod(cpu(**PRIVILEGED), nodeSelector={"accelerator": "nvidia-l4"}), DEFAULT, "default",
     {(f"{C0}.securityContext.privileged", "privileged-gpu"),
      ("spec.nodeSelector[accelerator]", "cpu-pod-on-gpu-nodes")}),
    ("a privileged CPU pod tolerating the GPU taint",
     pod(cpu(**PRIVILEGED), tolerations=[{"key": GPU, "operator": "Exists"}]), DEFAULT, "default",
     {(f"{C0}.securityContext.privileged", "privileged-gpu"), ("spec.tolerations[0]", "cpu-pod-on-gpu-nodes")}),
    ("a privileged CPU pod tolerating every taint", pod(cpu(**PRIVILEGED), tolerations=[{"operator": "Exists"}]),
     DEFAULT, "default", {(f"{C0}.securityContext.privileged", "privileged-gpu")}),
    ("a privileged CPU pod tolerating AKS's sku=gpu taint",
     pod(cpu(**PRIVILEGED), tolerations=[{"key": "sku", "operator": "Equal", "value": "gpu"}]), AKS, "default",
     {(f"{C0}.securityContext.privileged", "privileged-gpu"), ("spec.tolerations[0]", "cpu-pod-on-gpu-nodes")}),
    ("sku=gpu means nothing on a generic cluster",
     pod(cpu(**PRIVILEGED), tolerations=[{"key": "sku", "operator": "Equal", "value": "gpu"}]), DEFAULT, "default",
     set()),
    ("a privileged pod away from GPU nodes", pod(cpu(**PRIVILEGED)), DEFAULT, "default", set()),
    ("privileged: false", pod(gpu(securityContext={"privileged": False})), DEFAULT, "default", set()),
    ("a privileged GPU container, trusted", pod(gpu(**PRIVILEGED)), TRUSTING, "gpu-operator", set()),
    # --- device nodes and device-list mounts
    ("hostPath /dev/nvidia0", mounted_path("/dev/nvidia0"), DEFAULT, "default",
     {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("hostPath /dev/nvidiactl spelt oddly", mounted_path("//dev/./nvidiactl/"), DEFAULT, "default",
     {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("hostPath /dev/dri", mounted_path("/dev/dri"), DEFAULT, "default",
     {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("hostPath /dev/dri/renderD128", mounted_path("/dev/dri/renderD128"), DEFAULT, "default",
     {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("hostPath /dev/kfd", mounted_path("/dev/kfd"), DEFAULT, "default",
     {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("hostPath /dev holds them all", mounted_path("/dev"), DEFAULT, "default",
     {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("hostPath / holds them all", mounted_path("/"), DEFAULT, "default",
     {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("hostPath /dev/shm", mounted_path("/dev/shm"), DEFAULT, "default", set()),
    ("hostPath /dev/drivers is not /dev/dri", mounted_path("/dev/drivers"), DEFAULT, "default", set()),
    ("hostPath /var/log", mounted_path("/var/log"), DEFAULT, "default", set()),
    ("a privileged GPU container opens every device by hostPath",
     pod(gpu(volumeMounts=[{"name": "dev", "mountPath": "/host"}], **PRIVILEGED), volumes=host_path("/dev/nvidia1")),
     DEFAULT, "default", {("spec.volumes[0].hostPath.path", "gpu-device-mount"),
                          (f"{C0}.securityContext.privileged", "privileged-gpu")}),
    # The device cgroup: a container that is not privileged sees the device nodes it mounts but cannot open them.
    ("hostPath /dev mounted by a container that is not privileged",
     pod(cpu(volumeMounts=[{"name": "dev", "mountPath": "/host"}]), volumes=host_path("/dev")), DEFAULT, "default",
     set()),
    ("hostPath / mounted read-only by a GPU container that is not privileged",
     pod(gpu(volumeMounts=[{"name": "dev", "mountPath": "/host", "readOnly": True}]), volumes=host_path("/")),
     DEFAULT, "default", set()),
    ("hostPath /dev beside a privileged container that does not mount it",
     pod(cpu(**PRIVILEGED), cpu("b", volumeMounts=[{"name": "dev", "mountPath": "/host"}]), volumes=host_path("/dev")),
     DEFAULT, "default", set()),
    ("hostPath / mounted by a privileged init container", pod(cpu(), initContainers=[mounting("/", "init")],
                                                               volumes=host_path("/")),
     DEFAULT, "default", {("spec.volumes[0].hostPath.path", "gpu-device-mount")}),
    ("a mount into the device list directory",
     pod(cpu(volumeMounts=mount("/var/run/nvidia-container-devices/all"))), DEFAULT, "default",
     {(f"{C0}.volumeMounts[0].mountPath", "gpu-device-mount")}),
    ("the directory itself, under /run", pod(cpu(volumeMounts=mount("/run/nvidia-container-devices"))), DEFAULT,
     "default", {(f"{C0}.volumeMounts[0].mountPath", "gpu-device-mount")}),
    ("an ordinary mount", pod(cpu(volumeMounts=mount("/var/run/app"))), DEFAULT, "default", set()),
    ("device mounts, trusted", pod(cpu(volumeMounts=mount("/var/run/nvidia-container-devices/all")),
                                   volumes=host_path("/dev")), TRUSTING, "gpu-operator", set()),
    # --- CDI annotations
    ("a CDI annotation", pod(cpu(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), DEFAULT, "default",
     {("metadata.annotations[cdi.k8s.io/gpu]", "cdi-annotation")}),
    ("NVIDIA's NRI plugin, per container",
     pod(cpu(), annotations={"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=0"}),
     DEFAULT, "default", {("metadata.annotations[nvidia.cdi.k8s.io/container.main]", "cdi-annotation")}),
    ("NVIDIA's NRI plugin, the bare key",
     pod(cpu(), annotations={"nvidia.cdi.k8s.io": "management.nvidia.com/gpu=all"}),
     DEFAULT, "default", {("metadata.annotations[nvidia.cdi.k8s.io]", "cdi-annotation")}),
    ("a look-alike key", pod(cpu(), annotations={"example.com/cdi.k8s.io": "x"}), DEFAULT, "default", set()),
    ("a CDI annotation in a template",
     workload("Deployment", pod(gpu(), annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"})), DEFAULT, "default",
     {("spec.template.metadata.annotations[cdi.k8s.io/x]", "cdi-annotation")}),
    ("a CDI annotation, trusted", pod(cpu(), annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}), TRUSTING,
     "gpu-operator", set()),
    # --- zero GPU counts
    ("a GPU limit of 0", pod(gpu(n=0)), DEFAULT, "default", {(f"{C0}.resources.limits[{GPU}]", "zero-gpu-limit")}),
    ("an AMD request of 0 without limit",
     pod(container(requests={"amd.com/gpu": "0"})), DEFAULT, "default",
     {(f"{C0}.resources.requests[amd.com/gpu]", "zero-gpu-limit"),
      (f"{C0}.resources.requests[amd.com/gpu]", "requests-without-limits")}),
    ("a time-sliced replica of 0", pod(container(limits={"nvidia.com/gpu.shared": 0})), DEFAULT, "default",
     {(f"{C0}.resources.limits[nvidia.com/gpu.shared]", "zero-gpu-limit")}),
    ("0 MiB of HAMi memory counts no GPUs", pod(container(limits={GPU: 1, "nvidia.com/gpumem": 0})), DEFAULT,
     "default", set()),
    # --- runtime class, without the cluster
    ("runtimeClassName nvidia on a CPU pod", pod(cpu(), runtimeClassName="nvidia"), DEFAULT, "default",
     {("spec.runtimeClassName", "runtime-class-without-gpu")}),
    ("runtimeClassName nvidia-cdi on a CPU pod", pod(cpu(), runtimeClassName="nvidia-cdi"), DEFAULT, "default",
     {("spec.runtimeClassName", "runtime-class-without-gpu")}),
    ("runtimeClassName nvidia on a GPU pod", pod(gpu(), runtimeClassName="nvidia"), DEFAULT, "default", set()),
    ("another runtime on a CPU pod", pod(cpu(), runtimeClassName="kata"), DEFAULT, "default", set()),
    ("runtimeClassName nvidia on a trusted CPU pod", pod(cpu(), runtimeClassName="nvidia"), TRUSTING, "gpu-operator",
     set()),
    # --- isolation.nvidiaRuntime: cdi, the NVIDIA runtime reads the device variables only under its RuntimeClass
    ("CDI mode: a CPU pod naming every GPU under the default runtime", pod(cpu(env=env())), CDI, "default", set()),
    ("CDI mode: the same under runtimeClassName nvidia", pod(cpu(env=env()), runtimeClassName="nvidia"), CDI,
     "default", {(E0, "visible-devices-without-gpu"), ("spec.runtimeClassName", "runtime-class-without-gpu")}),
    ("CDI mode: a GPU pod's sidecar, the class injected by isolation.runtimeClass",
     pod(gpu(), cpu("sidecar", env=env())), CDI_INJECTING, "default",
     {(f"{C1}.env[0].value", "visible-devices-without-gpu")}),
    ("CDI mode: an envFrom under another runtime", pod(cpu(envFrom=[{"configMapRef": {"name": "c"}}]),
                                                      runtimeClassName="kata"), CDI, "default", set()),
    ("CDI mode: an envFrom under the NVIDIA runtime", pod(cpu(envFrom=[{"configMapRef": {"name": "c"}}]),
                                                         runtimeClassName="nvidia-cdi"), CDI, "default",
     {(f"{C0}.envFrom[0]", "visible-devices-unread"), ("spec.runtimeClassName", "runtime-class-without-gpu")}),
]


@pytest.mark.parametrize(("obj", "policy", "namespace", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_isolation(obj, policy, namespace, expected):
    assert found(obj, policy, namespace) == expected


REQUIRES_ACCELERATOR = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["a"]}]}]}}}
H100 = {"nvidia": {}, "nvidia-h100": {"accelerator": "nvidia-h100"}, "pooled": {"pool": "gpu"}}

# (id, object, policy, RuntimeClasses in the cluster or None, expected)
RUNTIME_CASES = [
    ("a GPU pod naming a RuntimeClass that exists", pod(gpu(), runtimeClassName="nvidia"), CLUSTER, H100, set()),
    ("a GPU pod naming one that does not", pod(gpu(), runtimeClassName="nvidia-legacy"), CLUSTER, H100,
     {("spec.runtimeClassName", "unknown-runtime-class")}),
    ("the class the policy injects does not exist", pod(gpu()), INJECTING, {"kata": {}},
     {("spec.runtimeClassName", "unknown-runtime-class")}),
    ("the class the policy injects exists", pod(gpu()), INJECTING, H100, set()),
    ("no class is injected into a CPU pod", pod(cpu()), INJECTING, {}, set()),
    ("nor into a pod with a GPU limit of 0", pod(gpu(n=0)), INJECTING, {},
     {(f"{C0}.resources.limits[{GPU}]", "zero-gpu-limit")}),
    ("a class whose nodeSelector contradicts the pod's",
     pod(gpu(), runtimeClassName="nvidia-h100", nodeSelector={"accelerator": "nvidia-l4"}), CLUSTER, H100,
     {("spec.runtimeClassName", "runtime-class-conflict")}),
    ("a class that contradicts the accelerator default we inject",
     pod(gpu(), runtimeClassName="nvidia-h100"), WITH_DEFAULT, H100,
     {("spec.runtimeClassName", "runtime-class-conflict")}),
    ("a class that contradicts the annotation's accelerator",
     pod(gpu(), runtimeClassName="nvidia-h100", annotations={"gpu-webhook/accelerator": "nvidia-l4"}), CLUSTER, H100,
     {("spec.runtimeClassName", "runtime-class-conflict")}),
    ("a class that agrees", pod(gpu(), runtimeClassName="nvidia-h100", nodeSelector={"accelerator": "nvidia-h100"}),
     CLUSTER, H100, set()),
    ("a class on other labels adds to the selector", pod(gpu(), runtimeClassName="pooled"), WITH_DEFAULT, H100, set()),
    ("a required node affinity on the label: no default is injected",
     pod(gpu(), runtimeClassName="nvidia-h100", affinity=REQUIRES_ACCELERATOR),
     WITH_DEFAULT, H100, set()),
    ("in a Deployment, whose pods would fail to be created again and again",
     workload("Deployment", pod(gpu(), runtimeClassName="nvidia-h100", nodeSelector={"accelerator": "nvidia-l4"})),
     CLUSTER, H100, {("spec.template.spec.runtimeClassName", "runtime-class-conflict")}),
    ("not for CPU pods", pod(cpu(), runtimeClassName="kata-fc"), CLUSTER, H100, set()),
    ("RuntimeClasses unknown: nothing to say", pod(gpu(), runtimeClassName="nvidia-legacy"), CLUSTER, None, set()),
]


@pytest.mark.parametrize(("obj", "policy", "classes", "expected"), [c[1:] for c in RUNTIME_CASES],
                         ids=[c[0] for c in RUNTIME_CASES])
def test_runtime_class_against_the_cluster(obj, policy, classes, expected):
    assert found(obj, policy, "default", runtime_class_view(classes)) == expected


def test_runtime_class_rules_are_cluster_rules():
    """With cluster.enabled false they are off, like every cluster rule."""
    obj = pod(gpu(), runtimeClassName="nvidia-legacy")
    answer = decide(obj, "", "Pod", "default", DEFAULT, runtime_class_view(H100))
    assert answer.allowed and not answer.violations
    answer = decide(obj, "", "Pod", "default", CLUSTER, runtime_class_view(H100))
    assert not answer.allowed


def test_the_messages_say_what_the_container_would_see_and_where():
    answer = decide(pod(cpu("app", env=env())), "", "Pod", "default", TENANTS)
    assert not answer.allowed
    assert answer.message == (
        '1 GPU violation: spec.containers[0].env[0].value: container "app" uses no GPU but sets '
        'NVIDIA_VISIBLE_DEVICES="all", and the NVIDIA runtime reads it in every pod (isolation.nvidiaRuntime: '
        "legacy): it would see every GPU of its node, outside the scheduler's accounting; remove it or set it to void"
    )
    answer = decide(pod(cpu("app", env=env(value="0")), runtimeClassName="nvidia"), "", "Pod", "default", CDI)
    assert answer.allowed
    assert answer.warnings[0] == (
        'spec.containers[0].env[0].value: container "app" uses no GPU but sets NVIDIA_VISIBLE_DEVICES="0", and the '
        "pod runs under runtimeClassName nvidia, whose NVIDIA runtime reads it (isolation.nvidiaRuntime: cdi): it "
        "would see the GPUs it names, outside the scheduler's accounting; remove it or set it to void; warn: not a "
        "tenant namespace (isolation.tenantNamespaces), and the pod asks for no GPU"
    )
    conflict = pod(gpu(), runtimeClassName="nvidia-h100", nodeSelector={"accelerator": "nvidia-l4"})
    answer = decide(conflict, "", "Pod", "default", CLUSTER, runtime_class_view(H100))
    assert answer.message == (
        "1 GPU violation: spec.runtimeClassName: runtimeClassName nvidia-h100, whose scheduling.nodeSelector "
        "contradicts the pod's: accelerator=nvidia-h100 (pod: nvidia-l4); the apiserver would reject the pod"
    )


def test_defaults_deny_and_warn_as_documented():
    """Unreadable values and zero limits warn; everything that opens GPUs denies."""
    answer = decide(pod(gpu(n=0), cpu("b", envFrom=[{"configMapRef": {"name": "c"}}])), "", "Pod", "default", DEFAULT)
    assert answer.allowed and len(answer.warnings) == 2
    answer = decide(pod(cpu(), runtimeClassName="nvidia"), "", "Pod", "default", DEFAULT)
    assert answer.allowed and answer.warnings
    # what opens GPUs is refused where the pod asks for GPUs, and, on a pod that asks for none, in the tenants'
    # namespaces; elsewhere it is a warning that says so
    assert not decide(pod(gpu(**PRIVILEGED)), "", "Pod", "default", DEFAULT).allowed
    for bad in (pod(cpu(env=env())), mounted_path("/dev/nvidia0"),
                pod(cpu(), annotations={"cdi.k8s.io/x": "y"})):
        assert not decide(bad, "", "Pod", "default", TENANTS).allowed
        softened = decide(bad, "", "Pod", "default", DEFAULT)
        assert softened.allowed and softened.actions == ("warn",)
        assert softened.warnings[0].endswith("; warn: not a tenant namespace (isolation.tenantNamespaces), and the "
                                             "pod asks for no GPU")


def test_an_update_keeps_an_old_isolation_problem_but_not_a_changed_one():
    old = pod(cpu("app", env=env(value="0")))
    relabelled = pod(cpu("app", env=env(value="0")))
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert decide(relabelled, "", "Pod", "default", TENANTS, old=old).allowed
    widened = pod(cpu("app", env=env(value="all")))
    assert not decide(widened, "", "Pod", "default", TENANTS, old=old).allowed
