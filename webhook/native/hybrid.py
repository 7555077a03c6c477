"""Hybrid mode: what the webhook must still see once the generated policies hold what CEL carries on a target.

Each of the chart's webhooks gets matchConditions that let through only what is left to it (``None``: it keeps
everything its own conditions let through):

- ``validate`` (Pods and built-in workloads): the pods whose claims the webhook follows (the DRA rules that read
  other objects), and what can make a rule fire that the target's CEL cannot carry
  (:data:`webhook.native.registry.REGISTRY`);
- ``dra`` (ResourceClaims, ResourceClaimTemplates, DeviceClasses): nothing where ``resource.k8s.io/v1`` is served;
- ``custom``: the custom kinds the policies do not know;
- ``mutate``: nothing where a MutatingAdmissionPolicy is served; with the cluster checks on, the pods with claims
  (the webhook reads their claims for the accelerator and tolerations), and everything where inline policies
  would have to inject a runtime class they cannot check against the cluster.

With the cluster-aware checks on (``cluster.enabled``), the policies that read the object live carry the cluster
rules whose facts the status writer keeps (``webhook.native.cluster``): the validating webhook still takes the pods
whose claims it follows, the DRA objects and the custom kinds, which the cluster rules it keeps read. Inline
policies read no facts, so there the webhook keeps everything. The two ``checks.*`` rules only the webhook carries
(process counts and accelerators across replicas) read PyTorchJobs and the RayCluster of RayClusters, RayJobs and
RayServices alone (``webhook.rules.crossfield.REPLICA_KINDS``): while either is on, those kinds go to the webhook
too. The chart renders the same from its generated helpers (:mod:`webhook.native.chart`).
"""

from __future__ import annotations

from webhook.core.catalog import CROSS_REPLICA, RULES
from webhook.core.policy import PolicySet
from webhook.native import kinds
from webhook.native.celtext import every_policy, lits
from webhook.native.generate import DRA_MINOR, live
from webhook.native.rules import BUILDERS, BUILTIN_TEMPLATE, native_rules, trigger_expression
from webhook.native.snippets import Ctx
from webhook.native.target import NEWEST, OLDEST, Target
from webhook.rules.crossfield import REPLICA_KINDS

Condition = tuple[str, str]  # (name, CEL)

# The name of each webhook's hybrid condition, and the CEL of "nothing is left to it".
NAMES = {"mutate": "left-to-mutating-admission-policy", "validate": "left-to-the-webhook",
         "dra": "left-to-validating-admission-policies", "custom": "kind-not-native",
         "mutate-claims": "pod-with-claims"}
NOTHING = "false"
# A custom kind's template path with more wildcards than this is walked only where flatten exists ("lists").
FLAT_WILDCARDS = 1

# The pods whose claims the webhook follows (gpu-limit-and-claim and the cluster's claim checks read the claims a
# pod names, which CEL cannot read).
FOLLOWS_CLAIMS = ("has(pod.spec.resourceClaims) && size(pod.spec.resourceClaims) > 0")
# The Pods the mutating webhook still takes with the cluster checks on.
POD_WITH_CLAIMS = "has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0"


def webhook_checks() -> list[str]:
    """The ``checks.*`` keys of the replica checks, which only the webhook carries (their defaults are warn or deny).
    ``unchecked-gpu`` is the webhook's too, but about kinds the policies do not know, which go to the webhook
    whole."""
    return [r.key for r in RULES.values() if r.why == CROSS_REPLICA and r.section == "checks" and r.key]


def keeps_all(policies: PolicySet) -> bool:
    """The cluster-aware checks are on and the policies read no facts (inline): the webhook must see every GPU
    object."""
    return policies.default.cluster_enabled and not live(policies)


def replica_checks_on(policies: PolicySet) -> bool:
    """A ``checks.*`` rule only the webhook carries (the replica checks) is on somewhere; always when the policy is
    read live (an edit of GPUPolicy/default may turn one on, and no webhook configuration follows the edit)."""
    if live(policies):
        return True
    webhook_only = [r.id for r in RULES.values() if r.why == CROSS_REPLICA and r.section == "checks"]
    return any(p.checks(rule) for p in every_policy(policies) for rule in webhook_only)


def replica_kinds() -> list[str]:
    """``group/resource`` of the kinds the replica checks read."""
    return [f"{k.group}/{k.resource}" for k in kinds.KNOWN_KINDS if (k.group, k.kind) in REPLICA_KINDS]


def lacking(target: Target) -> list[str]:
    """The native rules this target's CEL cannot carry."""
    return [r.id for r in native_rules() if target.lacks(BUILDERS[r.id].needs)]


def carries_all_from() -> int:
    """The first minor whose CEL carries every native rule: before it, the custom kinds the policies know go to
    the webhook too (their templates are not walked in a webhook's matchConditions, so the rules the policies
    leave out cannot be singled out there)."""
    return next(m for m in range(OLDEST, NEWEST + 1) if not lacking(Target(m, True, None)))


def validate_condition(policies: PolicySet, target: Target) -> str:
    """The CEL of what Pods and built-in workloads must still bring to the webhook on this target."""
    triggers = trigger_expression(Ctx(policies), lacking(target))
    clauses = [f"({FOLLOWS_CLAIMS})"]
    if triggers != "false":
        clauses.append(triggers)
    return f"({BUILTIN_TEMPLATE}).exists(pod, has(pod.spec) && ({' || '.join(clauses)}))"


def custom_condition(custom: list[kinds.CustomKind], replicas: bool) -> str:
    """The custom kinds the policies do not know, and with ``replicas`` the kinds the replica checks read."""
    kind = "(request.resource.group + '/' + request.resource.resource)"
    names = lits(f"{k.group}/{k.resource}" for k in custom)
    text = f"!({kind} in {names})"
    return f"{text} || {kind} in {lits(replica_kinds())}" if replicas else text


def conditions(policies: PolicySet, target: Target) -> dict[str, list[Condition] | None]:
    """Per webhook of the chart, its hybrid matchConditions on this target."""
    from webhook.native.generate import settings

    every_kind, _ = settings(policies)
    # Carried whole: templates the target's CEL walks, and no resource block (those only the webhook reads).
    custom = [k for k in every_kind
              if k.templates and not k.blocks and (kinds.wildcards(k) <= FLAT_WILDCARDS or target.has("lists"))]
    # With cluster checks, inline policies cannot check isolation.runtimeClass against the cluster: the webhook
    # injects it wherever a namespace sets one. Read live, the MutatingAdmissionPolicy reads the facts.
    cluster = policies.default.cluster_enabled
    runtime_class = any(p.runtime_class for p in every_policy(policies))
    mutate: list[Condition] | None = None
    if target.mutating and not (cluster and not live(policies) and runtime_class):
        mutate = [(NAMES["mutate-claims"], POD_WITH_CLAIMS)] if cluster else [(NAMES["mutate"], NOTHING)]
    out: dict[str, list[Condition] | None] = {"mutate": mutate, "validate": None, "dra": None, "custom": None}
    if keeps_all(policies):
        return out
    out["validate"] = [(NAMES["validate"], validate_condition(policies, target))]
    if policies.default.cluster_enabled:
        return out  # the DRA objects and the custom kinds: the cluster rules the webhook keeps read them too
    if target.minor >= DRA_MINOR:
        out["dra"] = [(NAMES["dra"], NOTHING)]
    if target.minor >= carries_all_from():
        out["custom"] = [(NAMES["custom"], custom_condition(custom, replica_checks_on(policies)))]
    return out


__all__ = ["FLAT_WILDCARDS", "FOLLOWS_CLAIMS", "NAMES", "NOTHING", "POD_WITH_CLAIMS", "carries_all_from",
           "conditions", "custom_condition", "keeps_all", "lacking", "replica_checks_on", "replica_kinds",
           "validate_condition", "webhook_checks"]
