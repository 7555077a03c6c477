"""The HTTP layer in process (Flask's test client): what an internal error, a bad body and a wrong method
answer, what is logged, and when readiness fails. The real server runs the same app (tests/test_http.py)."""

from __future__ import annotations

import json

import pytest

from tests.manifests import admission_review, container, pod, seed_pod
from webhook.core.policyfile import load_policy
from webhook.rules import admission
from webhook.serving.app import create_app
from webhook.telemetry import metrics

POLICY = load_policy(None)


def broken(request, policies, nodes):
    raise RuntimeError("a bug in a rule")


def client(handlers=None):
    app = create_app(lambda: POLICY, lambda: None, handlers=handlers or {"/validate": admission.validate})
    return app.test_client()


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_an_internal_error_is_an_http_500_so_the_failure_policy_governs(capsys):
    """An ``allowed: false`` answer is a rejection whatever the webhook's failurePolicy says; a 500 is a failed
    call, which the apiserver hands to the failurePolicy (Fail refuses, Ignore admits)."""
    answer = client({"/validate": broken}).post("/validate", json=admission_review(seed_pod()))
    assert answer.status_code == 500
    assert answer.get_json() == {"error": "internal error in gpu-webhook while evaluating the object"}
    lines = json_lines(capsys.readouterr().err)
    failure = next(line for line in lines if line["event"] == "handler_failed")
    assert failure["level"] == "error" and "RuntimeError: a bug in a rule" in failure["traceback"]


def test_readiness_fails_after_internal_errors_in_a_row_and_recovers_after_a_success():
    handlers = {"/validate": admission.validate, "/broken": broken}
    web = client(handlers)
    review = admission_review(seed_pod())
    assert web.get("/readyz").status_code == 200
    for _ in range(3):
        assert web.post("/broken", json=review).status_code == 500
    ready = web.get("/readyz")
    assert ready.status_code == 503 and b"the last 3 admission requests failed" in ready.data
    assert web.post("/validate", json=review).status_code == 200
    assert web.get("/readyz").status_code == 200


def test_readiness_fails_when_the_handler_cannot_decide_a_known_good_review():
    ready = client({"/validate": broken}).get("/readyz")
    assert ready.status_code == 503 and b"known-good review: RuntimeError" in ready.data


def test_a_wrong_method_gets_405_with_an_allow_header():
    answer = client().get("/validate")
    assert answer.status_code == 405 and "POST" in answer.headers["Allow"]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":42}}',
         "request.uid must be a string, not int"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","n":' + b"7" * 5000
         + b"}}", "body has a number out of range"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","n":1e400}}',
         "body has a number out of range"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","n":NaN}}',
         "body is not JSON"),
        (b"[" * 5000 + b"]" * 5000, "body is nested too deeply"),
    ],
    ids=["numeric uid", "5000-digit number", "1e400", "NaN", "nesting bomb"],
)
def test_bad_bodies_get_a_400_that_says_what_is_wrong(body, error, capsys):
    answer = client().post("/validate", data=body, content_type="application/json")
    assert (answer.status_code, answer.get_json()["error"]) == (400, error)
    logged = [line for line in json_lines(capsys.readouterr().err) if line["event"] == "bad_request"]
    assert logged and logged[0]["reason"] == error and logged[0]["status"] == 400


def test_each_violation_is_counted_under_its_rule_and_action():
    """gpu_webhook_violations_total{endpoint,rule,action} feeds the dashboard's refusals by rule: one count per
    violation the answer carries, with the rule id the decision log names."""
    review = admission_review(pod(container(requests={"nvidia.com/gpu": 1})))
    rules = [v.rule for v in admission.validate(review["request"], POLICY, None).violations]
    assert rules, "the pod must break a rule for this test to mean anything"

    def count(rule: str) -> float:
        value = metrics.REGISTRY.get_sample_value(
            "gpu_webhook_violations_total", {"endpoint": "validate", "rule": rule, "action": "deny"}
        )
        return value or 0.0

    before = {rule: count(rule) for rule in rules}
    assert client().post("/validate", json=review).get_json()["response"]["allowed"] is False
    for rule in set(rules):
        assert count(rule) == before[rule] + rules.count(rule)


def test_reload_and_audit_run_counters_start_at_zero():
    """A first failed reload must show as an increase from 0 (Prometheus' increase() needs two samples)."""
    for what in ("policy", "certificate"):
        for result in ("success", "failure"):
            labels = {"what": what, "result": result}
            assert metrics.REGISTRY.get_sample_value("gpu_webhook_reloads_total", labels) is not None
    for result in ("success", "failure"):
        assert metrics.REGISTRY.get_sample_value("gpu_webhook_audit_runs_total", {"result": result}) is not None
