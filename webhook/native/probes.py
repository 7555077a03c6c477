"""Probes of enforcement: for each generated policy, an object it must act on, to dry-run against the apiserver.

The apiserver stores a policy at once and enforces it a moment later (each policy is compiled on its own, some in
seconds), so ``admission-policies --apply`` waits until every policy acts on its probe (``webhook.cli.policies``).
A probe is chosen, never hand-written per rule: small candidate objects (a GPU pod with half a GPU, one that is
privileged, one whose accelerator annotation and selector disagree, ...) are put to the webhook's own decision
(``webhook.rules.admission.decide``) in the probe's namespace, and the first that breaks one of the policy's rules
(its ``gpu-webhook.io/rules`` annotation) with the policy's action (deny, or warn for a ``-warn`` policy) is the
policy's probe. Pods for the policies of Pods and workloads; an object of each custom kind the apiserver serves for
the custom kinds' policies (its template paths filled with the candidate pod template); ResourceClaims for the
claims' policies. For the MutatingAdmissionPolicy, the first candidate pod the webhook's own mutation changes
(nodeSelector, tolerations, runtimeClassName, env): the answer must hold those changes.

A policy no candidate breaks under the policy (every rule of it off, or only caught by the apiserver's own
validation on CREATE, as the seed's pod-level GPU rule is) has no probe: the caller says so and does not wait.
Nothing here does I/O.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.core.kinds import CustomKind
from webhook.core.podspecs import group_of
from webhook.core.policy import Policy, PolicySet
from webhook.core.resources import CDI_PREFIXES
from webhook.native.generate import NAME, RULES_ANNOTATION, Generated, settings
from webhook.rules import admission
from webhook.rules.mutate import mutated_pod

PROBE_NAME = "gpu-webhook-enforcement-probe"
# What a served custom kind is created as: (apiVersion, kind), or None when the apiserver does not serve it.
Resolver = Callable[[CustomKind], "tuple[str, str] | None"]
# The fields the MutatingAdmissionPolicy writes (webhook.native.mutations).
MUTATED = ("nodeSelector", "tolerations", "runtimeClassName")


@dataclass
class Probe:
    """Objects to dry-run create in ``namespace``, and what must be seen: ``policy`` refusing one (deny) or warning
    about it (warn), or (mutate) the answer holding ``expect`` (fields of the pod spec, and env per container).
    ``tries`` are the candidates that qualify, in order, each with the rule it breaks: the caller moves to the next
    when something else refuses one first (RBAC, the apiserver's own validation, a CRD's schema). ``refusers`` are,
    per candidate, the generated policies whose rules the webhook's own decision (no cluster view) finds it
    breaking with deny: another of those may refuse it first while this one compiles; one not among them refuses it
    for what the decision cannot see (the cluster's facts), and will again."""

    policy: str
    action: str  # deny | warn | mutate
    namespace: str
    tries: list[tuple[dict[str, Any], str]]
    expect: dict[str, Any] = field(default_factory=dict)
    at: int = 0  # the candidate in use
    passed: list[str] = field(default_factory=list)  # why earlier candidates were given up
    refusers: list[frozenset[str]] = field(default_factory=list)  # per candidate (none known: any)

    @property
    def obj(self) -> dict[str, Any]:
        return self.tries[self.at][0]

    @property
    def rule(self) -> str:
        return self.tries[self.at][1]

    def give_up(self, why: str) -> bool:
        """Move to the next candidate; False when none is left."""
        self.passed.append(f"{self.obj['kind']} ({self.rule}): {why}")
        self.at += 1
        return self.at < len(self.tries)

    @property
    def path(self) -> str:
        """The collection to POST to (``?dryRun=All`` added by the caller)."""
        api_version, kind = self.obj["apiVersion"], self.obj["kind"]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        return f"{base}/namespaces/{self.namespace}/{plural(kind)}"


def plural(kind: str) -> str:
    return {"ResourceClaim": "resourceclaims"}.get(kind, kind.lower() + "s")


# --- candidates ---------------------------------------------------------------------------------------------------


def _container(name: str, limits: Mapping[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause:3.10"}
    if limits:
        c["resources"] = {"limits": dict(limits)}
    c.update(extra)
    return c


def candidates(policy: Policy) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """(what, pod spec, annotations): small pods each breaking one GPU rule or two, in the order they are tried."""
    gpu = next((r for r in policy.resources if "*" not in r), "nvidia.com/gpu")
    one = {gpu: "1"}
    over = str(max(policy.per_container, policy.per_pod, 8) + 1)
    allowed = set(policy.allowed)
    outside = next(f"gpu-webhook-probe-{i}" for i in range(100) if f"gpu-webhook-probe-{i}" not in allowed)
    other = next(f"gpu-webhook-probe-{i}" for i in range(100, 200) if f"gpu-webhook-probe-{i}" not in allowed)
    out: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("a GPU pod", {"containers": [_container("c", one)]}, {}),
        ("half a GPU", {"containers": [_container("c", {gpu: "0.5"})]}, {}),
        ("accelerators that disagree", {"containers": [_container("c", one)],
                                         "nodeSelector": {policy.node_label: other}}, {policy.annotation: outside}),
        ("an accelerator outside the allowed list", {"containers": [_container("c", one)],
                                                     "nodeSelector": {policy.node_label: outside}}, {}),
        ("GPUs over the caps", {"containers": [_container("c", {gpu: over}), _container("d", {gpu: over})]}, {}),
        ("a privileged GPU container", {"containers": [_container("c", one,
                                                                  securityContext={"privileged": True})]}, {}),
        ("a GPU pod in the host PID namespace", {"hostPID": True, "containers": [_container("c", one)]}, {}),
        ("a GPU device mounted from the host", {
            "containers": [_container("c", one, volumeMounts=[{"name": "dev", "mountPath": "/dev/nvidia0"}])],
            "volumes": [{"name": "dev", "hostPath": {"path": "/dev/nvidia0"}}]}, {}),
        ("NVIDIA_VISIBLE_DEVICES without a GPU", {"containers": [_container(
            "c", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])]}, {}),
        ("a GPU and a MIG slice", {"containers": [_container("c", {**one, "nvidia.com/mig-1g.5gb": "1"})]}, {}),
        ("a GPU init container", {"initContainers": [_container("i", one)], "containers": [_container("c")]}, {}),
        ("a zero GPU limit", {"containers": [_container("c", {gpu: "0"})]}, {}),
        ("a GPU pod with spec.nodeName", {"nodeName": "gpu-webhook-probe", "containers": [_container("c", one)]}, {}),
        ("a CPU pod on GPU nodes", {"containers": [_container("c", {"cpu": "100m"})],
                                    "nodeSelector": {policy.node_label: outside}}, {}),
        ("a CDI device annotation", {"containers": [_container("c")]},
         {f"{CDI_PREFIXES[0]}gpu-webhook-probe": "nvidia.com/gpu=0"}),
        # Last: an apiserver without DynamicResourceAllocation (1.30's default) drops resources.claims, and the
        # policy then has nothing to refuse.
        ("a claim the pod does not declare", {"containers": [_container("c", one, resources={
            "limits": one, "claims": [{"name": "undeclared"}]})]}, {}),
    ]
    return out


def _pod(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": PROBE_NAME}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(dict(spec))}


def _at(path: str, template: dict[str, Any]) -> dict[str, Any]:
    """An object holding ``template`` at a template path of the registry of kinds (``a.b``, ``*`` for any key of a
    map, ``x[*]`` for any item of a list)."""
    value: Any = template
    for part in reversed(path.split(".")):
        if part == "*":
            value = {"probe": value}
        elif part.endswith("[*]"):
            value = {part[:-3]: [value]}
        else:
            value = {part: value}
    return value


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _custom(kind: CustomKind, api_version: str, kind_name: str, spec: Mapping[str, Any],
            annotations: Mapping[str, str]) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": copy.deepcopy(dict(spec))}
    if annotations:
        template["metadata"] = {"annotations": dict(annotations)}
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind_name, "metadata": {"name": PROBE_NAME}}
    for path in kind.templates:
        _merge(obj, _at(path, template))
    return obj


def _claims(policy: Policy, namespace: str) -> list[dict[str, Any]]:
    def claim(**request: Any) -> dict[str, Any]:
        body = {"name": "gpu", "exactly": {"deviceClassName": policy.gpu_classes[0] if policy.gpu_classes
                                           else "gpu.nvidia.com", **request}}
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": PROBE_NAME},
                "spec": {"devices": {"requests": [body]}}}

    return [claim(allocationMode="All"), claim(adminAccess=True), claim(count=64),
            claim(tolerations=[{"operator": "Exists"}])]


# --- choosing ---------------------------------------------------------------------------------------------------


def family(name: str) -> str:
    """builtin, custom or claims, by the generator's names."""
    for suffix in ("custom", "claims"):
        if name.startswith(f"{NAME}-{suffix}-"):
            return suffix
    return "builtin"


def action(name: str) -> str:
    return "warn" if re.search(r"-warn(-\d+)?$", name) else "deny"


def _judged(policies: PolicySet, obj: Mapping[str, Any], namespace: str) -> list[tuple[str, str]]:
    """(rule, action) of every violation the webhook's decision on ``obj`` finds, in order."""
    verdict = admission.decide(obj, group_of(str(obj["apiVersion"])), str(obj["kind"]), namespace, policies)
    return [(str(violation.rule), taken) for violation, taken in verdict.judged()]


def _acts(judged: Sequence[tuple[str, str]], rules: set[str], wanted: str) -> str | None:
    """The first of ``rules`` judged with action ``wanted``, or None."""
    return next((rule for rule, taken in judged if rule in rules and taken == wanted), None)


def mutation_expected(pod: Mapping[str, Any], policy: Policy, namespace: str) -> dict[str, Any]:
    """The fields of the pod spec (and each container's env) the webhook's mutation changes: what the
    MutatingAdmissionPolicy must change too."""
    after = mutated_pod(pod, policy, None, namespace)["spec"]
    before = pod["spec"]
    expect = {k: after[k] for k in MUTATED if k in after and after.get(k) != before.get(k)}
    envs = {c["name"]: c.get("env") for c in after.get("containers", [])
            if c.get("env") != next((b.get("env") for b in before["containers"] if b["name"] == c["name"]), None)}
    if envs:
        expect["env"] = envs
    return expect


def probes(generated: Generated, policies: PolicySet, namespace: str,
           resolve: Resolver | None = None) -> tuple[list[Probe], dict[str, str]]:
    """A probe per generated policy, and {policy: why it has none}. ``resolve`` says how the apiserver serves a
    custom kind (None: not served, and the custom kinds' policies get no probe)."""
    policy = policies.for_namespace(namespace)
    pods = [_pod(spec, annotations) for _, spec, annotations in candidates(policy)]
    custom_kinds, _ = settings(policies)
    served: list[tuple[CustomKind, str, str]] = []
    if resolve is not None:
        for kind in custom_kinds:
            if kind.templates and (how := resolve(kind)) is not None:
                served.append((kind, *how))
    found: list[Probe] = []
    missing: dict[str, str] = {}
    deny_rules = {str(o["metadata"]["name"]): set(str(o["metadata"]["annotations"][RULES_ANNOTATION]).split(","))
                  for o in generated.objects
                  if o["kind"] == "ValidatingAdmissionPolicy" and action(str(o["metadata"]["name"])) == "deny"}
    judged: dict[str, list[tuple[str, str]]] = {}

    def judge(candidate: dict[str, Any]) -> list[tuple[str, str]]:
        key = json.dumps(candidate, sort_keys=True)  # the custom kinds' candidates are built per policy
        if key not in judged:
            judged[key] = _judged(policies, candidate, namespace)
        return judged[key]

    def refusers(candidate: dict[str, Any]) -> frozenset[str]:
        return frozenset(name for name, rules in deny_rules.items() if _acts(judge(candidate), rules, "deny"))

    for obj in generated.objects:
        name = str(obj["metadata"]["name"])
        if obj["kind"] == "MutatingAdmissionPolicy":
            # A pod the policies admit (a refusal hides the mutation), and one the mutation changes; the
            # expectation is the first's (each candidate is judged alone, so each carries its own).
            changed = [(pod, mutation_expected(pod, policy, namespace)) for pod in pods
                       if admission.decide(pod, "", "Pod", namespace, policies).allowed]
            changed = [(pod, expect) for pod, expect in changed if expect]
            if changed:
                found.append(Probe(name, "mutate", namespace, [(changed[0][0], "")], expect=changed[0][1]))
            else:
                missing[name] = "no GPU pod it changes under this policy"
            continue
        if obj["kind"] != "ValidatingAdmissionPolicy":
            continue
        rules = set(str(obj["metadata"]["annotations"][RULES_ANNOTATION]).split(","))
        wanted, kin = action(name), family(name)
        tries: Sequence[dict[str, Any]]
        if kin == "builtin":
            tries = pods
        elif kin == "custom":
            tries = [_custom(kind, api_version, kind_name, spec, annotations)
                     for kind, api_version, kind_name in served for _, spec, annotations in candidates(policy)]
        else:
            tries = _claims(policy, namespace)
        qualified = []
        for candidate in tries:
            rule = _acts(judge(candidate), rules, wanted)
            if rule is not None:
                qualified.append((candidate, rule))
        if qualified:
            found.append(Probe(name, wanted, namespace, qualified, refusers=[refusers(c) for c, _ in qualified]))
        else:
            missing[name] = ("no custom kind of the policy is served" if kin == "custom" and not served
                             else f"no candidate object breaks its rules with action {wanted} in {namespace}")
    return found, missing


def refusing_policy(message: str) -> str | None:
    """The ValidatingAdmissionPolicy an apiserver's refusal names (``ValidatingAdmissionPolicy 'name' with binding
    …``), if any."""
    said = "ValidatingAdmissionPolicy '"
    return message.split(said, 1)[1].split("'", 1)[0] if said in message else None


def outcome(probe: Probe, status: int, answer: Mapping[str, Any], warnings: Sequence[str]) -> str:
    """``enforced``, ``waiting`` (the policy did not act yet) or ``inconclusive: why`` (the object was refused by
    something else: RBAC, the apiserver's own validation, another policy), from a dry-run's answer."""
    said = f"ValidatingAdmissionPolicy '{probe.policy}'"
    message = str(answer.get("message", "")) if status >= 300 else ""
    if probe.action == "deny":
        if said in message:
            return "enforced"
    elif probe.action == "warn":
        if any(said in w for w in warnings):
            return "enforced"
    elif status < 300:
        return "enforced" if holds(probe.expect, answer) else "waiting"
    if status < 300:
        if probe.rule == "undeclared-claim" and probe.obj["kind"] == "Pod" and not _claims_kept(answer):
            # An apiserver without DynamicResourceAllocation (1.30's default) drops a Pod's resources.claims: this
            # candidate can never be refused there. (A custom kind keeps what it was given.)
            return "inconclusive: the apiserver dropped the containers' resources.claims (no DynamicResourceAllocation)"
        return "waiting"
    if "ValidatingAdmissionPolicy '" in message and probe.action == "warn" and status in (400, 403, 422):
        # a deny policy refused it first: the warn policy's warning comes only on admission
        return "inconclusive: " + message[:200]
    refused_by = refusing_policy(message)
    if refused_by is not None and probe.action == "deny" and probe.refusers and \
            refused_by not in probe.refusers[probe.at]:
        # Refused by another of ours for what the webhook's rules alone do not find here (the cluster's facts,
        # which such a policy reads): it will be again, whatever the order the apiserver asks them in.
        return "inconclusive: " + message[:200]
    if refused_by is not None or 'admission webhook "' in message:
        return "waiting" if probe.action == "deny" else "inconclusive: " + message[:200]
    return "inconclusive: " + " ".join(message.split())[:200]


def _claims_kept(answer: Mapping[str, Any]) -> bool:
    """Whether the pod the apiserver answered still names a claim in a container's resources."""
    containers = (answer.get("spec") or {}).get("containers") or []
    return any((c.get("resources") or {}).get("claims") for c in containers if isinstance(c, Mapping))


def holds(expect: Mapping[str, Any], answer: Mapping[str, Any]) -> bool:
    """Whether the pod the apiserver answered holds the expected mutation (the apiserver may add tolerations of
    its own; env may hold more)."""
    spec = answer.get("spec") or {}
    for key, value in expect.items():
        if key == "tolerations":
            if not all(t in (spec.get("tolerations") or []) for t in value):
                return False
        elif key == "nodeSelector":
            if not all((spec.get("nodeSelector") or {}).get(k) == v for k, v in value.items()):
                return False
        elif key == "env":
            containers = {c.get("name"): c for c in spec.get("containers") or []}
            for container, env in value.items():
                have = (containers.get(container) or {}).get("env") or []
                if not all(e in have for e in env or []):
                    return False
        elif spec.get(key) != value:
            return False
    return True
