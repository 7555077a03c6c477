"""The cluster-facts differential: the generated policies reading GPUPolicy/default's ``status.cluster`` (evaluated by
the apiserver's own CEL, tests/celeval) against the webhook with its own cluster view, on three generated clusters.

The summary is what the status writer would write for each cluster (``core.clustersummary``), stamped ``writtenAt``;
each request carries the time the apiserver would have written into it (``creationTimestamp`` on CREATE). The
native cluster rules act on the summary only while the request is at most ``FRESH_FOR`` seconds after ``writtenAt``:
older, or missing, and they refuse nothing, which is the webhook deciding without a view.

Both engines judge the RuntimeClass a GPU pod names, or, naming none, the one ``isolation.runtimeClass`` gives it.
Where their words may differ, the reason is checked below: a violation told by another of the policies a custom
kind's rules are cut into (the apiserver stops at the first policy that denies; the verdict is the same).
"""

from __future__ import annotations

import copy
import datetime
import re
from typing import Any

import pytest

from tests.celeval import Request, evaluate
from tests.manifests import device_class, resource_slice, runtime_class
from tests.native_corpus import (
    NS,
    POLICY,
    RESEARCH,
    RUNTIME,
    Case,
    as_deployment,
    as_pod,
    as_pytorchjob,
    claim_cases,
    compare,
    corpus,
    gpu,
    mutation_differences,
    mutation_pods,
    spec,
)
from tests.test_native_eval import compatibility, seen
from webhook.core import clustersummary as cs
from webhook.core.cluster import ClusterState
from webhook.core.podspecs import group_of
from webhook.core.policyfile import parse_policy
from webhook.native.generate import RULES_ANNOTATION, generate
from webhook.native.target import for_version
from webhook.rules import admission

# The apiserver's CEL compiles the generated policies for every test here: seconds each, minutes in all.
pytestmark = pytest.mark.slow

POLICIES = parse_policy(POLICY + "cluster: {enabled: true}\n")
GPU = "nvidia.com/gpu"
WRITTEN = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=datetime.UTC)


def stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, model: str | None = None, gpus: int = 0) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, **({"accelerator": model} if model else {})}
    allocatable = {"cpu": "8", **({GPU: str(gpus)} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": allocatable}}


# RuntimeClasses that pin their pods: to one accelerator, and to one accelerator and a zone.
PINNED = [runtime_class("l4-only", accelerator="nvidia-l4"),
          runtime_class("pinned", accelerator="nvidia-tesla-p100", zone="a")]


# Three clusters: the corpus' accelerators, a RuntimeClass, the corpus' GPU DeviceClasses and the devices of one of
# them on two nodes; another model alone, no RuntimeClass and one DeviceClass; CPU nodes and no DeviceClass.
CLUSTERS = {
    "mixed": [node("l4-a", "nvidia-l4", 4), node("l4-b", "nvidia-l4", 2), node("p100", "nvidia-tesla-p100", 8),
              node("k80", "nvidia-tesla-k80", 4), node("cpu"), runtime_class("nvidia"),
              device_class("gpu.nvidia.com"), device_class("mig.nvidia.com"),
              resource_slice("l4-a", "gpu.nvidia.com", 4), resource_slice("l4-b", "gpu.nvidia.com", 2), *PINNED],
    "h100-only": [node("h100-a", "nvidia-h100", 8), node("h100-b", "nvidia-h100", 8), device_class("gpu.nvidia.com")],
    "cpu-only": [node("cpu-a"), node("cpu-b"), runtime_class("nvidia", accelerator="nvidia-h100"),
                 runtime_class("kata"), *PINNED],
}


# What the policies themselves must say on each cluster (an accelerator the policy allows but no node has, and so on).
NATIVELY_REFUSED = {
    "mixed": ["the pod needs 6 nvidia.com/gpu on one node; nodes with accelerator=nvidia-l4: 2, largest allocatable "
              "nvidia.com/gpu: 4", "no node advertises nvidia.com/mig-1g.5gb", "runtimeClassName missing, but no "
              "such RuntimeClass exists", "runtimeClassName pinned, whose scheduling.nodeSelector contradicts the "
              "pod's: accelerator=nvidia-tesla-p100 (pod: nvidia-l4), zone=a (pod: b); the apiserver would reject the "
              "pod", "runtimeClassName l4-only, whose scheduling.nodeSelector contradicts the pod's: "
              "accelerator=nvidia-l4 (pod: nvidia-tesla-k80)"],
    "h100-only": ["no node has accelerator=nvidia-l4", "runtimeClassName nvidia, but no such RuntimeClass exists",
                  # what isolation.runtimeClass gives a GPU pod that names no class (the mutation gives no class the
                  # facts do not list)
                  "spec.runtimeClassName: isolation.runtimeClass injects nvidia, but no such RuntimeClass exists"],
    "cpu-only": ["no node has accelerator=nvidia-tesla-p100",  # every pod has an accelerator: no capacity judged
                 "isolation.runtimeClass injects nvidia, whose scheduling.nodeSelector contradicts the pod's: "
                 "accelerator=nvidia-h100 (pod: nvidia-tesla-k80)"],
}
# ... and on claims, where resource.k8s.io/v1 is served (the claims policies are generated from 1.34).
CLAIMS_REFUSED = {
    "mixed": ['device class "gpu.example.com" does not exist, so the claim can never be allocated (DeviceClasses in '
              'the cluster: 2)',
              "8 devices of class gpu.nvidia.com on one node, but the most any node has is 4 (2 nodes with such "
              "devices)"],
    "h100-only": ['device class "mig.nvidia.com" does not exist',  # and gpu.nvidia.com publishes no device:
                  "1 device of class gpu.nvidia.com on one node, but the most any node has is 0 (0 nodes with such "
                  "devices)"],
    "cpu-only": ['device class "gpu.nvidia.com" does not exist, so the claim can never be allocated (DeviceClasses in '
                 'the cluster: 0)'],
}


def state_of(objects: list[dict[str, Any]]) -> ClusterState:
    state = ClusterState("accelerator")
    state.load(copy.deepcopy(objects), known=cs.KINDS)
    return state


def summary_of(state: ClusterState) -> dict[str, Any]:
    facts = cs.summarize(cs.view_of(state, cs.KINDS), cs.KINDS, POLICIES.default.is_gpu)
    return {**facts, "writtenAt": stamp(WRITTEN), "writer": "test"}


def cluster_cases() -> list[Case]:
    """Pods, Deployments and PyTorchJobs that name an accelerator (nodeSelector, annotation, or none: the default)
    and a RuntimeClass, in namespaces with the corpus' default (nvidia-tesla-k80), their own (nvidia-l4), and one
    where isolation.runtimeClass injects nvidia."""
    shapes: list[tuple[str, dict, dict]] = []
    for model in ("nvidia-l4", "nvidia-tesla-p100", "nvidia-h100", "nvidia-a100"):
        shapes.append((f"select-{model}", spec(gpu(1), nodeSelector={"accelerator": model}), {}))
        shapes.append((f"annotate-{model}", spec(gpu(1)), {"gpu-webhook/accelerator": model}))
    shapes.append(("default", spec(gpu(1)), {}))
    # More GPUs than one node has (6 in two containers: within the corpus' caps), and a GPU no node offers.
    shapes.append(("six-l4", spec(gpu(3, "a"), gpu(3, "b"), nodeSelector={"accelerator": "nvidia-l4"}), {}))
    shapes.append(("six-p100", spec(gpu(3, "a"), gpu(3, "b"), nodeSelector={"accelerator": "nvidia-tesla-p100"}), {}))
    shapes.append(("six-default", spec(gpu(3, "a"), gpu(3, "b")), {}))
    shapes.append(("mig", spec(gpu(1, resource="nvidia.com/mig-1g.5gb")), {}))
    shapes.append(("cpu-selects-a100", spec({"name": "c", "image": "busybox"}, nodeSelector={"accelerator": "x"}), {}))
    for name in ("nvidia", "kata", "missing", "l4-only", "pinned"):
        shapes.append((f"runtime-{name}", spec(gpu(1), runtimeClassName=name), {}))
        shapes.append((f"cpu-runtime-{name}", spec({"name": "c", "image": "busybox"}, runtimeClassName=name), {}))
    # A RuntimeClass's nodeSelector against the pod's own, the accelerator annotated, and a required node affinity
    # on the label (the mutation then injects none).
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["nvidia-l4"]}]}]}}}
    for name in ("l4-only", "pinned"):
        shapes.append((f"{name}-zone-b", spec(gpu(1), runtimeClassName=name,
                                              nodeSelector={"accelerator": "nvidia-l4", "zone": "b"}), {}))
        shapes.append((f"{name}-annotated-p100", spec(gpu(1), runtimeClassName=name),
                       {"gpu-webhook/accelerator": "nvidia-tesla-p100"}))
        shapes.append((f"{name}-affinity", spec(gpu(1), runtimeClassName=name, affinity=affinity), {}))
    cases = []
    for name, s, meta in shapes:
        for wrap in (as_pod, as_deployment, as_pytorchjob):
            for namespace in (NS, RESEARCH, RUNTIME):
                obj = wrap(f"{name}-{wrap.__name__[3:]}", s, meta)
                cases.append(Case(obj["metadata"]["name"], namespace, obj))
    return cases


def requested(cases: list[Case], at: datetime.datetime) -> list[Case]:
    """The cases as the apiserver hands them to admission on CREATE: ``creationTimestamp`` is the request's time."""
    out = []
    for case in cases:
        obj = copy.deepcopy(case.obj)
        obj["metadata"]["creationTimestamp"] = stamp(at)
        out.append(Case(case.name, case.namespace, obj))
    return out


def native(cluster: str, cases: list[Case], version: str, cluster_status: dict[str, Any] | None):
    generated = generate(POLICIES, for_version(version))
    param = copy.deepcopy(generated.policy_object)
    assert param is not None
    if cluster_status is not None:
        param["status"] = {"cluster": cluster_status}
    objects = [o for o in generated.objects if o["kind"].startswith("Validating")] + [param]
    evaluation = evaluate(objects, [Request(c.obj, c.namespace) for c in cases], compatibility(generated.target))
    assert evaluation.compile_errors == [], evaluation.compile_errors
    return generated, [seen(a) for a in evaluation.answers]


@pytest.fixture(scope="module", params=["1.30", "1.37"])
def version(request) -> str:
    return request.param


def test_the_mixed_cluster_has_devices_behind_a_device_class():
    """The differential's first cluster publishes ResourceSlices: the facts count what its DeviceClass selects."""
    classes = summary_of(state_of(CLUSTERS["mixed"]))["deviceClasses"]
    assert classes["gpu.nvidia.com"] == {"devices": 6, "largest": 4, "nodes": 2, "selectorsEvaluated": True}
    assert classes["mig.nvidia.com"]["devices"] == 0


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_with_fresh_facts_the_policies_decide_as_the_webhook_with_its_view(cluster, version):
    state = state_of(CLUSTERS[cluster])
    # The corpus once (the rest of it is test_native_eval's), its claims and the cluster cases on every cluster.
    everything = (corpus() if cluster == "mixed" else claim_cases()) + cluster_cases()
    cases = requested(everything, WRITTEN + datetime.timedelta(seconds=cs.FRESH_FOR))
    generated, answers = native(cluster, cases, version, summary_of(state))
    claims = generated.target.minor >= 34
    assert {"unknown-accelerator", "unknown-runtime-class", "exceeds-node-capacity", "unadvertised-resource",
            *(["unknown-device-class", "exceeds-device-capacity"] if claims else [])} <= set(generated.native)
    found = compare(POLICIES, generated, cases, answers, state.view())
    split = split_words(found.words, generated, cases, state)
    found.words = [w for w in found.words if w not in split]
    summary = found.summary(f"{version} {cluster}", len(cases)) + f"; {len(split)} told by a sibling policy"
    print(summary)
    assert not found, summary + "\n" + found.details()
    refused_by_facts = [c for c, a in zip(cases, answers, strict=True)
                        if not a.allowed and any(words in a.message for words in (
                            "no node has accelerator", "no such RuntimeClass", "on one node;", "no node advertises",
                            "so the claim can never be allocated"))]
    assert len(refused_by_facts) >= 12, [c.name for c in refused_by_facts]
    said = " ".join(a.message for a in answers)
    for words in NATIVELY_REFUSED[cluster] + (CLAIMS_REFUSED[cluster] if claims else []):
        assert words in said, words  # each rule the facts carry refuses something, natively


@pytest.mark.parametrize("when, facts", [
    ("stale", WRITTEN + datetime.timedelta(seconds=cs.FRESH_FOR + 1)),
    ("missing", None),
])
def test_with_stale_or_missing_facts_the_cluster_rules_refuse_nothing(when, facts, version):
    """A request more than FRESH_FOR seconds after writtenAt, or no summary at all: the policies decide as the
    webhook without a cluster view (its cluster rules off), so a model added while the writer was down is not
    refused, and no pod is refused for a fact."""
    state = state_of(CLUSTERS["h100-only"])  # every corpus accelerator is unknown here, and DeviceClass mig.nvidia.com
    cases = requested(cluster_cases() + claim_cases(), facts or WRITTEN)
    generated, answers = native("h100-only", cases, version, summary_of(state) if facts else None)
    claims = 0
    for case, answer in zip(cases, answers, strict=True):
        if case.kind.startswith("ResourceClaim"):
            if generated.target.minor < 34:
                continue  # resource.k8s.io/v1 is not served: no claims policy
            claims += 1
        expected = admission.decide(case.obj, group_of(case.obj["apiVersion"]), case.kind, case.namespace, POLICIES)
        for words in ("no node has", "no such RuntimeClass", "does not exist, so the claim", "the most any node has"):
            assert words not in answer.message, (case.name, answer.message)
        assert answer.allowed == expected.allowed, (case.name, answer.message, expected.message)
    assert claims == (len(claim_cases()) if generated.target.minor >= 34 else 0)


def test_on_update_the_newest_managed_fields_time_is_the_requests(version):
    """An UPDATE carries no new creationTimestamp; managedFields carry the update's time. Recent: the facts count.
    Only times long before the facts were written (an update that changed no managed field keeps the old ones): no
    clock, so they do not, and the update is admitted."""
    state = state_of(CLUSTERS["h100-only"])
    old = as_pod("upd", spec(gpu(1)), {})
    old["metadata"]["creationTimestamp"] = stamp(WRITTEN - datetime.timedelta(days=30))
    new = copy.deepcopy(old)
    new["spec"]["nodeSelector"] = {"accelerator": "nvidia-l4"}  # allowed by the policy, on no node of the cluster

    def with_times(*moments: datetime.datetime) -> dict[str, Any]:
        obj = copy.deepcopy(new)
        obj["metadata"]["managedFields"] = [{"manager": f"m{i}", "operation": "Update", "apiVersion": "v1",
                                             "time": stamp(m)} for i, m in enumerate(moments)]
        return obj

    recent = with_times(WRITTEN - datetime.timedelta(days=30), WRITTEN + datetime.timedelta(seconds=60))
    stale = with_times(WRITTEN - datetime.timedelta(days=30))
    generated = generate(POLICIES, for_version(version))
    param = {**copy.deepcopy(generated.policy_object), "status": {"cluster": summary_of(state)}}
    objects = [o for o in generated.objects if o["kind"].startswith("Validating")] + [param]
    evaluation = evaluate(objects, [Request(recent, NS, "UPDATE", old), Request(stale, NS, "UPDATE", old)],
                          compatibility(generated.target))
    refused, admitted = evaluation.answers
    assert not refused.allowed and "no node has accelerator=nvidia-l4" in refused.message, refused.message
    assert admitted.allowed, admitted.message


def policy_rules(generated) -> dict[str, set[str]]:
    """The rules each generated ValidatingAdmissionPolicy holds, by its name."""
    return {o["metadata"]["name"]: set(o["metadata"]["annotations"][RULES_ANNOTATION].split(","))
            for o in generated.objects if o["kind"] == "ValidatingAdmissionPolicy"}


def split_words(words: list[str], generated, cases: list[Case], state: ClusterState) -> list[str]:
    """The word differences that are the apiserver stopping at the first policy that denies: a custom kind's rules
    are cut into several deny policies, and a violation of a rule another of them carries is told only when that
    one is the first to deny (the verdict is the same). Each is checked to be exactly that."""
    rules_of = policy_rules(generated)
    by_where = {f"{c.namespace}/{c.kind}/{c.name}": c for c in cases}
    view = state.view()
    out = []
    for word in words:
        where, _, rest = word.partition(": ")
        case = by_where[where]
        denying = re.search(r"ValidatingAdmissionPolicy \\?'([^'\\]+)", rest)  # quoted in a repr
        expected = admission.decide(case.obj, group_of(case.obj["apiVersion"]), case.kind, case.namespace, POLICIES,
                                    view)
        quoted = rest.split(" not in ")[0]
        said = [v for v in expected.violations if quoted in (repr(str(v)), repr(f"{v.path}: "))]
        if denying and said and all(v.rule not in rules_of[denying[1]] for v in said):
            out.append(word)
    return out


# --- the mutation: isolation.runtimeClass as the facts allow ---------------------------------------------------

def classes_cluster(selector: dict[str, str] | None) -> list[dict[str, Any]]:
    """RuntimeClass nvidia (scheduling.nodeSelector ``selector``; None: no class at all) on a k80 and an l4 node."""
    objects = [node("k80", "nvidia-tesla-k80", 4), node("l4", "nvidia-l4", 4)]
    if selector is not None:
        objects.append({**runtime_class("nvidia"), "scheduling": {"nodeSelector": selector}})
    return objects


MUTATION_CLUSTERS = {
    "no-class": classes_cluster(None),
    "any-node": classes_cluster({}),
    "k80-only": classes_cluster({"accelerator": "nvidia-tesla-k80"}),
}


def mutation_cases(at: datetime.datetime) -> list[Case]:
    """The mutation corpus and pods that select or are given an accelerator, in the namespace where
    isolation.runtimeClass injects nvidia; each with the managedFields entry the apiserver writes before a mutating
    policy runs (creationTimestamp comes later)."""
    cases = mutation_pods()
    for name, s, meta in [
        ("selects-l4", spec(gpu(1), nodeSelector={"accelerator": "nvidia-l4"}), {}),
        ("selects-k80", spec(gpu(1), nodeSelector={"accelerator": "nvidia-tesla-k80"}), {}),
        ("annotated-l4", spec(gpu(1)), {"gpu-webhook/accelerator": "nvidia-l4"}),
        ("defaulted", spec(gpu(1)), {}),
        ("other-key", spec(gpu(1), nodeSelector={"zone": "a"}), {}),
    ]:
        cases.append(Case(f"m-{name}", RUNTIME, as_pod(f"m-{name}", s, meta)))
    cases += [Case(c.name, RUNTIME, c.obj) for c in mutation_pods() if c.namespace == NS]
    out = []
    for case in cases:
        obj = copy.deepcopy(case.obj)
        obj["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                                             "time": stamp(at), "fieldsType": "FieldsV1", "fieldsV1": {}}]
        out.append(Case(case.name, case.namespace, obj))
    return out


@pytest.mark.parametrize("cluster", MUTATION_CLUSTERS)
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "stale"])
def test_the_mutating_policy_injects_the_runtime_class_as_the_webhook_with_its_view(cluster, fresh):
    """With fresh facts, the MutatingAdmissionPolicy gives a GPU pod isolation.runtimeClass only where the webhook
    with its view would: the class exists, and its node selector agrees with the pod's and the accelerator this
    policy adds. With stale facts, as the webhook without a view: always."""
    target = for_version("1.37")
    state = state_of(MUTATION_CLUSTERS[cluster])
    generated = generate(POLICIES, target)
    param = {**copy.deepcopy(generated.policy_object), "status": {"cluster": summary_of(state)}}
    objects = [o for o in generated.objects if o["kind"].startswith("Mutating")] + [param]
    at = WRITTEN + datetime.timedelta(seconds=60 if fresh else cs.FRESH_FOR + 1)
    cases = mutation_cases(at)
    evaluation = evaluate(objects, [Request(c.obj, c.namespace) for c in cases], compatibility(target))
    assert evaluation.compile_errors == []
    differ, specs = mutation_differences(POLICIES, cases, evaluation.answers, state.view() if fresh else None)
    injected = sum("runtimeClassName" in spec for spec in specs)
    assert not differ, "\n".join(differ[:10])
    # What the cluster allows: nowhere without the class; else every GPU pod of the namespace that may run there.
    # (the 16 GPU pods there; 4 of them select or are given nvidia-l4, which the k80-only class contradicts).
    runtime_gpu_pods = 16
    if not fresh:
        assert injected == runtime_gpu_pods, injected
    else:
        assert injected == {"no-class": 0, "any-node": runtime_gpu_pods, "k80-only": 12}[cluster], injected
