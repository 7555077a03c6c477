"""webhook.native.probes: the objects ``admission-policies --apply`` dry-runs to see each generated policy enforced,
chosen with the webhook's own decision; and how a dry-run's answer is read. tests/e2e/test_native_enforced.py runs
them against the real apiserver."""

from __future__ import annotations

import pytest

from webhook.core.policyfile import load_policy, parse_policy
from webhook.kube.client import _warning_text
from webhook.native.generate import RULES_ANNOTATION, generate
from webhook.native.probes import Probe, action, family, holds, outcome, probes
from webhook.native.target import for_version
from webhook.rules import admission

BENCH = """\
accelerator: {allowed: [nvidia-tesla-p100, nvidia-tesla-k80, nvidia-l4], default: nvidia-tesla-k80}
limits: {perContainer: 4, perPod: 8}
"""


def pytorchjobs(kind):
    return ("kubeflow.org/v1", "PyTorchJob") if kind.resource == "pytorchjobs" else None


def test_names():
    assert [family(n) for n in ("gpu-webhook-deny-2", "gpu-webhook-custom-seed-deny", "gpu-webhook-claims-warn")] == [
        "builtin", "custom", "claims"]
    assert [action(n) for n in ("gpu-webhook-warn", "gpu-webhook-custom-warn-4", "gpu-webhook-seed-deny",
                                "gpu-webhook-deny-2")] == ["warn", "warn", "deny", "deny"]


@pytest.mark.parametrize("text", [None, BENCH, "nativePolicies: {params: inline}\n"],
                         ids=["default", "bench", "inline"])
def test_every_probe_breaks_a_rule_of_its_policy_with_its_action(text):
    policies = load_policy(None) if text is None else parse_policy(text)
    out = generate(policies)
    found, missing = probes(out, policies, "default", pytorchjobs)
    by_name = {o["metadata"]["name"]: o for o in out.objects if o["kind"].endswith("Policy")}
    assert set(p.policy for p in found) | set(missing) == set(by_name)
    for probe in found:
        if probe.action == "mutate":
            continue
        rules = by_name[probe.policy]["metadata"]["annotations"][RULES_ANNOTATION].split(",")
        for obj, rule in probe.tries:
            assert rule in rules
            verdict = admission.decide(obj, obj["apiVersion"].rpartition("/")[0], obj["kind"], "default", policies)
            assert (rule, probe.action) in {(v.rule, a) for v, a in verdict.judged()}, (probe.policy, obj)
    # The Pods' and the claims' policies all have one; the custom kinds' deny policies mostly.
    names = {p.policy for p in found}
    assert {n for n in by_name if n.startswith("gpu-webhook-") and "custom" not in n and
            by_name[n]["kind"] == "ValidatingAdmissionPolicy"} <= names, missing
    assert {"gpu-webhook-custom-deny", "gpu-webhook-custom-live-deny", "gpu-webhook-custom-seed-deny"} & names


def test_without_a_served_custom_kind_the_custom_policies_have_no_probe():
    policies = load_policy(None)
    found, missing = probes(generate(policies), policies, "default", lambda kind: None)
    assert not [p for p in found if "custom" in p.policy]
    assert missing["gpu-webhook-custom-live-deny"] == "no custom kind of the policy is served"


def test_the_mutating_policy_is_probed_where_the_policy_mutates():
    policies = parse_policy(BENCH)
    found, _ = probes(generate(policies), policies, "default", None)
    (mutating,) = [p for p in found if p.action == "mutate"]
    assert mutating.expect == {"nodeSelector": {"accelerator": "nvidia-tesla-k80"}}
    _, missing = probes(generate(load_policy(None)), load_policy(None), "default", None)
    assert "gpu-webhook-live" in missing  # the default policy changes no plain GPU pod


def _probe(act: str, policy: str = "gpu-webhook-deny") -> Probe:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    return Probe(policy, act, "default", [(pod, "r"), (pod, "s")], expect={"nodeSelector": {"a": "b"}})


def test_outcomes():
    denied = {"message": "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'gpu-webhook-deny' with binding "
                         "'gpu-webhook-deny' denied request: ..."}
    assert outcome(_probe("deny"), 403, denied, []) == "enforced"
    assert outcome(_probe("deny"), 201, {"spec": {}}, []) == "waiting"
    other = {"message": "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'gpu-webhook-seed-deny' denied ..."}
    assert outcome(_probe("deny"), 403, other, []) == "waiting"  # another of ours first; ours may follow
    invalid = {"message": "Pod \"p\" is invalid: spec.containers[0].resources.limits: must be an integer"}
    assert outcome(_probe("deny"), 422, invalid, []).startswith("inconclusive: ")
    rbac = {"message": "pytorchjobs.kubeflow.org is forbidden: User \"x\" cannot create resource"}
    assert outcome(_probe("deny"), 403, rbac, []).startswith("inconclusive: ")
    warn = _probe("warn", "gpu-webhook-warn")
    said = "ValidatingAdmissionPolicy 'gpu-webhook-warn' with binding 'gpu-webhook-warn': host-pid-gpu ..."
    assert outcome(warn, 201, {}, [said]) == "enforced"
    assert outcome(warn, 201, {}, ["something else"]) == "waiting"
    assert outcome(warn, 403, denied, []).startswith("inconclusive: ")  # refused first: no warning comes
    mutate = _probe("mutate", "gpu-webhook")
    assert outcome(mutate, 201, {"spec": {"nodeSelector": {"a": "b", "c": "d"}}}, []) == "enforced"
    assert outcome(mutate, 201, {"spec": {}}, []) == "waiting"
    probe = _probe("deny")
    assert probe.give_up("refused") and probe.rule == "s" and not probe.give_up("again")


def test_a_claim_the_apiserver_dropped_cannot_be_refused():
    """1.30 without DynamicResourceAllocation drops resources.claims and admits the last-resort probe: inconclusive,
    not a wait until --wait runs out (with the cluster checks on, a 1.30 policy had no other candidate)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    probe = Probe("gpu-webhook-live-deny-2", "deny", "default", [(pod, "undeclared-claim")])
    dropped = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    kept = {"spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "undeclared"}]}}]}}
    assert outcome(probe, 201, dropped, []).startswith("inconclusive: the apiserver dropped")
    assert outcome(probe, 201, kept, []) == "waiting"
    # A custom kind's answer holds no pod spec at the top, and keeps its claims: not enforced yet, so wait.
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "p"}, "spec": {}}
    custom = Probe("gpu-webhook-custom-live-deny-3", "deny", "default", [(job, "undeclared-claim")])
    assert outcome(custom, 201, {"spec": {"pytorchReplicaSpecs": {}}}, []) == "waiting"


def test_holds():
    assert holds({"tolerations": [{"key": "k"}], "env": {"c": [{"name": "X", "value": "1"}]}},
                 {"spec": {"tolerations": [{"key": "k"}, {"key": "other"}],
                           "containers": [{"name": "c", "env": [{"name": "Y"}, {"name": "X", "value": "1"}]}]}})
    assert not holds({"runtimeClassName": "nvidia"}, {"spec": {}})


def test_warning_header_text():
    assert _warning_text('299 - "ValidatingAdmissionPolicy \'x\' with binding \'x\': a \\"b\\""') == \
        "ValidatingAdmissionPolicy 'x' with binding 'x': a \"b\""
    assert _warning_text("odd") == "odd"


def test_a_pod_claim_is_the_last_resort_of_a_probe():
    """1.30 serves no DynamicResourceAllocation by default and drops a Pod's resources.claims: a probe that only
    had the undeclared claim never saw the policy that holds that rule act there (the chart's Job waited in vain)."""
    policies = parse_policy("accelerator: {default: nvidia-l4}\n")
    found, _ = probes(generate(policies, for_version("1.30")), policies, "default")
    for probe in found:
        rules = [rule for _, rule in probe.tries]
        assert "undeclared-claim" not in rules[:-1], (probe.policy, rules)
    [live] = [p for p in found if p.policy == "gpu-webhook-live-deny"]
    assert [rule for _, rule in live.tries][-2:] == ["privileged-gpu", "undeclared-claim"]


def test_with_the_cluster_checks_a_probe_refused_for_the_facts_moves_on_to_one_only_its_policy_refuses():
    """With ``cluster.enabled`` the facts rules sit in another policy than the accelerator rules (the cut), and they
    refuse candidates the webhook's decision without a view finds nothing against: an accelerator on no node, more
    GPUs than a node has, a MIG slice no node offers. Should the apiserver ask that other policy first every time,
    a probe that waited for its own policy would wait until --wait ran out. Each deny probe must end on a
    candidate no other of its policies refuses, here judged by the apiserver's CEL (celeval) with the facts of a
    cluster of one k80 node, whatever policy the apiserver would name first."""
    from tests.celeval import Request, evaluate
    from tests.native_corpus import Case
    from tests.test_native_cluster_facts import WRITTEN, node, requested, stamp, state_of
    from tests.test_native_eval import compatibility
    from webhook.core import clustersummary as cs

    policies = parse_policy(BENCH + "cluster: {enabled: true}\n")
    target = for_version("1.37")
    out = generate(policies, target)
    state = state_of([node("k80", "nvidia-tesla-k80", 4)])
    facts = {**cs.summarize(cs.view_of(state, cs.KINDS), cs.KINDS, policies.default.is_gpu),
             "writtenAt": stamp(WRITTEN), "writer": "test"}
    param = {**out.policy_object, "status": {"cluster": facts}}
    found, _ = probes(out, policies, "default", None)
    deny = [p for p in found if p.action == "deny" and family(p.policy) == "builtin"]
    candidates = [Case(f"c{n}", "default", obj) for p in deny for n, (obj, _) in enumerate(p.tries)]
    timed = requested(candidates, WRITTEN)
    objects = [o for o in out.objects if o["kind"].startswith("Validating")] + [param]
    answers = evaluate(objects, [Request(c.obj, "default") for c in timed], compatibility(target)).answers
    denying = iter([{d["policy"] for d in a.decisions if d["evaluation"] == "deny"} for a in answers])
    refused = {id(obj): next(denying) for p in deny for obj, _ in p.tries}
    spoiled = 0
    for probe in deny:
        while True:
            by = refused[id(probe.obj)]
            if not by:  # refused by the apiserver's own validation ("half a GPU"): inconclusive, the next one
                if not probe.give_up("invalid"):
                    break
                continue
            others = sorted(by - {probe.policy})
            if not others:
                assert probe.policy in by, (probe.policy, probe.rule)
                break
            # the apiserver names one of the others first: the one the webhook's rules do not predict, if any
            first = next((o for o in others if o not in probe.refusers[probe.at]), others[0])
            message = f"pods \"p\" is forbidden: ValidatingAdmissionPolicy '{first}' with binding '{first}' denied"
            seen = outcome(probe, 403, {"message": message}, [])
            assert seen.startswith("inconclusive: "), (probe.policy, probe.rule, first, seen)
            spoiled += 1
            assert probe.give_up(seen), (probe.policy, probe.passed)
    assert spoiled >= 1  # the facts did spoil a candidate
