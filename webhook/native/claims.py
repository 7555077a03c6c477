"""The DRA rules on ResourceClaims and ResourceClaimTemplates themselves, in CEL.

Variables (``Ctx.v``): ``dreq``, every device request of the object's claim spec, ``{p, sp, q}``: the
request's path (``spec.devices.requests[0].exactly``, ``…firstAvailable[1]``, in a template under
``spec.spec``), its stable path, and the request (``exactly``, a v1beta1-shaped request, or a
``firstAvailable`` alternative), as ``webhook.rules.claims.check_claim_spec`` walks them.
"""

from __future__ import annotations

from webhook.core.policy import Policy
from webhook.native.celtext import boolean, globs_regex, lit, matches, record
from webhook.native.snippets import Ctx, guarded, quoted, stable_item, violation


def requests(ctx: Ctx) -> str:
    """``dreq``: the object's device requests, ``exactly`` and every ``firstAvailable`` alternative."""
    root = "R"
    claim_spec = guarded(root, "spec", "map", "{}")
    template_spec = guarded(claim_spec, "spec", "map", "{}")
    base = "(request.kind.kind == 'ResourceClaimTemplate' ? 'spec.spec' : 'spec')"
    spec = f"(request.kind.kind == 'ResourceClaimTemplate' ? {template_spec} : {claim_spec})"
    items = guarded(guarded("S", "devices", "map", "{}"), "requests", "list", "[]")
    where = "B + '.devices.requests[' + string(i) + ']'"
    stable = stable_item("B + '.devices.requests'", "i", "x", "name")
    exact_record = record(p=where + " + '.exactly'", sp=stable + " + '.exactly'", q="x.exactly", o="o")
    plain_record = record(p=where, sp=stable, q="x", o="o")
    exactly = (f"'exactly' in x && type(x.exactly) == map ? [{exact_record}] : "
               f"'deviceClassName' in x && type(x.deviceClassName) == string ? [{plain_record}] : []")
    alternatives = guarded("x", "firstAvailable", "list", "[]")
    alternative = record(p=where + " + '.firstAvailable[' + string(j) + ']'",
                         sp=stable_item(stable + " + '.firstAvailable'", "j", "y", "name"), q="y", o="o")
    sub = f"{alternatives}.transformList(j, y, type(y) == map, {alternative})"
    one = f"[{spec}].map(S, [{base}].map(B, {items}.transformList(i, x, type(x) == map, ({exactly}) + {sub}))[0])[0]"
    return f"variables.roots.transformList(o, R, {one}.flatten()).flatten()"


def dviolation(rule: str, path: str, stable: str, value: str, message: str) -> str:
    """A violation found in device request ``d``."""
    return violation(rule, path, stable, value, message, "d.o")


def _per_request(ctx: Ctx, body: str, where: str = "true") -> str:
    return f"{ctx.v('dreq')}.filter(d, {where}).map(d, {body}).flatten()"


def _class(ctx: Ctx) -> str:
    return guarded("d.q", "deviceClassName", "string", "null")


def device_class_not_allowed(ctx: Ctx) -> str:
    def allowed(policy: Policy) -> str:
        if not policy.allowed_device_classes:
            return "true"
        return matches("n", globs_regex(policy.allowed_device_classes))
    if all(allowed(p) == "true" for p in _policies(ctx)):
        return "[]"
    listed = ctx.ns(lambda p: lit(", ".join(p.allowed_device_classes)))
    message = f"'device class ' + {quoted('n')} + ' is not allowed here (allowed: ' + {listed} + ')'"
    found = dviolation("device-class-not-allowed", "d.p + '.deviceClassName'", "d.sp + '.deviceClassName'", "n",
                      message)
    body = f"[{_class(ctx)}].filter(n, n != null && !{ctx.ns(allowed)}).map(n, {found})"
    return _per_request(ctx, body)


def allocation_mode_all(ctx: Ctx) -> str:
    message = lit("allocationMode: All takes every matching device on the node (and fails while any is in use); "
                  "ask for a count instead")
    found = dviolation("allocation-mode-all", "d.p + '.allocationMode'", "d.sp + '.allocationMode'", lit("All"),
                      message)
    body = f"'allocationMode' in d.q && d.q.allocationMode == 'All' ? [{found}] : []"
    return _per_request(ctx, body)


def admin_access(ctx: Ctx) -> str:
    namespaces = ctx.policy.admin_access_namespaces
    allowed = matches("request.namespace", globs_regex(namespaces)) if namespaces else "false"
    listed = ", ".join(namespaces) or "none"
    intro = lit("adminAccess gives access to devices in use by other pods; it is allowed only in the namespaces "
                "the webhook policy names (dra.adminAccessNamespaces: " + listed + "), not in ")
    message = f"{intro} + '\"' + request.namespace + '\"'"
    found = dviolation("admin-access", "d.p + '.adminAccess'", "d.sp + '.adminAccess'", lit("true"), message)
    body = f"'adminAccess' in d.q && d.q.adminAccess == true && !{allowed} ? [{found}] : []"
    return _per_request(ctx, body)


def blanket_device_toleration(ctx: Ctx) -> str:
    tolerations = guarded("d.q", "tolerations", "list", "[]")
    key_set = "('key' in x && x.key != null && x.key != '' && x.key != false && x.key != 0)"
    effect = "('effect' in x && x.effect != null ? x.effect : null)"
    blanket = f"(!{key_set} && 'operator' in x && x.operator == 'Exists')"
    path = "d.p + '.tolerations[' + string(i) + ']'"
    stable = stable_item("d.sp + '.tolerations'", "i", "x", "key")
    key_shown = f"({key_set} ? string(x.key) : '*')"
    every = dviolation("blanket-device-toleration", path, stable, lit("*"),
                      lit("tolerates every device taint, unhealthy and draining devices included"))
    no_execute = dviolation("blanket-device-toleration", path, stable, key_shown,
                           f"'tolerates the NoExecute device taint ' + {key_shown} + "
                           f"': the pod keeps devices taken out of service'")
    by_effect = dviolation("blanket-device-toleration", path, stable, lit("*"),
                          f"'tolerates every ' + string({effect}) + ' device taint'")
    body = (f"{tolerations}.transformList(i, x, type(x) == map, "
            f"{blanket} && ({effect} == null || {effect} == '') ? [{every}] : "
            f"{effect} == 'NoExecute' ? [{no_execute}] : {blanket} ? [{by_effect}] : []).flatten()")
    return _per_request(ctx, body)


def _cap(policy: Policy) -> tuple[int, str]:
    """``claims.check_request_count``: the smaller non-zero cap, and which rule it is."""
    cap = min((c for c in (policy.per_container, policy.per_pod) if c), default=0)
    return cap, "per-container-limit" if cap == policy.per_container else "per-pod-limit"


def _count_cap(ctx: Ctx, rule: str) -> str:
    """Requests on a GPU class counting more devices than the cap whose rule is ``rule``."""
    def cap_text(policy: Policy) -> str:
        cap, which = _cap(policy)
        return str(cap) if cap and which == rule else "0"
    if all(cap_text(p) == "0" for p in _policies(ctx)):
        return "[]"
    classes = ctx.policy.gpu_classes
    if not classes:
        return "[]"
    cap = ctx.ns(cap_text)
    scope = "per container" if rule == "per-container-limit" else "per pod"
    count = ("('count' in d.q && type(d.q.count) == int && d.q.count > 0 ? d.q.count : 1)")
    message = f"string(c) + ' devices of class ' + n + ' are over the limit of ' + string({cap}) + ' {scope}'"
    found = dviolation(rule, "d.p + '.count'", "d.sp + '.count'", "string(c)", message)
    body = (f"[{_class(ctx)}].filter(n, n != null && {matches('n', globs_regex(classes))} && "
            f"!('allocationMode' in d.q && d.q.allocationMode == 'All')).map(n, [{count}].filter(c, {cap} != 0 && "
            f"c > {cap}).map(c, {found})).flatten()")
    return _per_request(ctx, body)


def per_container_limit(ctx: Ctx) -> str:
    return _count_cap(ctx, "per-container-limit")


def per_pod_limit(ctx: Ctx) -> str:
    return _count_cap(ctx, "per-pod-limit")


def _policies(ctx: Ctx) -> list[Policy]:
    return [ctx.policies.default, *ctx.policies.by_namespace.values()]


BUILDERS = {
    "device-class-not-allowed": device_class_not_allowed,
    "allocation-mode-all": allocation_mode_all,
    "admin-access": admin_access,
    "blanket-device-toleration": blanket_device_toleration,
    "per-container-limit": per_container_limit,
    "per-pod-limit": per_pod_limit,
}

__all__ = ["BUILDERS", "boolean", "requests"]
