"""Placement with the real kube-scheduler: a pod that asks for GPU model B lands on a B node, never an A node."""

from __future__ import annotations

import json
import time

import pytest

from tests.manifests import container, pod

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
MODELS = {"a": "nvidia-tesla-k80", "b": "nvidia-l4"}


def add_gpu_node(cluster, name: str, accelerator: str, gpus: int = 4) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "accelerator": accelerator, "kubernetes.io/hostname": name}}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(node), check=True)
    # No kubelet here: we report what a device plugin would advertise, and a Ready condition.
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", GPU: str(gpus)}
    status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node for the e2e bed",
         "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status),
                    check=True)
    # The apiserver taints new nodes not-ready (TaintNodesByCondition); no node controller runs here to lift it.
    cluster.kubectl("taint", "node", name, "node.kubernetes.io/not-ready-", "--overwrite")


def node_of(cluster, name: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = cluster.kubectl("get", "pod", name, "-o", "jsonpath={.spec.nodeName}")
        if result.stdout:
            return result.stdout
        time.sleep(0.3)
    events = cluster.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}").stdout
    raise AssertionError(f"pod {name} was not scheduled within {timeout}s: {events}")


def test_a_pod_asking_for_model_b_lands_on_a_b_node(cluster, gpu_webhook):
    for i in range(2):
        add_gpu_node(cluster, f"node-a{i}", MODELS["a"])
        add_gpu_node(cluster, f"node-b{i}", MODELS["b"])
    cluster.start_scheduler()
    placed = {}
    for i in range(4):
        name = f"wants-b-{i}"
        want_b = pod(container(limits={GPU: 1}), name=name, annotations={"gpu-webhook/accelerator": MODELS["b"]})
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(want_b), check=True)
        placed[name] = node_of(cluster, name)
    models = {n: cluster.kubectl("get", "node", n, "-o", "jsonpath={.metadata.labels.accelerator}").stdout
              for n in set(placed.values())}
    assert set(models.values()) == {MODELS["b"]}, (placed, models)
    assert not any(node.startswith("node-a") for node in placed.values())
    # The injected selector did it: the stored pod carries it.
    selector = cluster.kubectl("get", "pod", "wants-b-0", "-o", "jsonpath={.spec.nodeSelector}").stdout
    assert json.loads(selector) == {"accelerator": MODELS["b"]}
