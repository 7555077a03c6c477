"""The admission policies of one gpu-webhook policy for one target cluster: ValidatingAdmissionPolicies, a
MutatingAdmissionPolicy where the cluster serves one, and their bindings, ready for ``kubectl apply -f -``.

Policies by kind family, so each request pays only for its own (every binding is one more evaluation of its
policy for the requests it matches):

- ``gpu-webhook-deny``, ``gpu-webhook-warn``: Pods and the built-in workloads. The apiserver decoded them
  into their types, so the CEL reads fields without type checks, and a ``matchConditions`` skips a template
  that has nothing the rules read (every CPU pod);
- ``gpu-webhook-custom-deny``, ``gpu-webhook-custom-warn``: the custom kinds whose pod templates the
  generator knows (``webhook.native.kinds``), read with a type check at every step;
- ``gpu-webhook-claims-deny``, ``gpu-webhook-claims-warn``: ResourceClaims and ResourceClaimTemplates
  (``resource.k8s.io/v1``, Kubernetes 1.34+).

Those are the names of ``nativePolicies.params: inline``, where the policy's values are written into the CEL. Read
live (the default), each family's policies are ``…-seed-deny`` (the hard rules, no params) and ``…-live-deny``,
``…-live-warn`` (every other rule, reading GPUPolicy/default through params), each cut into ``-2``, ``-3``… to stay
within :data:`MAX_BYTES`, and the MutatingAdmissionPolicy is ``gpu-webhook-live``.

A deny policy holds every rule whose setting is ``deny`` in some namespace, in one validation whose message
lists every violation with its field path, as the webhook's denial does (only the first denying validation
reaches the user). It is bound with ``[Deny]``, and with ``[Warn]`` in the namespaces whose ``enforcement``
is ``warn``. A warn policy has one validation per rule, bound with ``[Warn]``.

Each rule's CEL is written once, in ``<rule>_hits``: its violations in the object and, on UPDATE, in the old one
(``findings.hits``), built only for the items that violate it. ``<rule>`` says whether the object has one (its
setting in the namespace first); ``<rule>_found`` gives the words of those the old object did not have (a violation
the old object had too is not held against it), read only by the messages. The apiserver evaluates every
``messageExpression`` whether its validation failed or not, so each message starts with the cheap test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from webhook import __version__
from webhook.core import gpupolicy
from webhook.core.policy import PolicySet
from webhook.core.policycrd import as_spec
from webhook.native import celtext, claims, cluster, kinds, mutations, params, reads, tenants
from webhook.native.celtext import boolean, every_policy, layout, lit
from webhook.native.findings import OLD_ROOTS, SEPARATOR, Dialect, Finding, hits, joined, new_words, variable
from webhook.native.rules import BUILDERS, matters, native_rules, setting, webhook_rules
from webhook.native.snippets import Ctx, Shape
from webhook.native.target import DEFAULT, LIBRARIES, Target, every_version

NAME = "gpu-webhook"
RULES_ANNOTATION = "gpu-webhook.io/rules"
TARGET_ANNOTATION = "gpu-webhook.io/kubernetes"
VERSION_ANNOTATION = "gpu-webhook.io/generator-version"  # the gpu-webhook release that generated the object
# Live: the digest of the policy's keys compiled into the CEL (webhook.native.params.compiled_digest).
COMPILED_ANNOTATION = "gpu-webhook.io/compiled-keys"
# How a policy is generated: the values written in (INLINE); read through params (LIVE); the seed's hard rules,
# without params (SEED).
INLINE, LIVE, SEED = "inline", "live", "seed"
LABELS = {"app.kubernetes.io/name": "gpu-webhook", "app.kubernetes.io/component": "admission-policies"}
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
OPERATIONS = ["CREATE", "UPDATE"]
# The message a denial falls back to when the list does not fit in 5 KiB (or any messageExpression fails).
FALLBACK = "GPU violations; gpu-webhook check lists them all"
MESSAGE_BYTES = 5000
# The most an object may hold as JSON: a client-side kubectl apply, or a GitOps tool's default sync, stores the whole
# object in an annotation of at most 256 KiB; half of it leaves room for what those tools add.
MAX_BYTES = 128 * 1000


@dataclass
class Generated:
    """The objects for a target, and what stays with the webhook there (rule or feature, why), for stderr."""

    objects: list[dict[str, Any]]
    target: Target = DEFAULT
    webhook_only: list[tuple[str, str]] = field(default_factory=list)
    native: list[str] = field(default_factory=list)
    # live: GPUPolicy/default holding the policy as written, which the objects read through params
    policy_object: dict[str, Any] | None = None


@dataclass(frozen=True)
class Family:
    """Policies for one family of kinds."""

    suffix: str  # "", "custom-", "claims-"
    typed: bool
    root: str  # the variable the findings start from
    what: str  # for the docs and stderr


BUILTIN = Family("", True, "templates", "Pods and built-in workloads")
CUSTOM = Family("custom-", False, "templates", "custom kinds")
CLAIMS = Family("claims-", True, "requests", "ResourceClaims and ResourceClaimTemplates")
# resource.k8s.io/v1 (DRA GA) is served from this minor.
DRA_MINOR = 34


def _ctx(policies: PolicySet, target: Target, typed: bool, live: bool = False) -> Ctx:
    return Ctx(policies, Shape(typed), target.has("two-variable comprehensions"), target.has("lists"), live)


def live(policies: PolicySet) -> bool:
    """``nativePolicies.params``: live (the default) reads GPUPolicy/default through params; inline writes the
    policy's values into the CEL."""
    return (policies.document.get("nativePolicies") or {}).get("params", "live") == "live"


def _findings(ctx: Ctx, family: Family, rule: str) -> list[Finding]:
    builder = BUILDERS[rule]
    build = builder.claims if family is CLAIMS else builder.pods
    if build is None or (family is BUILTIN and builder.custom_only):
        return []
    return build(ctx)


def _gate(ctx: Ctx, rule: str, action: str) -> str:
    return ctx.ns(lambda p: boolean(setting(p, rule) == action), live=params.gate(rule, action))


@dataclass
class RuleCel:
    rule: str
    name: str  # its variable
    gate: str  # the rule is on (``true``: always)
    hits: str  # its violations in the object, then in an UPDATE's old object: a list of two (findings.hits)


def _rules(ctx: Ctx, family: Family, action: str, target: Target, only: Sequence[str] | None = None,
           skip: Sequence[str] = ()) -> list[RuleCel]:
    out = []
    dialect = Dialect(two_variable=ctx.two_variable)
    for rule in native_rules():
        if target.lacks(BUILDERS[rule.id].needs) or rule.id in skip or (only is not None and rule.id not in only):
            continue
        gate, soften = tenants.gate(ctx, rule, action, _gate)
        if gate == "false":
            continue
        findings = soften(_findings(ctx, family, rule.id)) if family is not CLAIMS else _findings(ctx, family, rule.id)
        if not findings:
            continue
        root = findings[0].loops[0].over
        every = joined("[" + ", ".join(hits(f, dialect, "pods") for f in findings) + "]") if len(findings) > 1 \
            else hits(findings[0], dialect, "pods")
        out.append(RuleCel(rule.id, variable(rule.id), gate, f"[{root}, {OLD_ROOTS[root]}].map(pods, {every})"))
    return out


def _describe(found: str) -> str:
    """``admission.describe`` of the separator-joined ``found``: "N GPU violation(s): path: message; …", cut to
    fit the apiserver's 5 KiB."""
    text = "string(size(hits)) + ' GPU violation' + (size(hits) == 1 ? '' : 's') + ': ' + hits.join('; ')"
    fitted = (f"size(bytes(message)) <= {MESSAGE_BYTES} ? message : message.substring(0, 1000) + ' … (' + "
              f"string(size(hits)) + ' violations in all; gpu-webhook check lists them)'")
    return f"[{found}.split({lit(SEPARATOR)})].map(hits, [{text}].map(message, {fitted})[0])[0]"


def _template_variables(ctx: Ctx, family: Family, custom_kinds: Sequence[kinds.CustomKind],
                        texts: Sequence[str]) -> list[tuple[str, str]]:
    """Where the findings start: the object's pod templates as records (``templates``, with the facts the rules in
    ``texts`` read; ``old_templates`` for an UPDATE) and its resource names, classified once; or a claim's device
    requests."""
    if family is CLAIMS:
        return [("requests", claims.requests("object", ctx.two_variable)),
                ("old_requests", claims.requests("oldObject", ctx.two_variable))]
    out: list[tuple[str, str]] = []
    if family is CUSTOM:
        out.append(("group_resource", kinds.KIND))
    read = " ".join(texts)
    every = reads.template_facts(ctx, "pod.spec", "pod.meta")
    facts = {k: v for k, v in every.items() if re.search(rf"\bpod\.{k}\b", read)}
    if "holds" in facts:
        facts["fractional"] = "fractional"  # computed once, below
    fields = ", ".join([f"'{k}': dyn(pod.{k})" for k in ("path", "stable", "metaPath", "spec", "meta")]
                       + [f"'{k}': dyn({v})" for k, v in facts.items()])
    record_ = f"{{{fields}}}"
    if "holds" in facts:
        record_ = f"[{every['fractional']}].map(fractional, {record_})[0]"
    # The object's templates and, on UPDATE, the old object's, by one expression (index 0 and 1).
    roots = "(variables.update ? [object, oldObject] : [object])"
    found = (kinds.builtin_templates("obj") if family is BUILTIN
             else kinds.custom_templates("obj", custom_kinds, ctx.two_variable))
    out.append(("candidate_nodes", f"{roots}.map(obj, {found})"))
    out.append(("pod_specs", f"variables.candidate_nodes.map(candidates, candidates.filter(candidate, "
                             f"{kinds.is_node('candidate.node')}).map(candidate, {kinds.node_record('candidate')}))"))
    # Names are classified once, from the object (an old violation matters only when the object has it too).
    out.extend(reads.name_variables(ctx, "variables.pod_specs[0]"))
    if re.search(r"\bvariables\.gpu_taint_keys\b", read):
        # the old object's too: a rule whose key does not name the toleration (privileged-gpu) excuses an UPDATE
        # by the old object's reasons
        both = ("(size(variables.pod_specs) > 1 ? variables.pod_specs[0] + variables.pod_specs[1] : "
                "variables.pod_specs[0])")
        out.append(reads.taint_variable(ctx, both))
    out.append(("all_templates", f"variables.pod_specs.map(specs, specs.map(pod, {record_}))"))
    out.append(("templates", "variables.all_templates[0]"))
    out.append(("old_templates", "variables.update ? variables.all_templates[1] : []"))
    return out


def _validating_policies(name: str, policies: PolicySet, family: Family, action: str, target: Target,
                         custom_kinds: Sequence[kinds.CustomKind], exclude: Sequence[str], mode: str = INLINE
                         ) -> list[tuple[dict[str, Any], list[str]]]:
    """The policies of ``family`` holding the rules that are ``action`` somewhere. ``mode``: INLINE, every rule with
    the policy's values written in; LIVE, every rule but the seed's, reading the values through params; SEED, the
    seed's rules alone, without params. Live and seed, the rules go into as few policies as keep each within
    :data:`MAX_BYTES`, in the catalog's order: ``name``, then ``name-2``, ``name-3``."""
    ctx = _ctx(policies, target, family.typed, live=mode == LIVE)
    rules = _rules(ctx, family, action, target, only=params.SEED if mode == SEED else None,
                   skip=params.SEED if mode == LIVE else ())
    if not rules:
        return []

    def build(part: list[RuleCel]) -> dict[str, Any]:
        return _validating_policy(name, policies, family, action, ctx, target, custom_kinds, exclude, mode, part)

    weights = {id(r): len(r.hits) for r in rules}
    whole = build(rules)
    # Inline keeps the policies as they always were: one per family and action.
    if mode == INLINE or len(rules) == 1 or _laid_out_size(whole) <= MAX_BYTES:
        packed = [whole]
    else:
        # Bytes per character of a rule's CEL and the bytes every policy of the family holds, from the whole
        # family and its first rule alone; then as few parts as the estimate allows, as even as they can be (each
        # policy pays for the family's shared variables once more, so fewer is cheaper for the apiserver).
        first = _laid_out_size(build(rules[:1]))
        scale = (_laid_out_size(whole) - first) / max(1, sum(weights.values()) - weights[id(rules[0])])
        base = first - weights[id(rules[0])] * scale
        sizes = [weights[id(r)] for r in rules]
        count = len(_contiguous(sizes, max(max(sizes), int((MAX_BYTES - base) / scale))))
        for parts in range(count, len(rules) + 1):
            packed = [build(rules[a:b]) for a, b in _contiguous(sizes, _least_capacity(sizes, parts))]
            if all(_laid_out_size(policy) <= MAX_BYTES for policy in packed):
                break

    out = []
    for i, policy in enumerate(packed):
        if i:
            policy["metadata"]["name"] = f"{name}-{i + 1}"
        out.append((policy, policy["metadata"]["annotations"][RULES_ANNOTATION].split(",")))
    return out


def _contiguous(sizes: Sequence[int], capacity: int) -> list[tuple[int, int]]:
    """``sizes`` cut in order into runs (start, end) of at most ``capacity`` each (one item more when it alone is
    over): the fewest such runs."""
    runs, start, total = [], 0, 0
    for i, n in enumerate(sizes):
        if i > start and total + n > capacity:
            runs.append((start, i))
            start, total = i, 0
        total += n
    return runs + [(start, len(sizes))]


def _least_capacity(sizes: Sequence[int], count: int) -> int:
    """The least capacity that cuts ``sizes`` into at most ``count`` runs (the most even cut)."""
    low, high = max(sizes), sum(sizes)
    while low < high:
        middle = (low + high) // 2
        if len(_contiguous(sizes, middle)) <= count:
            high = middle
        else:
            low = middle + 1
    return low


def size(obj: Mapping[str, Any]) -> int:
    """An object's size as JSON, as kubectl's last-applied annotation stores it."""
    return len(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode())


def _laid_out_size(policy: Mapping[str, Any]) -> int:
    """``policy``'s size once its CEL is laid out on short lines, as it is written out."""
    return size(_laid_out(policy, celtext.layout))


def _validating_policy(name: str, policies: PolicySet, family: Family, action: str, ctx: Ctx, target: Target,
                       custom_kinds: Sequence[kinds.CustomKind], exclude: Sequence[str], mode: str,
                       rules: list[RuleCel]) -> dict[str, Any]:
    texts = [t for r in rules for t in (r.gate, r.hits)]
    variables = [("update", "request.operation == 'UPDATE'"), *_template_variables(ctx, family, custom_kinds, texts)]
    if mode == LIVE:
        variables[1:1] = params.variables([e for _, e in variables] + texts, policies.default.platform)
    # Each rule's hits, in the object and in an UPDATE's old object (read only when the rule is on); whether it has
    # one; and the words of those the old object did not have (a violation it had too is excused).
    for r in rules:
        variables.append((f"{r.name}_hits", r.hits))
    for r in rules:
        hit = f"variables.{r.name}_hits[0] != ''"
        variables.append((r.name, hit if r.gate == "true" else f"{r.gate} && {hit}"))
    for r in rules:
        old = f"(variables.update ? variables.{r.name}_hits[1] : '')"
        variables.append((f"{r.name}_found", new_words(f"variables.{r.name}_hits[0]", old)))
    if action == "deny":
        # Violations, and on UPDATE at least one the old object did not have.
        violated = " || ".join(f"variables.{r.name}" for r in rules)
        new = " || ".join(f"(variables.{r.name} && variables.{r.name}_found != '')" for r in rules)
        variables.append(("violated", f"({violated}) && (!variables.update || {new})"))
        every = joined("[" + ", ".join(f"(variables.{r.name} ? variables.{r.name}_found : '')" for r in rules) + "]")
        validations = [{
            "expression": "!variables.violated",
            "messageExpression": f"variables.violated ? string({_describe(every)}) : ''",
            "message": FALLBACK,
            "reason": "Forbidden",
        }]
    else:
        validations = [{
            "expression": f"!variables.{r.name} || (variables.update && variables.{r.name}_found == '')",
            "messageExpression": f"variables.{r.name} ? string({_describe(f'variables.{r.name}_found')}) : ''",
            "message": f"{r.rule}: {FALLBACK}",
        } for r in rules]
    spec: dict[str, Any] = {
        # A deny policy that cannot evaluate refuses, as the webhook's failurePolicy Fail does; warnings never
        # stop an object. One that reads GPUPolicy/default ignores: the apiserver resolves params before
        # matchConditions, so while it cannot (the CRD just installed; up to ~30 s after an apiserver starts, on 1.37)
        # Fail would refuse every pod it matches, CPU pods too; the seed's hard rules, without params, still fail
        # closed.
        "failurePolicy": "Fail" if action == "deny" and mode != LIVE else "Ignore",
        "matchConstraints": _match_constraints(family, custom_kinds, exclude),
    }
    if mode == LIVE:
        spec["paramKind"] = dict(params.PARAM_KIND)
    if family is BUILTIN:
        spec["matchConditions"] = [{"name": "may-concern-gpus",
                                    "expression": matters(ctx, [r.rule for r in rules])}]
    spec["variables"] = [{"name": n, "expression": e} for n, e in variables]
    spec["validations"] = validations
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(name, [r.rule for r in rules], target, policies),
        "spec": spec,
    }
    return policy


def _rule(group: str, version: str, resources: list[str], operations: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "apiVersions": [version], "operations": operations, "resources": resources,
            "scope": "Namespaced"}


def _resource_rules(family: Family, custom_kinds: Sequence[kinds.CustomKind]) -> list[dict[str, Any]]:
    if family is CLAIMS:
        return [_rule("resource.k8s.io", "v1", ["resourceclaims", "resourceclaimtemplates"], OPERATIONS)]
    if family is CUSTOM:
        return [_rule(k.group, k.version, [k.resource], OPERATIONS) for k in custom_kinds]
    by_group: dict[str, list[str]] = {}
    for group, _, plural, _ in kinds.BUILTIN_KINDS:
        by_group.setdefault(group, []).append(plural)
    return [_rule(g, "v1", r, OPERATIONS) for g, r in by_group.items()]


def _excluded(exclude: Sequence[str]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": NAMESPACE_LABEL, "operator": "NotIn", "values": list(exclude)}]}


def _match_constraints(family: Family, custom_kinds: Sequence[kinds.CustomKind],
                       exclude: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"matchPolicy": "Equivalent", "resourceRules": _resource_rules(family, custom_kinds)}
    if exclude:
        out["namespaceSelector"] = _excluded(exclude)
    return out


def _metadata(name: str, rules: Sequence[str], target: Target, policies: PolicySet) -> dict[str, Any]:
    annotations = {RULES_ANNOTATION: ",".join(rules), TARGET_ANNOTATION: target.version,
                   VERSION_ANNOTATION: __version__}
    if live(policies):
        annotations[COMPILED_ANNOTATION] = params.compiled_digest(policies.document)
    return {"name": name, "labels": dict(LABELS), "annotations": annotations}


def _bindings(policy: str, rules: Sequence[str], policies: PolicySet, deny: bool,
              target: Target, mode: str = INLINE) -> list[dict[str, Any]]:
    """``[Deny]`` (or ``[Warn]``) where ``enforcement`` says so; a warn policy warns everywhere. Live, the policy
    reads ``enforcement`` itself: one binding, naming GPUPolicy/default."""
    def binding(name: str, actions: list[str], selector: dict[str, Any] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"policyName": policy, "validationActions": actions}
        if mode == LIVE:
            spec["paramRef"] = dict(params.PARAM_REF)
        if selector is not None:
            spec["matchResources"] = {"namespaceSelector": selector}
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": _metadata(name, rules, target, policies), "spec": spec}

    if not deny or mode == LIVE:
        return [binding(policy, ["Deny"] if deny else ["Warn"], None)]
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


def _mutating_policy(policies: PolicySet, exclude: Sequence[str], target: Target) -> list[dict[str, Any]]:
    if not target.mutating:
        return []
    ctx = _ctx(policies, target, typed=True, live=live(policies))
    patches = [(name, build(ctx)) for name, build in mutations.MUTATIONS.items()]
    patches = [(name, text) for name, text in patches if text is not None]
    if not patches:
        return []
    constraints: dict[str, Any] = {
        "matchPolicy": "Equivalent",
        "resourceRules": [_rule("", "v1", ["pods"], ["CREATE"])],
    }
    if exclude:
        constraints["namespaceSelector"] = _excluded(exclude)
    names = [name for name, _ in patches]
    api = f"admissionregistration.k8s.io/{target.mutating}"
    name = f"{NAME}-live" if ctx.live else NAME
    variables = mutations.variables(ctx)
    if ctx.live:
        texts = [e for _, e in variables] + [text for _, text in patches if text] + [mutations.matters(ctx)]
        variables = params.variables(texts, policies.default.platform, mutating=True) + variables
    policy: dict[str, Any] = {
        "apiVersion": api,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _metadata(name, names, target, policies),
        "spec": {
            # /mutate never denies: a mutation that cannot evaluate leaves the pod as it is.
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": constraints,
            "matchConditions": [{"name": "may-concern-gpus", "expression": mutations.matters(ctx)}],
            "variables": [{"name": n, "expression": e} for n, e in variables],
            # One expression: every mutation of a policy evaluates its variables afresh, and these add disjoint
            # fields (nodeSelector, tolerations, env, runtimeClassName) of the same pod.
            "mutations": [{"patchType": "JSONPatch",
                           "jsonPatch": {"expression": " +\n".join(f"({text})" for _, text in patches)}}],
        },
    }
    binding: dict[str, Any] = {"apiVersion": api, "kind": "MutatingAdmissionPolicyBinding",
               "metadata": _metadata(name, names, target, policies), "spec": {"policyName": name}}
    if ctx.live:
        policy["spec"] = {"paramKind": dict(params.PARAM_KIND), **policy["spec"]}
        binding["spec"]["paramRef"] = dict(params.PARAM_REF)
    return [policy, binding]


def settings(policies: PolicySet) -> tuple[list[kinds.CustomKind], list[str]]:
    """The custom kinds, and the namespaces left alone: ``excludeNamespaces``, then ``nativePolicies``' own."""
    document: Mapping[str, Any] = policies.document
    native = document.get("nativePolicies") or {}
    exclude = [*document.get("excludeNamespaces", ()), *native.get("excludeNamespaces", ())]
    return kinds.custom_kinds(document), list(dict.fromkeys(exclude))


def _carried_kinds(all_kinds: Sequence[kinds.CustomKind], target: Target) -> list[kinds.CustomKind]:
    """The custom kinds whose template paths the target's CEL can walk (two wildcards need flatten); a kind with
    resource blocks alone has none to walk."""
    return [k for k in all_kinds if k.templates and (kinds.wildcards(k) <= 1 or target.has("lists"))]


def generate(policies: PolicySet, target: Target = DEFAULT) -> Generated:
    all_kinds, exclude = settings(policies)
    custom_kinds = _carried_kinds(all_kinds, target)
    families = [BUILTIN, CUSTOM] + ([CLAIMS] if target.minor >= DRA_MINOR else [])
    objects: list[dict[str, Any]] = []
    native: list[str] = []
    # Live, the seed's policies (no params), then the ones that read GPUPolicy/default. Their names are never the
    # inline ones: a policy that gains paramKind in place would meet its old binding, which names no param (the
    # apiserver then evaluates it with null params, the built-in defaults), and a binding gains paramRef only from
    # who may read every kind while its stored policy names none. So a change of mode adds the new set beside the
    # old, which goes once the new one acts.
    modes = [(SEED, "seed-"), (LIVE, "live-")] if live(policies) else [(INLINE, "")]
    for family in families:
        if family is CUSTOM and not custom_kinds:
            continue
        for mode, prefix in modes:
            for action in ("deny", "warn"):
                name = f"{NAME}-{family.suffix}{prefix}{action}"
                for policy, rules in _validating_policies(name, policies, family, action, target, custom_kinds,
                                                          exclude, mode):
                    objects.append(policy)
                    objects.extend(_bindings(policy["metadata"]["name"], rules, policies, action == "deny", target,
                                             mode))
                    native.extend(r for r in rules if r not in native)
    objects.extend(_mutating_policy(policies, exclude, target))
    return Generated(_laid_out(objects), target, _left_to_webhook(policies, target, all_kinds, custom_kinds), native,
                     policy_object(policies) if live(policies) else None)


def policy_object(policies: PolicySet) -> dict[str, Any]:
    """GPUPolicy/default with the policy as written for its spec."""
    return {"apiVersion": gpupolicy.API_VERSION, "kind": gpupolicy.KIND,
            "metadata": {"name": gpupolicy.NAME}, "spec": as_spec(policies.written)}


# The fields of the objects that hold CEL.
CEL_FIELDS = ("expression", "messageExpression")


def _laid_out(value: Any, lay: Callable[[str], str] | None = None) -> Any:
    """Every CEL field of ``value`` (objects, lists, maps) laid out on short lines (``celtext.layout``)."""
    lay = lay or layout
    if isinstance(value, list):
        return [_laid_out(v, lay) for v in value]
    if isinstance(value, dict):
        return {k: lay(v) if k in CEL_FIELDS and isinstance(v, str) else _laid_out(v, lay) for k, v in value.items()}
    return value


def left_to_webhook(policies: PolicySet, target: Target) -> list[tuple[str, str]]:
    """What stays with the webhook on ``target`` (rule or feature, why), without generating the policies."""
    all_kinds, _ = settings(policies)
    return _left_to_webhook(policies, target, all_kinds, _carried_kinds(all_kinds, target))


def versions_table(policies: PolicySet) -> str:
    """Markdown: for each Kubernetes minor this release knows (and 1.34/1.35 with MutatingAdmissionPolicy v1beta1
    turned on), the admission-policy APIs it serves, the engine of each half, and what that version leaves to the
    webhook beyond what every version does, which follows the table."""
    every = [left_to_webhook(policies, t) for t in every_version()]
    always = [item for item in every[0] if all(item in other for other in every)]
    lines = ["| Kubernetes | ValidatingAdmissionPolicy | MutatingAdmissionPolicy | validation | mutation | "
             "also left to the webhook |", "|---|---|---|---|---|---|"]
    for target, left in zip(every_version(), every, strict=True):
        validation, mutation = target.engines
        extra = ", ".join(name for name, _ in left if (name, _) not in always) or "nothing more"
        lines.append(f"| {target.version} | {'v1' if target.validating else '-'} | {target.mutating or '-'} | "
                     f"{validation} | {mutation} | {extra} |")
    lines += ["", "On every version the webhook keeps: " + ", ".join(name for name, _ in always) + "."]
    return "\n".join(lines) + "\n"


def _left_to_webhook(policies: PolicySet, target: Target, all_kinds: Sequence[kinds.CustomKind],
                     custom_kinds: Sequence[kinds.CustomKind]) -> list[tuple[str, str]]:
    out = [(rule.id, rule.why) for rule in webhook_rules()]
    out += [(r.id, cluster.INLINE_WHY) for r in native_rules() if BUILDERS[r.id].reads_facts and not live(policies)]
    for rule in native_rules():
        missing = target.lacks(BUILDERS[rule.id].needs)
        if missing:
            wanted = "; ".join(f"{m} ({LIBRARIES[m][1]}, Kubernetes 1.{LIBRARIES[m][0] + 1}+)" for m in missing)
            out.append((rule.id, f"its CEL needs {wanted}; this cluster is {target.version}"))
    blocks = [k for k in all_kinds if k.blocks]
    if blocks:
        out.append((f"GPU resource blocks of {', '.join(k.title for k in blocks)}",
                    "the generated policies read pod templates; the webhook reads the resources an operator copies "
                    "into the pods it makes"))
    for k in all_kinds:
        if k not in custom_kinds and k.templates:
            out.append((f"pod templates of {k.title}",
                        f"a template path with two wildcards needs the CEL lists library (flatten, Kubernetes 1.35+); "
                        f"this cluster is {target.version}"))
    if target.minor < DRA_MINOR:
        out.append(("DRA rules on ResourceClaims and ResourceClaimTemplates",
                    f"resource.k8s.io/v1 is served from Kubernetes 1.{DRA_MINOR}; this cluster is {target.version}"))
    if not target.mutating:
        out.append(("mutation (accelerator, tolerations, hideGpus, runtimeClass)",
                    f"Kubernetes {target.version} serves no MutatingAdmissionPolicy (v1 from 1.36, v1beta1 in 1.34 and "
                    f"1.35 when turned on)"))
    elif policies.default.cluster_enabled and not live(policies) and any(p.runtime_class for p in
                                                                         every_policy(policies)):
        out.append(("mutation: isolation.runtimeClass", "with cluster.enabled it is injected only where the "
                    "RuntimeClass exists and agrees with the pod's selector, which inline policies cannot read"))
    out.append(("mutation: requests from limits",
                "the apiserver copies Pod limits into missing requests before admission; the webhook does not "
                "mutate custom resources either"))
    out.append(("pod templates in other kinds",
                "CEL cannot walk an unknown object; add the kind with nativePolicies.customKinds"))
    out.append(("audit, policy reports, gpu-webhook check", "they run the webhook's own rules"))
    return out


class _Dumper(yaml.SafeDumper):
    """Every value written out: no anchors and aliases (``&id001``) for repeated values."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # A multi-line value (an expression laid out on lines) as a literal block, ``|-``: read as it was written.
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """A multi-document YAML stream (one document per object)."""
    # No folding: an expression stays on the lines it was written on. Unicode as it is (the ellipsis of the
    # messages): escaped, a multi-line expression could not be a block.
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=2**31, default_flow_style=False,
                         allow_unicode=True)


__all__ = ["Generated", "generate", "lit", "to_yaml"]
