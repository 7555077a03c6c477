"""The chart's webhooks are sent whatever the rules speak about: for every object of the shared corpora and every
chart mode, a violation, a warning or a patch from ``webhook.rules.admission`` means the matchConditions that mode
renders let the object through to the webhook (or, in hybrid mode, the generated native policies carry that rule).

The conditions are built by the functions the chart's generated helpers come from (``webhook.native.webhooks``,
``webhook.native.hybrid``), for the chart's default policy and two others, and evaluated by the apiserver's CEL
(tests/celeval), each wrapped as a one-validation ValidatingAdmissionPolicy: matchConditions and validations see the
same ``object`` and ``request``. tests/chart/test_webhook_conditions_chart.py checks that ``helm template`` renders
exactly these texts.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import day_one, native_corpus
from tests.celeval import PLURALS, Request, evaluate
from webhook.core.cluster import KINDS as CLUSTER_KINDS
from webhook.core.cluster import ClusterState
from webhook.core.clusterview import ClusterView
from webhook.core.kinds import BLOCK_KINDS, KNOWN_KINDS
from webhook.core.podspecs import group_of
from webhook.core.policy import PolicySet
from webhook.core.policyfile import parse_policy
from webhook.core.policyschema import EXCLUDED_NAMESPACES
from webhook.native import hybrid, webhooks
from webhook.native.generate import generate
from webhook.native.rules import BUILDERS, trigger_expression
from webhook.native.snippets import Ctx
from webhook.native.target import Target
from webhook.rules import admission

# The chart's default policy (values.policy: {}), the native corpus's (caps, accelerators, checks, overlays, a custom
# kind) and one with hideGpus on, a platform's label and taints, and globs.
POLICIES: dict[str, dict[str, Any]] = {
    "default": {},
    "corpus": yaml.safe_load(native_corpus.POLICY),
    "platform": {"platform": "gke", "resources": ["nvidia.com/gpu", "nvidia.com/mig-?g.*", "amd.com/gpu"],
                 "isolation": {"hideGpus": "void"},
                 "namespaces": {native_corpus.LAB: {"isolation": {"hideGpus": "off"}}}},
}
# The validating webhook's built-in kinds (the chart's rules), by API group.
BUILTIN = {"": {"Pod", "PodTemplate", "ReplicationController"},
           "apps": {"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"}, "batch": {"Job", "CronJob"}}
DRA_KINDS = {"ResourceClaim", "ResourceClaimTemplate", "DeviceClass"}
# Hybrid mode's targets: a MutatingAdmissionPolicy served, and not.
WITH_MAP, WITHOUT_MAP = Target(36, True, "v1"), Target(35, True, None)


def cluster_view() -> ClusterView:
    """A cluster for the modes with the cluster checks on, so that their rules speak: one model of the corpus, a
    RuntimeClass whose node selector other models contradict, a DeviceClass and a claim of it (every kind
    complete)."""
    state = ClusterState("accelerator")
    labels = {"accelerator": "nvidia-l4", "kubernetes.io/hostname": "l4"}
    state.load([
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "l4", "labels": labels},
         "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "4"}}},
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia",
         "scheduling": {"nodeSelector": {"accelerator": "nvidia-l4"}}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
         "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "one-gpu", "namespace": native_corpus.NS},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}},
    ], known=CLUSTER_KINDS)
    return state.view()


@dataclass(frozen=True)
class Mode:
    """A chart mode: per webhook, its matchConditions (None: no condition, everything is sent); what the native
    policies carry; whether the MutatingAdmissionPolicy holds the mutation."""

    name: str
    conditions: Mapping[str, Sequence[str] | None]
    native: frozenset[str] = frozenset()
    native_mutation: bool = False
    view: ClusterView | None = field(default=None, compare=False)  # the cluster the rules see (cluster checks on)


def modes(document: Mapping[str, Any]) -> list[Mode]:
    policies = parse_policy(json.dumps(document))
    own = webhooks.expressions(policies)
    webhook_only = {"validate": [own["validate"]], "mutate": [own["mutate"]], "dra": [own["dra"]], "custom": None}
    out = [Mode("webhook-only", webhook_only)]
    cluster = parse_policy(json.dumps({**document, "cluster": {"enabled": True}}))
    inline = parse_policy(json.dumps({**document, "cluster": {"enabled": True},
                                      "nativePolicies": {"params": "inline"}}))
    out.append(Mode("webhook-only-cluster", webhook_only, view=cluster_view()))
    for name, target, policy_set in (("hybrid", WITH_MAP, policies), ("hybrid-no-map", WITHOUT_MAP, policies),
                                     ("hybrid-cluster", WITH_MAP, cluster), ("hybrid-cluster-inline", WITH_MAP, inline),
                                     ("hybrid-cluster-no-map", WITHOUT_MAP, cluster)):
        extra = hybrid.conditions(policy_set, target)
        conditions: dict[str, list[str] | None] = {}
        for hook, first in webhook_only.items():
            more = [text for _, text in extra[hook] or ()]
            conditions[hook] = None if first is None and not more else [*(first or ()), *more]
        native_mutation = extra["mutate"] is not None
        out.append(Mode(name, conditions, frozenset(generate(policy_set, target).native), native_mutation,
                        cluster_view() if policy_set.default.cluster_enabled else None))
    return out


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, namespace, object): the shared corpora and the cases the chart's conditions once missed."""
    out = [(c.name, c.namespace, c.obj) for c in native_corpus.corpus()]
    out += [(c.name, c.namespace, c.obj) for c in native_corpus.mutation_pods()]
    out += [(c.name, c.namespace, c.obj) for c in day_one.corpus()]
    ns = native_corpus.NS
    fraction = {"gpu-fraction": "0.5"}
    visible = native_corpus.ctr("main", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    gpu = native_corpus.gpu(1)
    bare = native_corpus.ctr("main")
    out += [
        ("kai-fraction-visible-all", ns, native_corpus.as_pod("kai-fraction-visible-all",
                                                              native_corpus.spec(visible), fraction)),
        ("kai-fraction-host-pid", ns, native_corpus.as_pod("kai-fraction-host-pid",
                                                           native_corpus.spec(bare, hostPID=True), fraction)),
        ("runai-memory-privileged", ns, native_corpus.as_pod(
            "runai-memory-privileged", native_corpus.spec(native_corpus.ctr(
                "main", securityContext={"privileged": True})), {"gpu-memory": "4000"})),
        ("gpu-host-pid", ns, native_corpus.as_pod("gpu-host-pid", native_corpus.spec(gpu, hostPID=True), {})),
        ("gpu-host-pid-deployment", ns, native_corpus.as_deployment(
            "gpu-host-pid-deployment", native_corpus.spec(gpu, hostPID=True), {})),
        ("cpu-tolerates-gpu", ns, native_corpus.as_pod("cpu-tolerates-gpu", native_corpus.spec(bare, tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]), {})),
        ("cpu-selects-accelerator", ns, native_corpus.as_pod("cpu-selects-accelerator", native_corpus.spec(
            bare, nodeSelector={"accelerator": "nvidia-l4"}), {})),
        # CPU pods with what the rules about GPU pods read: none of them may speak.
        ("cpu-accelerator-annotation", ns, native_corpus.as_pod("cpu-accelerator-annotation", native_corpus.spec(
            bare, nodeSelector={"zone": "a"}), {"gpu-webhook/accelerator": "nvidia-a100"})),
        ("cpu-node-name", ns, native_corpus.as_pod("cpu-node-name", native_corpus.spec(bare, nodeName="n1"), {})),
        ("cpu-every-list", ns, native_corpus.as_pod("cpu-every-list", native_corpus.spec(
            bare, initContainers=[native_corpus.ctr("init")], resources={"limits": {"cpu": "1"}}), {})),
        ("cpu-host-pid", ns, native_corpus.as_pod("cpu-host-pid", native_corpus.spec(bare, hostPID=True), {})),
        ("cpu-env-from", ns, native_corpus.as_pod("cpu-env-from", native_corpus.spec(native_corpus.ctr(
            "main", envFrom=[{"configMapRef": {"name": "c"}}])), {})),
        ("gpu-fraction-node-name", ns, native_corpus.as_pod("gpu-fraction-node-name", native_corpus.spec(
            bare, nodeName="n1"), fraction)),
        # What the cluster rules speak of (with the cluster checks on): a RuntimeClass whose node selector the pod's
        # contradicts, or that does not exist; a claim the namespace does not have; a model no node has.
        ("gpu-runtime-conflict", ns, native_corpus.as_pod("gpu-runtime-conflict", native_corpus.spec(
            gpu, runtimeClassName="nvidia", nodeSelector={"accelerator": "nvidia-tesla-p100"}), {})),
        ("gpu-runtime-conflict-deployment", ns, native_corpus.as_deployment("gpu-runtime-conflict-deployment",
                                                                            native_corpus.spec(
            gpu, runtimeClassName="nvidia", nodeSelector={"accelerator": "nvidia-tesla-p100"}), {})),
        ("gpu-runtime-missing", ns, native_corpus.as_pod("gpu-runtime-missing", native_corpus.spec(
            gpu, runtimeClassName="missing"), {})),
        ("claim-missing", ns, native_corpus.as_pod("claim-missing", native_corpus.spec(
            bare, resourceClaims=[{"name": "gpu", "resourceClaimName": "missing"}]), {})),
        # A GPU through a claim alone: the webhook gives it the accelerator, reading the claim.
        ("claim-gpu", ns, native_corpus.as_pod("claim-gpu", native_corpus.spec(
            native_corpus.ctr("main", resources={"claims": [{"name": "gpu"}]}),
            resourceClaims=[{"name": "gpu", "resourceClaimName": "one-gpu"}]), {})),
        ("gpu-unknown-model", ns, native_corpus.as_pod("gpu-unknown-model", native_corpus.spec(
            gpu, nodeSelector={"accelerator": "nvidia-h100"}), {})),
    ]
    return out


def _group_kind(obj: Mapping[str, Any]) -> tuple[str, str]:
    return group_of(obj.get("apiVersion")), str(obj.get("kind"))


def hook_of(obj: Mapping[str, Any]) -> str:
    group, kind = _group_kind(obj)
    if kind in BUILTIN.get(group, ()):
        return "validate"
    return "dra" if group == "resource.k8s.io" and kind in DRA_KINDS else "custom"


def said(name: str, namespace: str, obj: Mapping[str, Any], policies: PolicySet,
         view: ClusterView | None = None) -> tuple[set[str], bool]:
    """(the rules /validate speaks of, whether /mutate patches) for the object, on CREATE, in the cluster
    ``view``."""
    group, kind = _group_kind(obj)
    decision = admission.decide(copy.deepcopy(obj), group, kind, namespace, policies, view)
    rules = {v.rule for v in decision.violations}
    patched = False
    if (group, kind) == ("", "Pod"):
        request = {"operation": "CREATE", "object": copy.deepcopy(obj), "namespace": namespace,
                   "kind": {"group": "", "version": "v1", "kind": "Pod"}}
        patched = bool(admission.mutate(request, policies, view).patch)
    return rules, patched


# The resource of every kind the webhooks are sent: celeval's, and the registry's custom kinds.
RESOURCES = {**PLURALS, **{k.kind: k.resource for k in (*KNOWN_KINDS, *BLOCK_KINDS)}}


class _Request(Request):
    """celeval's request, for the registry's custom kinds too."""

    def to_json(self) -> dict[str, Any]:
        kind = str(self.obj["kind"])
        if kind in PLURALS:
            return super().to_json()
        group, _, version = str(self.obj["apiVersion"]).rpartition("/")
        return {"id": self.id, "operation": self.operation, "namespace": self.namespace,
                "name": self.obj.get("metadata", {}).get("name", ""),
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": RESOURCES[kind]},
                "object": self.obj, "oldObject": self.old}


def _policy(name: str, expression: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
             "metadata": {"name": name},
             "spec": {"failurePolicy": "Fail", "validations": [{"expression": expression, "message": name}]}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]}}]


def evaluate_conditions(texts: Sequence[str], requests: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, str]]:
    """Per request (namespace, object), each condition's evaluation by the apiserver's CEL: admit (true), deny
    (false) or error; an empty answer for an object the apiserver refuses before any admission webhook."""
    names = {text: f"c{n}" for n, text in enumerate(dict.fromkeys(texts))}
    objects = [o for text, name in names.items() for o in _policy(name, text)]
    done = evaluate(objects, [_Request(obj, namespace) for namespace, obj in requests])
    assert done.compile_errors == [], done.compile_errors
    by_name = {name: text for text, name in names.items()}
    return [{by_name[d["policy"]]: d["evaluation"] for d in answer.decisions} for answer in done.answers]


def sent(texts: Sequence[str] | None, answer: Mapping[str, str], where: object) -> bool:
    """A webhook with these conditions is called (None: no condition); an evaluation error fails the test (under
    failurePolicy Fail it would refuse the object)."""
    if texts is None:
        return True
    errors = [t for t in texts if answer[t] == "error"]
    assert not errors, (where, errors)
    return all(answer[t] == "admit" for t in texts)


def unsent(conditions: Mapping[str, Mapping[str, Mode]], documents: Mapping[str, Mapping[str, Any]] = POLICIES
           ) -> list[str]:
    """Every (policy, mode, case) where the rules speak and the mode's conditions keep the object from the webhook
    (``conditions``: policy name -> mode name -> Mode)."""
    every = cases()
    requests = [(ns, obj) for _, ns, obj in every if obj.get("kind") in RESOURCES]
    texts = [t for by_mode in conditions.values() for mode in by_mode.values()
             for hook in mode.conditions.values() for t in hook or ()]
    results = iter(evaluate_conditions(texts, requests))
    evaluated = {id(obj): next(results) for _, obj in requests}
    failures = []
    for policy_name, by_mode in conditions.items():
        policies = parse_policy(json.dumps(documents[policy_name]))
        with_cluster = parse_policy(json.dumps({**documents[policy_name], "cluster": {"enabled": True}}))
        excluded = set(policies.document.get("excludeNamespaces", EXCLUDED_NAMESPACES))
        for name, namespace, obj in every:
            if namespace in excluded or id(obj) not in evaluated:
                continue
            answer = evaluated[id(obj)]
            if not answer:
                continue  # refused by the apiserver itself (decoding, validation) before any webhook
            plain = said(name, namespace, obj, policies)
            in_cluster = said(name, namespace, obj, with_cluster, cluster_view())
            for mode in by_mode.values():
                rules, patched = in_cluster if mode.view is not None else plain
                left = rules - mode.native - webhooks.UNSENT
                if left and not sent(mode.conditions[hook_of(obj)], answer, (name, mode.name)):
                    failures.append(f"{policy_name}/{mode.name}/{name}: {sorted(left)} not sent to /validate")
                # With the cluster checks the webhook's patch of a pod with claims reads them: no policy can.
                claims = bool(obj.get("spec", {}).get("resourceClaims")) and mode.view is not None
                if patched and (claims or not mode.native_mutation) and not sent(mode.conditions["mutate"], answer,
                                                                                 name):
                    failures.append(f"{policy_name}/{mode.name}/{name}: the patch not sent to /mutate")
    return failures


def test_whatever_the_rules_speak_of_reaches_the_webhook_in_every_mode() -> None:
    failures = unsent({name: {m.name: m for m in modes(document)} for name, document in POLICIES.items()})
    assert failures == [], "\n".join(failures)


def test_the_any_pod_triggers_read_no_policy_value() -> None:
    """The triggers of the rules the webhook applies to pods without GPUs are written with the default policy: they
    must be the same under any other."""
    for document in POLICIES.values():
        policies = parse_policy(json.dumps(document))
        assert trigger_expression(Ctx(policies), list(webhooks.ANY_POD)) == webhooks.any_pod_triggers()


def test_every_rule_is_placed() -> None:
    """A rule the registry gains is sent by its triggers unless it is said to need a GPU: never silently skipped."""
    placed = webhooks.GPU_ONLY | webhooks.OWN_CLAUSE | webhooks.UNSENT
    pod_rules = {rule for rule, entry in BUILDERS.items() if entry.pods}
    assert placed <= pod_rules
    assert set(webhooks.ANY_POD) | placed == pod_rules
    assert webhooks.UNSENT == {"visible-devices-unread"}, "a rule the webhook-only chart never sees for itself"


@pytest.mark.parametrize("glob", ["nvidia.com/gpu", "a.io/*", "a.io/g-?", "a.io/[!a]b*", "a.io/[a-c]", "a.io/[]x]",
                                  "a.io/[", "a.io/x[!]]", "a.io/(x)+{1}$^|", "a.io/it's\\"])
def test_the_chart_converts_globs_as_the_generator(glob: str) -> None:
    """webhooks.glob_regex (the chart's converter, token by token) is celtext.glob_to_regex (it checks itself)."""
    assert webhooks.glob_regex(glob)


def test_no_hand_written_file_of_the_chart_holds_cel_or_a_rule() -> None:
    """Every CEL fragment and rule list of the chart is generated (_native.tpl, _webhooks.tpl, _policy.tpl, the
    GPUPolicy CRD's validation rules in crd.yaml and the values schema, by tests/chart/sync_schema.py); the
    hand-written templates only read values and call the generated helpers, and the chart's README, values and
    monitoring speak of the policy's keys, not of the rules' ids or their CEL."""
    from webhook.core.catalog import RULES

    chart = Path(__file__).resolve().parent.parent / "charts" / "gpu-webhook"
    generated = {"_native.tpl", "_webhooks.tpl", "_policy.tpl", "crd.yaml", "values.schema.json"}
    cel = re.compile(r"has\(|\.exists\(|\.startsWith\(|\.matches\(|request\.(kind|namespace|resource)|object\.[a-z]")
    rule = re.compile(r"\b(" + "|".join(map(re.escape, RULES)) + r")\b")
    found = []
    for path in sorted(p for p in chart.rglob("*") if p.is_file()):
        if path.name in generated:
            head = path.read_text(encoding="utf-8")[:120]
            assert path.name == "values.schema.json" or "Generated by tests/chart/sync_schema.py" in head, path.name
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if cel.search(line) or rule.search(line):
                found.append(f"{path.relative_to(chart)}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)


def test_the_generated_templates_are_fresh() -> None:
    """_native.tpl, _webhooks.tpl and the values schema's policy section are what tests/chart/sync_schema.py writes
    from the code today (run it after changing a rule, a trigger or a default)."""
    from tests.chart import sync_schema

    assert sync_schema.main(["--check"]) == 0


# Edits GPUPolicy/default may take live, and the webhook configurations' conditions must not depend on: the values
# the generated policies read through params (webhook.native.params.LIVE) and the rules' settings.
LIVE_EDITS = [
    {"accelerator": {"allowed": ["nvidia-l4"], "default": "nvidia-l4"}},
    {"limits": {"perContainer": 2, "perPod": 4}},
    {"namespaces": {"team-a": {"limits": {"perPod": 16}, "enforcement": "warn"}}},
    {"checks": {"cpuPodOnGpuNodes": "off", "privilegedGpu": "warn"}},
    {"checks": {"processCountMismatch": "off", "replicaAcceleratorMismatch": "off"}},
    {"tolerations": True, "isolation": {"runtimeClass": "nvidia"}},
]


@pytest.mark.parametrize("edit", LIVE_EDITS, ids=lambda e: ",".join(e))
def test_the_webhooks_conditions_do_not_go_stale_when_the_policy_object_is_edited(edit: dict[str, Any]) -> None:
    """Read live (the default), an edit of GPUPolicy/default reaches no webhook configuration, so nothing the
    chart rendered from the values may depend on what the edit changes: the conditions of every webhook, in every
    mode, are the same before and after. Inline, the same edit may narrow them (the values were compiled in)."""
    before = {m.name: m for m in modes({}) if not m.name.endswith("-inline")}  # that mode compiles values in
    after = {m.name: m for m in modes(edit) if not m.name.endswith("-inline")}
    assert after == before
    inline = {"nativePolicies": {"params": "inline"}}
    narrowed = {m.name: m for m in modes({**edit, **inline})} != {m.name: m for m in modes(inline)}
    if "checks" in edit:
        assert narrowed  # the own clause or the replica checks' kinds follow the values when compiled in
