"""The Pod mutations (``webhook.rules.mutate.pod_patch``) as JSONPatch expressions of a MutatingAdmissionPolicy.

JSONPatch, not ApplyConfiguration: ``spec.nodeSelector`` and ``spec.tolerations`` are atomic, and an
ApplyConfiguration may not change an atomic field ("may not mutate atomic arrays, maps or structs").
Each mutation adds what is absent and nothing else, like the webhook's, so the order of the four does not
matter and a second pass changes nothing. They read the pod variables of ``webhook.native.pods``.

Not here: GPU requests copied from limits (the apiserver's Pod defaulting copies every limit into a missing
request before admission, so there is nothing left to copy), and, with ``cluster.enabled``, the runtime
class (the webhook injects it only when the RuntimeClass exists and agrees with the pod's selector, which
CEL cannot read).
"""

from __future__ import annotations

from webhook.core.policy import Policy
from webhook.native.celtext import boolean, lit, lits
from webhook.native.pods import VISIBLE_DEVICES
from webhook.native.snippets import Ctx, guarded


def _escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def used(ctx: Ctx) -> str:
    """``mutate.default_requests``' ``used``: GPU names in the limits or requests of containers and init
    containers whose count is not a valid 0 (an invalid count still asks for the device)."""
    parts = [f"E.{f}.filter(k, E.{f}[k].g && !E.{f}[k].z)" for f in ("l", "r")]
    return (f"{ctx.v('ctr')}.transformList(j, r, r.l != 'ephemeralContainers', [{ctx.v('ent')}[j]].map(E, "
            f"{' + '.join(parts)})[0]).flatten().distinct()")


def _affinity_names(label: str) -> str:
    spec = "object.spec"
    affinity = guarded(spec, "affinity", "map", "{}")
    node = guarded(affinity, "nodeAffinity", "map", "{}")
    required = guarded(node, "requiredDuringSchedulingIgnoredDuringExecution", "map", "{}")
    terms = guarded(required, "nodeSelectorTerms", "list", "[]")
    return (f"{terms}.exists(term, {guarded('term', 'matchExpressions', 'list', '[]')}.exists(x, type(x) == map && "
            f"'key' in x && x.key == {lit(label)}))")


def accelerator(ctx: Ctx) -> str | None:
    """``mutate.inject_accelerator``: the annotation's accelerator, else the default, if allowed; never over an
    existing key or a required node affinity on the label."""
    if not any(p.default for p in _policies(ctx)) and not ctx.policy.annotation:
        return None
    label, annotation = ctx.policy.node_label, ctx.policy.annotation
    annotations = guarded("object.metadata", "annotations", "map", "{}")
    value = f"{annotations}[{lit(annotation)}]"
    default = ctx.ns(lambda p: lit(p.default))
    asked = f"({lit(annotation)} in {annotations} && type({value}) == string && {value} != '' ? {value} : {default})"
    allowed = ctx.ns(lambda p: lits(p.allowed))
    selector = "object.spec.nodeSelector"
    free = (f"!(has(object.spec.nodeSelector) && {lit(label)} in {selector}) && !{_affinity_names(label)}")
    whole = f"JSONPatch{{op: 'add', path: '/spec/nodeSelector', value: {{{lit(label)}: v}}}}"
    one = f"JSONPatch{{op: 'add', path: {lit('/spec/nodeSelector/' + _escape_pointer(label))}, value: v}}"
    return (f"size({ctx.v('used')}) > 0 ? [{asked}].filter(v, v != '' && (size({allowed}) == 0 || v in {allowed}) && "
            f"{free}).map(v, has(object.spec.nodeSelector) ? {one} : {whole}) : []")


def _tolerated_by(taint: str, x: str) -> str:
    """``Taint.tolerated_by``: the toleration ``x`` tolerates the taint record ``taint`` ({key, value?, effect?})."""
    effect = (f"(!('effect' in {x}) || {x}.effect == '' || {x}.effect == null || !('effect' in {taint}) || "
              f"{x}.effect == {taint}.effect)")
    operator = f"('operator' in {x} && {x}.operator != '' && {x}.operator != null ? {x}.operator : 'Equal')"
    keyless = f"(!('key' in {x}) || {x}.key == '' || {x}.key == null)"
    return (f"({effect} && ({keyless} ? {operator} == 'Exists' : {x}.key == {taint}.key && ({operator} == 'Exists' || "
            f"('value' in {taint} && 'value' in {x} && {x}.value == {taint}.value))))")


def tolerations(ctx: Ctx) -> str | None:
    """``mutate.add_tolerations``: one toleration per ``gpuTaints`` entry, else per GPU resource used, unless
    already tolerated."""
    if not any(p.tolerations for p in _policies(ctx)):
        return None
    on = ctx.ns(lambda p: boolean(p.tolerations))
    taints = ctx.policy.gpu_taints
    if taints:
        records = []
        for taint in taints:
            fields = {"key": taint.key}
            if taint.value is not None:
                fields["value"] = taint.value
            if taint.effect is not None:
                fields["effect"] = taint.effect
            toleration = taint.toleration()
            records.append("{'t': {" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in fields.items()) + "}, 'o': {"
                           + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in toleration.items()) + "}}")
        candidates = "[" + ", ".join(records) + "]"
    else:
        candidates = (f"{ctx.v('used')}.sort().map(n, {{'t': {{'key': string(n), 'effect': 'NoSchedule'}}, "
                      f"'o': {{'key': string(n), 'operator': 'Exists', 'effect': 'NoSchedule'}}}})")
    present = "(has(object.spec.tolerations) ? object.spec.tolerations : [])"
    added = f"{candidates}.filter(c, !{present}.exists(x, type(x) == map && {_tolerated_by('c.t', 'x')})).map(c, c.o)"
    return (f"{on} && size({ctx.v('used')}) > 0 ? [{added}].filter(a, size(a) > 0).map(a, "
            f"has(object.spec.tolerations) ? a.map(o, JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: o}}) : "
            f"[JSONPatch{{op: 'add', path: '/spec/tolerations', value: a}}]).flatten() : []")


def hide_gpus(ctx: Ctx) -> str | None:
    """``mutate.hide_gpus``: NVIDIA_VISIBLE_DEVICES=void (or none) on every container and init container that
    holds no GPU, unless it names the variable itself; never in a fractional scheduler's or a trusted pod."""
    if all(p.hide_gpus not in ("void", "none") for p in _policies(ctx)):
        return None
    value = ctx.ns(lambda p: lit(p.hide_gpus if p.hide_gpus in ("void", "none") else ""))
    px = f"{ctx.v('px')}[0]"
    env = guarded("r.c", "env", "list", "null")
    variable = f"{{'name': {lit(VISIBLE_DEVICES)}, 'value': {value}}}"
    patch = (f"{env} == null ? JSONPatch{{op: 'add', path: '/spec/' + r.l + '/' + string(r.i) + '/env', "
             f"value: [{variable}]}} : JSONPatch{{op: 'add', path: '/spec/' + r.l + '/' + string(r.i) + '/env/-', "
             f"value: {variable}}}")
    holds = f"({px}.frac || {ctx.v('gx')}[j].holds)"
    names = f"{env} != null && {env}.exists(e, type(e) == map && 'name' in e && e.name == {lit(VISIBLE_DEVICES)})"
    return (f"{value} != '' && !{px}.frac && !{px}.trusted ? {ctx.v('ctr')}.transformList(j, r, "
            f"r.l != 'ephemeralContainers' && !{holds} && !({names}), {patch}) : []")


def runtime_class(ctx: Ctx) -> str | None:
    """``mutate.inject_runtime_class`` without the cluster view: isolation.runtimeClass on GPU pods (a counted
    GPU, no fractional scheduler) that name none."""
    if not any(p.runtime_class for p in _policies(ctx)) or ctx.policy.cluster_enabled:
        return None
    name = ctx.ns(lambda p: lit(p.runtime_class))
    px = f"{ctx.v('px')}[0]"
    return (f"{name} != '' && !has(object.spec.runtimeClassName) && {px}.counted && !{px}.frac ? "
            f"[JSONPatch{{op: 'add', path: '/spec/runtimeClassName', value: {name}}}] : []")


MUTATIONS = {
    "accelerator": accelerator,
    "tolerations": tolerations,
    "hideGpus": hide_gpus,
    "runtimeClass": runtime_class,
}


def _policies(ctx: Ctx) -> list[Policy]:
    return [ctx.policies.default, *ctx.policies.by_namespace.values()]


def matters(ctx: Ctx) -> str:
    """``matchConditions`` of the MutatingAdmissionPolicy: a pod with an extended resource in a container or init
    container (every GPU name has a domain), or any pod where ``hideGpus`` applies; the rest skip it."""
    hidden = ctx.ns(lambda p: boolean(p.hide_gpus in ("void", "none")))
    extended = " || ".join(f"(has(c.resources.{s}) && c.resources.{s}.exists(k, k.contains('/')))"
                           for s in ("limits", "requests"))
    gpu = (f"['containers', 'initContainers'].exists(l, l in object.spec && object.spec[l].exists(c, "
           f"has(c.resources) && ({extended})))")
    return gpu if hidden == "false" else f"{hidden} || {gpu}"
