"""The HTTP interface, through a real TLS server on a loopback port verified with the CA from `gpu-webhook certs`."""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import time

import pytest

from tests.manifests import admission_review, container, pod, seed_pod, workload
from tests.server import client_context, make_certs, start_webhook

pytestmark = pytest.mark.process

GPU = "nvidia.com/gpu"
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


def test_the_seed_pod_is_admitted_and_the_answer_echoes_version_kind_and_uid(webhook):
    answer = webhook.post("/validate", admission_review(seed_pod()))
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": UID, "allowed": True}}


def test_v1beta1_is_answered_in_v1beta1(webhook):
    body = webhook.post("/validate", admission_review(seed_pod(), api_version="admission.k8s.io/v1beta1")).json()
    assert body["apiVersion"] == "admission.k8s.io/v1beta1" and body["response"]["uid"] == UID


def test_a_bad_pod_is_denied_with_every_violation_by_path(webhook):
    bad = pod(container("a", requests={GPU: 1}), container("b", limits={GPU: "500m"}))
    response = webhook.post("/validate", admission_review(bad)).json()["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert message.startswith("2 GPU violations: ")
    assert f"spec.containers[0].resources.requests[{GPU}]: container \"a\"" in message
    assert f"spec.containers[1].resources.limits[{GPU}]: container \"b\"" in message


def test_the_policy_file_is_in_force(webhook):
    five = pod(container(limits={GPU: 5}))
    assert webhook.post("/validate", admission_review(five)).json()["response"]["allowed"] is False


def test_a_warn_namespace_admits_with_warnings(webhook):
    bad = pod(container(requests={GPU: 1}))
    response = webhook.post("/validate", admission_review(bad, namespace="research")).json()["response"]
    assert response["allowed"] is True
    assert response["warnings"][0].startswith(f"spec.containers[0].resources.requests[{GPU}]: ")


def test_a_deployment_template_is_validated(webhook):
    bad = workload("Deployment", pod(container(limits={GPU: "1.5"})))
    message = webhook.post("/validate", admission_review(bad)).json()["response"]["status"]["message"]
    assert f"spec.template.spec.containers[0].resources.limits[{GPU}]" in message


def test_mutate_returns_a_json_patch_defaulting_requests(webhook):
    response = webhook.post("/mutate", admission_review(seed_pod())).json()["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/containers/0/resources/requests", "value": {GPU: 1}}
    ]


def test_mutate_sends_no_patch_when_nothing_changes(webhook):
    response = webhook.post("/mutate", admission_review(pod(container()))).json()["response"]
    assert response == {"uid": UID, "allowed": True}


def test_delete_with_a_null_object_is_allowed(webhook):
    response = webhook.post("/validate", admission_review(None, operation="DELETE")).json()["response"]
    assert response == {"uid": UID, "allowed": True}


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        (pod(container(limits={GPU: "two"})), '"two" is not a quantity'),
        ({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": "c"}},
         "spec.containers: must be a list of containers"),
        ("just a string", "request.object must be an object"),
    ],
    ids=["quantity two", "containers not a list", "object not a mapping"],
)
def test_an_odd_object_gets_a_200_denial_that_says_what_is_wrong(webhook, obj, says):
    review = admission_review(pod(container()))
    review["request"]["object"] = obj
    answer = webhook.post("/validate", review)
    assert answer.status == 200
    assert says in answer.json()["response"]["status"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"{not json", 400, "body is not JSON"),
        (b"[1, 2]", 400, "body is not a JSON object"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod"}).encode(), 400, "expected kind AdmissionReview"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(), 400,
         "AdmissionReview has no request"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}).encode(), 400,
         "request.uid is missing"),
        (b"\xff\xfe", 400, "body is not JSON"),
    ],
    ids=["not json", "not an object", "not a review", "no request", "no uid", "not utf-8"],
)
def test_bad_requests_get_a_400_with_a_short_message(webhook, body, status, error):
    answer = webhook.post("/validate", body)
    assert answer.status == status
    assert error in answer.json()["error"]


def test_wrong_method_is_405_and_unknown_path_is_404(webhook):
    assert webhook.request("GET", "/validate").status == 405
    assert webhook.request("PUT", "/mutate", b"{}").status == 405
    assert webhook.request("GET", "/nope").status == 404


def test_a_body_over_the_limit_is_413_before_it_is_sent(webhook):
    # Only the headers go out: the server answers from Content-Length without waiting for 7 MiB.
    conn = webhook.connection()
    conn.putrequest("POST", "/validate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(7 * 1024 * 1024 + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert "error" in json.loads(response.read())
    conn.close()


def test_a_body_just_under_the_limit_is_read(webhook):
    review = admission_review(pod(container()))
    review["request"]["object"]["metadata"]["annotations"] = {"big": "x" * (6 * 1024 * 1024)}
    assert webhook.post("/validate", review).json()["response"]["allowed"] is True


def test_health_readiness_and_metrics(webhook):
    assert webhook.request("GET", "/healthz").status == 200
    assert webhook.request("GET", "/readyz").status == 200
    before = webhook.metric("gpu_webhook_requests_total", endpoint="validate", kind="Pod", decision="denied")
    webhook.post("/validate", admission_review(pod(container(requests={GPU: 1}))))
    after = webhook.metric("gpu_webhook_requests_total", endpoint="validate", kind="Pod", decision="denied")
    assert after == before + 1
    assert webhook.metric("gpu_webhook_request_duration_seconds_count", endpoint="validate") >= 1


def test_one_json_log_line_per_decision_without_the_object(webhook):
    secret_env = [{"name": "TOKEN", "value": "s3cr3t-value"}]
    review = admission_review(pod(container(requests={GPU: 1}, env=secret_env), name="logged-pod"))
    review["request"]["uid"] = "log-test-uid"
    webhook.post("/validate", review)
    # The server writes the line after it answered: read until it is there (a busy machine takes a moment).
    deadline = time.monotonic() + 10
    while not any("log-test-uid" in line for line in webhook.log_lines()) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = [json.loads(line) for line in webhook.log_lines() if "log-test-uid" in line]
    assert len(lines) == 1
    line = lines[0]
    assert {k: line[k] for k in ("uid", "kind", "namespace", "name", "operation", "allowed")} == {
        "uid": "log-test-uid", "kind": "Pod", "namespace": "default", "name": "logged-pod",
        "operation": "CREATE", "allowed": False,
    }
    assert line["violations"] == [f"spec.containers[0].resources.requests[{GPU}] (requests-without-limits)"]
    assert isinstance(line["ms"], float)
    assert "s3cr3t-value" not in webhook.log.read_text()


def test_keep_alive_serves_many_requests_on_one_connection(webhook):
    conn = webhook.connection()
    for _ in range(20):
        assert webhook.post("/validate", admission_review(seed_pod()), conn=conn).status == 200
    conn.close()


def test_tls_is_http_1_1_and_at_least_tls_1_2(webhook):
    context = client_context(webhook.ca)
    context.set_alpn_protocols(["h2", "http/1.1"])
    with context.wrap_socket(__import__("socket").create_connection(("127.0.0.1", webhook.port)),
                             server_hostname="127.0.0.1") as tls:
        assert tls.selected_alpn_protocol() == "http/1.1"
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_the_server_certificate_must_verify_against_the_ca(webhook, tmp_path):
    other = make_certs(tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError):
        webhook.request("GET", "/healthz", context=client_context(other["ca"]))


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_rotated_certificate_is_served_without_restart(tmp_path):
    server = start_webhook(tmp_path)
    try:
        new = make_certs(tmp_path / "new")
        for name in ("cert", "key"):
            staged = getattr(server, name).with_suffix(".new")
            staged.write_bytes(new[name].read_bytes())
            os.replace(staged, getattr(server, name))

        def new_ca_verifies():
            try:
                return server.request("GET", "/healthz", context=client_context(new["ca"])).status == 200
            except ssl.SSLError:
                return False

        assert _wait_for(new_ca_verifies), server.log.read_text()
        server.ca = new["ca"]
        assert server.metric("gpu_webhook_reloads_total", what="certificate", result="success") >= 1
    finally:
        server.stop()


def test_a_broken_policy_is_rejected_and_the_last_good_one_stays(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("limits: {perContainer: 1}\n")
    server = start_webhook(tmp_path, "--policy", str(policy))
    two = admission_review(pod(container(limits={GPU: 2})))
    try:
        assert server.post("/validate", two).json()["response"]["allowed"] is False
        policy.write_text("limits: {perContainer: lots}\n")
        assert _wait_for(lambda: server.metric("gpu_webhook_reloads_total", what="policy", result="failure") >= 1)
        assert server.post("/validate", two).json()["response"]["allowed"] is False
        assert server.request("GET", "/readyz").status == 200
        policy.write_text("limits: {perContainer: 2}\n")
        assert _wait_for(lambda: server.post("/validate", two).json()["response"]["allowed"] is True)
    finally:
        server.stop()


def test_sigterm_fails_readiness_first_then_exits(tmp_path):
    server = start_webhook(tmp_path, "--drain-seconds", "2")
    try:
        assert server.request("GET", "/readyz").status == 200
        server.proc.send_signal(signal.SIGTERM)
        assert _wait_for(lambda: server.request("GET", "/readyz").status == 503, timeout=2)
        assert server.post("/validate", admission_review(seed_pod())).json()["response"]["allowed"] is True
        assert server.proc.wait(timeout=20) == 0
    finally:
        server.stop()


def test_idle_handshaken_connections_do_not_hold_the_worker_threads(webhook):
    # Go's transport (the apiserver's) parks freshly dialled connections idle when a request found
    # another connection first; more of them than the worker has threads must not stall it.
    import socket

    context = client_context(webhook.ca)
    idle = [context.wrap_socket(socket.create_connection(("127.0.0.1", webhook.port)), server_hostname="127.0.0.1")
            for _ in range(12)]  # handshakes complete here; no request follows
    try:
        started = time.monotonic()
        assert webhook.post("/validate", admission_review(seed_pod())).status == 200
        assert time.monotonic() - started < 2
    finally:
        for tls in idle:
            tls.close()


def test_a_metrics_port_serves_metrics_and_probes_over_plain_http_and_nothing_else(tmp_path):
    """With --metrics-port the admission port can be opened to the apiserver alone (NetworkPolicy) and the
    monitoring scrapes elsewhere; probes work there even when the admission port demands client certificates."""
    import http.client

    from tests.server import free_port

    metrics_port = free_port()
    server = start_webhook(tmp_path, "--metrics-port", str(metrics_port))
    try:
        assert server.post("/validate", admission_review(seed_pod())).status == 200

        def plain(method: str, path: str) -> int:
            conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=5)
            try:
                conn.request(method, path, body=b"{}" if method == "POST" else None)
                return conn.getresponse().status
            finally:
                conn.close()

        assert [plain("GET", p) for p in ("/metrics", "/healthz", "/readyz")] == [200, 200, 200]
        assert plain("POST", "/validate") == 404 and plain("POST", "/mutate") == 404
        assert server.request("GET", "/metrics").status == 404
        assert server.request("GET", "/readyz").status == 200
    finally:
        server.stop()
