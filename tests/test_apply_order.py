"""A change between ``nativePolicies.params`` inline and live never switches a policy in place. In place, a policy
that gains paramKind meets its old binding, which names no param, and the apiserver evaluates the pair with null
params, the built-in defaults (a node-bed upgrade from the inline generation admitted pods the policy refuses for a
minute that way); and a binding may gain a paramRef only from who may read every kind while its stored policy names
none (the chart's Job was refused). So the live set's names are not the inline set's: ``--apply`` adds the new set
beside the old and prunes the old once the new one acts."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.cli.policies import _ordered
from webhook.core.policyfile import parse_policy
from webhook.native.generate import generate
from webhook.native.target import for_version

POLICY = "limits: {perPod: 6}\nnamespaces:\n  lab: {enforcement: warn}\n"
TARGETS = [for_version("1.30"), for_version("1.34", ["admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"]),
           for_version("1.37")]


def objects(mode: str, target: Any) -> list[dict[str, Any]]:
    return generate(parse_policy(POLICY + f"nativePolicies: {{params: {mode}}}\n"), target).objects


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.describe())
def test_the_live_and_the_inline_sets_share_no_name(target: Any) -> None:
    inline = {(o["kind"], o["metadata"]["name"]) for o in objects("inline", target)}
    live = {(o["kind"], o["metadata"]["name"]) for o in objects("live", target)}
    assert inline and live and not inline & live


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.describe())
def test_every_binding_of_a_policy_that_reads_params_names_the_object_and_follows_its_policy(target: Any) -> None:
    ordered = _ordered(objects("live", target))
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in ordered:
        if obj["kind"].endswith("Binding"):
            policy = seen[(obj["kind"].removesuffix("Binding"), obj["spec"]["policyName"])]  # applied before it
            assert bool(policy["spec"].get("paramKind")) == ("paramRef" in obj["spec"]), obj["metadata"]["name"]
        else:
            seen[(obj["kind"], obj["metadata"]["name"])] = obj
