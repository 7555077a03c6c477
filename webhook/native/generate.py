"""The admission policies of one gpu-webhook policy: ValidatingAdmissionPolicies, a MutatingAdmissionPolicy
and their bindings (``admissionregistration.k8s.io/v1``, Kubernetes 1.36), ready for ``kubectl apply -f -``.

Few objects, few bindings (every binding is one more evaluation of its policy per request):

- ``gpu-webhook-deny`` holds every rule whose setting is ``deny`` in some namespace. One validation whose
  message lists every violation with its field path, as the webhook's denial does (only the first denying
  validation of all policies reaches the user, and a message is one line of at most 5 KiB). Bound with
  ``[Deny]``, and with ``[Warn]`` in the namespaces whose ``enforcement`` is ``warn`` (a namespaceSelector on
  ``kubernetes.io/metadata.name``).
- ``gpu-webhook-warn`` holds the rules whose setting is ``warn`` somewhere; one validation per rule, bound
  with ``[Warn]``.
- ``gpu-webhook`` (a MutatingAdmissionPolicy) patches new Pods: accelerator selector, GPU tolerations,
  ``hideGpus``, ``runtimeClass``.

Values that differ by namespace are CEL literals chosen by ``request.namespace``; settings that are ``off``
in a namespace leave its violations out. On UPDATE a violation the old object already had (same rule, same
place with list items by name, same value) is not held against the update, as in the webhook.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from webhook.core.policy import PolicySet
from webhook.native import claims, kinds, mutations, pods
from webhook.native.celtext import boolean, join_lists, lit
from webhook.native.rules import BUILDERS, Builder, native_rules, setting, webhook_rules
from webhook.native.snippets import Ctx

API = "admissionregistration.k8s.io/v1"
NAME = "gpu-webhook"
RULES_ANNOTATION = "gpu-webhook.io/rules"
LABELS = {"app.kubernetes.io/name": "gpu-webhook", "app.kubernetes.io/component": "admission-policies"}
DEFAULT_EXCLUDED = ("kube-system", "kube-node-lease")
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
OPERATIONS = ["CREATE", "UPDATE"]
# The message a denial falls back to when the list does not fit in 5 KiB (or any messageExpression fails).
FALLBACK = "GPU violations; gpu-webhook check lists them all"
MESSAGE_BYTES = 5000


@dataclass
class Generated:
    """The objects, and what stays with the webhook (rule or feature, why) for stderr."""

    objects: list[dict[str, Any]]
    webhook_only: list[tuple[str, str]] = field(default_factory=list)
    native: list[str] = field(default_factory=list)


def _variable(rule: str) -> str:
    return "v_" + re.sub(r"[^A-Za-z0-9]", "_", rule)


def _gated(ctx: Ctx, builder: Builder, action: str, custom: bool) -> str:
    """The rule's violations where its setting is ``action``: pod templates or claims, by the request's kind."""
    gate = ctx.ns(lambda p: boolean(setting(p, builder.rule) == action))
    if gate == "false":
        return "[]"
    pod_part = builder.pods(ctx) if builder.pods else "[]"
    if builder.custom_only and pod_part != "[]":
        pod_part = f"(variables.custom ? {pod_part} : [])" if custom else "[]"
    claim_part = builder.claims(ctx) if builder.claims else "[]"
    if pod_part == "[]" and claim_part == "[]":
        return "[]"
    if pod_part == "[]":
        body = f"(variables.dra ? {claim_part} : [])"
    elif claim_part == "[]":
        body = f"(variables.dra ? [] : {pod_part})"
    else:
        body = f"(variables.dra ? {claim_part} : {pod_part})"
    return body if gate == "true" else f"({gate} ? {body} : [])"


def _rule_variables(ctx: Ctx, action: str, custom: bool) -> list[tuple[str, str, str]]:
    """(rule, variable name, expression) of every native rule that is ``action`` in some namespace."""
    out = []
    for rule in native_rules():
        text = _gated(ctx, BUILDERS[rule.id], action, custom)
        if text != "[]":
            out.append((rule.id, _variable(rule.id), text))
    return out


def _shared_variables(ctx: Ctx, custom_kinds: Sequence[kinds.CustomKind]) -> list[tuple[str, str]]:
    templates = kinds.dispatch("R", custom_kinds)
    return [*pods.variables(ctx, templates), ("dreq", claims.requests(ctx))]


def _message(found: str) -> str:
    """``admission.describe``: "N GPU violation(s): path: message; …", cut to fit the apiserver's 5 KiB."""
    text = (f"string(size({found})) + ' GPU violation' + (size({found}) == 1 ? '' : 's') + ': ' + "
            f"{found}.map(x, x.m).join('; ')")
    return (f"[{text}].map(s, size(bytes(s)) <= {MESSAGE_BYTES} ? s : s.substring(0, 1000) + ' … (' + "
            f"string(size({found})) + ' violations in all; gpu-webhook check lists them)')[0]")


def _excused(found: str) -> str:
    """Violations of the object (``o`` 0) in ``found`` that the old object of an UPDATE (``o`` 1) did not have."""
    return f"{found}.filter(x, x.o == 0 && !(x.k in variables.old_keys))"


def _validating_policy(name: str, policies: PolicySet, action: str, custom_kinds: Sequence[kinds.CustomKind],
                       exclude: Sequence[str]) -> tuple[dict[str, Any], list[str]] | None:
    ctx = Ctx(policies)
    current = _rule_variables(ctx, action, bool(custom_kinds))
    if not current:
        return None
    every = join_lists([f"variables.{var}" for _, var, _ in current])
    variables = [
        ("dra", "request.kind.group == 'resource.k8s.io'"),
        ("kindkey", kinds.KIND_KEY),
        ("resourcekey", kinds.RESOURCE_KEY),
        ("custom", kinds.is_custom(custom_kinds)),
        *_shared_variables(ctx, custom_kinds),
        *[(var, text) for _, var, text in current],
        # On UPDATE the old object's violations (o == 1) excuse the same ones in the object.
        ("old_keys", f"({every}).filter(x, x.o == 1).map(x, x.k)"),
    ]
    rules = [rule for rule, _, _ in current]
    if action == "deny":
        variables.append(("found", _excused(f"({every})")))
        validations = [{
            "expression": "size(variables.found) == 0",
            "messageExpression": _message("variables.found"),
            "message": FALLBACK,
            "reason": "Forbidden",
        }]
    else:
        validations = [{
            "expression": f"size({_excused(f'variables.{var}')}) == 0",
            "messageExpression": _message(_excused(f"variables.{var}")),
            "message": f"{rule}: {FALLBACK}",
        } for rule, var, _ in current]
    policy = {
        "apiVersion": API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(name, rules),
        "spec": {
            # A deny policy that cannot evaluate refuses, as the webhook's failurePolicy Fail does; warnings never
            # stop an object.
            "failurePolicy": "Fail" if action == "deny" else "Ignore",
            "matchConstraints": _match_constraints(custom_kinds, exclude),
            "matchConditions": [{"name": "may-concern-gpus", "expression": pods.matters(ctx, rules)}],
            "variables": [{"name": n, "expression": e} for n, e in variables],
            "validations": validations,
        },
    }
    return policy, rules


def _resource_rules(custom_kinds: Sequence[kinds.CustomKind], operations: list[str]) -> list[dict[str, Any]]:
    by_group: dict[str, list[str]] = {}
    for group, _, plural, _ in kinds.BUILTIN_KINDS:
        by_group.setdefault(group, []).append(plural)
    rules = [{"apiGroups": [g], "apiVersions": ["v1"], "operations": operations, "resources": r, "scope": "Namespaced"}
             for g, r in by_group.items()]
    rules.append({"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": operations,
                  "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "Namespaced"})
    for k in custom_kinds:
        rules.append({"apiGroups": [k.group], "apiVersions": [k.version], "operations": operations,
                      "resources": [k.resource], "scope": "Namespaced"})
    return rules


def _excluded(exclude: Sequence[str]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "NotIn", "values": list(exclude)}]}


def _match_constraints(custom_kinds: Sequence[kinds.CustomKind], exclude: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"matchPolicy": "Equivalent", "resourceRules": _resource_rules(custom_kinds, OPERATIONS)}
    if exclude:
        out["namespaceSelector"] = _excluded(exclude)
    return out


def _metadata(name: str, rules: Sequence[str]) -> dict[str, Any]:
    return {"name": name, "labels": dict(LABELS), "annotations": {RULES_ANNOTATION: ",".join(rules)}}


def _bindings(policy: str, rules: Sequence[str], policies: PolicySet, deny: bool) -> list[dict[str, Any]]:
    """``[Deny]`` (or ``[Warn]``) where ``enforcement`` says so; a warn policy warns everywhere."""
    def binding(name: str, actions: list[str], selector: dict[str, Any] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"policyName": policy, "validationActions": actions}
        if selector is not None:
            spec["matchResources"] = {"namespaceSelector": selector}
        return {"apiVersion": API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": _metadata(name, rules),
                "spec": spec}

    if not deny:
        return [binding(policy, ["Warn"], None)]
    default = policies.default.enforcement
    others = sorted(ns for ns, p in policies.by_namespace.items() if p.enforcement != default)
    action = {"deny": ["Deny"], "warn": ["Warn"]}
    if not others:
        return [binding(policy, action[default], None)]
    other = "warn" if default == "deny" else "deny"
    return [
        binding(policy, action[default],
                {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "NotIn", "values": others}]}),
        binding(f"{policy}-{other}", action[other],
                {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "In", "values": others}]}),
    ]


def _mutating_policy(policies: PolicySet, exclude: Sequence[str]) -> list[dict[str, Any]]:
    ctx = Ctx(policies)
    patches = [(name, build(ctx)) for name, build in mutations.MUTATIONS.items()]
    patches = [(name, text) for name, text in patches if text is not None]
    if not patches:
        return []
    variables = [("roots", "[object]"), *pods.variables(ctx, kinds.pod_template("R"), with_roots=False),
                 ("used", mutations.used(ctx))]
    constraints: dict[str, Any] = {
        "matchPolicy": "Equivalent",
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                           "scope": "Namespaced"}],
    }
    if exclude:
        constraints["namespaceSelector"] = _excluded(exclude)
    names = [name for name, _ in patches]
    policy = {
        "apiVersion": API,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": NAME, "labels": dict(LABELS), "annotations": {RULES_ANNOTATION: ",".join(names)}},
        "spec": {
            # /mutate never denies: a mutation that cannot evaluate leaves the pod as it is.
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": constraints,
            "matchConditions": [{"name": "may-concern-gpus", "expression": mutations.matters(ctx)}],
            "variables": [{"name": n, "expression": e} for n, e in variables],
            # One expression: every mutation of a policy evaluates its variables afresh, and these four add disjoint
            # fields (nodeSelector, tolerations, env, runtimeClassName) from the same pod.
            "mutations": [{"patchType": "JSONPatch",
                           "jsonPatch": {"expression": " + ".join(f"({text})" for _, text in patches)}}],
        },
    }
    binding = {"apiVersion": API, "kind": "MutatingAdmissionPolicyBinding",
               "metadata": {"name": NAME, "labels": dict(LABELS), "annotations": {RULES_ANNOTATION: ",".join(names)}},
               "spec": {"policyName": NAME}}
    return [policy, binding]


def settings(policies: PolicySet) -> tuple[list[kinds.CustomKind], list[str]]:
    """The custom kinds and the excluded namespaces of ``nativePolicies`` (defaults where unset)."""
    document: Mapping[str, Any] = policies.document
    native = document.get("nativePolicies") or {}
    exclude = list(native.get("excludeNamespaces", DEFAULT_EXCLUDED))
    return kinds.custom_kinds(document), exclude


def generate(policies: PolicySet) -> Generated:
    custom_kinds, exclude = settings(policies)
    objects: list[dict[str, Any]] = []
    native: list[str] = []
    for action in ("deny", "warn"):
        built = _validating_policy(f"{NAME}-{action}", policies, action, custom_kinds, exclude)
        if built is None:
            continue
        policy, rules = built
        objects.append(policy)
        objects.extend(_bindings(policy["metadata"]["name"], rules, policies, action == "deny"))
        native.extend(r for r in rules if r not in native)
    objects.extend(_mutating_policy(policies, exclude))
    return Generated(objects, _left_to_webhook(policies), native)


def _left_to_webhook(policies: PolicySet) -> list[tuple[str, str]]:
    out = [(rule.id, rule.why) for rule in webhook_rules()]
    if policies.default.cluster_enabled and any(p.runtime_class for p in [policies.default,
                                                                          *policies.by_namespace.values()]):
        out.append(("mutation: isolation.runtimeClass",
                    "with cluster.enabled the webhook injects it only when the RuntimeClass exists and agrees with "
                    "the pod's selector, which CEL cannot read"))
    out.append(("mutation: requests from limits",
                "the apiserver copies Pod limits into missing requests before admission; the webhook does not "
                "mutate custom resources either"))
    out.append(("pod templates in other kinds",
                "CEL cannot walk an unknown object; add the kind with nativePolicies.customKinds"))
    out.append(("audit, policy reports, gpu-webhook check", "they run the webhook's own rules"))
    return out


class _Dumper(yaml.SafeDumper):
    pass


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """A multi-document YAML stream (one document per object)."""
    # No folding: an expression stays on one line, as written.
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=2**31, default_flow_style=False)


__all__ = ["Generated", "generate", "lit", "to_yaml"]
