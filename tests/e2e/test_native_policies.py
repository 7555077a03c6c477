"""The generated admission policies (``gpu-webhook admission-policies``) on a real kube-apiserver of every version
of the matrix (``matrix_cluster``: 1.30, 1.34 with and without MutatingAdmissionPolicy v1beta1, 1.36, 1.37, and
the newer ones with it turned off), with no webhook registered. On each bed the policies are generated for what
the apiserver serves, as ``--apply`` discovers it, and:

- the apiserver's verdict on every object of the corpus equals the webhook's (``webhook.rules.admission.decide``,
  what ``gpu-webhook check`` runs) for the rules that version carries natively, with the same words; refusals
  name the policy of the object's family;
- where MutatingAdmissionPolicy is served, it patches Pods as ``/mutate`` does;
- warn-mode namespaces get warnings, an UPDATE is held only to what it changes, a policy change reaches the
  objects, and a large pod stays within the CEL cost budget.

The corpus is a table (tests/native_corpus.py): pod specs placed in Pods, built-in workloads and the custom kinds
the policies know, and ResourceClaims and ResourceClaimTemplates (from 1.34, where resource.k8s.io/v1 is served).
Every object is created with server-side dry run. The same corpus runs in seconds through the apiserver's CEL
packages in the unit tier (tests/test_native_eval.py); this is the final proof.
"""

from __future__ import annotations

import copy
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.e2e.cluster import ADMIN_TOKEN, MAP_BETA, MAP_OFF, ControlPlane
from tests.e2e.conftest import MATRIX_BEDS
from tests.native_corpus import (
    ADMIN,
    BUILTIN,
    LAB,
    NAMESPACES,
    NS,
    OPEN,
    POLICY,
    RESEARCH,
    RUNTIME,
    Case,
    Seen,
    as_pod,
    as_pytorchjob,
    as_raycluster,
    compare,
    corpus,
    ctr,
    gpu,
    mutation_pods,
    spec,
)
from webhook.cli.policies import discover
from webhook.core.podspecs import group_of
from webhook.core.policy import PolicySet, parse_policy
from webhook.kube.client import Kube
from webhook.native.generate import RULES_ANNOTATION, TARGET_ANNOTATION, Generated, generate, to_yaml
from webhook.native.pods import CUSTOM_ONLY
from webhook.native.target import Target
from webhook.rules import admission

# The beds the issue of versions asks for: the oldest, MutatingAdmissionPolicy v1beta1, 1.36 and the newest. Their
# ValidatingAdmissionPolicies are the same objects with MutatingAdmissionPolicy on or off (a target's validation
# depends on its minor only), so the other beds of the matrix (1.34 without the beta API, 1.36 and 1.37 with it
# turned off) run the chart's hybrid install (tests/e2e/test_native_chart.py) and not this corpus again.
BEDS = [bed for bed in MATRIX_BEDS if bed.id in ("1.30", "1.34-map-beta", "1.36", "1.37")]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.parametrize("matrix_cluster", BEDS, ids=[b.id for b in BEDS], indirect=True)]

CRDS = Path(__file__).resolve().parent / "native-crds.yaml"
COMPONENT = "app.kubernetes.io/component=admission-policies"
RAW = "e2e.gpu-webhook.io/raw"  # pods with this label skip the MutatingAdmissionPolicy (the test's binding says so)
FAMILY = {"builtin": "gpu-webhook-deny", "custom": "gpu-webhook-custom-deny", "claims": "gpu-webhook-claims-deny"}

# --- talking to the apiserver ---------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return self.status < 300

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


PLURALS = {"Pod": "pods", "Deployment": "deployments", "CronJob": "cronjobs", "PyTorchJob": "pytorchjobs",
           "TFJob": "tfjobs", "RayCluster": "rayclusters", "RayJob": "rayjobs", "RayService": "rayservices",
           "JobSet": "jobsets", "LeaderWorkerSet": "leaderworkersets", "TrainJob": "trainjobs",
           "ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}


class Api:
    """POST and PUT to the bed's apiserver, reading the status, the body and the Warning headers."""

    def __init__(self, cluster: ControlPlane):
        self.url = cluster.url
        context = ssl.create_default_context(cafile=str(cluster.ca_file))
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  urllib.request.HTTPSHandler(context=context))

    def path(self, obj: dict, namespace: str) -> str:
        api = obj["apiVersion"]
        base = "/api/v1" if api == "v1" else f"/apis/{api}"
        return f"{base}/namespaces/{namespace}/{PLURALS[obj['kind']]}"

    def send(self, method: str, path: str, obj: dict | None = None) -> Answer:
        request = urllib.request.Request(
            self.url + path, data=None if obj is None else json.dumps(obj).encode(), method=method,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
        try:
            with self.opener.open(request, timeout=30) as response:
                return Answer(response.status, json.loads(response.read()), response.headers.get_all("Warning") or [])
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, json.loads(exc.read() or b"{}"), exc.headers.get_all("Warning") or [])

    def create(self, obj: dict, namespace: str, dry_run: bool = True) -> Answer:
        return self.send("POST", self.path(obj, namespace) + ("?dryRun=All" if dry_run else ""), obj)

    def update(self, obj: dict, namespace: str) -> Answer:
        return self.send("PUT", f"{self.path(obj, namespace)}/{obj['metadata']['name']}", obj)


def decide(policies: PolicySet, case: Case) -> Any:
    return admission.decide(case.obj, group_of(case.obj["apiVersion"]), case.kind, case.namespace, policies)


def warning_text(header: str) -> str:
    """A Warning header's text (``299 - "…"``)."""
    text = header.split(" ", 2)[-1]
    return json.loads(text) if text.startswith('"') else text


def family(kind: str) -> str:
    if kind in BUILTIN:
        return "builtin"
    return "claims" if kind.startswith("ResourceClaim") else "custom"


def failed_expressions(text: str) -> bool:
    """An expression that did not evaluate (an error, or over the cost budget), as the apiserver words it."""
    return "resulted in error" in text or "failed expression" in text or "cost" in text.lower()


def seen(case: Case, answer: Answer) -> Seen:
    """What the apiserver answered, as the comparison reads it: its own validation refuses what names no policy."""
    warnings = [warning_text(w) for w in answer.warnings]
    errors = [m for m in (answer.message, *warnings) if failed_expressions(m)]
    ours = "ValidatingAdmissionPolicy" in answer.message
    decoded = answer.body if answer.admitted and case.kind in BUILTIN else None
    return Seen(answer.admitted, answer.message, warnings, decoded, not answer.admitted and not ours, errors)


# --- the bed ------------------------------------------------------------------------------------------------------


@dataclass
class NativeBed:
    cluster: ControlPlane
    api: Api
    policies: PolicySet
    target: Target
    generated: Generated

    def apply(self, policy_text: str) -> None:
        apply(self.cluster, generated(policy_text, self.target).objects)


def generated(policy_text: str, target: Target) -> Generated:
    """The generated objects for ``target``, the MutatingAdmissionPolicyBinding told to skip pods labelled RAW (the
    test's reference: the same pod as the apiserver defaults it, not mutated)."""
    out = generate(parse_policy(policy_text), target)
    for obj in out.objects:
        if obj["kind"] == "MutatingAdmissionPolicyBinding":
            obj["spec"]["matchResources"] = {"objectSelector": {"matchExpressions": [
                {"key": RAW, "operator": "DoesNotExist"}]}}
    return out


def apply(cluster: ControlPlane, objects: list[dict]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=to_yaml(objects), check=True)


def labelled_raw(obj: dict) -> dict:
    raw = copy.deepcopy(obj)
    raw["metadata"].setdefault("labels", {})[RAW] = "true"
    return raw


PROBE = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "probe"},
         "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [
             {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}]}}}}}}


def probes(bed: NativeBed) -> dict[str, Case]:
    """For each generated ValidatingAdmissionPolicy, the first case of the corpus it must act on (deny, or warn for
    a ``-warn`` policy): each policy is compiled on its own when it reaches the apiserver, some in seconds."""
    found = {}
    cases = [c for c in corpus() if c.namespace == NS]
    for policy in bed.generated.objects:
        if policy["kind"] != "ValidatingAdmissionPolicy":
            continue
        name = policy["metadata"]["name"]
        rules = set(policy["metadata"]["annotations"][RULES_ANNOTATION].split(","))
        action = "warn" if name.endswith("-warn") else "deny"
        for case in cases:
            if FAMILY[family(case.kind)] != name.replace("-warn", "-deny"):
                continue
            verdict = decide(bed.policies, case)
            if any(a == action and v.rule in rules and not (case.kind in BUILTIN and v.rule in CUSTOM_ONLY)
                   for v, a in zip(verdict.violations, verdict.actions, strict=True)):
                found[name] = case
                break
        assert name in found, f"no case of the corpus for {name}"
    return found


def wait_until_enforced(bed: NativeBed, timeout: float = 60) -> float:
    """Policies reach the apiserver's admission asynchronously, each compiled on its own: wait until every
    generated ValidatingAdmissionPolicy acts on its probe and (where MutatingAdmissionPolicy is served) a GPU pod
    gets the accelerator selector. Returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    waiting = probes(bed)
    gpu_pod = as_pod("probe", spec(gpu(1)), {})
    mutated = not bed.target.mutating
    while time.monotonic() < deadline:
        for name, case in list(waiting.items()):
            answer = bed.api.create(labelled_raw(case.obj) if case.kind == "Pod" else case.obj, case.namespace)
            said = " ".join(answer.warnings) if name.endswith("-warn") else answer.message
            if f"ValidatingAdmissionPolicy '{name}'" in said:
                del waiting[name]
        mutated = mutated or bed.api.create(gpu_pod, NS).body.get("spec", {}).get("nodeSelector", {}).get(
            "accelerator")
        if not waiting and mutated:
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"the generated policies never took effect on {bed.target.describe()}: {sorted(waiting)} "
                         f"did not act{'' if mutated else ', the MutatingAdmissionPolicy did not mutate'}")


@pytest.fixture(scope="module")
def bed(matrix_cluster: ControlPlane) -> Iterator[NativeBed]:
    cluster = matrix_cluster
    webhooks = cluster.kubectl("get", "validatingwebhookconfigurations,mutatingwebhookconfigurations", "-o", "name")
    assert "gpu-webhook" not in webhooks.stdout, "a gpu-webhook webhook is registered in the bed"
    cluster.kubectl("apply", "-f", str(CRDS), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS), check=True)
    for namespace in NAMESPACES:
        cluster.kubectl("create", "namespace", namespace)
    # adminAccess also needs the namespace label the apiserver checks (DRAAdminAccess).
    for namespace in (ADMIN, LAB, OPEN):
        cluster.kubectl("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true", "--overwrite",
                        check=True)
    cluster.kubectl("apply", "-f", "-", check=True, stdin=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia",
        "overhead": {"podFixed": {"cpu": "100m"}}, "scheduling": {"nodeSelector": {"runtime": "nvidia"}}}))
    target = discover(Kube.connect(str(cluster.kubeconfig)))
    out = generated(POLICY, target)
    native = NativeBed(cluster, Api(cluster), parse_policy(POLICY), target, out)
    apply(cluster, out.objects)
    took = wait_until_enforced(native)
    print(f"{cluster.bed.id if cluster.bed else '?'}: {target.describe()}, {len(out.objects)} objects enforced "
          f"{took:.1f} s after kubectl apply; left to the webhook: {', '.join(r for r, _ in out.webhook_only)}")
    yield native


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
    for obj in listed:
        assert obj["metadata"]["annotations"][TARGET_ANNOTATION] == bed.target.version
        assert "paramKind" not in obj["spec"] and "paramRef" not in obj["spec"]
    claims = any(o["metadata"]["name"].startswith("gpu-webhook-claims-") for o in listed)
    assert claims == (bed.target.minor >= 34)
    assert any(o["kind"].startswith("Mutating") for o in listed) == bool(bed.target.mutating)


def test_the_apiserver_decides_every_object_of_the_corpus_as_the_webhook_does(bed):
    cases = corpus()
    assert len(cases) >= 200
    started = time.monotonic()
    claims = bed.target.minor >= 34  # resource.k8s.io/v1: the comparison leaves the claims out below
    # Pods skip the MutatingAdmissionPolicy: the validation sees the object as sent, as the webhook's reference does.
    answers = [bed.api.create(labelled_raw(c.obj) if c.kind == "Pod" else c.obj, c.namespace)
               if claims or family(c.kind) != "claims" else Answer(404, {}) for c in cases]
    elapsed = time.monotonic() - started
    found = compare(bed.policies, bed.generated, cases, [seen(c, a) for c, a in zip(cases, answers, strict=True)])
    sources = [f"{c.name}: {a.message[:200]}" for c, a in zip(cases, answers, strict=True)
               if "ValidatingAdmissionPolicy" in a.message and f"'{FAMILY[family(c.kind)]}'" not in a.message]
    summary = found.summary(f"{bed.target.describe()} ({elapsed:.1f} s)", len(cases))
    print(summary)
    assert not found, summary + "\n" + found.details()
    assert found.admitted >= 100 and found.refused >= 150 and found.warned >= 30, summary
    assert len(cases) - found.skipped >= 200, summary
    assert not sources, "refused by another family's policy:\n" + "\n".join(sources)


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
    assert not refused.admitted and f"ValidatingAdmissionPolicy '{FAMILY['custom']}'" in refused.message
    answer = bed.api.create(obj, LAB)
    assert answer.admitted, answer.message
    texts = [warning_text(w) for w in answer.warnings]
    denied = [t for t in texts if f"'{FAMILY['custom']}' with binding '{FAMILY['custom']}-warn'" in t]
    assert len(denied) == 1, texts
    expected = decide(bed.policies, Case("warned", LAB, obj))
    assert expected.allowed and expected.warnings
    for line in expected.warnings:
        assert line in denied[0], (line, denied[0])


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
        while FAMILY["custom"] not in api.create(as_pytorchjob("new", spec(gpu("500m")), {}), namespace).message:
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
