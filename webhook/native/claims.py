"""The DRA rules of ``webhook.rules.draobjects`` and ``webhook.rules.claims`` as findings: on ResourceClaims and
ResourceClaimTemplates themselves, and on the pod's own DRA fields (what needs no other object).

On a claim or a claim template, every finding starts from ``variables.requests``: the object's device requests as
records, ``r.path`` and ``r.stable`` (``spec.devices.requests[0]``, in a template under ``spec.spec``), and
``r.devices``: what the request asks for, each ``{path, stable, q}`` (``exactly``, a v1beta1-shaped request itself,
or every ``firstAvailable`` alternative), as ``webhook.rules.draobjects.check_claim_spec`` walks them. On a pod, from
``variables.templates`` (:mod:`webhook.native.reads`).
"""

from __future__ import annotations

from webhook.core.policy import Policy
from webhook.native import params
from webhook.native.celtext import boolean, every_policy, globs_regex, lit, matches, record
from webhook.native.findings import Each, Finding
from webhook.native.reads import LISTS_WITH_CLAIMS, Reads
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, plain, quoted, stable_item

REQUESTS = Each("r", "variables.requests")
DEVICES = Each("d", "r.devices")


def requests(root: str, two_variable: bool) -> str:
    """``variables.requests`` of ``root`` (``object`` or ``oldObject``)."""
    base = "(request.kind.kind == 'ResourceClaimTemplate' ? 'spec.spec' : 'spec')"
    spec = (f"(request.kind.kind == 'ResourceClaimTemplate' ? {root}.?spec.?spec.orValue({{}}) : "
            f"{root}.?spec.orValue({{}}))")
    items = "S.?devices.?requests.orValue([])"
    where = "B + '.devices.requests[' + string(i) + ']'"
    stable = stable_item("B + '.devices.requests'", "i", "x", "name")
    exact = f"[{record(path=where + ' + ' + lit('.exactly'), stable=stable + ' + ' + lit('.exactly'), q='x.exactly')}]"
    plain = f"[{record(path=where, stable=stable, q='x')}]"
    alternative = record(path=where + " + '.firstAvailable[' + string(j) + ']'",
                         stable=stable_item(stable + " + '.firstAvailable'", "j", "y", "name"), q="y")
    alternatives = "x.?firstAvailable.orValue([])"
    if two_variable:
        subs = f"{alternatives}.transformList(j, y, {alternative})"
    else:
        subs = f"{alternatives}.map(y, [{alternatives}.indexOf(y)].map(j, {alternative})[0])"
    devices = f"(has(x.exactly) ? {exact} : has(x.deviceClassName) ? {plain} : []) + {subs}"
    one = record(path=where, stable=stable, devices=devices)
    if two_variable:
        listed = f"{items}.transformList(i, x, {one})"
    else:
        listed = f"{items}.map(x, [{items}.indexOf(x)].map(i, {one})[0])"
    return f"[{spec}].map(S, [{base}].map(B, {listed})[0])[0]"


def _trusted(ctx: Ctx) -> str:
    """Whether the claim's namespace is trusted (``isolation.trusted``, ``isolation.platformNamespaces``): the
    platform's node agents there may take every device and watch devices in use."""
    return ctx.ns(lambda p: boolean(p.trusted), live="variables.trusted_namespace")


def _class() -> str:
    return "d.q.?deviceClassName.orValue(null)"


@native("device-class-not-allowed", claims=True)
def device_class_not_allowed(ctx: Ctx) -> list[Finding]:
    def allowed(policy: Policy) -> str:
        if not policy.allowed_device_classes:
            return "true"
        return matches("n", globs_regex(policy.allowed_device_classes))
    if all(allowed(p) == "true" for p in every_policy(ctx.policies)):
        return []
    listed = ctx.compiled(lambda p: lit(", ".join(p.allowed_device_classes)))
    message = f"'device class ' + {quoted('n')} + ' is not allowed here (allowed: ' + {listed} + ')'"
    return [Finding("device-class-not-allowed", (REQUESTS, DEVICES), f"n != null && !{ctx.compiled(allowed)}",
                    "d.path + '.deviceClassName'", "d.stable + '.deviceClassName'", "n", message, (("n", _class()),))]


@native("allocation-mode-all", claims=True)
def allocation_mode_all(ctx: Ctx) -> list[Finding]:
    message = lit("allocationMode: All takes every matching device on the node (and fails while any is in use); "
                  "ask for a count instead")
    # draobjects.check_allocation_mode: not with adminAccess (an admin-access allocation holds no device), nor where
    # the platform's agents are trusted
    where = (f"d.q.?allocationMode.orValue('') == 'All' && d.q.?adminAccess.orValue(false) != true && "
             f"!{_trusted(ctx)}")
    return [Finding("allocation-mode-all", (REQUESTS, DEVICES), where,
                    "d.path + '.allocationMode'", "d.stable + '.allocationMode'", lit("All"), message)]


@native("admin-access", claims=True)
def admin_access(ctx: Ctx) -> list[Finding]:
    namespaces = ctx.policy.admin_access_namespaces
    allowed = matches("request.namespace", globs_regex(namespaces)) if namespaces else "false"
    allowed = f"({allowed} || {_trusted(ctx)})" if _trusted(ctx) != "false" else allowed
    listed = ", ".join(namespaces) or "none"
    intro = lit("adminAccess gives access to devices in use by other pods; it is allowed only in the namespaces "
                "the webhook policy names (dra.adminAccessNamespaces: " + listed + "), not in ")
    message = f"{intro} + '\"' + request.namespace + '\"'"
    return [Finding("admin-access", (REQUESTS, DEVICES), f"d.q.?adminAccess.orValue(false) == true && !{allowed}",
                    "d.path + '.adminAccess'", "d.stable + '.adminAccess'", lit("true"), message)]


@native("blanket-device-toleration", claims=True)
def blanket_device_toleration(ctx: Ctx) -> list[Finding]:
    key_set = "x.?key.orValue('') != ''"
    effect = "x.?effect.orValue('')"
    blanket = f"(!({key_set}) && x.?operator.orValue('') == 'Exists')"
    trusted = _trusted(ctx)
    tolerations = Each("x", "d.q.?tolerations.orValue([])", "" if trusted == "false" else f"!{trusted}", "i")
    path = "d.path + '.tolerations[' + string(i) + ']'"
    stable = stable_item("d.stable + '.tolerations'", "i", "x", "key")
    key_shown = f"({key_set} ? x.key : '*')"
    loops = (REQUESTS, DEVICES, tolerations)
    return [
        Finding("blanket-device-toleration", loops, f"{blanket} && {effect} == ''", path, stable, lit("*"),
                lit("tolerates every device taint, unhealthy and draining devices included")),
        Finding("blanket-device-toleration", loops, f"{effect} == 'NoExecute'", path, stable, key_shown,
                f"'tolerates the NoExecute device taint ' + {key_shown} + "
                f"': the pod keeps devices taken out of service'"),
        Finding("blanket-device-toleration", loops, f"{blanket} && {effect} != '' && {effect} != 'NoExecute'", path,
                stable, lit("*"), f"'tolerates every ' + {effect} + ' device taint'"),
    ]


def _cap(policy: Policy) -> tuple[int, str]:
    """``draobjects.check_request_count``: the smaller non-zero cap, and which rule it is."""
    cap = min((c for c in (policy.per_container, policy.per_pod) if c), default=0)
    return cap, "per-container-limit" if cap == policy.per_container else "per-pod-limit"


def _count_cap(ctx: Ctx, rule: str) -> list[Finding]:
    """Requests on a GPU class counting more devices than the cap whose rule is ``rule``."""
    def cap_text(policy: Policy) -> str:
        cap, which = _cap(policy)
        return str(cap) if cap and which == rule else "0"
    if not ctx.any(lambda p: cap_text(p) != "0"):
        return []
    classes = ctx.policy.gpu_classes
    if not classes:
        return []
    cap = ctx.ns(cap_text, live=_live_cap(rule))
    scope = "per container" if rule == "per-container-limit" else "per pod"
    count = "(d.q.?count.orValue(0) > 0 ? d.q.count : 1)"
    message = f"string(c) + ' devices of class ' + n + ' are over the limit of ' + string({cap}) + ' {scope}'"
    where = (f"n != null && {matches('n', globs_regex(classes))} && d.q.?allocationMode.orValue('') != 'All' && "
             f"{cap} != 0 && c > {cap}")
    return [Finding(rule, (REQUESTS, DEVICES), where, "d.path + '.count'", "d.stable + '.count'", "string(c)", message,
                    (("n", _class()), ("c", count)))]


def _live_cap(rule: str) -> str:
    """``_cap`` read live: the smaller non-zero cap when it is ``rule``'s, else 0."""
    container, pod = params.of("perContainer"), params.of("perPod")
    smaller = f"({container} != 0 && ({pod} == 0 || {container} <= {pod}))"
    if rule == "per-container-limit":
        return f"({smaller} ? {container} : 0)"
    return f"({smaller} ? 0 : {pod})"


@native("per-container-limit", claims=True)
def per_container_limit(ctx: Ctx) -> list[Finding]:
    return _count_cap(ctx, "per-container-limit")


@native("per-pod-limit", claims=True)
def per_pod_limit(ctx: Ctx) -> list[Finding]:
    return _count_cap(ctx, "per-pod-limit")


# --- the pod's own DRA fields (webhook.rules.claims, what needs no other object) ---------------------------


def _declared(r: Reads) -> str:
    """``spec.resourceClaims[].name``."""
    claims = r.get("t.spec", "resourceClaims", "list", "[]")
    if r.typed:
        return f"{claims}.map(x, x.name)"
    return f"{claims}.filter(x, type(x) == map && 'name' in x && type(x.name) == string).map(x, x.name)"


@native("node-name-with-gpus",
        fires=(Trigger("template", "has(t.spec.nodeName) && t.spec.nodeName != ''", "node-name"),))
def node_name_with_gpus(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    node = r.get("t.spec", "nodeName", "string", "''")
    lost = "(t.declares ? 'its claims are never allocated' : 'no GPU capacity is checked')"
    message = (f"'nodeName ' + n + ' bypasses the scheduler, so ' + {lost} + '; use nodeSelector "
               f"kubernetes.io/hostname: ' + n")
    return [Finding("node-name-with-gpus", (Each("t", "variables.templates", "!t.trusted"),),
                    "n != '' && (t.uses || t.declares)", "t.path + '.nodeName'",
                    "t.stable + '.nodeName'", "n", message, (("n", node),))]


def _truthy(field: str) -> str:
    return f"({lit(field)} in x && x.{field} != null && x.{field} != '' && x.{field} != false && x.{field} != 0)"


CLAIMS_USED = Trigger("container", "l != 'ephemeralContainers' && has(c.resources) && has(c.resources.claims) && "
                                   "size(c.resources.claims) > 0", "claims")
CLAIMS_DECLARED = Trigger("template", "has(t.spec.resourceClaims) && size(t.spec.resourceClaims) > 0",
                          "declared-claims")


@native("claim-source", fires=(CLAIMS_USED, CLAIMS_DECLARED))
def claim_source(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    claims = r.get("t.spec", "resourceClaims", "list", "[]")
    named = f"[{_truthy('resourceClaimName')}, {_truthy('resourceClaimTemplateName')}].filter(b, b)"
    name = "('name' in x ? x.name : null)"
    # claims.moved_source: the keys the pre-1.31 source: names as non-empty strings; one of them is told to move up.
    source = "('source' in x && type(x.source) == map ? x.source : {})"
    moved = "['resourceClaimName', 'resourceClaimTemplateName'].filter(k, k in S && type(S[k]) == string && S[k] != '')"
    message = (f"'claim ' + {quoted('m')} + ' names ' + w + ' of resourceClaimName and resourceClaimTemplateName; "
               f"exactly one is required'")
    moved_message = (f"'claim ' + {quoted('m')} + ' uses source:, the pre-1.31 form Kubernetes removed; move the "
                     f"name up into the entry: ' + K[0] + ': ' + S[K[0]]")
    loops = (Each("t", "variables.templates", "t.dra"), Each("x", claims, "type(x) == map", "i"))
    path = "t.path + '.resourceClaims[' + string(i) + ']'"
    stable = stable_item("t.stable + '.resourceClaims'", "i", "x", "name")
    lets = (("n", f"size({named})"), ("w", "n == 2 ? 'both' : 'neither'"), ("S", source), ("K", moved), ("m", name))
    return [
        Finding("claim-source", loops, "n != 1 && !(n == 0 && size(K) == 1)", path, stable, "w", message, lets),
        Finding("claim-source", loops, "n == 0 && size(K) == 1", path, stable, lit("source"), moved_message, lets),
    ]


@native("undeclared-claim", fires=(CLAIMS_USED,))
def undeclared_claim(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    declared = _declared(r)
    listed = "(size(D) > 0 ? D.join(', ') : 'none')"
    name = "('name' in x ? x.name : null)"
    message = (f"'claim ' + {quoted('m')} + ' is not declared in ' + t.path + '.resourceClaims (declared: ' + "
               f"{listed} + ')'")
    claims = Each("x", r.claims(), "type(x) == map", "k")
    loops = (Each("t", "variables.templates", "t.dra"), *r.containers(LISTS_WITH_CLAIMS), claims)
    return [Finding("undeclared-claim", loops, "!(m in D)",
                    f"{Reads.PATH} + '.resources.claims[' + string(k) + '].name'",
                    stable_item(f"{r.stable} + '.resources.claims'", "k", "x", "name") + " + '.name'", plain("m"),
                    message, (("D", declared), ("m", name)))]


@native("unused-claim", fires=(CLAIMS_DECLARED,))
def unused_claim(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    claims = r.get("t.spec", "resourceClaims", "list", "[]")
    lists = f"[{r.get('t.spec', 'containers', 'list', '[]')}, {r.get('t.spec', 'initContainers', 'list', '[]')}]"
    is_map = "" if r.typed else "type(c) == map && "
    used = (f"{lists}.exists(L, L.exists(c, {is_map}{r.claims('c')}.exists(y, type(y) == map && 'name' in y && "
            f"y.name == x.name)))")
    first = f"{claims}.filter(y, type(y) == map && 'name' in y && y.name == x.name)[0] == x"
    message = ("'claim ' + " + quoted("x.name") + " + ' is declared but no container uses it; its devices would be "
               "allocated for nothing'")
    loops = (Each("t", "variables.templates", "t.dra"),
             Each("x", claims, "type(x) == map && 'name' in x && type(x.name) == string", "i"))
    return [Finding("unused-claim", loops, f"{first} && !{used}", "t.path + '.resourceClaims[' + string(i) + ']'",
                    "t.stable + '.resourceClaims[name=' + x.name + ']'", "x.name", message)]
