"""The DRA rules of ``webhook.rules.draobjects`` and ``webhook.rules.claims`` as findings: on ResourceClaims and
ResourceClaimTemplates themselves, and on the pod's own DRA fields (what needs no other object).

On a claim or a claim template, every finding starts from ``variables.requests``: the object's device requests as
records, ``claim_request.path`` and ``claim_request.stable`` (``spec.devices.requests[0]``, in a template under
``spec.spec``), and ``claim_request.devices``: what the request asks for, each ``{path, stable, body}``
(``exactly``, a v1beta1-shaped request itself, or every ``firstAvailable`` alternative), as
``webhook.rules.draobjects.check_claim_spec`` walks them. On a pod, from ``variables.templates``
(:mod:`webhook.native.reads`).
"""

from __future__ import annotations

from webhook.core.policy import Policy
from webhook.native import params
from webhook.native.celtext import boolean, every_policy, globs_regex, lit, matches, record
from webhook.native.findings import Each, Finding
from webhook.native.reads import LISTS_WITH_CLAIMS, Reads
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, plain, quoted, stable_item

REQUESTS = Each("claim_request", "variables.requests")
DEVICES = Each("device", "claim_request.devices")


def requests(root: str, two_variable: bool) -> str:
    """``variables.requests`` of ``root`` (``object`` or ``oldObject``)."""
    base = "(request.kind.kind == 'ResourceClaimTemplate' ? 'spec.spec' : 'spec')"
    spec = (f"(request.kind.kind == 'ResourceClaimTemplate' ? {root}.?spec.?spec.orValue({{}}) : "
            f"{root}.?spec.orValue({{}}))")
    items = "spec.?devices.?requests.orValue([])"
    where = "base + '.devices.requests[' + string(i) + ']'"
    stable = stable_item("base + '.devices.requests'", "i", "entry", "name")
    exactly = record(path=where + " + " + lit(".exactly"), stable=stable + " + " + lit(".exactly"),
                     body="entry.exactly")
    exact = f"[{exactly}]"
    plain = f"[{record(path=where, stable=stable, body='entry')}]"
    alternative = record(path=where + " + '.firstAvailable[' + string(j) + ']'",
                         stable=stable_item(stable + " + '.firstAvailable'", "j", "choice", "name"), body="choice")
    alternatives = "entry.?firstAvailable.orValue([])"
    if two_variable:
        subs = f"{alternatives}.transformList(j, choice, {alternative})"
    else:
        subs = f"{alternatives}.map(choice, [{alternatives}.indexOf(choice)].map(j, {alternative})[0])"
    devices = f"(has(entry.exactly) ? {exact} : has(entry.deviceClassName) ? {plain} : []) + {subs}"
    one = record(path=where, stable=stable, devices=devices)
    if two_variable:
        listed = f"{items}.transformList(i, entry, {one})"
    else:
        listed = f"{items}.map(entry, [{items}.indexOf(entry)].map(i, {one})[0])"
    return f"[{spec}].map(spec, [{base}].map(base, {listed})[0])[0]"


def _trusted(ctx: Ctx) -> str:
    """Whether the claim's namespace is trusted (``isolation.trusted``, ``isolation.platformNamespaces``): the
    platform's node agents there may take every device and watch devices in use."""
    return ctx.ns(lambda p: boolean(p.trusted), live="variables.trusted_namespace")


# The class a device request names (null when none).
DEVICE_CLASS = "device.body.?deviceClassName.orValue(null)"
# The devices a request counts (``clusterindex.device_count``: 1 when absent or not positive, as the apiserver
# defaults it).
DEVICE_COUNT = "(device.body.?count.orValue(0) > 0 ? device.body.count : 1)"


@native("device-class-not-allowed", claims=True)
def device_class_not_allowed(ctx: Ctx) -> list[Finding]:
    def allowed(policy: Policy) -> str:
        if not policy.allowed_device_classes:
            return "true"
        return matches("device_class", globs_regex(policy.allowed_device_classes))
    if all(allowed(p) == "true" for p in every_policy(ctx.policies)):
        return []
    listed = ctx.compiled(lambda p: lit(", ".join(p.allowed_device_classes)))
    message = f"'device class ' + {quoted('device_class')} + ' is not allowed here (allowed: ' + {listed} + ')'"
    return [Finding("device-class-not-allowed", (REQUESTS, DEVICES),
                    f"device_class != null && !{ctx.compiled(allowed)}",
                    "device.path + '.deviceClassName'", "device.stable + '.deviceClassName'", "device_class", message,
                    (("device_class", DEVICE_CLASS),))]


@native("allocation-mode-all", claims=True)
def allocation_mode_all(ctx: Ctx) -> list[Finding]:
    message = lit("allocationMode: All takes every matching device on the node (and fails while any is in use); "
                  "ask for a count instead")
    # draobjects.check_allocation_mode: not with adminAccess (an admin-access allocation holds no device), nor where
    # the platform's agents are trusted
    where = (f"device.body.?allocationMode.orValue('') == 'All' && device.body.?adminAccess.orValue(false) != true && "
             f"!{_trusted(ctx)}")
    return [Finding("allocation-mode-all", (REQUESTS, DEVICES), where,
                    "device.path + '.allocationMode'", "device.stable + '.allocationMode'", lit("All"), message)]


@native("admin-access", claims=True)
def admin_access(ctx: Ctx) -> list[Finding]:
    namespaces = ctx.policy.admin_access_namespaces
    allowed = matches("request.namespace", globs_regex(namespaces)) if namespaces else "false"
    allowed = f"({allowed} || {_trusted(ctx)})" if _trusted(ctx) != "false" else allowed
    listed = ", ".join(namespaces) or "none"
    intro = lit("adminAccess gives access to devices in use by other pods; it is allowed only in the namespaces "
                "the webhook policy names (dra.adminAccessNamespaces: " + listed + "), not in ")
    message = f"{intro} + '\"' + request.namespace + '\"'"
    return [Finding("admin-access", (REQUESTS, DEVICES),
                    f"device.body.?adminAccess.orValue(false) == true && !{allowed}",
                    "device.path + '.adminAccess'", "device.stable + '.adminAccess'", lit("true"), message)]


@native("blanket-device-toleration", claims=True)
def blanket_device_toleration(ctx: Ctx) -> list[Finding]:
    key_set = "toleration.?key.orValue('') != ''"
    effect = "toleration.?effect.orValue('')"
    blanket = f"(!({key_set}) && toleration.?operator.orValue('') == 'Exists')"
    trusted = _trusted(ctx)
    tolerations = Each("toleration", "device.body.?tolerations.orValue([])",
                       "" if trusted == "false" else f"!{trusted}", "i")
    path = "device.path + '.tolerations[' + string(i) + ']'"
    stable = stable_item("device.stable + '.tolerations'", "i", "toleration", "key")
    key_shown = f"({key_set} ? toleration.key : '*')"
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
    count = DEVICE_COUNT
    message = (f"string(count) + ' devices of class ' + device_class + ' are over the limit of ' + string({cap}) + "
               f"' {scope}'")
    where = (f"device_class != null && {matches('device_class', globs_regex(classes))} && "
             f"device.body.?allocationMode.orValue('') != 'All' && {cap} != 0 && count > {cap}")
    return [Finding(rule, (REQUESTS, DEVICES), where, "device.path + '.count'", "device.stable + '.count'",
                    "string(count)", message, (("device_class", DEVICE_CLASS), ("count", count)))]


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
    claims = r.get("pod.spec", "resourceClaims", "list", "[]")
    if r.typed:
        return f"{claims}.map(claim, claim.name)"
    return (f"{claims}.filter(claim, type(claim) == map && 'name' in claim && type(claim.name) == string)"
            f".map(claim, claim.name)")


@native("node-name-with-gpus",
        fires=(Trigger("template", "has(pod.spec.nodeName) && pod.spec.nodeName != ''", "node-name"),))
def node_name_with_gpus(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    node = r.get("pod.spec", "nodeName", "string", "''")
    lost = "(pod.declares ? 'its claims are never allocated' : 'no GPU capacity is checked')"
    message = (f"'nodeName ' + node + ' bypasses the scheduler, so ' + {lost} + '; use nodeSelector "
               f"kubernetes.io/hostname: ' + node")
    return [Finding("node-name-with-gpus", (Each("pod", "variables.templates", "!pod.trusted"),),
                    "node != '' && (pod.uses || pod.declares)", "pod.path + '.nodeName'",
                    "pod.stable + '.nodeName'", "node", message, (("node", node),))]


def _truthy(field: str) -> str:
    return (f"({lit(field)} in claim && claim.{field} != null && claim.{field} != '' && claim.{field} != false && "
            f"claim.{field} != 0)")


CLAIMS_USED = Trigger("container", "field != 'ephemeralContainers' && has(container.resources) && "
                                   "has(container.resources.claims) && size(container.resources.claims) > 0", "claims")
CLAIMS_DECLARED = Trigger("template", "has(pod.spec.resourceClaims) && size(pod.spec.resourceClaims) > 0",
                          "declared-claims")


@native("claim-source", fires=(CLAIMS_USED, CLAIMS_DECLARED))
def claim_source(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    claims = r.get("pod.spec", "resourceClaims", "list", "[]")
    named = f"[{_truthy('resourceClaimName')}, {_truthy('resourceClaimTemplateName')}].filter(named, named)"
    name = "('name' in claim ? claim.name : null)"
    # claims.moved_source: the keys the pre-1.31 source: names as non-empty strings; one of them is told to move up.
    source = "('source' in claim && type(claim.source) == map ? claim.source : {})"
    moved = ("['resourceClaimName', 'resourceClaimTemplateName'].filter(key, key in source && "
             "type(source[key]) == string && source[key] != '')")
    message = (f"'claim ' + {quoted('claim_name')} + ' names ' + which + ' of resourceClaimName and "
               f"resourceClaimTemplateName; exactly one is required'")
    moved_message = (f"'claim ' + {quoted('claim_name')} + ' uses source:, the pre-1.31 form Kubernetes removed; move "
                     f"the name up into the entry: ' + moved[0] + ': ' + source[moved[0]]")
    loops = (Each("pod", "variables.templates", "pod.dra"), Each("claim", claims, "type(claim) == map", "i"))
    path = "pod.path + '.resourceClaims[' + string(i) + ']'"
    stable = stable_item("pod.stable + '.resourceClaims'", "i", "claim", "name")
    lets = (("names", f"size({named})"), ("which", "names == 2 ? 'both' : 'neither'"), ("source", source),
            ("moved", moved), ("claim_name", name))
    return [
        Finding("claim-source", loops, "names != 1 && !(names == 0 && size(moved) == 1)", path, stable, "which",
                message, lets),
        Finding("claim-source", loops, "names == 0 && size(moved) == 1", path, stable, lit("source"),
                moved_message, lets),
    ]


@native("undeclared-claim", fires=(CLAIMS_USED,))
def undeclared_claim(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    declared = _declared(r)
    listed = "(size(declared) > 0 ? declared.join(', ') : 'none')"
    name = "('name' in claim ? claim.name : null)"
    message = (f"'claim ' + {quoted('claim_name')} + ' is not declared in ' + pod.path + "
               f"'.resourceClaims (declared: ' + {listed} + ')'")
    claims = Each("claim", r.claims(), "type(claim) == map", "position")
    loops = (Each("pod", "variables.templates", "pod.dra"), *r.containers(LISTS_WITH_CLAIMS), claims)
    return [Finding("undeclared-claim", loops, "!(claim_name in declared)",
                    f"{Reads.PATH} + '.resources.claims[' + string(position) + '].name'",
                    stable_item(f"{r.stable} + '.resources.claims'", "position", "claim", "name") + " + '.name'",
                    plain("claim_name"), message, (("declared", declared), ("claim_name", name)))]


@native("unused-claim", fires=(CLAIMS_DECLARED,))
def unused_claim(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    claims = r.get("pod.spec", "resourceClaims", "list", "[]")
    lists = f"[{r.get('pod.spec', 'containers', 'list', '[]')}, {r.get('pod.spec', 'initContainers', 'list', '[]')}]"
    is_map = "" if r.typed else "type(container) == map && "
    used = (f"{lists}.exists(containers, containers.exists(container, {is_map}{r.claims('container')}.exists(use, "
            f"type(use) == map && 'name' in use && use.name == claim.name)))")
    first = f"{claims}.filter(use, type(use) == map && 'name' in use && use.name == claim.name)[0] == claim"
    message = ("'claim ' + " + quoted("claim.name") + " + ' is declared but no container uses it; its devices would be "
               "allocated for nothing'")
    loops = (Each("pod", "variables.templates", "pod.dra"),
             Each("claim", claims, "type(claim) == map && 'name' in claim && type(claim.name) == string", "i"))
    return [Finding("unused-claim", loops, f"{first} && !{used}", "pod.path + '.resourceClaims[' + string(i) + ']'",
                    "pod.stable + '.resourceClaims[name=' + claim.name + ']'", "claim.name", message)]
