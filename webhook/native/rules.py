"""Which rules the native policies carry: exactly the rules ``webhook.core.catalog`` marks ``native``, each
with its builders of findings (for pod templates, for claims, or both) in the one registry, what can make it fire
on a Pod or built-in template (``matchConditions``), what its CEL needs beyond the oldest target, and the reasons
the others stay with the webhook."""

from __future__ import annotations

from webhook.core.catalog import RULES, Rule
from webhook.core.podspecs import CONTAINER_LISTS
from webhook.core.policy import CLUSTER_RULES, Policy

# The rule families' modules: their builders declare themselves in the registry as they are imported.
from webhook.native import claims, cluster, crossfield, isolation, params, pods, sharing  # noqa: F401
from webhook.native.celtext import lits
from webhook.native.registry import NEVER, REGISTRY, NativeRule
from webhook.native.snippets import Ctx

# One record per rule id; tests/test_native.py holds its keys to the catalog's native rules.
BUILDERS: dict[str, NativeRule] = REGISTRY
# The rules the apiserver enforces on Pods and built-in templates itself: only custom kinds get them from us.
CUSTOM_ONLY = frozenset(rule for rule, entry in BUILDERS.items() if entry.custom_only)


def native_rules() -> list[Rule]:
    """The catalog's native rules, in its order."""
    return [rule for rule in RULES.values() if rule.engine == "native"]


def webhook_rules() -> list[Rule]:
    return [rule for rule in RULES.values() if rule.engine == "webhook"]


def setting(policy: Policy, rule: str) -> str:
    """deny, warn or off for ``rule`` in this namespace, before ``enforcement`` (which the bindings carry)."""
    value = policy.settings.get(rule, "deny")
    if value == "off" or (rule in CLUSTER_RULES and not policy.cluster_enabled):
        return "off"
    return value


# --- what can matter at all (matchConditions) -------------------------------------------------------------------

BUILTIN_TEMPLATE = (
    "request.kind.kind == 'Pod' ? [object] : request.kind.kind == 'PodTemplate' ? (has(object.template) ? "
    "[object.template] : []) : request.kind.kind == 'CronJob' ? (has(object.spec.jobTemplate.spec.template) ? "
    "[object.spec.jobTemplate.spec.template] : []) : (has(object.spec.template) ? [object.spec.template] : [])"
)


def trigger_expression(ctx: Ctx, rules: list[str]) -> str:
    """Whether anything in template ``pod`` can make one of ``rules`` fire (what each declared it ``fires`` on),
    tested in one pass over the containers; ``false`` for none."""
    missing = [rule for rule in rules if rule not in BUILDERS or not BUILDERS[rule].fires]
    if missing:
        raise KeyError(f"rules without triggers (what can make them fire, for matchConditions): {missing}")
    fires = [t for rule in rules for t in BUILDERS[rule].fires if t is not NEVER]
    shared = {t.key: t for t in fires if t.key}
    wanted = [shared[key] for key in sorted(shared)] + list(dict.fromkeys(t for t in fires if not t.key))

    def tests(level: str) -> list[str]:
        return [f"({t.text(ctx)})" for t in wanted if t.level == level]

    names = tests("name")
    per_container = tests("container")
    if names:
        sections = " || ".join(f"(has(container.resources.{s}) && container.resources.{s}.exists(name, "
                               f"name.contains('/') && [container.resources.{s}[name]].exists(value, "
                               f"{' || '.join(names)})))"
                               for s in ("limits", "requests"))
        per_container.append(f"(has(container.resources) && ({sections}))")
    per_template = tests("template")
    if per_container:
        per_template.append(f"{lits(CONTAINER_LISTS)}.exists(field, field in pod.spec && "
                            f"pod.spec[field].exists(container, {' || '.join(per_container)}))")
    return "(" + " || ".join(per_template) + ")" if per_template else "false"


def matters(ctx: Ctx, rules: list[str]) -> str:
    """The ``matchConditions`` expression of a policy on Pods and built-in workloads holding ``rules``: false when
    nothing in the template can make one of them fire, so CPU pods and ordinary GPU pods (plain counts, no isolation
    field) cost the policy one pass over their containers. Every rule says what can make it fire."""
    text = f"({BUILTIN_TEMPLATE}).exists(pod, has(pod.spec) && {trigger_expression(ctx, rules)})"
    read = params.expression("perContainer")
    if ctx.live and read in text:
        # The cap per container is read through params (a matchCondition has no variables) for every resource name
        # of every container: read once, bound by a one-item exists under its variable's name. The values read once
        # per template are left where they are, so a CPU pod does not pay for them.
        variable = params.VARIABLES["perContainer"]
        text = f"[{read}].exists({variable}, {text.replace(read, variable)})"
    return text
