"""The tenant rules in the generated policies (``webhook.rules.admission.judge``): on a pod that asks for no GPU,
outside ``isolation.tenantNamespaces``, a tenant rule's denial is a warning that says why. Each of the rule's findings
is split between the deny policy (where the pod holds a GPU or the namespace is a tenant's) and the warn policy (the
rest, its words ending as the webhook's do)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from webhook.core.catalog import Rule
from webhook.native import params
from webhook.native.celtext import lit, lits
from webhook.native.findings import Each, Finding
from webhook.native.snippets import Ctx
from webhook.rules.admission import NOT_TENANT


def gate(ctx: Ctx, rule: Rule, action: str, gate_of: Callable[[Ctx, str, str], str]
         ) -> tuple[str, Callable[[list[Finding]], list[Finding]]]:
    """The rule's gate in the ``action`` policy (``gate_of(ctx, rule, action)``: the rule is ``action`` in the
    request's namespace), and what becomes of its findings there: a tenant rule's warn policy also carries its
    softened denials."""
    own = gate_of(ctx, rule.id, action)
    if not rule.tenant:
        return own, lambda found: found
    denied = gate_of(ctx, rule.id, "deny")
    tenant = namespace_test(ctx)
    return (either_gate(own, denied) if action == "warn" else own,
            lambda found: [split(f, action, denied, tenant) for f in found])


def namespace_test(ctx: Ctx) -> str:
    """``PolicySet.is_tenant`` of the request's namespace: read live, or the policy's patterns written in."""
    if ctx.live:
        return f"variables.{params.TENANT_VARIABLE}"
    patterns = ctx.policies.tenant_namespaces
    if "*" in patterns:
        return "true"
    names = [p for p in patterns if not p.endswith("*")]
    tests = ([f"request.namespace in {lits(names)}"] if names else []) + [
        f"request.namespace.startsWith({lit(p[:-1])})" for p in patterns if p.endswith("*")]
    return "(" + " || ".join(tests) + ")" if tests else "false"


def either_gate(a: str, b: str) -> str:
    """Either of two gates, simplified where one is a literal."""
    if "true" in (a, b):
        return "true"
    return b if a == "false" else a if b == "false" else f"({a} || {b})"


def split(f: Finding, action: str, denied: str, tenant: str) -> Finding:
    """A tenant rule's finding in the ``action`` policy (``admission.judge``): its denial holds where the pod asks
    for a GPU or the namespace is a tenant's; elsewhere it is a warning that says why. ``denied``: the rule is deny
    in the request's namespace."""
    first, rest = f.loops[0], f.loops[1:]
    strict = "pod.holds" if tenant == "false" else f"(pod.holds || {tenant})"
    if action == "deny":
        where, message = _and_where(first.where, strict), f.message
    elif denied == "false":
        return f
    else:
        where = _and_where(first.where, f"(!{denied} || !{strict})" if denied != "true" else f"!{strict}")
        suffix = lit("; " + NOT_TENANT)
        message = f"{f.message} + {suffix}" if denied == "true" else f"{f.message} + ({denied} ? {suffix} : '')"
    return replace(f, loops=(Each(first.var, first.over, where, first.index), *rest), message=message)


def _and_where(a: str, b: str) -> str:
    return b if not a else f"{a} && {b}"
