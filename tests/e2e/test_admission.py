"""The webhook through a real kube-apiserver: what a user creating GPU workloads sees."""

from __future__ import annotations

import json
import time

import pytest
from kubernetes import dynamic
from kubernetes.client.rest import ApiException

from tests.e2e.bed import apply, render_webhook_configurations
from tests.manifests import container, pod, seed_pod, workload

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
OUR_DENIAL = 'admission webhook "validate.gpu-webhook.io" denied the request: '


@pytest.fixture(scope="module")
def kube(api, gpu_webhook):
    """The dynamic client: it sends manifests as written (typed clients would reject ``nvidia.com/gpu: 1``)."""
    return dynamic.DynamicClient(api)


def create(kube, obj, namespace="default"):
    resource = kube.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    return resource.create(body=obj, namespace=namespace)


def read(kube, kind, name, namespace="default", api_version="v1"):
    return kube.resources.get(api_version=api_version, kind=kind).get(name=name, namespace=namespace).to_dict()


def refusal(call, statuses=(400, 403, 422)) -> str:
    """The message the apiserver returns when it refuses, as kubectl would print it."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status in statuses, caught.value.body
    return json.loads(caught.value.body)["message"]


def seed(name, annotations=None):
    p = seed_pod()
    p["metadata"]["name"] = name
    del p["spec"]["nodeSelector"]
    if annotations:
        p["metadata"]["annotations"] = annotations
    return p


@pytest.mark.parametrize(
    ("namespace", "annotations", "accelerator"),
    [
        ("default", {"gpu-webhook/accelerator": "nvidia-tesla-p100"}, "nvidia-tesla-p100"),
        ("research", None, "nvidia-l4"),
        ("default", None, "nvidia-tesla-k80"),
    ],
    ids=["from the annotation", "from the namespace default", "from the global default"],
)
def test_the_seed_pod_is_stored_with_requests_and_the_accelerator_selector(kube, namespace, annotations, accelerator):
    name = f"cuda-vector-add-{accelerator}"
    create(kube, seed(name, annotations), namespace)
    stored = read(kube, "Pod", name, namespace)
    assert stored["spec"]["containers"][0]["resources"] == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert stored["spec"]["nodeSelector"] == {"accelerator": accelerator}


REFUSED = [
    # (name, pod, who refuses, what the user reads)
    ("requests-only", pod(container(requests={GPU: 1}), name="requests-only"), "built-in",
     "Limit must be set for non overcommitable resources"),
    ("fractional", pod(container(limits={GPU: "500m"}), name="fractional"), "built-in",
     "must be an integer"),
    ("mismatched", pod(container(limits={GPU: 2}, requests={GPU: 1}), name="mismatched"), "built-in",
     "must be equal to nvidia.com/gpu limit"),
    ("over-cap", pod(container(limits={GPU: 3}), container("b", limits={GPU: 2}), name="over-cap"), "webhook",
     "1 GPU violation: spec: pod asks for 5 nvidia.com/gpu, over the limit of 4 per pod"),
    ("not-allowed", pod(container(limits={GPU: 1}), name="not-allowed", nodeSelector={"accelerator": "nvidia-a100"}),
     "webhook", 'spec.nodeSelector[accelerator]: accelerator "nvidia-a100" is not allowed here'),
]


@pytest.mark.parametrize(("obj", "who", "says"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_bad_gpu_pods_are_refused_and_we_know_by_whom(kube, obj, who, says):
    message = refusal(lambda: create(kube, obj))
    refused_by = "webhook" if message.startswith(OUR_DENIAL) else "built-in"
    assert (refused_by, says in message) == (who, True), message


def test_a_deployment_with_a_bad_gpu_template_is_refused_at_creation(kube):
    bad = workload("Deployment", pod(container(limits={GPU: 5}), name="x"), name="bad-deploy")
    bad["spec"]["selector"] = {"matchLabels": {"app": "x"}}
    bad["spec"]["template"]["metadata"]["labels"] = {"app": "x"}
    message = refusal(lambda: create(kube, bad))
    assert message.startswith(OUR_DENIAL)
    assert f"spec.template.spec.containers[0].resources.limits[{GPU}]" in message


def test_a_cronjob_with_a_bad_gpu_template_is_refused_at_creation(kube):
    bad = workload("CronJob", pod(container(limits={GPU: 5}), name="x", restartPolicy="OnFailure"), name="bad-cron")
    message = refusal(lambda: create(kube, bad))
    assert message.startswith(OUR_DENIAL)
    assert f"spec.jobTemplate.spec.template.spec.containers[0].resources.limits[{GPU}]" in message


TRAINING_JOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "trainingjobs.example.com"},
    "spec": {
        "group": "example.com",
        "names": {"kind": "TrainingJob", "plural": "trainingjobs", "singular": "trainingjob"},
        "scope": "Namespaced",
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }}}],
    },
}


def training_job(name, worker_limits):
    return {
        "apiVersion": "example.com/v1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {"replicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": {
            "containers": [container("trainer", limits=worker_limits)]}}}}},
    }


def test_a_custom_resource_with_a_bad_gpu_template_is_refused_by_the_webhook(cluster, kube):
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(TRAINING_JOB_CRD), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "crd/trainingjobs.example.com", "--timeout=60s",
                    check=True)
    kube.resources.invalidate_cache()
    create(kube, training_job("good", {GPU: 1}))
    message = refusal(lambda: create(kube, training_job("bad", {GPU: "1.5"})))
    assert message == (
        'admission webhook "validate-custom.gpu-webhook.io" denied the request: 1 GPU violation: '
        "spec.replicaSpecs.Worker.template.spec.containers[0].resources."
        'limits[nvidia.com/gpu]: container "trainer": "1.5" is not a whole number (GPUs cannot be shared)'
    )


def test_warn_enforcement_creates_the_object_and_kubectl_prints_the_warnings(cluster, gpu_webhook):
    over = pod(container(limits={GPU: 6}), name="warned")
    result = cluster.kubectl("create", "-n", "lab", "-f", "-", stdin=json.dumps(over))
    assert result.returncode == 0, result.stderr
    assert f"Warning: spec.containers[0].resources.limits[{GPU}]: container \"main\": 6 {GPU} is over the limit " \
           "of 4 per container" in result.stderr
    assert cluster.kubectl("get", "pod", "warned", "-n", "lab").returncode == 0


def test_match_conditions_spare_the_webhook_pods_without_gpus(kube, gpu_webhook):
    calls = lambda: gpu_webhook.metric("gpu_webhook_requests_total")  # noqa: E731
    before = calls()
    for i in range(3):
        create(kube, pod(container(limits={"cpu": "100m"}), name=f"cpu-only-{i}"))
    assert calls() == before
    create(kube, seed("one-gpu-pod"))
    assert calls() == before + 2  # one mutate and one validate call


def test_server_side_dry_run_goes_through_the_webhook_and_stores_nothing(cluster, gpu_webhook):
    before = gpu_webhook.metric("gpu_webhook_requests_total", endpoint="validate")
    bad = pod(container(limits={GPU: 9}), name="dry-bad")
    refused = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(bad))
    assert refused.returncode != 0 and OUR_DENIAL in refused.stderr
    good = seed("dry-good")
    admitted = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(good))
    assert admitted.returncode == 0, admitted.stderr
    assert json.loads(admitted.stdout)["spec"]["nodeSelector"] == {"accelerator": "nvidia-tesla-k80"}
    assert gpu_webhook.metric("gpu_webhook_requests_total", endpoint="validate") == before + 2
    for name in ("dry-bad", "dry-good"):
        assert cluster.kubectl("get", "pod", name).returncode != 0


def test_failure_policy_with_the_webhook_down(cluster, kube, gpu_webhook):
    """Runs last in this module: it stops the webhook process."""
    gpu_webhook.stop()
    message = refusal(lambda: create(kube, seed("gpu-while-down")), statuses=(500,))
    assert "failed calling webhook" in message and "mutate.gpu-webhook.io" in message
    create(kube, pod(container(), name="cpu-while-down"))  # matchConditions: never called, so admitted

    ignore = render_webhook_configurations(cluster, gpu_webhook.address, gpu_webhook.ca,
                                           webhook={"failurePolicy": "Ignore"})
    apply(cluster, ignore)
    deadline = time.monotonic() + 30
    while True:
        try:
            create(kube, seed("gpu-with-ignore"))
            break
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    assert "nodeSelector" not in read(kube, "Pod", "gpu-with-ignore")["spec"]  # admitted unmutated
