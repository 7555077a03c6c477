"""Cluster-aware checks through the real apiserver: the webhook watches Nodes and refuses pods that can never run."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.bed import register_webhook, unregister_webhook
from tests.e2e.test_placement import add_gpu_node
from tests.manifests import container, pod
from tests.server import make_certs, start_webhook

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def aware_webhook(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster-aware")
    policy = tmp / "policy.yaml"
    policy.write_text("cluster: {enabled: true}\n")
    add_gpu_node(cluster, "l4-node", "nvidia-l4", gpus=4)
    server = start_webhook(tmp, "--policy", str(policy), "--kubeconfig", str(cluster.kubeconfig),
                           certs=make_certs(tmp / "tls", "127.0.0.1"))
    try:  # a registration that fails must not leave the server running
        register_webhook(cluster, server)
        yield server
    finally:
        unregister_webhook(cluster)
        server.stop()


def try_create(cluster, obj):
    return cluster.kubectl("create", "-f", "-", stdin=json.dumps(obj))


def test_an_unknown_accelerator_is_refused_then_admitted_once_a_node_has_it(cluster, aware_webhook):
    wants = pod(container(limits={GPU: 1}), name="wants-h100", nodeSelector={"accelerator": "nvidia-h100"})
    refused = try_create(cluster, wants)
    assert refused.returncode != 0
    assert "no node has accelerator=nvidia-h100, so the pod would stay Pending" in refused.stderr
    assert "(values of accelerator on the nodes: " in refused.stderr

    add_gpu_node(cluster, "h100-node", "nvidia-h100", gpus=8)
    added = time.monotonic()
    while try_create(cluster, wants).returncode != 0:
        assert time.monotonic() - added < 10, "the new node did not reach the webhook's index within 10 s"
        time.sleep(0.1)
    reached = time.monotonic() - added
    print(f"node change reached decisions in {reached:.2f} s")


def test_more_gpus_than_the_largest_node_is_refused_with_what_the_cluster_has(cluster, aware_webhook):
    big = pod(container(limits={GPU: 6}), name="too-big", nodeSelector={"accelerator": "nvidia-l4"})
    refused = try_create(cluster, big)
    assert "nodes with accelerator=nvidia-l4: 1, largest allocatable nvidia.com/gpu: 4" in refused.stderr


def test_the_webhook_keeps_deciding_from_its_index_when_the_apiserver_is_gone(cluster, aware_webhook):
    """Stops the apiserver: the index is all the webhook has, and it must still answer."""
    from tests.manifests import admission_review

    apiserver = next(p for p in cluster.processes if p.name == "kube-apiserver")
    apiserver.stop()
    try:
        # The watch notices, backs off, and the staleness gauge flips (its reporter runs once a second).
        deadline = time.monotonic() + 30
        while aware_webhook.metric("gpu_webhook_node_index_stale") != 1:
            assert time.monotonic() < deadline, "the staleness gauge did not flip after the apiserver stopped"
            time.sleep(0.1)
        assert aware_webhook.request("GET", "/readyz").status == 200
        ok = pod(container(limits={GPU: 4}), name="fits", nodeSelector={"accelerator": "nvidia-l4"})
        assert aware_webhook.post("/validate", admission_review(ok)).json()["response"]["allowed"] is True
        nowhere = pod(container(limits={GPU: 1}), name="nowhere", nodeSelector={"accelerator": "nvidia-b200"})
        assert aware_webhook.post("/validate", admission_review(nowhere)).json()["response"]["allowed"] is False
    finally:
        cluster.processes.remove(apiserver)
        cluster.restart_apiserver()
    deadline = time.monotonic() + 30
    while aware_webhook.metric("gpu_webhook_node_index_stale") != 0:
        assert time.monotonic() < deadline, "the watch did not resume after the apiserver came back"
        time.sleep(0.5)
