"""The generated admission policies (``gpu-webhook admission-policies``) on a real kube-apiserver v1.36.3, with no
webhook registered: the apiserver's verdict on every object of a generated corpus equals the webhook's
(``webhook.rules.admission.decide``, what ``gpu-webhook check`` runs), refusals of custom resources name the
generated policy, the MutatingAdmissionPolicy patches Pods as ``/mutate`` does, warn-mode namespaces get warnings,
an UPDATE is held only to what it changes, and a policy change reaches the objects.

The corpus is a table: pod specs (quantity spellings as strings and numbers, caps, accelerators, isolation cases,
the pod's own DRA fields, odd shapes) placed in Pods, built-in workloads and the custom kinds the policies know
(PyTorchJob, TFJob, RayCluster, RayJob, JobSet, LeaderWorkerSet), and ResourceClaims and ResourceClaimTemplates.
Every object is created with server-side dry run.
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
import yaml

from tests.e2e.cluster import ADMIN_TOKEN, ControlPlane
from tests.native_corpus import (
    ADMIN,
    LAB,
    NAMESPACES,
    NS,
    OPEN,
    POLICY,
    RESEARCH,
    RUNTIME,
    Case,
    as_pod,
    as_pytorchjob,
    as_raycluster,
    corpus,
    ctr,
    gpu,
    mutation_pods,
    spec,
)
from webhook.core.podspecs import group_of
from webhook.core.policy import PolicySet, parse_policy
from webhook.native.generate import generate, to_yaml
from webhook.rules import admission

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CRDS = Path(__file__).resolve().parent / "native-crds.yaml"
COMPONENT = "app.kubernetes.io/component=admission-policies"
RAW = "e2e.gpu-webhook.io/raw"  # pods with this label skip the MutatingAdmissionPolicy (the test's binding says so)

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
           "TFJob": "tfjobs", "RayCluster": "rayclusters", "RayJob": "rayjobs", "JobSet": "jobsets",
           "LeaderWorkerSet": "leaderworkersets", "TrainJob": "trainjobs", "ResourceClaim": "resourceclaims",
           "ResourceClaimTemplate": "resourceclaimtemplates"}


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


BUILTIN = ("Pod", "Deployment", "CronJob")


def decide(policies: PolicySet, case: Case) -> Any:
    return admission.decide(case.obj, group_of(case.obj["apiVersion"]), case.kind, case.namespace, policies)


def warning_text(header: str) -> str:
    """A Warning header's text (``299 - "…"``)."""
    text = header.split(" ", 2)[-1]
    return json.loads(text) if text.startswith('"') else text


# --- the bed ------------------------------------------------------------------------------------------------------


def generated(policy_text: str) -> list[dict]:
    """The generated objects, the MutatingAdmissionPolicyBinding told to skip pods labelled RAW (the test's
    reference: the same pod as the apiserver defaults it, not mutated)."""
    objects = generate(parse_policy(policy_text)).objects
    for obj in objects:
        if obj["kind"] == "MutatingAdmissionPolicyBinding":
            obj["spec"]["matchResources"] = {"objectSelector": {"matchExpressions": [
                {"key": RAW, "operator": "DoesNotExist"}]}}
    return objects


def apply(cluster: ControlPlane, objects: list[dict]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=to_yaml(objects), check=True)


PROBE = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "probe"},
         "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [
             {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}]}}}}}}


def wait_until_enforced(api: Api, timeout: float = 30) -> float:
    """Policies reach the apiserver's admission asynchronously: wait until a probe is refused by ours and a GPU pod
    gets the accelerator selector. Returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    gpu_pod = as_pod("probe", spec(gpu(1)), {})
    zero = as_pod("probe", spec(gpu(0)), {})
    while time.monotonic() < deadline:
        refused = "gpu-webhook-deny" in api.create(PROBE, NS).message
        mutated = api.create(gpu_pod, NS).body.get("spec", {}).get("nodeSelector", {}).get("accelerator")
        warned = any("gpu-webhook-warn" in w for w in api.create(zero, NS).warnings)
        if refused and mutated and warned:
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError("the generated policies never took effect")


@pytest.fixture(scope="module")
def bed(cluster: ControlPlane) -> Iterator[tuple[ControlPlane, Api, PolicySet]]:
    webhooks = cluster.kubectl("get", "validatingwebhookconfigurations,mutatingwebhookconfigurations", "-o", "name")
    assert "gpu-webhook" not in webhooks.stdout, "a gpu-webhook webhook is still registered in the bed"
    existing = set(cluster.kubectl("get", "crd", "-o", "name").stdout.split())
    cluster.kubectl("apply", "-f", str(CRDS), check=True)
    ours = [d for d in yaml.safe_load_all(CRDS.read_text()) if d and f"customresourcedefinition.apiextensions.k8s.io/"
            f"{d['metadata']['name']}" not in existing]
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
    api = Api(cluster)
    apply(cluster, generated(POLICY))
    wait_until_enforced(api)
    try:
        yield cluster, api, parse_policy(POLICY)
    finally:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy", "mutatingadmissionpolicybinding",
                     "mutatingadmissionpolicy"):
            cluster.kubectl("delete", kind, "-l", COMPONENT, "--ignore-not-found")
        cluster.kubectl("delete", "runtimeclass", "nvidia", "--ignore-not-found")
        cluster.kubectl("delete", "namespace", *NAMESPACES, "--ignore-not-found", "--wait=false")
        for crd in ours:
            cluster.kubectl("delete", "crd", crd["metadata"]["name"], "--ignore-not-found", "--wait=false")


# --- the tests --------------------------------------------------------------------------------------------------


def test_the_generated_objects_are_v1_policies_with_literal_values_and_rule_annotations(bed):
    cluster, _, policies = bed
    listed = json.loads(cluster.kubectl("get", "validatingadmissionpolicies,validatingadmissionpolicybindings,"
                                        "mutatingadmissionpolicies,mutatingadmissionpolicybindings", "-l", COMPONENT,
                                        "-o", "json", check=True).stdout)["items"]
    kinds = sorted(o["kind"] for o in listed)
    assert kinds == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                     "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding"]
    for obj in listed:
        assert obj["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert obj["metadata"]["annotations"]["gpu-webhook.io/rules"]
        assert "paramKind" not in obj["spec"] and "paramRef" not in obj["spec"]
    rules = {r for o in listed if o["kind"] == "ValidatingAdmissionPolicy"
             for r in o["metadata"]["annotations"]["gpu-webhook.io/rules"].split(",")}
    assert {"invalid-quantity", "per-pod-limit", "privileged-gpu", "device-class-not-allowed"} <= rules


def test_the_apiserver_decides_every_object_of_the_corpus_as_the_webhook_does(bed):
    _, api, policies = bed
    cases = corpus()
    assert len(cases) >= 200
    disagreements, messages, sources, decoded = [], [], [], []
    started = time.monotonic()
    admitted = with_warnings = ours = 0
    for case in cases:
        answer = api.create(case.obj, case.namespace)
        expected = decide(policies, case)
        admitted += int(answer.admitted)
        with_warnings += int(answer.admitted and any("gpu-webhook" in w for w in answer.warnings))
        ours += int("ValidatingAdmissionPolicy 'gpu-webhook-deny'" in answer.message)
        if answer.admitted and not expected.allowed and case.kind in BUILTIN:
            # The webhook sees a built-in object as the apiserver decoded it (a null limit dropped, say): judge that.
            seen = Case(case.name, case.namespace, answer.body)
            if decide(policies, seen).allowed:
                decoded.append(case.name)
                continue
        if answer.admitted != expected.allowed:
            disagreements.append(f"{case.namespace}/{case.kind}/{case.name}: apiserver {answer.status} "
                                 f"{answer.message[:300]!r}, webhook {expected.allowed} {expected.message[:300]!r}")
            continue
        custom = case.kind not in BUILTIN and not case.kind.startswith("ResourceClaim")
        if not answer.admitted and (custom or "ValidatingAdmissionPolicy" in answer.message):
            if "ValidatingAdmissionPolicy 'gpu-webhook-deny'" not in answer.message:
                sources.append(f"{case.name}: {answer.message[:200]}")
            # Every violation the webhook reports is in the policy's one-line message, at the same path and in the
            # same words (for built-in kinds the apiserver has canonicalised the values, "1e400" to "10e399": there
            # the path).
            for violation, action in zip(expected.violations, expected.actions, strict=True):
                said = str(violation) if custom else f"{violation.path}: "
                if action == "deny" and said not in answer.message:
                    messages.append(f"{case.name}: missing {said!r} in {answer.message!r}")
        warned = " ".join(warning_text(w) for w in answer.warnings)
        for violation, action in zip(expected.violations, expected.actions, strict=True):
            said = str(violation) if case.kind not in BUILTIN else f"{violation.path}: "
            if action == "warn" and said not in warned:
                messages.append(f"{case.name}: no warning {said!r} in {warned!r}")
    elapsed = time.monotonic() - started
    summary = (f"{len(cases)} objects in {elapsed:.1f} s: {admitted} admitted ({with_warnings} with warnings), "
               f"{len(cases) - admitted} refused ({ours} by gpu-webhook-deny); {len(disagreements)} verdicts differ; "
               f"{len(decoded)} judged as the apiserver decoded them: {', '.join(decoded)}")
    print(summary)
    assert not disagreements, summary + "\n" + "\n".join(disagreements)
    assert admitted >= 100 and len(cases) - admitted >= 150 and with_warnings >= 30, summary
    assert not sources, "\n".join(sources)
    assert not messages, "\n".join(messages[:40])


def labelled_raw(obj: dict) -> dict:
    raw = copy.deepcopy(obj)
    raw["metadata"].setdefault("labels", {})[RAW] = "true"
    return raw


def test_the_mutating_policy_patches_pods_as_mutate_does(bed):
    _, api, policies = bed
    cases = mutation_pods()
    compared, differ, changed = 0, [], 0
    for case in cases:
        mutated = api.create(case.obj, case.namespace)
        raw = api.create(labelled_raw(case.obj), case.namespace)
        assert mutated.admitted == raw.admitted, (case.name, mutated.message, raw.message)
        if not mutated.admitted:
            continue
        # What /mutate gets: the pod as the apiserver decoded and defaulted it, before any mutation of ours.
        seen = copy.deepcopy(raw.body)
        del seen["metadata"]["labels"][RAW]
        request = {"uid": "u", "operation": "CREATE", "namespace": case.namespace,
                   "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": seen}
        response = admission.mutate(request, policies)
        expected = jsonpatch.apply_patch(seen, list(response.patch))
        compared += 1
        changed += bool(response.patch)
        if expected["spec"] != mutated.body["spec"]:
            differ.append(f"{case.namespace}/{case.name}: /mutate {json.dumps(list(response.patch))}\n"
                          f"  expected {json.dumps(expected['spec'], sort_keys=True)}\n"
                          f"  got      {json.dumps(mutated.body['spec'], sort_keys=True)}")
    print(f"{compared} pods compared, {changed} patched by /mutate, {len(differ)} differ")
    assert compared >= 80 and changed >= 40
    assert not differ, "\n".join(differ)


def test_the_runtime_class_is_injected_and_the_apiserver_applies_it(bed):
    _, api, policies = bed
    answer = api.create(as_pod("rt", spec(gpu(1)), {}), RUNTIME)
    assert answer.admitted, answer.message
    got = answer.body["spec"]
    assert got["runtimeClassName"] == "nvidia"
    # The RuntimeClass admission plugin ran after the MutatingAdmissionPolicy: its overhead and selector are there.
    assert got["overhead"] == {"cpu": "100m"} and got["nodeSelector"]["runtime"] == "nvidia"
    cpu = api.create(as_pod("rt-cpu", spec(ctr()), {}), RUNTIME).body["spec"]
    assert "runtimeClassName" not in cpu


def test_a_warn_namespace_gets_warnings_and_no_refusal(bed):
    _, api, policies = bed
    obj = as_pytorchjob("warned", spec(gpu(5, securityContext={"privileged": True})), {})
    refused = api.create(obj, NS)
    assert not refused.admitted and "ValidatingAdmissionPolicy 'gpu-webhook-deny'" in refused.message
    answer = api.create(obj, LAB)
    assert answer.admitted, answer.message
    texts = [warning_text(w) for w in answer.warnings]
    denied = [t for t in texts if "'gpu-webhook-deny' with binding 'gpu-webhook-deny-warn'" in t]
    assert len(denied) == 1, texts
    expected = decide(policies, Case("warned", LAB, obj))
    assert expected.allowed and expected.warnings
    for line in expected.warnings:
        assert line in denied[0], (line, denied[0])


def test_an_update_is_held_only_to_what_it_changes(bed):
    cluster, api, policies = bed
    namespace = "np-update"
    cluster.kubectl("create", "namespace", namespace)
    try:
        # Stored while the policies leave its namespace out (nativePolicies.excludeNamespaces), as an object
        # created before they were installed is.
        excluded = POLICY.replace("nativePolicies:\n",
                                  f"nativePolicies:\n  excludeNamespaces: [kube-system, {namespace}]\n")
        apply(cluster, generated(excluded))
        old = as_pytorchjob("legacy", spec(gpu("500m")), {})
        deadline = time.monotonic() + 30
        while not (stored := api.create(old, namespace, dry_run=False)).admitted:
            assert time.monotonic() < deadline, stored.message
            time.sleep(0.2)
        apply(cluster, generated(POLICY))
        deadline = time.monotonic() + 30
        while "gpu-webhook-deny" not in api.create(as_pytorchjob("new", spec(gpu("500m")), {}), namespace).message:
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
    cluster, api, _ = bed
    five = as_raycluster("five", spec(gpu(3, "a"), gpu(2, "b")), {})
    assert api.create(five, NS).admitted  # 5 GPUs: within perPod 6
    stricter = POLICY.replace("perPod: 6", "perPod: 4")
    start = time.monotonic()
    apply(cluster, generated(stricter))
    try:
        while True:
            answer = api.create(five, NS)
            if not answer.admitted:
                break
            assert time.monotonic() - start < 30, "the new limit never reached the apiserver"
            time.sleep(0.1)
        took = time.monotonic() - start
        print(f"perPod 6 -> 4 refused the 5-GPU RayCluster {took:.2f} s after kubectl apply")
        expected = decide(parse_policy(stricter), Case("five", NS, five))
        assert not expected.allowed and str(expected.violations[0]) in answer.message
    finally:
        apply(cluster, generated(POLICY))
        wait_until_enforced(api)
        while not api.create(five, NS).admitted:
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
    _, api, policies = bed
    for n in (6, 40):
        for obj in (as_pod(f"big-{n}", big_pod(n, False), {}), as_pytorchjob(f"big-{n}", big_pod(n, True), {})):
            case = Case(obj["metadata"]["name"], RESEARCH, obj)
            expected = decide(policies, case)
            started = time.monotonic()
            answer = api.create(obj, RESEARCH)
            took = time.monotonic() - started
            assert "cost" not in answer.message.lower(), answer.message
            assert answer.admitted == expected.allowed, (answer.message, expected.message)
            print(f"{case.kind} with {n} containers: {answer.status} in {took * 1000:.0f} ms")
