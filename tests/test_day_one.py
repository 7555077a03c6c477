"""Do no harm: with the default policy the platform's node agents get no finding, other node agents are never
refused (a tenant rule that finds something on a pod asking for no GPU warns outside a tenant namespace), tenants'
exploit shapes are warned, and refused once ``isolation.tenantNamespaces`` names the tenants' namespaces; the kinds
users run are looked into, and GPUs no rule reads are reported, in every engine.

The corpus is tests/day_one.py: each case names the findings every engine must give it, rule by rule. The webhook
(its /validate, through the Flask app), ``check`` (its JSON output) and the generated admission policies (the
apiserver's CEL, tests/celeval) are held to it; the e2e tier holds a real kube-apiserver to the same
(tests/e2e/test_day_one_native.py), and the node tier the chart on a real node (tests/e2e/test_node_day_one.py).
"""

from __future__ import annotations

import io
import json
import re
from collections import defaultdict

import pytest
import yaml

from tests.celeval import Request, evaluate
from tests.day_one import (
    EVERY_TAINT_MESSAGE,
    OPERATOR,
    STRICT,
    Case,
    agents,
    agents_elsewhere,
    corpus,
    device_plugin,
    excluded,
    operands,
    platform,
    tenants,
)
from webhook.cli import check
from webhook.core.kinds import BLOCK_KINDS
from webhook.core.policyfile import load_policy, parse_policy
from webhook.native.generate import generate
from webhook.native.target import for_version
from webhook.rules import admission
from webhook.serving.app import create_app

POLICIES = load_policy(None)
STRICT_POLICIES = parse_policy(STRICT)
CASES = corpus()
MODES = {"default": (POLICIES, False), "tenants-named": (STRICT_POLICIES, True)}


def review(case: Case) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "operation": "CREATE", "namespace": case.namespace, "object": case.obj,
        "kind": {"group": case.group, "version": case.obj["apiVersion"].rpartition("/")[2], "kind": case.kind}}}


@pytest.fixture(scope="module")
def webhook():
    app = create_app(lambda: POLICIES, lambda: None, handlers={"/validate": admission.validate})
    return app.test_client()


@pytest.fixture(scope="module")
def strict_webhook():
    app = create_app(lambda: STRICT_POLICIES, lambda: None, handlers={"/validate": admission.validate})
    return app.test_client()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_webhook_finds_what_the_case_says(webhook, strict_webhook, case, mode):
    policies, strict = MODES[mode]
    expected = case.expects(strict)
    decided = admission.decide(case.obj, case.group, case.kind, case.namespace, policies)
    assert {v.rule: a for v, a in zip(decided.violations, decided.actions, strict=True)} == expected
    answer = (strict_webhook if strict else webhook).post("/validate", json=review(case)).get_json()["response"]
    denies = [r for r, a in expected.items() if a == "deny"]
    assert answer["allowed"] is not bool(denies), answer
    assert len(answer.get("warnings", [])) == sum(a == "warn" for a in decided.actions)


def test_no_node_agent_is_refused_in_its_namespace_or_elsewhere_and_a_softened_denial_says_why():
    """The agents of the notes' table, in their documented namespaces and in a release namespace such as
    ``observability``, with the default policy and with the tenants named: warned at most. A warning that a denial
    was softened says why; one the rule's own setting gives does not."""
    cases = [*agents(), *agents_elsewhere()]
    assert len(cases) == 28
    softened = 0
    for case in cases:
        for policies in (POLICIES, STRICT_POLICIES):
            decided = admission.decide(case.obj, case.group, case.kind, case.namespace, policies)
            assert decided.allowed, (case.name, decided.message)
            for violation, action in zip(decided.violations, decided.actions, strict=True):
                assert action == "warn"
                is_softened = policies.for_namespace(case.namespace).action(violation.rule) == "deny"
                assert (admission.NOT_TENANT in violation.message) is is_softened, (case.name, violation.message)
                softened += is_softened
    assert softened >= 30


def test_a_pod_that_asks_for_a_gpu_is_refused_by_the_tenant_rules_in_any_namespace():
    """Severity by shape: the softening is for pods that ask for no GPU. A privileged GPU pod in a namespace no list
    names is refused, and so is a GPU pod's CPU sidecar that names every GPU."""
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "observability"},
                  "spec": {"containers": [{"name": "train", "image": "x", "securityContext": {"privileged": True},
                                           "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    sidecar = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s", "namespace": "observability"},
               "spec": {"containers": [{"name": "train", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}},
                                       {"name": "sidecar", "image": "x",
                                        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    for obj, rule in ((privileged, "privileged-gpu"), (sidecar, "visible-devices-without-gpu")):
        decided = admission.decide(obj, "", "Pod", "observability", POLICIES)
        assert not decided.allowed
        assert {v.rule: a for v, a in zip(decided.violations, decided.actions, strict=True)} == {rule: "deny"}
        assert admission.NOT_TENANT not in decided.message


def test_the_platforms_node_agents_get_no_finding():
    """The GPU Operator's operands (13 objects), the device plugin's DaemonSets, calico-node: nothing at all."""
    agents = platform()
    assert len(agents) == 17
    assert all(not c.expected for c in agents)
    for case in agents:
        decided = admission.decide(case.obj, case.group, case.kind, case.namespace, POLICIES)
        assert decided.violations == (), case.name


def test_the_same_agents_are_refused_or_warned_in_a_tenants_namespace():
    """What trust leaves alone is what the rules are about: the operands moved to a tenant's namespace, where the
    tenants are named."""
    rules: set[str] = set()
    refused = 0
    for case in operands("team-b"):
        decided = admission.decide(case.obj, case.group, case.kind, "team-b", STRICT_POLICIES)
        rules |= {v.rule for v in decided.violations}
        refused += not decided.allowed
    assert {"privileged-gpu", "gpu-device-mount", "visible-devices-without-gpu", "cdi-annotation", "admin-access",
            "cpu-pod-on-gpu-nodes", "init-container-gpus", "node-name-with-gpus",
            "runtime-class-without-gpu"} <= rules
    assert refused >= 10


def test_a_tenants_agent_that_tolerates_every_taint_is_told_so_once():
    agent = tenants()[0]
    decided = admission.decide(agent.obj, agent.group, agent.kind, agent.namespace, STRICT_POLICIES)
    assert not decided.allowed
    for violation in decided.violations:
        assert violation.message.count("tolerates every taint") == 1, violation.message
        assert EVERY_TAINT_MESSAGE in violation.message


def test_platform_gpu_operator_trusts_the_operator_whatever_the_lists_say():
    bare = parse_policy("isolation: {platformNamespaces: [], tenantNamespaces: ['*']}")
    preset = parse_policy("platform: gpu-operator\nisolation: {platformNamespaces: [], trusted: {namespaces: [x]}}")
    driver = operands()[0]
    assert not admission.decide(driver.obj, driver.group, driver.kind, OPERATOR, bare).allowed
    assert admission.decide(driver.obj, driver.group, driver.kind, OPERATOR, preset).violations == ()
    assert preset.for_namespace("nvidia-gpu-operator").trusted


def _manifests(cases: list[Case]) -> str:
    def placed(case: Case) -> dict:
        metadata = dict(case.obj["metadata"])
        if case.namespace:
            metadata["namespace"] = case.namespace
        return {**case.obj, "metadata": metadata}
    return yaml.safe_dump_all([placed(c) for c in cases], sort_keys=False)


@pytest.mark.parametrize("mode", MODES)
def test_check_finds_the_same_and_counts_what_it_looked_into(tmp_path, mode):
    policies, strict = MODES[mode]
    manifests = tmp_path / "day-one.yaml"
    manifests.write_text(_manifests(CASES), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    status = check.run([str(manifests)], policies, output="json", out=out, err=err)
    report = json.loads(out.getvalue())
    by_object: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    softened: set[tuple[str, str]] = set()
    for finding in report["findings"]:
        by_object[(finding["kind"], finding["name"])][finding["rule"]] = finding["action"]
        if admission.NOT_TENANT in finding["message"]:
            softened.add((finding["name"], finding["rule"]))
    for case in CASES:
        assert by_object.get((case.kind, case.obj["metadata"]["name"]), {}) == case.expects(strict), case.name
    # check says which warnings are softened denials: the datadog agent's NVIDIA_VISIBLE_DEVICES, not its
    # RuntimeClass (a warning by its own setting)
    assert ("datadog", "visible-devices-without-gpu") in softened
    assert ("datadog", "runtime-class-without-gpu") not in softened
    assert (("everywhere", "privileged-gpu") in softened) is not strict
    assert status == 1
    assert report["summary"]["objects"] == len(CASES)
    assert report["summary"]["nothingToCheck"] == 1  # the ConfigMap
    assert err.getvalue().splitlines()[-1].startswith(f"1 object with nothing to check; {len(CASES) - 1} objects "
                                                      "checked, ")


def test_check_leaves_the_excluded_namespaces_alone_and_says_so(tmp_path):
    manifests = tmp_path / "kube-system.yaml"
    manifests.write_text(_manifests(excluded() + device_plugin("nvidia-device-plugin")[:1]), encoding="utf-8")
    err = io.StringIO()
    assert check.run([str(manifests)], POLICIES, out=io.StringIO(), err=err) == 0
    lines = err.getvalue().splitlines()
    assert "skipped 6 objects in kube-system, which no engine checks (excludeNamespaces)" in lines
    assert lines[-1] == "1 object checked, 0 denied, 0 warned"
    # the same namespace, once the policy stops excluding it: the privileged agents are warned about (they ask for
    # no GPU, and kube-system is no tenant's), and refused once it is named a tenant's
    err = io.StringIO()
    assert check.run([str(manifests)], parse_policy("excludeNamespaces: []"), out=io.StringIO(), err=err) == 0
    assert err.getvalue().splitlines()[-1] == "7 objects checked, 0 denied, 6 warned"
    named = parse_policy("excludeNamespaces: []\nisolation: {tenantNamespaces: [kube-system]}")
    assert check.run([str(manifests)], named, out=io.StringIO(), err=io.StringIO()) == 1


def test_a_kind_with_resource_blocks_named_by_the_policy_is_read_in_check_and_the_webhook():
    unknown = next(c for c in CASES if c.name == "unseen/unknown-kind")
    policies = parse_policy("nativePolicies:\n  customKinds:\n  - {group: example.com, resource: modelservers, "
                            "kind: ModelServer, resources: [spec.accelerators]}\n")
    decided = admission.decide(unknown.obj, unknown.group, unknown.kind, unknown.namespace, policies)
    assert [(str(v.path), v.rule) for v in decided.violations] == [
        ("spec.accelerators.limits[nvidia.com/gpu]", "invalid-quantity")]
    assert not decided.allowed
    off = parse_policy("checks: {uncheckedGpu: \"off\"}")
    assert admission.decide(unknown.obj, unknown.group, unknown.kind, unknown.namespace, off).violations == ()


# --- the generated admission policies ---------------------------------------------------------------------------

BLOCKS = {k.kind for k in BLOCK_KINDS}


def native_expected(case: Case, native: set[str], strict: bool = False) -> bool:
    """Whether the generated policies must refuse the case: a denial whose rule they carry, on what they read."""
    if case.kind in BLOCKS:
        return False  # resource blocks are the webhook's (admission-policies says so)
    return any(action == "deny" and rule in native for rule, action in case.expects(strict).items())


def native_warnings(case: Case, policies, native: set[str]) -> list[str]:
    """The warnings the generated policies give the case, as the webhook words them: one per warned native rule,
    its violations described as the webhook describes a denial's."""
    decided = admission.decide(case.obj, case.group, case.kind, case.namespace, policies)
    by_rule: dict[str, list] = defaultdict(list)
    for violation, action in zip(decided.violations, decided.actions, strict=True):
        if action == "warn" and violation.rule in native:
            by_rule[violation.rule].append(violation)
    return sorted(admission.describe(found) for found in by_rule.values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version", ["1.30", "1.37"])
def test_the_generated_policies_agree_where_the_kind_is_native(version, mode):
    policies, strict = MODES[mode]
    target = for_version(version)
    generated = generate(policies, target)
    matched = [c for c in CASES if c.kind in ("Pod", "DaemonSet", "Deployment", "LeaderWorkerSet")
               or (c.kind.startswith("ResourceClaim") and target.minor >= 34)]
    validating = [o for o in generated.objects if o["kind"].startswith("Validating")] + [generated.policy_object]
    evaluation = evaluate(validating, [Request(c.obj, c.namespace) for c in matched], f"1.{target.compatibility}")
    assert evaluation.compile_errors == []
    native = set(generated.native)
    for case, answer in zip(matched, evaluation.answers, strict=True):
        assert not answer.errors, (case.name, answer.errors)
        assert answer.allowed is not native_expected(case, native, strict), (case.name, answer.message)
        if case.kind not in BLOCKS:
            # the apiserver puts "Validation failed for ValidatingAdmissionPolicy '…' with binding '…': " first
            said = sorted(re.sub(r"^Validation failed for .*? with binding '[^']*': ", "", w) for w in answer.warnings)
            assert said == native_warnings(case, policies, native), case.name
    assert "GPU resource blocks of InferenceService.serving.kserve.io" in " ".join(
        name for name, _ in generated.webhook_only)
    assert len(matched) >= 20
