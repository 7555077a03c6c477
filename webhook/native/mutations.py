"""The Pod mutations (``webhook.rules.mutate.pod_patch``) as JSONPatch expressions of a MutatingAdmissionPolicy.

JSONPatch, not ApplyConfiguration: ``spec.nodeSelector`` and ``spec.tolerations`` are atomic, and an
ApplyConfiguration may not change an atomic field ("may not mutate atomic arrays, maps or structs").
Each mutation adds what is absent and nothing else, like the webhook's, so their order does not matter and
a second pass changes nothing.

A MutatingAdmissionPolicy exists from Kubernetes 1.34 (``v1beta1``), whose CEL has two-variable
comprehensions; the expressions need nothing newer.

Not here: GPU requests copied from limits (the apiserver's Pod defaulting copies every limit into a missing
request before admission, so there is nothing left to copy). With ``cluster.enabled``, the runtime class is injected
only where the cluster's facts (``status.cluster``, read live) say the RuntimeClass exists and agrees with the pod's
selector, as the webhook does with its view; inline policies cannot read them, and leave the mutation to the webhook.
The accelerator and tolerations of a pod that asks for GPUs through claims alone need the claims, which no policy
reads: with ``cluster.enabled`` the webhook mutates such pods.
"""

from __future__ import annotations

from collections.abc import Callable

from webhook.core.resources import FRACTION_ANNOTATIONS, VISIBLE_DEVICES
from webhook.native import params
from webhook.native.celtext import boolean, lit, lits, matches
from webhook.native.reads import trusted
from webhook.native.snippets import SCHEDULER, Ctx, holds_gpu, holds_name, is_gpu, is_zero, ranked

SPEC = "object.spec"
# The containers and init containers of the Pod (ephemeral containers are never mutated).
LISTS = ("containers", "initContainers")


def _escape_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _names(container: str, ctx: Ctx) -> str:
    """A container's GPU names whose value is not a valid 0 (an invalid count still asks for the device), each once."""
    def used(section: str) -> str:
        m = f"{container}.?resources.?{section}.orValue({{}})"
        return f"{m}.filter(name, name.contains('/') && {is_gpu(ctx, 'name')} && !{is_zero(f'{m}[name]')})"
    return f"[{used('limits')}].map(limited, limited + {used('requests')}.filter(name, !(name in limited)))[0]"


def variables(ctx: Ctx) -> list[tuple[str, str]]:
    """The variables the mutations read: ``used`` (``mutate.default_requests``' GPU names, each once, sorted;
    the tolerations name them), ``gpu`` (some container asks for one), ``fractional`` and ``trusted``; and, where a
    mutation reads it, :data:`INJECTED` (:func:`_injected`)."""
    containers = "object.spec.?containers.orValue([])"
    inits = "object.spec.?initContainers.orValue([])"
    if ctx.lists:
        names_of = _names("container", ctx)
        every = f"[{containers}.map(container, {names_of}), {inits}.map(container, {names_of})]"
        names = f"{every}.flatten().flatten().distinct().sort()"
    else:
        # Each name at the first container (in list order) that asks for it; Pod container names are unique.
        first = (f"[{containers}.map(container, {_names('container', ctx)}.filter(name, !{containers}.exists(earlier, "
                 f"{containers}.indexOf(earlier) < {containers}.indexOf(container) && "
                 f"name in {_names('earlier', ctx)})))"
                 f", {inits}.map(container, {_names('container', ctx)}.filter(name, "
                 f"!{containers}.exists(earlier, name in {_names('earlier', ctx)}) && "
                 f"!{inits}.exists(earlier, {inits}.indexOf(earlier) < {inits}.indexOf(container) && "
                 f"name in {_names('earlier', ctx)})))]")
        # Joined and split again (a resource name has no comma): one flat list, then sorted by rank.
        flat = (f"{first}.map(containers, containers.map(names, names.join(',')).filter(text, text != '').join(','))"
                f".filter(text, text != '').join(',')")
        unsorted = f"[{flat}].map(text, text == '' ? [] : text.split(','))[0]"
        names = ranked(unsorted)
    annotations = "object.metadata.?annotations.orValue({})"
    scheduler = (f"[{containers}, {inits}, object.spec.?ephemeralContainers.orValue([])]"
                 f".exists(containers, containers.exists(container, "
                 + " || ".join(f"container.?resources.?{s}.orValue({{}}).exists(name, name.contains('/') && "
                               f"{matches('name', SCHEDULER)} && !{is_zero(f'container.resources.{s}[name]')})"
                               for s in ("limits", "requests")) + "))")
    fractional = f"({scheduler} || {lits(FRACTION_ANNOTATIONS)}.exists(annotation, annotation in {annotations}))"
    # Whether any container asks for a GPU: stops at the first; the names themselves only for the tolerations.
    gpu = (f"[{containers}, {inits}].exists(containers, containers.exists(container, " + " || ".join(
        f"container.?resources.?{s}.orValue({{}}).exists(name, name.contains('/') && {is_gpu(ctx, 'name')} && "
        f"!{is_zero(f'container.resources.{s}[name]')})" for s in ("limits", "requests")) + "))")
    out = [("used", names), ("gpu", gpu), ("fractional", fractional), ("trusted", trusted(ctx, SPEC))]
    if accelerator(ctx) is not None or (runtime_class(ctx) is not None and ctx.policy.cluster_enabled):
        out.append((INJECTED, _injected(ctx)))  # the accelerator patch and, with the facts, the class's fit read it
    return out


INJECTED = "injected_accelerator"


def _injected(ctx: Ctx) -> str:
    """The accelerator ``inject_accelerator`` adds, as a list of none or one: the annotation's, else the default, if
    allowed; never over an existing key or a required node affinity on the label."""
    label, annotation = ctx.policy.node_label, ctx.policy.annotation
    default = ctx.ns(lambda p: lit(p.default), live=params.of("default"))
    asked = f"object.metadata.?annotations[?{lit(annotation)}].orValue('')"
    asked = f"({asked} != '' ? {asked} : {default})"
    allowed = ctx.ns(lambda p: lits(p.allowed), live=params.of("allowed"))
    terms = ("object.spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution.?nodeSelectorTerms"
             ".orValue([])")
    by_affinity = (f"{terms}.exists(term, term.?matchExpressions.orValue([]).exists(requirement, "
                   f"requirement.key == {lit(label)}))")
    free = f"!({lit(label)} in object.spec.?nodeSelector.orValue({{}})) && !{by_affinity}"
    return f"[{asked}].filter(model, model != '' && (size({allowed}) == 0 || model in {allowed}) && {free})"


def accelerator(ctx: Ctx) -> str | None:
    """``mutate.inject_accelerator``: :func:`_injected` (a variable) into the pod's nodeSelector, on a pod that asks
    for GPUs."""
    if not ctx.any(lambda p: p.default) and not ctx.policy.annotation:
        return None
    label = ctx.policy.node_label
    whole = f"JSONPatch{{op: 'add', path: '/spec/nodeSelector', value: {{{lit(label)}: model}}}}"
    one = f"JSONPatch{{op: 'add', path: {lit('/spec/nodeSelector/' + _escape_pointer(label))}, value: model}}"
    return f"variables.gpu ? variables.{INJECTED}.map(model, has(object.spec.nodeSelector) ? {one} : {whole}) : []"


def _tolerated_by(taint: str, x: str) -> str:
    """``Taint.tolerated_by``: the toleration ``x`` tolerates the taint record ``taint`` ({key, value?, effect?})."""
    effect = f"({x}.?effect.orValue('') == '' || !('effect' in {taint}) || {x}.effect == {taint}.effect)"
    operator = f"({x}.?operator.orValue('') != '' ? {x}.operator : 'Equal')"
    keyless = f"({x}.?key.orValue('') == '')"
    return (f"({effect} && ({keyless} ? {operator} == 'Exists' : {x}.key == {taint}.key && ({operator} == 'Exists' || "
            f"('value' in {taint} && {x}.?value.orValue('') == {taint}.value))))")


def tolerations(ctx: Ctx) -> str | None:
    """``mutate.add_tolerations``: one toleration per ``gpuTaints`` entry, else per GPU resource used, unless
    already tolerated."""
    if not ctx.any(lambda p: p.tolerations):
        return None
    on = ctx.ns(lambda p: boolean(p.tolerations), live=params.of("tolerations"))
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
            records.append("{'taint': {" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in fields.items())
                           + "}, 'toleration': {"
                           + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in toleration.items()) + "}}")
        candidates = "[" + ", ".join(records) + "]"
    else:
        candidates = ("variables.used.map(name, {'taint': {'key': string(name), 'effect': 'NoSchedule'}, "
                      "'toleration': {'key': string(name), 'operator': 'Exists', 'effect': 'NoSchedule'}})")
    present = "object.spec.?tolerations.orValue([])"
    added = (f"{candidates}.filter(candidate, !{present}.exists(present, "
             f"{_tolerated_by('candidate.taint', 'present')})).map(candidate, candidate.toleration)")
    return (f"{on} && variables.gpu ? [{added}].map(added, size(added) == 0 ? [] : has(object.spec.tolerations) ? "
            f"added.map(toleration, JSONPatch{{op: 'add', path: '/spec/tolerations/-', value: toleration}}) : "
            f"[JSONPatch{{op: 'add', path: '/spec/tolerations', value: added}}])[0] : []")


def _holds(ctx: Ctx, c: str) -> str:
    def held(section: str) -> tuple[str, str]:
        return (f"{c}.?resources.?{section}.orValue({{}})",
                f"name.contains('/') && {holds_name(ctx, 'name')} && !{is_zero(f'{c}.resources.{section}[name]')}")
    return holds_gpu(held, f"{c}.?resources.?claims.orValue([])")


def hide_gpus(ctx: Ctx) -> str | None:
    """``mutate.hide_gpus``: NVIDIA_VISIBLE_DEVICES=void (or none) on every container and init container that
    holds no GPU, unless it names the variable itself; never in a fractional scheduler's or a trusted pod."""
    if not ctx.any(lambda p: p.hide_gpus in ("void", "none")):
        return None
    value = ctx.ns(lambda p: lit(p.hide_gpus if p.hide_gpus in ("void", "none") else ""),
                   live=f"({params.of('hideGpus')} in ['void', 'none'] ? {params.of('hideGpus')} : '')")
    variable = f"{{'name': {lit(VISIBLE_DEVICES)}, 'value': {value}}}"
    parts = []
    for name in LISTS:
        base = f"'/spec/{name}/' + string(i)"
        patch = (f"has(container.env) ? JSONPatch{{op: 'add', path: {base} + '/env/-', value: {variable}}} : "
                 f"JSONPatch{{op: 'add', path: {base} + '/env', value: [{variable}]}}")
        names = f"container.?env.orValue([]).exists(env, env.name == {lit(VISIBLE_DEVICES)})"
        parts.append(f"object.spec.?{name}.orValue([]).transformList(i, container, !{_holds(ctx, 'container')} && "
                     f"!{names}, {patch})")
    return (f"{value} != '' && !variables.fractional && !variables.trusted ? " + " + ".join(parts) + " : []")


def _class_fits(ctx: Ctx, name: str) -> str:
    """``inject_runtime_class`` knowing the RuntimeClasses (the facts count and hold the section whole): only a class
    that exists and whose ``scheduling.nodeSelector`` agrees with the pod's, with the accelerator this policy adds
    (``isolation.runtime_class_conflicts``); not knowing them, any."""
    classes = f"{params.FACTS}.runtimeClasses"
    wanted = f"{classes}[{name}].?nodeSelector.orValue({{}})"
    selector = "object.spec.?nodeSelector.orValue({})"
    label = lit(ctx.policy.node_label)
    conflict = (f"{wanted}.exists(key, key in {selector} ? {selector}[key] != {wanted}[key] : "
                f"key == {label} && variables.{INJECTED}.exists(model, model != {wanted}[key]))")
    return f"(!({params.facts_section('runtimeClasses')}) || ({name} in {classes} && !({conflict})))"


def runtime_class(ctx: Ctx) -> str | None:
    """``mutate.inject_runtime_class``: isolation.runtimeClass on GPU pods (a counted GPU, no fractional scheduler)
    that name none; with ``cluster.enabled``, as the facts allow (:func:`_class_fits`)."""
    if not ctx.any(lambda p: p.runtime_class) or (ctx.policy.cluster_enabled and not ctx.live):
        return None
    name = ctx.ns(lambda p: lit(p.runtime_class), live=params.of("runtimeClass"))
    fits = f" && {_class_fits(ctx, name)}" if ctx.policy.cluster_enabled else ""
    return (f"{name} != '' && !has(object.spec.runtimeClassName) && variables.gpu && "
            f"!variables.fractional{fits} ? "
            f"[JSONPatch{{op: 'add', path: '/spec/runtimeClassName', value: {name}}}] : []")


MUTATIONS: dict[str, Callable[[Ctx], str | None]] = {
    "accelerator": accelerator,
    "tolerations": tolerations,
    "hideGpus": hide_gpus,
    "runtimeClass": runtime_class,
}


def matters(ctx: Ctx) -> str:
    """``matchConditions`` of the MutatingAdmissionPolicy: any pod where ``hideGpus`` applies; else a pod with an
    extended resource in a container or init container (every GPU name has a domain) to which a mutation can apply:
    a default accelerator, tolerations or a runtimeClass in its namespace, or the accelerator annotation. The rest
    skip it."""
    hidden = ctx.ns(lambda p: boolean(p.hide_gpus in ("void", "none")),
                    live=f"{params.expression('hideGpus')} in ['void', 'none']")
    extended = " || ".join(f"container.?resources.?{s}.orValue({{}}).exists(name, name.contains('/'))"
                           for s in ("limits", "requests"))
    gpu = (f"[object.spec.?containers.orValue([]), object.spec.?initContainers.orValue([])]"
           f".exists(containers, containers.exists(container, {extended}))")
    runtime = not ctx.policy.cluster_enabled or ctx.live
    live = f"{params.expression('default')} != '' || {params.expression('tolerations')}" + (
        f" || {params.expression('runtimeClass')} != ''" if runtime else "")
    adds = ctx.ns(lambda p: boolean(bool(p.default) or p.tolerations or (runtime and bool(p.runtime_class))),
                  live=f"({live})")
    asked = f"{lit(ctx.policy.annotation)} in object.metadata.?annotations.orValue({{}})"
    wanted = {"true": "", "false": f"{asked} && "}.get(adds, f"({adds} || {asked}) && ")
    return f"{wanted}{gpu}" if hidden == "false" else f"{hidden} || {wanted}{gpu}"
