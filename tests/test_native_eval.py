"""The generated admission policies compiled and evaluated by the apiserver's own CEL (k8s.io/apiserver's admission
packages, in tests/celeval), in seconds: on the corpus of the e2e differential (tests/native_corpus.py) their
verdicts, messages and warnings are the webhook's, their patches /mutate's, on the oldest and the newest target.
Every target's policies compile in the CEL environment that version gives new expressions. The e2e differential
on real apiservers of each version (tests/e2e/test_native_policies.py) stays the final proof.

A built-in object reaches the policies as an apiserver decodes it (celeval: quantities canonical, a Pod's
requests defaulted, the extended-resource rules the apiserver enforces refused with a message starting
"apiserver:"); the webhook then judges the decoded object, as it would see it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import pytest

from tests.celeval import Answer, Request, evaluate
from tests.native_corpus import NS, POLICY, Case, as_pod, as_pytorchjob, corpus, ctr, gpu, mutation_pods, spec
from webhook.core.podspecs import group_of
from webhook.core.policy import PolicySet, parse_policy
from webhook.native.generate import generate
from webhook.native.pods import CUSTOM_ONLY
from webhook.native.target import Target, every_version, for_version
from webhook.rules import admission

BUILTIN = ("Pod", "Deployment", "CronJob")
MAP_BETA = "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"
POLICIES = parse_policy(POLICY)


def validating(target: Target, policies: PolicySet = POLICIES) -> list[dict[str, Any]]:
    return [o for o in generate(policies, target).objects if o["kind"].startswith("Validating")]


def compatibility(target: Target) -> str:
    return f"1.{target.compatibility}"


@dataclass
class Differences:
    verdicts: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    admitted: int = 0
    refused: int = 0
    warned: int = 0

    def __bool__(self) -> bool:
        return bool(self.verdicts or self.words)


def compare(target: Target, cases: list[Case], answers: list[Answer]) -> Differences:
    """Each case's answer against ``webhook.rules.admission.decide`` on the object as the apiserver decoded it, for
    the rules the target carries natively."""
    generated = generate(POLICIES, target)
    native = set(generated.native)
    claims = any(o["metadata"]["name"].startswith("gpu-webhook-claims-") for o in generated.objects)
    out = Differences()
    for case, answer in zip(cases, answers, strict=True):
        if case.kind.startswith("ResourceClaim") and not claims:
            continue  # resource.k8s.io/v1 is not served: the claims stay with the webhook
        seen = answer.decoded or case.obj
        expected = admission.decide(seen, group_of(case.obj["apiVersion"]), case.kind, case.namespace, POLICIES)
        builtin = case.kind in BUILTIN
        if answer.message.startswith("apiserver:"):
            # Refused before admission by the apiserver's own validation: the webhook must refuse it too.
            out.refused += 1
            if expected.allowed:
                out.verdicts.append(f"{case.namespace}/{case.name}: the apiserver refuses, the webhook admits")
            continue
        carried = [(v, a) for v, a in zip(expected.violations, expected.actions, strict=True)
                   if v.rule in native and not (builtin and v.rule in CUSTOM_ONLY)]
        denied = [v for v, a in carried if a == "deny"]
        warned = [v for v, a in carried if a == "warn"]
        out.admitted += answer.allowed
        out.refused += not answer.allowed
        out.warned += bool(answer.allowed and answer.warnings)
        if answer.allowed == bool(denied) or any(d["evaluation"] == "error" for d in answer.decisions):
            out.verdicts.append(f"{case.namespace}/{case.kind}/{case.name}: native {answer.allowed} "
                                f"{answer.message[:200]!r}, webhook {[str(v) for v in denied][:2]}")
            continue
        warnings = " ".join(answer.warnings)
        for violation in denied:
            # Built-in objects' values are the apiserver's canonical ones ("1e400" is "10e399"): there the path.
            said = f"{violation.path}: " if builtin else str(violation)
            if said not in answer.message:
                out.words.append(f"{case.name}: {said!r} not in {answer.message!r}")
        for violation in warned:
            said = f"{violation.path}: " if builtin else str(violation)
            if said not in warnings:
                out.words.append(f"{case.name}: no warning {said!r} in {warnings!r}")
    return out


@pytest.fixture(scope="module", params=["1.30", "1.37"])
def corpus_answers(request):
    target = for_version(request.param)
    cases = corpus()
    evaluation = evaluate(validating(target), [Request(c.obj, c.namespace) for c in cases], compatibility(target))
    return target, cases, evaluation


def _many(kind) -> dict:
    containers = [gpu("500m" if i % 7 == 0 else 1, f"c{i}", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
                  for i in range(40)]
    return kind("many", spec(*containers), {})


@pytest.fixture(scope="module")
def newest() -> dict[str, list[Answer]]:
    """The newest target's validating policies of the corpus' policy, compiled once for the requests of the tests
    below (updates, forty containers), by test."""
    target = for_version("1.37")
    requests = {
        "updates": [Request(new, NS, "UPDATE", old) for _, old, new, *_ in UPDATES],
        "many": [Request(_many(as_pod), NS), Request(_many(as_pytorchjob), NS)],
    }
    flat = [r for group in requests.values() for r in group]
    answers = iter(evaluate(validating(target), flat, compatibility(target)).answers)
    return {name: [next(answers) for _ in group] for name, group in requests.items()}


def test_every_expression_compiles_in_the_cel_its_target_accepts(corpus_answers):
    _, _, evaluation = corpus_answers
    assert evaluation.compile_errors == []


def test_the_apiservers_cel_decides_every_object_as_the_webhook_does(corpus_answers):
    target, cases, evaluation = corpus_answers
    found = compare(target, cases, evaluation.answers)
    summary = (f"{target.describe()}: {len(cases)} objects, {found.admitted} admitted ({found.warned} warned), "
               f"{found.refused} refused; {len(found.verdicts)} verdicts and {len(found.words)} words differ")
    print(summary)
    assert not found, summary + "\n" + "\n".join((found.verdicts + found.words)[:30])
    assert len(cases) >= 400 and found.admitted >= 100 and found.refused >= 150 and found.warned >= 30, summary


@pytest.mark.slow
@pytest.mark.parametrize("target", every_version(), ids=lambda t: f"{t.version}-{t.mutating or 'nomap'}")
def test_every_target_compiles(target):
    objects = generate(POLICIES, target).objects
    assert evaluate(objects, [], compatibility(target)).compile_errors == []


@pytest.mark.parametrize("version, api_versions", [("1.37", ()), ("1.34", (MAP_BETA,))], ids=["v1", "v1beta1"])
def test_the_mutating_policy_patches_pods_as_mutate_does(version, api_versions):
    target = for_version(version, api_versions)
    objects = [o for o in generate(POLICIES, target).objects if o["kind"].startswith("Mutating")]
    assert [o["apiVersion"].rpartition("/")[2] for o in objects] == [target.mutating] * 2
    cases = mutation_pods()
    evaluation = evaluate(objects, [Request(c.obj, c.namespace) for c in cases], compatibility(target))
    assert evaluation.compile_errors == []
    differ, changed = [], 0
    for case, answer in zip(cases, evaluation.answers, strict=True):
        seen = answer.decoded or case.obj
        request = {"uid": "u", "operation": "CREATE", "namespace": case.namespace,
                   "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": seen}
        patch = list(admission.mutate(request, POLICIES).patch)
        changed += bool(patch)
        expected = jsonpatch.apply_patch(seen, patch)
        got = answer.mutated or seen
        if expected["spec"] != got["spec"] or answer.errors:
            differ.append(f"{case.namespace}/{case.name}: {answer.errors} expected {expected['spec']} "
                          f"got {got['spec']}")
    assert len(cases) >= 80 and changed >= 40
    assert not differ, "\n".join(differ[:10])


# --- UPDATE: held only to what it changes ------------------------------------------------------------------------


def half(name: str, *containers: dict) -> dict:
    return as_pytorchjob(name, spec(*containers), {})


UPDATES = [
    # (old, new, refused, a violation said, a violation not said)
    ("unchanged", half("u", gpu("500m")), half("u", gpu("500m")), False, None, None),
    ("added", half("u", gpu("500m")), half("u", gpu("500m"), gpu("0.5", "b")), True, 'container "b"',
     'container "main"'),
    ("worse", half("u", gpu("500m")), half("u", gpu("250m")), True, '"250m"', None),
    ("renamed", half("u", gpu("500m", "a")), half("u", gpu("500m", "b")), True, 'container "b"', None),
    ("new container before", half("u", gpu("500m", "a")), half("u", ctr("x"), gpu("500m", "a")), False, None, None),
]


def test_an_update_is_held_only_to_the_violations_its_old_object_did_not_have(newest):
    for (name, old, new, refused, said, unsaid), answer in zip(UPDATES, newest["updates"], strict=True):
        expected = admission.decide(new, "kubeflow.org", "PyTorchJob", NS, POLICIES, old=old)
        assert answer.allowed == expected.allowed == (not refused), (name, answer.message)
        if said:
            assert said in answer.message, name
        if unsaid:
            assert unsaid not in answer.message, name


# --- what it costs the apiserver -------------------------------------------------------------------------------


def test_an_ordinary_gpu_pod_skips_the_validating_policies_and_a_bad_one_stays_within_a_small_budget():
    """The apiserver's own cost units as a bound: a 7-container GPU pod with plain counts matches no validating
    policy (its matchConditions find nothing that could fire), and one with a bad count costs its deny policy
    little against the 1,000,000 an expression may spend."""
    from bench.admission_paths import gpu_pod

    good, bad = gpu_pod("good"), gpu_pod("bad")
    bad["spec"]["containers"][3]["resources"]["limits"]["nvidia.com/gpu"] = "2M"
    cpu = as_pod("cpu", spec(ctr("a"), ctr("b")), {})
    target = for_version("1.37")
    requests = [Request(good, "default"), Request(bad, "default"), Request(cpu, "default")]
    builtin = [o for o in validating(target, parse_policy("{}")) if o["metadata"]["name"].startswith(
        ("gpu-webhook-deny", "gpu-webhook-warn"))]
    ok, refused, plain = evaluate(builtin, requests, compatibility(target)).answers
    assert ok.allowed and ok.cost == {} and plain.cost == {}
    assert not refused.allowed and "2M" in refused.message
    assert 0 < refused.cost["gpu-webhook-deny"] < 20_000, refused.cost


def test_forty_containers_stay_within_the_budget_in_every_family(newest):
    for answer in newest["many"]:
        assert not answer.allowed and "cost" not in answer.message.lower(), answer.message
        assert all(d["evaluation"] != "error" for d in answer.decisions), answer.decisions
