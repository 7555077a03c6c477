"""``admission-policies --apply`` moves a cluster from one generated set to another object by object; the apiserver
evaluates a policy that reads params under a binding that names none with null params, the built-in defaults (a
node-bed upgrade from the inline generation admitted pods the policy refuses for a minute that way). Every
intermediate state of an apply, from inline to live and back, pairs no such policy with such a binding."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.cli.policies import _ordered
from webhook.core.policy import parse_policy
from webhook.native.generate import generate
from webhook.native.target import for_version

POLICY = "limits: {perPod: 6}\nnamespaces:\n  lab: {enforcement: warn}\n"


def objects(mode: str) -> list[dict[str, Any]]:
    return generate(parse_policy(POLICY + f"nativePolicies: {{params: {mode}}}\n"), for_version("1.37")).objects


def unsafe_pairs(state: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    out = []
    for (kind, name), binding in state.items():
        if not kind.endswith("Binding"):
            continue
        policy = state.get((kind.removesuffix("Binding"), binding["spec"]["policyName"]))
        if policy and policy["spec"].get("paramKind") and "paramRef" not in binding["spec"]:
            out.append(f"{kind}/{name} -> {policy['metadata']['name']}")
    return out


@pytest.mark.parametrize("before, after", [("inline", "live"), ("live", "inline")])
def test_no_moment_of_an_apply_evaluates_a_policy_with_null_params(before: str, after: str) -> None:
    state = {(o["kind"], o["metadata"]["name"]): o for o in objects(before)}
    assert unsafe_pairs(state) == []
    new = objects(after)
    ordered = _ordered(new)
    assert sorted(map(id, ordered)) == sorted(map(id, new))  # every object, once
    names = {(o["kind"], o["metadata"]["name"]) for o in new}
    for obj in ordered:
        if obj["spec"].get("paramKind"):  # apply() drops the old set's bindings of a policy that now reads params
            for key in [k for k, b in state.items() if k[0] == obj["kind"] + "Binding" and k not in names
                        and b["spec"]["policyName"] == obj["metadata"]["name"]]:
                del state[key]
        state[(obj["kind"], obj["metadata"]["name"])] = obj
        assert unsafe_pairs(state) == [], f"after {obj['kind']}/{obj['metadata']['name']}"


def test_the_order_before_the_fix_had_such_a_moment() -> None:
    """Policies first, then bindings (the previous order): the live gpu-webhook-deny met the inline binding."""
    state = {(o["kind"], o["metadata"]["name"]): o for o in objects("inline")}
    seen = []
    for obj in sorted(objects("live"), key=lambda o: o["kind"].endswith("Binding")):
        state[(obj["kind"], obj["metadata"]["name"])] = obj
        seen += unsafe_pairs(state)
    assert seen
