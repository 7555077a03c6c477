"""The project's own image runs as pods on the node bed: the OCI archive that tests/image/build-image.sh built for
this tree is imported into the node's containerd, the chart is installed with helm as a user would (``certs.mode``
helm, one replica, ``--wait`` for the Deployment to be Ready through the chart's own probes), and the apiserver
calls the webhook through the chart's Service, kube-proxy and the pod network."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.bed import CHART, forget_policy_crd
from tests.e2e.node import NodeBed, until

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(480)]

RELEASE, NAMESPACE = "gw-node", "gw-node-system"


@pytest.fixture(scope="module")
def release(node_bed: NodeBed, webhook_image: str):
    reference = webhook_image
    repository, tag = reference.rsplit(":", 1)
    start = time.monotonic()
    result = node_bed.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
                           "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
                           "--set", "image.pullPolicy=Never", "--set", "replicaCount=1",
                           # The default policy sets no GPU limit; with this one a 99-GPU pod is refused.
                           "--set-json", 'policy={"limits": {"perContainer": 4, "perPod": 4}}',
                           "--wait", "--timeout=180s")
    if result.returncode:
        diagnosis = node_bed.kubectl("describe", "pods", "-n", NAMESPACE).stdout + node_bed.logs("kubelet")
        node_bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=60s")
        pytest.fail(f"helm install failed: {result.stderr}\n{diagnosis}", pytrace=False)
    node_bed.timings["helm install --wait (pod Ready)"] = time.monotonic() - start
    print(f"node bed timings (s): { {k: round(v, 1) for k, v in node_bed.timings.items()} }")
    yield reference
    uninstall = node_bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=90s")
    forget_policy_crd(node_bed.kubectl)
    # The pod stops gracefully (preStop 5 s, the drain, its idle connections: about 26 s); deleted with the
    # namespace meanwhile, the namespace controller would recheck only after the whole grace period and more.
    until("the release's pod gone", lambda: not node_bed.kubectl_json("get", "pods", "-n", NAMESPACE)["items"], 90,
          interval=0.5)
    node_bed.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=60s", timeout=90)
    assert uninstall.returncode == 0, uninstall.stderr


def test_the_webhook_image_runs_ready_as_a_pod_of_the_chart(node_bed, release):
    pods = node_bed.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")
    (pod,) = pods["items"]
    (container,) = pod["status"]["containerStatuses"]
    assert container["image"] == release and container["ready"] and container["restartCount"] == 0
    assert pod["spec"]["containers"][0]["readinessProbe"], "the chart's readiness probe gated the rollout"


def test_the_apiserver_calls_the_webhook_pod_through_the_chart_service(node_bed, release):
    gpu_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "too-many-gpus", "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": "gw-e2e.invalid/pause:1",
                                        "resources": {"limits": {"nvidia.com/gpu": 99}}}]}}

    def refused() -> str | None:
        # The apiserver picks new configurations up asynchronously, and kube-proxy may program the new Service a
        # moment after helm saw the pod Ready (until then its REJECT rule answers: "connection refused").
        result = node_bed.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(gpu_pod))
        return result.stderr if result.returncode and "denied the request" in result.stderr else None

    message = until("the chart's webhook called", refused, 30, interval=0.5,
                    diagnose=lambda: node_bed.logs("kube-apiserver", tail=3000))
    assert "gpu-webhook" in message and "99" in message, message
    cpu_pod = {**gpu_pod, "metadata": {"name": "no-gpus", "namespace": "default"},
               "spec": {"containers": [{"name": "c", "image": "gw-e2e.invalid/pause:1"}]}}
    allowed = node_bed.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(cpu_pod))
    assert allowed.returncode == 0, allowed.stderr
