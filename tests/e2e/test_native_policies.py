"""The generated admission policies (``gpu-webhook admission-policies``) on a real kube-apiserver of every version
of the matrix (``matrix_cluster``: 1.30, 1.34 with and without MutatingAdmissionPolicy v1beta1, 1.36, 1.37, and
the newer ones with it turned off), with no webhook registered. On each bed the policies are generated for what
the apiserver serves, as ``--apply`` discovers it, in live mode (``nativePolicies.params: live``, the default:
the bed installs the GPUPolicy CRD and GPUPolicy/default, which the policies read through params, beside the
seed policies that hold the hard rules without it), and:

- the apiserver's verdict on every object of the corpus equals the webhook's (``webhook.rules.admission.decide``,
  what ``gpu-webhook check`` runs) for the rules that version carries natively, with the same words; refusals
  and warnings name policies of the object's family;
- where MutatingAdmissionPolicy is served, it patches Pods as ``/mutate`` does;
- warn-mode namespaces get warnings, an UPDATE is held only to what it changes, a policy change reaches the
  objects, and a large pod stays within the CEL cost budget.

The corpus is a table (tests/native_corpus.py): pod specs placed in Pods, built-in workloads and the custom kinds
the policies know, and ResourceClaims and ResourceClaimTemplates (from 1.34, where resource.k8s.io/v1 is served).
Every object is created with server-side dry run. The same corpus runs in seconds through the apiserver's CEL
packages in the unit tier (tests/test_native_eval.py); this is the final proof. The inline mode
(``nativePolicies.params: inline``) goes through the same differential in tests/e2e/test_native_inline.py, edits of
GPUPolicy/default alone in tests/e2e/test_live_edits.py; the bed is tests/e2e/native_bed.py.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator

import jsonpatch
import pytest

from tests.e2e.cluster import MAP_BETA, MAP_OFF, ControlPlane
from tests.e2e.native_bed import (
    BEDS,
    COMPONENT,
    RAW,
    NativeBed,
    action_of,
    assert_agrees,
    decide,
    differential,
    failed_expressions,
    family_of,
    labelled_raw,
    native_bed,
    policies_named,
    seed,
    wait_until_enforced,
    warning_text,
)
from tests.native_corpus import (
    LAB,
    NS,
    POLICY,
    RESEARCH,
    RUNTIME,
    Case,
    as_pod,
    as_pytorchjob,
    as_raycluster,
    ctr,
    gpu,
    mutation_pods,
    spec,
)
from webhook.core import gpupolicy
from webhook.core.policycrd import as_spec
from webhook.core.policyfile import parse_policy
from webhook.native import params
from webhook.native.generate import RULES_ANNOTATION, TARGET_ANNOTATION
from webhook.rules import admission

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.parametrize("matrix_cluster", BEDS, ids=[b.id for b in BEDS], indirect=True)]


@pytest.fixture(scope="module")
def bed(matrix_cluster: ControlPlane) -> Iterator[NativeBed]:
    yield from native_bed(matrix_cluster, POLICY)


# --- the tests --------------------------------------------------------------------------------------------------


def expected_mutating(cluster: ControlPlane) -> str | None:
    """The MutatingAdmissionPolicy version the bed serves, as its flags and version say (tests/e2e/cluster.py)."""
    assert cluster.bed is not None
    if cluster.bed.mutating_policy == MAP_BETA:
        return "v1beta1"
    if cluster.bed.mutating_policy == MAP_OFF:
        return None
    return "v1" if cluster.bed.minor >= 36 else None


def test_discovery_targets_the_beds_version_and_the_policies_apply_as_generated(bed):
    assert bed.cluster.bed is not None
    assert (bed.target.minor, bed.target.validating, bed.target.mutating) == \
        (bed.cluster.bed.minor, True, expected_mutating(bed.cluster))
    listed = json.loads(bed.cluster.kubectl(
        "get", "validatingadmissionpolicies,validatingadmissionpolicybindings", "-l", COMPONENT, "-o", "json",
        check=True).stdout)["items"]
    if bed.target.mutating:
        listed += json.loads(bed.cluster.kubectl(
            "get", f"mutatingadmissionpolicies.{bed.target.mutating}.admissionregistration.k8s.io,"
            f"mutatingadmissionpolicybindings.{bed.target.mutating}.admissionregistration.k8s.io",
            "-l", COMPONENT, "-o", "json", check=True).stdout)["items"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in listed) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in bed.generated.objects)
    seeds = lives = 0
    for obj in listed:
        assert obj["metadata"]["annotations"][TARGET_ANNOTATION] == bed.target.version
        binding = obj["kind"].endswith("Binding")
        of_seed = seed(obj["spec"]["policyName"] if binding else obj["metadata"]["name"])
        seeds += of_seed
        lives += not of_seed
        if of_seed:  # the hard rules, without params: they hold while GPUPolicy/default is missing
            assert "paramKind" not in obj["spec"] and "paramRef" not in obj["spec"], obj["metadata"]["name"]
        elif binding:
            assert obj["spec"]["paramRef"] == {"name": "default", "parameterNotFoundAction": "Allow"}
            assert "paramKind" not in obj["spec"]
        else:
            assert obj["spec"]["paramKind"] == {"apiVersion": gpupolicy.API_VERSION, "kind": gpupolicy.KIND}
            assert "paramRef" not in obj["spec"]
        if obj["kind"] == "ValidatingAdmissionPolicy":
            assert family_of(obj["metadata"]["name"]) in ("builtin", "custom", "claims")
    assert seeds >= 4 and lives >= 8, (seeds, lives)
    # Every rule the bed carries natively is in a deny and a warn policy of each family that has it: one of them
    # acts, as the rule's setting in the request's namespace says.
    for action in ("deny", "warn"):
        rules = {r for o in listed if o["kind"] == "ValidatingAdmissionPolicy" and action_of(o["metadata"]["name"]) ==
                 action and not seed(o["metadata"]["name"])
                 for r in o["metadata"]["annotations"][RULES_ANNOTATION].split(",")}
        assert rules == set(bed.generated.native) - set(params.SEED), action
    stored = json.loads(bed.cluster.kubectl("get", f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}", gpupolicy.NAME, "-o",
                                            "json", check=True).stdout)
    assert stored["spec"] == as_spec(bed.policies.written)
    claims = any(o["metadata"]["name"].startswith("gpu-webhook-claims-") for o in listed)
    assert claims == (bed.target.minor >= 34)
    assert any(o["kind"].startswith("Mutating") for o in listed) == bool(bed.target.mutating)


def test_the_apiserver_decides_every_object_of_the_corpus_as_the_webhook_does(bed):
    assert_agrees(differential(bed))


def test_the_mutating_policy_patches_pods_as_mutate_does(bed):
    if not bed.target.mutating:
        pytest.skip(f"{bed.target.describe()}: mutation stays with the webhook")
    cases = mutation_pods()
    compared, differ, changed = 0, [], 0
    for case in cases:
        mutated = bed.api.create(case.obj, case.namespace)
        raw = bed.api.create(labelled_raw(case.obj), case.namespace)
        assert mutated.admitted == raw.admitted, (case.name, mutated.message, raw.message)
        if not mutated.admitted:
            continue
        # What /mutate gets: the pod as the apiserver decoded and defaulted it, before any mutation of ours.
        seen_pod = copy.deepcopy(raw.body)
        del seen_pod["metadata"]["labels"][RAW]
        request = {"uid": "u", "operation": "CREATE", "namespace": case.namespace,
                   "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": seen_pod}
        response = admission.mutate(request, bed.policies)
        expected = jsonpatch.apply_patch(seen_pod, list(response.patch))
        compared += 1
        changed += bool(response.patch)
        if expected["spec"] != mutated.body["spec"]:
            differ.append(f"{case.namespace}/{case.name}: /mutate {json.dumps(list(response.patch))}\n"
                          f"  expected {json.dumps(expected['spec'], sort_keys=True)}\n"
                          f"  got      {json.dumps(mutated.body['spec'], sort_keys=True)}")
    print(f"{bed.target.describe()}: {compared} pods compared, {changed} patched by /mutate, {len(differ)} differ")
    assert compared >= 80 and changed >= 40
    assert not differ, "\n".join(differ)


def test_the_runtime_class_is_injected_and_the_apiserver_applies_it(bed):
    if not bed.target.mutating:
        pytest.skip(f"{bed.target.describe()}: mutation stays with the webhook")
    answer = bed.api.create(as_pod("rt", spec(gpu(1)), {}), RUNTIME)
    assert answer.admitted, answer.message
    got = answer.body["spec"]
    assert got["runtimeClassName"] == "nvidia"
    # The RuntimeClass admission plugin ran after the MutatingAdmissionPolicy: its overhead and selector are there.
    assert got["overhead"] == {"cpu": "100m"} and got["nodeSelector"]["runtime"] == "nvidia"
    cpu = bed.api.create(as_pod("rt-cpu", spec(ctr()), {}), RUNTIME).body["spec"]
    assert "runtimeClassName" not in cpu


def test_a_warn_namespace_gets_warnings_and_no_refusal(bed):
    obj = as_pytorchjob("warned", spec(gpu(5, securityContext={"privileged": True})), {})
    refused = bed.api.create(obj, NS)
    named = policies_named(refused.message)
    assert not refused.admitted and named, refused.message
    assert all(family_of(n) == "custom" and action_of(n) == "deny" for n in named), named
    answer = bed.api.create(obj, LAB)
    assert answer.admitted, answer.message
    texts = [warning_text(w) for w in answer.warnings]
    expected = decide(bed.policies, Case("warned", LAB, obj))
    assert expected.allowed and expected.warnings
    # Live: the warn policies warn, one warning per rule (one validation each), each from a custom warn policy
    # through its own binding; no deny policy is bound [Warn].
    ours = [t for t in texts if policies_named(t)]
    assert len(ours) == len({v.rule for v in expected.violations}), texts
    for text in ours:
        (name,) = policies_named(text)
        assert family_of(name) == "custom" and action_of(name) == "warn", text
        assert f"with binding '{name}'" in text, text
    for line in expected.warnings:
        assert sum(line in t for t in ours) == 1, (line, ours)


def test_an_update_is_held_only_to_what_it_changes(bed):
    cluster, api, policies = bed.cluster, bed.api, bed.policies
    namespace = "np-update"
    cluster.kubectl("create", "namespace", namespace)
    try:
        # Stored while the policies leave its namespace out (nativePolicies.excludeNamespaces), as an object
        # created before they were installed is.
        excluded = POLICY.replace("nativePolicies:\n",
                                  f"nativePolicies:\n  excludeNamespaces: [kube-system, {namespace}]\n")
        bed.apply(excluded)
        old = as_pytorchjob("legacy", spec(gpu("500m")), {})
        deadline = time.monotonic() + 30
        while not (stored := api.create(old, namespace, dry_run=False)).admitted:
            assert time.monotonic() < deadline, stored.message
            time.sleep(0.2)
        bed.apply(POLICY)
        deadline = time.monotonic() + 30
        while not any(family_of(n) == "custom" for n in policies_named(
                api.create(as_pytorchjob("new", spec(gpu("500m")), {}), namespace).message)):
            assert time.monotonic() < deadline, "the policy never covered the namespace again"
            time.sleep(0.2)
        current = stored.body
        # A label: the old problem is the same problem, at the same place; the update is admitted.
        current["metadata"].setdefault("labels", {})["team"] = "a"
        relabelled = api.update(current, namespace)
        assert relabelled.admitted, relabelled.message
        expected = admission.decide(current, "kubeflow.org", "PyTorchJob", namespace, policies, old=stored.body)
        assert expected.allowed
        # A different value is a new problem: refused, as the webhook refuses it.
        changed = copy.deepcopy(relabelled.body)
        changed["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"][
            "limits"]["nvidia.com/gpu"] = "1500m"
        answer = api.update(changed, namespace)
        verdict = admission.decide(changed, "kubeflow.org", "PyTorchJob", namespace, policies, old=relabelled.body)
        assert not answer.admitted and not verdict.allowed
        assert str(verdict.violations[0]) in answer.message
        assert '"500m"' not in answer.message
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_a_policy_change_reaches_the_objects(bed):
    five = as_raycluster("five", spec(gpu(3, "a"), gpu(2, "b")), {})
    # The previous test applied changed policies twice: the apiserver compiles each anew, and a policy being
    # compiled does not act yet (20-43 s here); the time below is the change's alone.
    wait_until_enforced(bed)
    assert bed.api.create(five, NS).admitted  # 5 GPUs: within perPod 6
    stricter = POLICY.replace("perPod: 6", "perPod: 4")
    start = time.monotonic()
    bed.apply(stricter)
    try:
        while True:
            answer = bed.api.create(five, NS)
            if not answer.admitted:
                break
            assert time.monotonic() - start < 30, "the new limit never reached the apiserver"
            time.sleep(0.1)
        took = time.monotonic() - start
        print(f"{bed.target.describe()}: perPod 6 -> 4 refused the 5-GPU RayCluster {took:.2f} s after kubectl apply")
        expected = decide(parse_policy(stricter), Case("five", NS, five))
        assert not expected.allowed and str(expected.violations[0]) in answer.message
    finally:
        bed.apply(POLICY)
        wait_until_enforced(bed)
        while not bed.api.create(five, NS).admitted:
            assert time.monotonic() - start < 60
            time.sleep(0.1)


def big_pod(containers: int, up: bool) -> dict:
    """Many containers, each with a GPU, environment and mounts, and a deep hostPath: the cost budget's test. The
    apiserver refuses ``..`` in a Pod's hostPath itself; custom resources may have it (``up``)."""
    items = []
    for i in range(containers):
        env = [{"name": f"V{k}", "value": str(k)} for k in range(20)]
        items.append(gpu(1, f"c{i}", env=env, volumeMounts=[{"name": "data", "mountPath": f"/data/{i}"}]))
    deep = "/" + "/".join(f"d{k}" for k in range(36)) + ("/../.." if up else "") + "/x"
    return spec(*items, volumes=[{"name": "data", "hostPath": {"path": deep}}])


def test_a_large_pod_stays_within_the_cost_budget(bed):
    native = set(bed.generated.native)
    for n in (6, 40):
        for obj in (as_pod(f"big-{n}", big_pod(n, False), {}), as_pytorchjob(f"big-{n}", big_pod(n, True), {})):
            case = Case(obj["metadata"]["name"], RESEARCH, obj)
            expected = decide(bed.policies, case)
            denied = [v for v, a in zip(expected.violations, expected.actions, strict=True)
                      if a == "deny" and v.rule in native]
            started = time.monotonic()
            answer = bed.api.create(labelled_raw(obj) if obj["kind"] == "Pod" else obj, RESEARCH)
            took = time.monotonic() - started
            assert not failed_expressions(answer.message), answer.message
            assert answer.admitted == (not denied), (answer.message, expected.message)
            print(f"{bed.target.describe()}: {case.kind} with {n} containers: {answer.status} in {took * 1000:.0f} ms")
