"""The pod-template rules of ``webhook.rules.pods`` as findings: quantities and caps, the accelerator, odd shapes,
ephemeral containers and pod-level resources.

Every finding reads the templates as :mod:`webhook.native.reads` describes them.
"""

from __future__ import annotations

from webhook.native import params
from webhook.native.celtext import lit, lits, matches
from webhook.native.findings import Each, Finding
from webhook.native.reads import TEMPLATES, Reads, held_counts, per_name, selector_path
from webhook.native.registry import NEVER, Trigger, native
from webhook.native.snippets import DIGITS, Ctx, about, count, is_gpu, quoted, type_name


def _cap(ctx: Ctx, attribute: str) -> str:
    return ctx.ns(lambda p: str(getattr(p, attribute)),
                  live=params.of({"per_container": "perContainer", "per_pod": "perPod"}[attribute]))


# --- the quantity rules --------------------------------------------------------------------------------------
# A Pod's and a built-in template's quantities are canonical: a count of at most six digits is whole, not negative
# and sensible.


def _odd_count(ctx: Ctx) -> str:
    """A count that is no plain count of at most six digits (or is over the cap per container)."""
    cap = ctx.ns(lambda p: str(p.per_container), live=params.expression("perContainer"))
    over_cap = f" || ({cap} != 0 && int(value) > {cap})" if ctx.any(lambda p: p.per_container) else ""
    return f"!{matches('value', DIGITS)}{over_cap}"


ODD_COUNT = Trigger("name", _odd_count, "count")


@native("invalid-quantity", fires=(ODD_COUNT,))
def invalid_quantity(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    return per_name(r, "invalid-quantity", ("limits", "requests"), "name in variables.gpus", "error != ''",
                    f"{r.label} + ': ' + error", r.about("value"), (("error", r.error("value")),), template="pod.uses")


@native("requests-without-limits", fires=(NEVER,), custom_only=True)
def requests_without_limits(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + name + ' is requested without a limit, set it in limits "
               f"(requests default to limits)'")
    return per_name(r, "requests-without-limits", ("requests",),
                    f"name in variables.gpus && !(name in {r.section('limits')})", "", message, r.about("value"),
                    template="pod.uses")


@native("requests-differ", fires=(NEVER,), custom_only=True)
def requests_differ(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + name + ' requests (' + {r.about('value')} + ') must equal limits (' + "
               f"{r.about('limit')} + ')'")
    return per_name(r, "requests-differ", ("requests",), f"name in variables.gpus && name in {r.section('limits')}",
                    f"{r.valid('value')} && {r.valid('limit')} && {count('value')} != {count('limit')}", message,
                    f"string({count('value')}) + ' != ' + string({count('limit')})",
                    (("limit", f"{r.section('limits')}[name]"),), template="pod.uses")


@native("per-container-limit", fires=(ODD_COUNT,))
def per_container_limit(ctx: Ctx) -> list[Finding]:
    if not ctx.any(lambda p: p.per_container):
        return []
    r = Reads(ctx)
    cap = _cap(ctx, "per_container")
    message = (f"{r.label} + ': ' + string(count) + ' ' + name + ' is over the limit of ' + string({cap}) + "
               f"' per container'")
    return per_name(r, "per-container-limit", ("limits",), "name in variables.gpus", f"count > {cap}", message,
                    "string(count)", (("count", f"{r.valid('value')} ? {count('value')} : 0"),),
                    template=f"{cap} != 0 && pod.uses")


def _effective(container: str, name: str) -> str:
    """The count the scheduler holds for ``name`` in a ``pod.gpuCounts`` entry."""
    return f"([0] + {container}.counts.filter(counted, counted.name == {name}).map(counted, counted.count)).sum()"


# Each GPU name ``gpu.name`` once: at the first container of ``pod.gpuCounts`` (app containers, then init containers)
# that counts it, where the pod's total of it is summed.
FIRST_COUNTED = ("!pod.gpuCounts.exists(other, (other.list == container.list ? other.pos < container.pos : "
                 "other.list == 'containers') && other.counts.exists(counted, counted.name == gpu.name))")


def total(name: str) -> str:
    """``pod_gpu_totals`` of ``name`` in template ``pod``: app containers and sidecars together, or an init container
    with the sidecars started before it, whichever is larger."""
    running = (f"([0] + pod.gpuCounts.filter(entry, entry.list == 'containers' || entry.sidecar)"
               f".map(entry, {_effective('entry', name)})).sum()")
    before = (f"([0] + pod.gpuCounts.filter(earlier, earlier.sidecar && earlier.pos < init.pos)"
              f".map(earlier, {_effective('earlier', name)})).sum()")
    peaks = (f"pod.gpuCounts.filter(init, init.list == 'initContainers' && !init.sidecar)"
             f".map(init, {_effective('init', name)} + {before})")
    return f"([{running}] + {peaks}).max()"


def plain_sum(ctx: Ctx) -> str:
    """Template ``pod``'s GPU counts, every plain count of every container summed: never less than any name's total;
    other spellings are the count trigger's."""
    limits = "container.resources.limits"
    each = (f"has(container.resources) && has({limits}) ? ([0] + {limits}.filter(name, {is_gpu(ctx, 'name')} && "
            f"{matches(limits + '[name]', DIGITS)}).map(name, int({limits}[name]))).sum() : 0")
    return (f"([0] + {lits(('containers', 'initContainers'))}"
            f".map(field, field in pod.spec ? ([0] + pod.spec[field].map(container, {each})).sum() : 0)).sum()")


def _pod_over_cap(ctx: Ctx) -> str:
    """The pod's GPU counts (:func:`plain_sum`) over the cap."""
    per_pod = ctx.ns(lambda p: str(p.per_pod), live=params.expression("perPod"))
    return f"{per_pod} != 0 && {plain_sum(ctx)} > {per_pod}"


@native("per-pod-limit", fires=(Trigger("template", _pod_over_cap, "pod-over-cap"),))
def per_pod_limit(ctx: Ctx) -> list[Finding]:
    if not ctx.any(lambda p: p.per_pod):
        return []
    cap = _cap(ctx, "per_pod")
    loops = (Each("pod", "variables.templates", f"{cap} != 0 && pod.uses"), Each("container", "pod.gpuCounts"),
             Each("gpu", "container.counts", FIRST_COUNTED))
    message = f"'pod asks for ' + string(count) + ' ' + gpu.name + ', over the limit of ' + string({cap}) + ' per pod'"
    return [Finding("per-pod-limit", loops, f"count > {cap}", "pod.path", "pod.stable",
                    "string(count) + ' ' + gpu.name", message, (("count", total("gpu.name")),))]


# --- the accelerator --------------------------------------------------------------------------------------


def annotated(r: Reads) -> str:
    """The accelerator annotation when a non-empty string (``accelerator_of``), else null."""
    annotations = r.get("pod.meta", "annotations", "map", "{}")
    key = lit(r.ctx.policy.annotation)
    if r.typed:
        return f"dyn({annotations}[?{key}].orValue('') != '' ? {annotations}[{key}] : null)"
    return (f"[{annotations}].map(annotations, {key} in annotations && type(annotations[{key}]) == string && "
            f"annotations[{key}] != '' ? annotations[{key}] : null)[0]")


def selected(r: Reads) -> str:
    selector = r.get("pod.spec", "nodeSelector", "map", "{}")
    key = lit(r.ctx.policy.node_label)
    if r.typed:
        return f"dyn({selector}[?{key}].orValue(null))"
    return f"[{selector}].map(labels, {key} in labels && type(labels[{key}]) == string ? labels[{key}] : null)[0]"


def _annotation_path(ctx: Ctx) -> str:
    return "pod.metaPath + " + lit(".annotations[" + ctx.policy.annotation + "]")


ANNOTATED = Trigger("template", lambda ctx: f"has(pod.metadata.annotations) && {lit(ctx.policy.annotation)} in "
                                            f"pod.metadata.annotations", "annotation")


def _selector_not_allowed(ctx: Ctx) -> str:
    """A selected accelerator outside the namespace's allowed list (the mutation's own default is allowed)."""
    label = lit(ctx.policy.node_label)
    allowed = ctx.ns(lambda p: lits(p.allowed), live=params.expression("allowed"))
    return (f"has(pod.spec.nodeSelector) && {label} in pod.spec.nodeSelector && size({allowed}) > 0 "
            f"&& !(pod.spec.nodeSelector[{label}] in {allowed})")


@native("accelerator-not-allowed",
        fires=(ANNOTATED, Trigger("template", _selector_not_allowed, "selector-not-allowed")))
def accelerator_not_allowed(ctx: Ctx) -> list[Finding]:
    if not ctx.any(lambda p: p.allowed):
        return []
    r = Reads(ctx)
    allowed = ctx.ns(lambda p: lits(p.allowed), live=params.of("allowed"))
    listed = ctx.ns(lambda p: lit(", ".join(p.allowed)), live=f"{params.of('allowed')}.join(', ')")
    message = f"'accelerator ' + {quoted('accelerator')} + ' is not allowed here (allowed: ' + {listed} + ')'"
    where = f"accelerator != null && size({allowed}) > 0 && !(accelerator in {allowed})"
    loops = (Each("pod", "variables.templates", "pod.uses"),)
    return [Finding("accelerator-not-allowed", loops, where, path, stable, "accelerator", message,
                    (("accelerator", value),))
            for path, stable, value in ((_annotation_path(ctx), _annotation_path(ctx), annotated(r)),
                                        (selector_path(ctx), selector_path(ctx, "pod.stable"), selected(r)))]


@native("accelerator-conflict", fires=(ANNOTATED,))
def accelerator_conflict(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    annotation, label = ctx.policy.annotation, ctx.policy.node_label
    path = _annotation_path(ctx)
    message = (lit("annotation " + annotation + "=") + " + accelerator + "
               + lit(" conflicts with nodeSelector " + label + "=") + " + selected")
    return [Finding("accelerator-conflict", (Each("pod", "variables.templates", "pod.uses"),),
                    "accelerator != null && selected != null && accelerator != selected", path, path,
                    "accelerator + ' != ' + selected", message,
                    (("accelerator", annotated(r)), ("selected", selected(r))))]


# --- odd shapes, ephemeral containers, pod-level resources -----------------------------------------------


def _not_a_mapping(loops: tuple[Each, ...], parent: str, key: str, base: str, stable: str) -> Finding:
    """``_mapping_at``: ``parent[key]`` is neither absent, null nor a mapping."""
    value = f"({lit(key)} in {parent} ? {parent}[{lit(key)}] : null)"
    return Finding("structure", loops, "value != null && type(value) != map", f"{base} + {lit('.' + key)}",
                   f"{stable} + {lit('.' + key)}", type_name("value"),
                   f"{lit('must be a mapping, not ')} + {type_name('value')}",
                   (("value", value),))


@native("structure", fires=(NEVER,), custom_only=True)
def structure(ctx: Ctx) -> list[Finding]:
    """``structure``: in custom resources (Pods have a schema): lists and mappings of the wrong type."""
    r = Reads(ctx)
    out = []
    for name in ("initContainers", "ephemeralContainers"):
        value = f"pod.spec[{lit(name)}]"
        out.append(Finding("structure", (TEMPLATES,),
                           f"{lit(name)} in pod.spec && {value} != null && type({value}) != list",
                           f"pod.path + {lit('.' + name)}", f"pod.stable + {lit('.' + name)}", "''",
                           lit("must be a list of containers")))
        item = f" + {lit('.' + name + '[')} + string(i) + ']'"
        items = Each("value", f"({lit(name)} in pod.spec && type({value}) == list ? {value} : [])", index="i")
        out.append(Finding("structure", (TEMPLATES, items), "type(value) != map", "pod.path" + item,
                           "pod.stable" + item, "''",
                           lit("must be a container mapping")))
    every = (TEMPLATES, *r.containers())
    out.append(_not_a_mapping(every, "container", "resources", Reads.PATH, r.stable))
    resources = r.get("container", "resources", "map", "{}")
    for key in ("limits", "requests"):
        out.append(_not_a_mapping(every, resources, key, r.resources_path, r.resources_stable))
    out.append(_not_a_mapping((TEMPLATES,), "pod.spec", "resources", "pod.path", "pod.stable"))
    spec_resources = r.get("pod.spec", "resources", "map", "{}")
    for key in ("limits", "requests"):
        out.append(_not_a_mapping((TEMPLATES,), spec_resources, key, "pod.path + '.resources'",
                                  "pod.stable + '.resources'"))
    gpu_pod = (Each("pod", "variables.templates", "pod.uses"),)
    out.append(_not_a_mapping(gpu_pod, "pod.meta", "annotations", "pod.metaPath", "pod.metaPath"))
    out.append(_not_a_mapping(gpu_pod, "pod.spec", "nodeSelector", "pod.path", "pod.stable"))
    annotations = r.get("pod.meta", "annotations", "map", "{}")
    key = ctx.policy.annotation
    truthy = ("!(value == null || value == false || (type(value) == int && value == 0) || "
              "(type(value) == double && value == 0.0) || (type(value) == list && size(value) == 0) || "
              "(type(value) == map && size(value) == 0))")
    path = f"pod.metaPath + '.annotations' + {lit('[' + key + ']')}"
    out.append(Finding("structure", gpu_pod, f"{truthy} && type(value) != string", path, path, type_name("value"),
                       lit("must be a string"),
                       (("value", f"({lit(key)} in {annotations} ? {annotations}[{lit(key)}] : null)"),)))
    selector = r.get("pod.spec", "nodeSelector", "map", "{}")
    label = ctx.policy.node_label
    path = f"pod.path + '.nodeSelector' + {lit('[' + label + ']')}"
    out.append(Finding("structure", gpu_pod, "value != null && type(value) != string", path, path, type_name("value"),
                       lit("must be a string"),
                       (("value", f"({lit(label)} in {selector} ? {selector}[{lit(label)}] : null)"),)))
    return out


@native("ephemeral-gpu", fires=(Trigger("name", "field == 'ephemeralContainers'", "ephemeral"),))
def ephemeral_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    loops = (Each("pod", "variables.templates", "pod.uses"), *r.containers(("ephemeralContainers",)))
    return [Finding("ephemeral-gpu", loops, "held != ''", r.resources_path, r.resources_stable, "held",
                    lit("ephemeral containers may not use GPUs"), (("held", held_counts(r, False)),))]


POD_LEVEL = " || ".join(f"(has(pod.spec.resources.{s}) && pod.spec.resources.{s}.exists(name, name.contains('/')))"
                      for s in ("limits", "requests"))


@native("pod-level-gpu", fires=(Trigger("template", f"has(pod.spec.resources) && ({POD_LEVEL})", "pod-level"),))
def pod_level_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    out = []
    for section in ("limits", "requests"):
        values = r.at("pod.spec", f"resources.{section}", "map", "{}")
        loops = (TEMPLATES, Each("name", values, "name in variables.gpus"))
        out.append(Finding("pod-level-gpu", loops, "", f"pod.path + '.resources.{section}[' + name + ']'",
                           f"pod.stable + '.resources.{section}[' + name + ']'", about("value"),
                           "name + ' cannot be set in pod-level resources; set it on a container'",
                           (("value", f"{values}[name]"),)))
    return out
