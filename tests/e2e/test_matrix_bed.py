"""The apiserver version matrix itself (fixture ``matrix_cluster``, tests/e2e/conftest.py): each bed is the
Kubernetes version it claims, serves the admission-policy APIs that version serves with the flags it was given,
and enforces a ValidatingAdmissionPolicy. Runs bed by bed, one apiserver at a time."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.cluster import MAP_BETA, MAP_DEFAULT, MAP_OFF, ControlPlane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

VALIDATING = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
MUTATING = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}

POLICY = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "matrix-deny-me"},
    "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                                "resources": ["configmaps"]}]},
        "validations": [{"expression": "object.metadata.name != 'deny-me'", "message": "matrix bed says no"}],
    },
}
BINDING = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": "matrix-deny-me"},
    "spec": {"policyName": "matrix-deny-me", "validationActions": ["Deny"]},
}


def mutating_versions(minor: int, mutating_policy: str) -> set[str]:
    """Where a bed serves MutatingAdmissionPolicy (docs: v1beta1 in 1.34-1.35 behind a gate, v1 from 1.36)."""
    if mutating_policy == MAP_BETA:
        return {"v1beta1"}
    if mutating_policy == MAP_OFF:
        return set()
    assert mutating_policy == MAP_DEFAULT
    return {"v1"} if minor >= 36 else set()


def configmap(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}})


def test_version_is_the_beds(matrix_cluster: ControlPlane) -> None:
    assert matrix_cluster.bed is not None
    assert matrix_cluster.version() == matrix_cluster.bed.version


def matrix_apiservers() -> list[str]:
    """The work directories of the matrix kube-apiservers this process started (the main bed's is not one)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                argv = (proc / "cmdline").read_bytes().decode().split("\0")
                found += [arg.split("=", 1)[1].rsplit("/", 2)[0] for arg in argv
                          if argv[0].endswith("/kube-apiserver") and arg.startswith("--tls-cert-file=")
                          and "/gpu-webhook-matrix-" in arg]
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
    return found


def test_only_this_bed_runs(matrix_cluster: ControlPlane) -> None:
    """The fixture stops a bed before it starts the next: one matrix kube-apiserver runs, this bed's."""
    assert matrix_apiservers() == [str(matrix_cluster.workdir)]


def test_discovery_serves_the_versions_policy_apis(matrix_cluster: ControlPlane) -> None:
    bed = matrix_cluster.bed
    assert bed is not None
    served = matrix_cluster.admission_policy_apis()
    assert VALIDATING <= served.get("v1", frozenset()), served
    with_mutating = {version for version, kinds in served.items() if kinds & MUTATING}
    assert with_mutating == mutating_versions(bed.minor, bed.mutating_policy), served
    for version in with_mutating:  # the policy and its binding together, never one alone
        assert MUTATING <= served[version], served


def test_a_validating_admission_policy_denies(matrix_cluster: ControlPlane) -> None:
    for document in (POLICY, BINDING):
        matrix_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(document), check=True)
    deadline = time.monotonic() + 30  # the apiserver's policy informer picks the binding up within seconds
    while True:
        denied = matrix_cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=configmap("deny-me"))
        if denied.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert denied.returncode != 0, "deny-me was admitted for 30 s after the policy and binding were applied"
    assert "ValidatingAdmissionPolicy 'matrix-deny-me'" in denied.stderr, denied.stderr
    assert "matrix bed says no" in denied.stderr, denied.stderr
    admitted = matrix_cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=configmap("allow-me"))
    assert admitted.returncode == 0, admitted.stderr


# --- upstream: a passing validation's messageExpression still runs, and is charged -----------------------------
# The reproduction docs/native-policies.md gives ("Messages cost even when nothing is wrong"): twelve validations
# that always pass, each with a messageExpression of about 900,000 cost units (a 45,000-character string matched
# against an 800-character regular expression: cheap in time, dear in cost). Their sum is over the 10,000,000
# budget of one evaluation, so the object is refused although every validation passed. The same validations with a
# static message admit it, and so do eleven of them.
REGEX = "b*" * 400
TEXT = "a" * 45_000


def message_cost_policy(name: str, dynamic: bool, validations: int = 12) -> dict:
    message = ({"messageExpression": f"object.data.x.matches('{REGEX}') ? 'matched' : 'not matched'"} if dynamic
               else {"message": "static"})
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["configmaps"]}]},
            "matchConditions": [{"name": "this-test", "expression": f"object.metadata.name.startsWith('{name}')"}],
            # A probe ConfigMap named NAME-probe is refused once the policy is in force (a static message).
            "validations": [{"expression": f"object.metadata.name != '{name}-probe'", "message": "probe"}] +
                           [{"expression": "true", **message} for _ in range(validations)],
        },
    }


def test_a_passing_validations_message_expression_is_run_and_charged(matrix_cluster: ControlPlane) -> None:
    for name, dynamic, validations in (("message-expression", True, 12), ("static-message", False, 12),
                                       ("eleven-messages", True, 11)):
        binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                   "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}
        for document in (message_cost_policy(name, dynamic, validations), binding):
            matrix_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(document), check=True)

    def create(name: str) -> subprocess.CompletedProcess:
        return matrix_cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": {"x": TEXT}}))

    deadline = time.monotonic() + 30
    for name in ("message-expression", "static-message", "eleven-messages"):
        while create(f"{name}-probe").returncode == 0:
            assert time.monotonic() < deadline, f"{name} never took effect"
            time.sleep(0.5)
    refused = create("message-expression")
    assert refused.returncode != 0, "twelve passing validations did not refuse the ConfigMap"
    assert "ValidatingAdmissionPolicy 'message-expression'" in refused.stderr, refused.stderr
    assert "failed messageExpression" in refused.stderr and "cost budget" in refused.stderr, refused.stderr
    print(f"{matrix_cluster.bed.id if matrix_cluster.bed else '?'}: {refused.stderr.strip()}")
    # The static messages' policy and eleven such messages (about 9.9 million units) admit.
    for name in ("static-message", "eleven-messages"):
        admitted = create(name)
        assert admitted.returncode == 0, admitted.stderr
