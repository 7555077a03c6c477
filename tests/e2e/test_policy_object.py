"""serve --policy-object default on the real apiserver: the policy read live from GPUPolicy/default, a refused spec,
the object deleted, and one replica of two writing the status (the Lease)."""

from __future__ import annotations

import json
import statistics
import time

import pytest

from tests.e2e import gpupolicy as gp
from tests.e2e.gpupolicy import eventually, eventually_status
from tests.manifests import admission_review, container, pod
from tests.server import WebhookProcess, make_certs, start_webhook
from webhook.core.policyfile import parse_policy
from webhook.kube.client import Kube
from webhook.native import params
from webhook.native.generate import COMPILED_ANNOTATION, LABELS

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
LEASE = "default/gpu-webhook-status-e2e"


def allowed(server: WebhookProcess, accelerator: str) -> bool:
    review = admission_review(pod(container(limits={GPU: 1}), name="p", nodeSelector={"accelerator": accelerator}))
    answer = server.post("/validate", review)
    assert answer.status == 200, answer.body
    return bool(answer.json()["response"]["allowed"])


def start(tmp, *args: str, cluster) -> WebhookProcess:
    return start_webhook(tmp, "--policy-object", "default", "--kubeconfig", str(cluster.kubeconfig),
                         "--status-lease", LEASE, *args, certs=make_certs(tmp / "tls", "127.0.0.1"))


@pytest.fixture(scope="module")
def kube(cluster):
    gp.install_crd(cluster)
    client = Kube.connect(str(cluster.kubeconfig))
    gp.delete(client)
    yield client
    gp.delete(client)
    client.close()


@pytest.fixture(scope="module")
def live_webhook(cluster, kube, tmp_path_factory):
    server = start(tmp_path_factory.mktemp("policy-object"), cluster=cluster)
    yield server
    server.stop()


def test_missing_at_start_serves_the_defaults_and_says_so(live_webhook):
    assert allowed(live_webhook, "anything-goes")  # the built-in defaults allow every accelerator
    assert live_webhook.metric("gpu_webhook_policy_object_present") == 0
    assert live_webhook.metric("gpu_webhook_policy_generation") == 0
    assert any("policy_object_listed" in line and '"present":false' in line for line in live_webhook.log_lines())


def test_an_edit_is_enforced_within_seconds(live_webhook, kube):
    stored = gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4"]}})
    eventually("the new object enforced", lambda: not allowed(live_webhook, "nvidia-h100"))
    assert allowed(live_webhook, "nvidia-l4")
    eventually("the generation metric", lambda: live_webhook.metric("gpu_webhook_policy_generation")
               == stored["metadata"]["generation"])
    assert live_webhook.metric("gpu_webhook_policy_object_present") == 1

    latencies = []
    for i in range(20):
        accelerator = f"acc-{i}"
        assert not allowed(live_webhook, accelerator)
        gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4", accelerator]}})
        latencies.append(eventually(f"edit {i} enforced", lambda a=accelerator: allowed(live_webhook, a),
                                    timeout=10.0, every=0.02))
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    p50, p99 = statistics.median(latencies), cuts[98]
    print(f"edit -> enforcement over 20 edits: p50 {p50:.3f} s, p99 {p99:.3f} s, max {max(latencies):.3f} s")
    assert p99 < 5.0

    status = eventually_status(kube, lambda s: (s.get("webhook") or {}).get("observedGeneration")
                               == gp.get(kube)["metadata"]["generation"])
    accepted = gp.condition(status, "Accepted")
    assert accepted is not None and accepted["status"] == "True", status
    rules = status["status"]["rules"]
    assert rules["native"] and rules["webhook"] and rules["target"].startswith("Kubernetes 1.")


def test_an_invalid_spec_is_refused_and_the_last_good_policy_stays(live_webhook, kube):
    good = gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4"]}})["metadata"]["generation"]
    eventually("the good spec", lambda: live_webhook.metric("gpu_webhook_policy_generation") == good)
    failures = live_webhook.metric("gpu_webhook_reloads_total", what="policy", result="failure")

    bad = gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4"]}, "limits": {"perContainer": "lots"}})
    eventually("the failed reload counted", lambda: live_webhook.metric(
        "gpu_webhook_reloads_total", what="policy", result="failure") > failures)
    assert not allowed(live_webhook, "nvidia-h100") and allowed(live_webhook, "nvidia-l4")  # the last good one
    assert live_webhook.metric("gpu_webhook_policy_generation") == good

    status = eventually_status(kube, lambda s: any(c.get("type") == "Accepted" and c.get("status") == "False"
                                                   for c in s.get("conditions") or []))
    accepted = gp.condition(status, "Accepted")
    assert accepted["observedGeneration"] == bad["metadata"]["generation"]
    assert "perContainer" in accepted["message"], accepted
    assert status["status"]["webhook"]["observedGeneration"] == good
    assert any('"reload_failed"' in line and "perContainer" in line for line in live_webhook.log_lines())


BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def test_the_native_policies_condition_follows_the_compiled_keys(live_webhook, kube):
    """A binding as admission-policies generates it (labelled, reading GPUPolicy/default, annotated with the digest
    of the compiled keys): Live while they match; CompiledKeysChanged, and the stale gauge 1, once one is edited."""
    spec = {"accelerator": {"allowed": ["nvidia-l4"]}}
    digest = params.compiled_digest(parse_policy(json.dumps(spec), "values").document)
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "gpu-webhook-e2e-status", "labels": dict(LABELS),
                            "annotations": {COMPILED_ANNOTATION: digest}},
               "spec": {"policyName": "gpu-webhook-e2e-status", "validationActions": ["Deny"],
                        "paramRef": dict(params.PARAM_REF)}}
    kube.create(BINDINGS, binding)
    try:
        generation = gp.put_spec(kube, {**spec, "limits": {"perPod": 4}})["metadata"]["generation"]
        status = eventually_status(kube, lambda s: native_reason(s, generation) == "Live")
        assert status["status"]["native"]["observedGeneration"] == generation
        assert gp.condition(status, "NativePolicies")["status"] == "True"
        assert live_webhook.metric("gpu_webhook_native_policies_stale") == 0

        generation = gp.put_spec(kube, {**spec, "excludeNamespaces": ["batch"]})["metadata"]["generation"]
        status = eventually_status(kube, lambda s: native_reason(s, generation) == "CompiledKeysChanged")
        condition = gp.condition(status, "NativePolicies")
        assert condition["status"] == "False" and "admission-policies --apply" in condition["message"]
        eventually("the stale gauge", lambda: live_webhook.metric("gpu_webhook_native_policies_stale") == 1)
    finally:
        kube.delete(f"{BINDINGS}/gpu-webhook-e2e-status")
    generation = gp.put_spec(kube, spec)["metadata"]["generation"]
    status = eventually_status(kube, lambda s: native_reason(s, generation) == "NotInstalled")
    assert "native" not in status["status"]
    eventually("the stale gauge", lambda: live_webhook.metric("gpu_webhook_native_policies_stale") == 0)


def native_reason(status: dict, generation: int) -> str | None:
    for c in status.get("conditions") or []:
        if c.get("type") == "NativePolicies" and c.get("observedGeneration") == generation:
            return c.get("reason")
    return None


def test_deleted_keeps_the_last_good_policy_and_says_so(live_webhook, kube):
    gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4"]}})
    eventually("the good spec", lambda: not allowed(live_webhook, "nvidia-h100")
               and live_webhook.metric("gpu_webhook_policy_object_present") == 1)
    gp.delete(kube)
    eventually("present 0", lambda: live_webhook.metric("gpu_webhook_policy_object_present") == 0)
    assert not allowed(live_webhook, "nvidia-h100") and allowed(live_webhook, "nvidia-l4")
    assert any("policy_object_missing" in line for line in live_webhook.log_lines())


def test_an_object_there_at_start_is_enforced_from_the_first_answer(cluster, kube, tmp_path):
    gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4"]}})
    server = start(tmp_path, cluster=cluster)  # returns once /readyz answers 200
    try:
        assert not allowed(server, "nvidia-h100")
        assert server.metric("gpu_webhook_policy_object_present") == 1
    finally:
        server.stop()


def test_of_two_replicas_one_writes_the_status(cluster, kube, live_webhook, tmp_path):
    """live_webhook has held the Lease since its start; a second replica waits, then takes over when it goes."""
    second = start(tmp_path, cluster=cluster)
    try:
        before = live_webhook.metric("gpu_webhook_policy_status_writes_total", result="success")
        generation = gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4", "two-replicas"]}})["metadata"][
            "generation"]
        eventually_status(kube, lambda s: (s.get("webhook") or {}).get("observedGeneration") == generation)
        time.sleep(3)  # what either would write by now, it wrote
        assert live_webhook.metric("gpu_webhook_policy_status_writes_total", result="success") > before
        assert second.metric("gpu_webhook_policy_status_writes_total", result="success") == 0
        assert not any("policy_status_lease_acquired" in line for line in second.log_lines())

        live_webhook.stop()  # SIGINT: its writer gives the Lease back
        generation = gp.put_spec(kube, {"accelerator": {"allowed": ["nvidia-l4", "taken-over"]}})["metadata"][
            "generation"]
        eventually_status(kube, lambda s: (s.get("webhook") or {}).get("observedGeneration") == generation,
                          timeout=30.0)
        assert second.metric("gpu_webhook_policy_status_writes_total", result="success") > 0
        assert any("policy_status_lease_acquired" in line for line in second.log_lines())
    finally:
        second.stop()
