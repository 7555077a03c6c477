"""The inline mode (``nativePolicies.params: inline``: the policy's values written into the CEL, one deny and one warn
policy per family, no params) on the newest bed of the matrix, so the option stays proven on a real apiserver: the
apiserver decides every object of the corpus as the webhook does, and a warn namespace gets the deny policy's
aggregated warning through its ``-warn`` binding. The live mode, the default, goes through the same differential on
every bed of tests/e2e/test_native_policies.py; the bed is tests/e2e/native_bed.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import ControlPlane
from tests.e2e.conftest import MATRIX_BEDS
from tests.e2e.native_bed import (
    COMPONENT,
    INLINE,
    NativeBed,
    assert_agrees,
    decide,
    differential,
    native_bed,
    warning_text,
)
from tests.native_corpus import LAB, NS, POLICY, Case, as_pytorchjob, gpu, spec
from webhook.core import gpupolicy

BEDS = [bed for bed in MATRIX_BEDS if bed.id == "1.37"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.parametrize("matrix_cluster", BEDS, ids=[b.id for b in BEDS], indirect=True)]
CUSTOM = "gpu-webhook-custom-deny"


@pytest.fixture(scope="module")
def bed(matrix_cluster: ControlPlane) -> Iterator[NativeBed]:
    yield from native_bed(matrix_cluster, POLICY, INLINE)


def test_inline_policies_read_no_params_and_keep_one_policy_per_family_and_action(bed):
    listed = json.loads(bed.cluster.kubectl(
        "get", "validatingadmissionpolicies,validatingadmissionpolicybindings", "-l", COMPONENT, "-o", "json",
        check=True).stdout)["items"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in listed) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in bed.generated.objects if o["kind"].startswith("Valid"))
    assert sorted(o["metadata"]["name"] for o in listed if o["kind"] == "ValidatingAdmissionPolicy") == sorted(
        f"gpu-webhook-{family}{action}" for family in ("", "claims-", "custom-") for action in ("deny", "warn"))
    for obj in listed:
        assert "paramKind" not in obj["spec"] and "paramRef" not in obj["spec"], obj["metadata"]["name"]
    assert bed.generated.policy_object is None
    assert bed.cluster.kubectl("get", f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}", gpupolicy.NAME).returncode != 0


def test_the_apiserver_decides_every_object_of_the_corpus_as_the_webhook_does(bed):
    assert_agrees(differential(bed, what=" inline"))


def test_a_warn_namespace_gets_the_deny_policys_warning_through_its_warn_binding(bed):
    obj = as_pytorchjob("warned", spec(gpu(5, securityContext={"privileged": True})), {})
    refused = bed.api.create(obj, NS)
    assert not refused.admitted and f"ValidatingAdmissionPolicy '{CUSTOM}'" in refused.message
    answer = bed.api.create(obj, LAB)
    assert answer.admitted, answer.message
    texts = [warning_text(w) for w in answer.warnings]
    denied = [t for t in texts if f"'{CUSTOM}' with binding '{CUSTOM}-warn'" in t]
    assert len(denied) == 1, texts
    expected = decide(bed.policies, Case("warned", LAB, obj))
    assert expected.allowed and expected.warnings
    for line in expected.warnings:
        assert line in denied[0], (line, denied[0])
