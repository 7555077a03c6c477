"""Hybrid mode where MutatingAdmissionPolicy is not served: the node bed's kube-apiserver restarted with the API and
its admission plugin off (``NodeBed.restart_apiserver(MAP_OFF)``, the flags of tests/e2e/cluster.py's MAP-off
beds), the same node build, then back to the default for the modules after this one.

The release of test_node_release.py, webhook-only, takes the load and the SIGKILL of test_node_hybrid.py (the
baseline on this bed). Then ``helm upgrade --set admissionPolicies.enabled=true`` with the chart's defaults: the hook
Job applies ValidatingAdmissionPolicies only, the mutation stays with the webhook, the validating webhooks get
failurePolicy Ignore and the mutating webhook Fail (NOTES says so). The same kill must cost no admission to the
validating side; what it costs the mutating side is recorded: creates refused with ``failed calling webhook
"mutate.gpu-webhook.io"`` (their controllers retry them), and no GPU pod admitted without its accelerator selector.
Last, ``admissionPolicies.mutatingWebhookFailurePolicy=Ignore``: the same kill fails nothing, and the pods admitted
without the selector the default accelerator would have added are counted (the cost of Ignore: such a pod can
land on the wrong GPU model).

The tests share the release and run in file order. Figures are printed after each test (``-s``).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.cluster import MAP_DEFAULT, MAP_OFF
from tests.e2e.load import LoadReport
from tests.e2e.node import NodeBed
from tests.e2e.test_node_hybrid import (
    MUTATE_CALL,
    VALIDATE_CALL,
    _causes,
    _kill_a_replica_under_load,
    _native_takes_over,
    _steady,
)
from tests.e2e.test_node_release import (  # noqa: F401 (release is a fixture, used by name)
    NAMESPACE,
    POLICY,
    RELEASE,
    _dry_run,
    _upgrade,
    release,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420),
              pytest.mark.usefixtures("map_off", "release")]

DEFAULT_ACCELERATOR = POLICY["accelerator"]["default"]
FIGURES: dict[str, object] = {}


@pytest.fixture(scope="module")
def map_off(node_bed: NodeBed):
    """The bed's apiserver without MutatingAdmissionPolicy for this module (set up before ``release``, torn down
    after it), then as it was."""
    FIGURES["apiserver restarted without MutatingAdmissionPolicy, node Ready (s)"] = round(
        node_bed.restart_apiserver(MAP_OFF), 1)
    try:
        yield node_bed
    finally:
        node_bed.restart_apiserver(MAP_DEFAULT)


def _served(bed: NodeBed) -> set[str]:
    return set(bed.kubectl("api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name",
                           check=True).stdout.split())


def _failure_policies(bed: NodeBed) -> dict[str, str]:
    return {hook["name"]: hook["failurePolicy"]
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
            for hook in bed.kubectl_json("get", kind, RELEASE)["webhooks"]}


def _notes(bed: NodeBed) -> str:
    result = bed.helm("get", "notes", RELEASE, "--namespace", NAMESPACE)
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())


def _print() -> None:
    print(json.dumps(FIGURES, indent=1))


def test_the_bed_serves_no_mutating_admission_policy(node_bed):
    served = _served(node_bed)
    assert "validatingadmissionpolicies.admissionregistration.k8s.io" in served, served
    assert not [r for r in served if r.startswith("mutatingadmissionpolic")], served
    assert "--disable-admission-plugins=MutatingAdmissionPolicy" in node_bed.apiserver_args()


def test_webhook_only_a_killed_replica_on_this_bed(node_bed):
    assert set(_failure_policies(node_bed).values()) == {"Fail"}
    FIGURES["webhook only, steady (10 s)"] = _steady(node_bed)
    figures = _kill_a_replica_under_load(node_bed)
    figures.pop("report")
    FIGURES["webhook only, one replica SIGKILLed"] = figures
    _print()


def test_hybrid_by_default_validates_natively_and_leaves_the_mutation_to_a_fail_webhook(node_bed):
    FIGURES["hybrid upgrade (s)"] = round(_upgrade(node_bed, "--set", "admissionPolicies.enabled=true"), 1)
    returned = time.monotonic()
    names = node_bed.kubectl("get", "validatingadmissionpolicies", "-o", "name",
                             "-l", "app.kubernetes.io/component=admission-policies", check=True).stdout.split()
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-webhook-live-deny" in names, names
    assert not node_bed.kubectl("get", "mutatingadmissionpolicies").returncode == 0
    policies = _failure_policies(node_bed)
    assert policies.pop("mutate.gpu-webhook.io") == "Fail"
    assert set(policies.values()) == {"Ignore"}, policies
    mutate = node_bed.kubectl_json("get", "mutatingwebhookconfiguration", RELEASE)["webhooks"][0]
    assert not any(c["expression"] == "false" for c in mutate["matchConditions"]), mutate["matchConditions"]
    notes = _notes(node_bed)
    assert "Mutation: the webhook (failurePolicy Fail): this cluster serves no MutatingAdmissionPolicy" in notes, notes
    assert "with Ignore they are admitted" not in notes

    _native_takes_over(node_bed, returned, FIGURES)
    _print()


def _outcome(report: LoadReport, figures: dict[str, object]) -> tuple[list, list]:
    admitted = [r for r in report.results if r.ok]
    unselected = [r for r in admitted if r.accelerator is None]
    figures["admitted"] = len(admitted)
    figures["admitted without the accelerator selector"] = len(unselected)
    figures["accelerators of the admitted"] = sorted({str(r.accelerator) for r in admitted})
    return admitted, unselected


def test_hybrid_mutating_fail_a_killed_replica_refuses_some_creates_and_admits_none_unmutated(node_bed):
    FIGURES["hybrid (mutating Fail), steady (10 s)"] = _steady(node_bed)
    figures = _kill_a_replica_under_load(node_bed)
    report = figures.pop("report")
    assert isinstance(report, LoadReport)
    admitted, unselected = _outcome(report, figures)
    causes = _causes(report.results)
    figures[f"refused: {MUTATE_CALL}"] = f"{causes.get(MUTATE_CALL, 0)} of {report.sent}"
    FIGURES["hybrid (mutating Fail), one replica SIGKILLed"] = figures
    _print()
    # Validation loses nothing: no call of a validating webhook failed an admission, no native policy refused one
    # of these valid pods; the only failures are the mutating webhook's, as chosen.
    assert VALIDATE_CALL not in causes and set(causes) <= {MUTATE_CALL}, causes
    # Fail never admits a GPU pod without its selector.
    assert not unselected and {r.accelerator for r in admitted} == {DEFAULT_ACCELERATOR}, figures


def test_hybrid_mutating_ignore_a_killed_replica_fails_nothing_and_admits_some_unmutated(node_bed):
    _upgrade(node_bed, "--set", "admissionPolicies.mutatingWebhookFailurePolicy=Ignore")
    assert set(_failure_policies(node_bed).values()) == {"Ignore"}
    notes = _notes(node_bed)
    assert "Mutation: the webhook (failurePolicy Ignore)" in notes, notes
    assert "with Ignore they are admitted without the accelerator selector" in notes, notes
    FIGURES["hybrid (mutating Ignore), steady (10 s)"] = _steady(node_bed)
    figures = _kill_a_replica_under_load(node_bed)
    report = figures.pop("report")
    assert isinstance(report, LoadReport)
    admitted, unselected = _outcome(report, figures)
    figures["admitted without the selector, sent s into the load"] = [
        round(r.sent - report.started, 2) for r in unselected]
    FIGURES["hybrid (mutating Ignore), one replica SIGKILLed"] = figures
    _print()
    assert not _causes(report.results), figures
    assert {r.accelerator for r in admitted} <= {DEFAULT_ACCELERATOR, None}, figures
