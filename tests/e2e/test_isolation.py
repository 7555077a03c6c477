"""GPU isolation through a real kube-apiserver: the chart's matchConditions as the apiserver evaluates them,
NVIDIA_VISIBLE_DEVICES refused and hidden, RuntimeClasses checked before the apiserver rejects a pod.

The webhook runs with cluster checks on, so it watches Nodes and lists the bed's RuntimeClasses once at
start (the server's temporary adapter until the cluster view lands); the RuntimeClasses are created first.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.e2e.bed import register_webhook, unregister_webhook
from tests.e2e.test_placement import add_gpu_node
from tests.manifests import container, pod, workload
from tests.server import make_certs, start_webhook

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
NVD = "NVIDIA_VISIBLE_DEVICES"
OUR_DENIAL = 'admission webhook "validate.gpu-webhook.io" denied the request: '
HIDDEN, INJECTED, MISMATCHED = "iso-shared", "iso-k3s", "iso-h100"

POLICY = {
    "cluster": {"enabled": True},
    "accelerator": {"default": "nvidia-l4"},
    # the tenants' namespaces: here a tenant rule refuses a pod that asks for no GPU
    "isolation": {"tenantNamespaces": ["default"]},
    "namespaces": {
        HIDDEN: {"isolation": {"hideGpus": "void"}},
        INJECTED: {"isolation": {"runtimeClass": "nvidia"}},
        MISMATCHED: {"isolation": {"runtimeClass": "nvidia-h100"}},
    },
}
RUNTIME_CLASSES = [
    {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia",
     "scheduling": {"nodeSelector": {"gpu-runtime": "nvidia"}}},
    {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia-h100"}, "handler": "nvidia",
     "scheduling": {"nodeSelector": {"accelerator": "nvidia-h100"}}},
]


@pytest.fixture(scope="module")
def isolating_webhook(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("isolation")
    policy = tmp / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    add_gpu_node(cluster, "l4-node", "nvidia-l4", gpus=4)
    for namespace in (HIDDEN, INJECTED, MISMATCHED):
        cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": RUNTIME_CLASSES}), check=True)
    server = start_webhook(tmp, "--policy", str(policy), "--kubeconfig", str(cluster.kubeconfig),
                           certs=make_certs(tmp / "tls", "127.0.0.1"))
    try:  # a registration that fails must not leave the server running
        register_webhook(cluster, server, policy=POLICY)  # the chart renders its matchConditions from the same policy
        yield server
    finally:
        unregister_webhook(cluster)
        server.stop()


def create(cluster, obj, namespace="default", *args):
    return cluster.kubectl("create", "-n", namespace, "-o", "json", *args, "-f", "-", stdin=json.dumps(obj))


def calls(server, endpoint):
    return server.metric("gpu_webhook_requests_total", endpoint=endpoint)


def leaky(name="leaky"):
    return pod(container("app", env=[{"name": NVD, "value": "all"}]), name=name)


def test_a_cpu_pod_with_nvidia_visible_devices_all_is_refused_with_its_field_path(cluster, isolating_webhook):
    refused = create(cluster, leaky())
    assert refused.returncode != 0
    assert refused.stderr.strip() == (
        f'Error from server (Forbidden): error when creating "STDIN": {OUR_DENIAL}1 GPU violation: '
        'spec.containers[0].env[0].value: container "app" uses no GPU but sets NVIDIA_VISIBLE_DEVICES="all", and '
        "the NVIDIA runtime reads it in every pod (isolation.nvidiaRuntime: legacy): it would see every GPU of its "
        "node, outside the scheduler's accounting; remove it or set it to void"
    )
    deployment = workload("Deployment", leaky(), name="leaky-deploy")
    deployment["spec"]["selector"] = {"matchLabels": {"app": "leaky"}}
    deployment["spec"]["template"]["metadata"]["labels"] = {"app": "leaky"}
    refused = create(cluster, deployment)
    assert "spec.template.spec.containers[0].env[0].value: container \"app\" uses no GPU" in refused.stderr
    admitted = create(cluster, pod(container("app", env=[{"name": NVD, "value": "void"}]), name="void-ok"))
    assert admitted.returncode == 0, admitted.stderr


def test_hide_gpus_sets_void_on_a_cpu_pod_of_a_named_namespace_and_leaves_the_gpu_pod(cluster, isolating_webhook):
    mutations, validations = calls(isolating_webhook, "mutate"), calls(isolating_webhook, "validate")
    stored = create(cluster, pod(container("notebook"), name="cpu-notebook"), HIDDEN)
    assert stored.returncode == 0, stored.stderr
    assert json.loads(stored.stdout)["spec"]["containers"][0]["env"] == [{"name": NVD, "value": "void"}]
    # Sent to /mutate for its namespace; then to /validate for the variable /mutate added (and admitted).
    assert (calls(isolating_webhook, "mutate"), calls(isolating_webhook, "validate")) == \
        (mutations + 1, validations + 1)

    gpu_pod = create(cluster, pod(container("cuda", limits={GPU: 1}), name="gpu-notebook"), HIDDEN)
    assert gpu_pod.returncode == 0, gpu_pod.stderr
    cuda = json.loads(gpu_pod.stdout)["spec"]["containers"][0]
    assert "env" not in cuda, "the GPU container keeps the device plugin's NVIDIA_VISIBLE_DEVICES"
    assert cuda["resources"] == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}

    elsewhere = create(cluster, pod(container("notebook"), name="cpu-elsewhere"))
    assert elsewhere.returncode == 0 and "env" not in json.loads(elsewhere.stdout)["spec"]["containers"][0]
    assert calls(isolating_webhook, "mutate") == mutations + 2, "a CPU pod elsewhere never waits on the webhook"


def test_two_time_sliced_replicas_are_refused(cluster, isolating_webhook):
    refused = create(cluster, pod(container("train", limits={"nvidia.com/gpu.shared": 2}), name="shared-two"))
    assert refused.returncode != 0
    assert OUR_DENIAL + "1 GPU violation: spec.containers[0].resources.limits[nvidia.com/gpu.shared]: " \
        'container "train": 2 nvidia.com/gpu.shared asks for several replicas of a shared GPU' in refused.stderr
    one = create(cluster, pod(container("train", limits={"nvidia.com/gpu.shared": 1}), name="shared-one"))
    assert one.returncode == 0, one.stderr


def conflicting(name):
    return pod(container("cuda", limits={GPU: 1}), name=name, runtimeClassName="nvidia-h100",
               nodeSelector={"accelerator": "nvidia-l4"})


def test_a_conflicting_runtime_class_is_reported_before_the_apiserver_would_reject_the_pod(cluster, isolating_webhook):
    # The apiserver itself stores a Deployment whose pods it will refuse one by one (kube-system: no webhook).
    deployment = workload("Deployment", conflicting("x"), name="h100-runtime")
    deployment["spec"]["selector"] = {"matchLabels": {"app": "x"}}
    deployment["spec"]["template"]["metadata"]["labels"] = {"app": "x"}
    assert create(cluster, deployment, "kube-system", "--dry-run=server").returncode == 0
    # ...and refuses each such pod, in its RuntimeClass admission.
    by_apiserver = create(cluster, conflicting("h100-pod"), "kube-system", "--dry-run=server")
    assert by_apiserver.returncode != 0 and "gpu-webhook" not in by_apiserver.stderr
    print(by_apiserver.stderr)
    # The webhook refuses the Deployment at creation, naming the field.
    refused = create(cluster, deployment)
    assert refused.returncode != 0
    assert OUR_DENIAL + "1 GPU violation: spec.template.spec.runtimeClassName: runtimeClassName nvidia-h100, whose " \
        "scheduling.nodeSelector contradicts the pod's: accelerator=nvidia-h100 (pod: nvidia-l4); the apiserver " \
        "would reject the pod" in refused.stderr


def test_a_runtime_class_the_policy_would_inject_is_checked_too(cluster, isolating_webhook):
    """In iso-h100 the policy injects nvidia-h100, which contradicts the accelerator default (nvidia-l4):
    /mutate leaves it out and /validate says why, instead of the apiserver's reinvoked RuntimeClass admission."""
    refused = create(cluster, pod(container("cuda", limits={GPU: 1}), name="injected-h100"), MISMATCHED)
    assert refused.returncode != 0
    assert "spec.runtimeClassName: isolation.runtimeClass injects nvidia-h100, whose scheduling.nodeSelector " \
           "contradicts the pod's: accelerator=nvidia-h100 (pod: nvidia-l4)" in refused.stderr


def test_the_runtime_class_is_injected_and_the_apiserver_applies_its_scheduling(cluster, isolating_webhook):
    stored = create(cluster, pod(container("cuda", limits={GPU: 1}), name="k3s-gpu"), INJECTED)
    assert stored.returncode == 0, stored.stderr
    spec = json.loads(stored.stdout)["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    # The apiserver reinvokes its in-tree admission after a webhook's patch: RuntimeClass merges its selector.
    assert spec["nodeSelector"] == {"accelerator": "nvidia-l4", "gpu-runtime": "nvidia"}
    cpu_pod = create(cluster, pod(container("web"), name="k3s-cpu"), INJECTED)
    assert "runtimeClassName" not in json.loads(cpu_pod.stdout)["spec"]


CPU = {"name": "app", "image": "busybox"}
# CPU pods that reach /validate only through what an isolation rule reads: the live apiserver's CEL lets
# each through, and the webhook answers (denial, or warnings kubectl prints).
REACHING = [
    ("privileged-on-gpu-nodes", pod({**CPU, "securityContext": {"privileged": True}}, name="priv",
                                    tolerations=[{"key": GPU, "operator": "Exists"}]),
     "spec.containers[0].securityContext.privileged: container \"app\" is privileged and its pod tolerates the "
     "nvidia.com/gpu taint"),
    ("host-device", pod({**CPU, "securityContext": {"privileged": True},
                         "volumeMounts": [{"name": "d", "mountPath": "/host/nvidia0"}]},
                        name="hostdev", volumes=[{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}]),
     "spec.volumes[0].hostPath.path: hostPath \"/dev/nvidia0\" is mounted by a privileged container, which can open "
     "the node's GPU devices"),
    ("device-list-mount",
     pod({**CPU, "volumeMounts": [{"name": "e", "mountPath": "/var/run/nvidia-container-devices/all"}]},
         name="devlist", volumes=[{"name": "e", "emptyDir": {}}]),
     "spec.containers[0].volumeMounts[0].mountPath: container \"app\": a mount at"),
    ("cdi-annotation", pod(CPU, name="cdi", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
     "metadata.annotations[cdi.k8s.io/gpu]: annotation cdi.k8s.io/gpu=\"nvidia.com/gpu=all\" asks the container "
     "runtime to inject CDI devices"),
    ("mig-config", pod({**CPU, "env": [{"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"}]}, name="migcfg"),
     "spec.containers[0].env[0].value: container \"app\" uses no GPU but sets NVIDIA_MIG_CONFIG_DEVICES"),
    ("intel-monitoring", pod({**CPU, "resources": {"limits": {"gpu.intel.com/monitoring": "1"}}}, name="mon"),
     "spec.containers[0].resources.limits[gpu.intel.com/monitoring]: container \"app\": gpu.intel.com/monitoring "
     "gives access to every GPU"),
    ("runtime-class-without-gpu", pod(CPU, name="rt-cpu", runtimeClassName="nvidia"),
     "Warning: spec.runtimeClassName: runtimeClassName nvidia on a pod that uses no GPU"),
]


@pytest.mark.parametrize(("obj", "says"), [r[1:] for r in REACHING], ids=[r[0] for r in REACHING])
def test_the_live_cel_sends_what_each_rule_needs(cluster, isolating_webhook, obj, says):
    before = calls(isolating_webhook, "validate")
    result = create(cluster, obj, "default", "--dry-run=server")
    assert says in result.stderr, result.stderr
    assert calls(isolating_webhook, "validate") == before + 1


ORDINARY = [
    pod({**CPU, "env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "all"}, {"name": "PATH", "value": "/bin"}]},
        name="ordinary-env"),
    pod({**CPU, "envFrom": [{"configMapRef": {"name": "settings", "optional": True}}]}, name="ordinary-envfrom"),
    pod({**CPU, "securityContext": {"privileged": False, "runAsNonRoot": True}}, name="ordinary-security"),
    pod({**CPU, "volumeMounts": [{"name": "e", "mountPath": "/data"}]}, name="ordinary-volume",
        volumes=[{"name": "e", "emptyDir": {}}]),
    pod(CPU, name="ordinary-annotations", annotations={"prometheus.io/scrape": "true"}),
    pod(CPU, name="ordinary-runtime", runtimeClassName="kata"),
]


def test_ordinary_cpu_pods_never_wait_on_the_webhook(cluster, isolating_webhook):
    before = (calls(isolating_webhook, "mutate"), calls(isolating_webhook, "validate"))
    for obj in ORDINARY:
        result = create(cluster, obj, "default", "--dry-run=server")
        # RuntimeClass kata does not exist: the apiserver, not the webhook, refuses that one.
        assert result.returncode == 0 or "RuntimeClass" in result.stderr, result.stderr
        assert "gpu-webhook" not in result.stderr
    assert (calls(isolating_webhook, "mutate"), calls(isolating_webhook, "validate")) == before
