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
    over_cap = f" || ({cap} != 0 && int(v) > {cap})" if ctx.any(lambda p: p.per_container) else ""
    return f"!{matches('v', DIGITS)}{over_cap}"


ODD_COUNT = Trigger("name", _odd_count, "count")


@native("invalid-quantity", fires=(ODD_COUNT,))
def invalid_quantity(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    return per_name(r, "invalid-quantity", ("limits", "requests"), "k in variables.gpus", "e != ''",
                    f"{r.label} + ': ' + e", r.about("x"), (("e", r.error("x")),), template="t.uses")


@native("requests-without-limits", fires=(NEVER,), custom_only=True)
def requests_without_limits(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = f"{r.label} + ': ' + k + ' is requested without a limit, set it in limits (requests default to limits)'"
    return per_name(r, "requests-without-limits", ("requests",),
                    f"k in variables.gpus && !(k in {r.section('limits')})", "", message, r.about("x"),
                    template="t.uses")


@native("requests-differ", fires=(NEVER,), custom_only=True)
def requests_differ(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = f"{r.label} + ': ' + k + ' requests (' + {r.about('x')} + ') must equal limits (' + {r.about('y')} + ')'"
    return per_name(r, "requests-differ", ("requests",), f"k in variables.gpus && k in {r.section('limits')}",
                    f"{r.valid('x')} && {r.valid('y')} && {count('x')} != {count('y')}", message,
                    f"string({count('x')}) + ' != ' + string({count('y')})",
                    (("y", f"{r.section('limits')}[k]"),), template="t.uses")


@native("per-container-limit", fires=(ODD_COUNT,))
def per_container_limit(ctx: Ctx) -> list[Finding]:
    if not ctx.any(lambda p: p.per_container):
        return []
    r = Reads(ctx)
    cap = _cap(ctx, "per_container")
    message = f"{r.label} + ': ' + string(n) + ' ' + k + ' is over the limit of ' + string({cap}) + ' per container'"
    return per_name(r, "per-container-limit", ("limits",), "k in variables.gpus", f"n > {cap}", message,
                    "string(n)", (("n", f"{r.valid('x')} ? {count('x')} : 0"),), template=f"{cap} != 0 && t.uses")


def _effective(container: str, name: str) -> str:
    """The count the scheduler holds for ``name`` in a ``t.gpuCounts`` entry."""
    return f"([0] + {container}.counts.filter(x, x.name == {name}).map(x, x.count)).sum()"


def _total(name: str) -> str:
    """``pod_gpu_totals`` of ``name`` in template ``t``: app containers and sidecars together, or an init container
    with the sidecars started before it, whichever is larger."""
    running = (f"([0] + t.gpuCounts.filter(a, a.list == 'containers' || a.sidecar).map(a, {_effective('a', name)}))"
               f".sum()")
    before = (f"([0] + t.gpuCounts.filter(b, b.sidecar && b.pos < p.pos).map(b, {_effective('b', name)})).sum()")
    peaks = (f"t.gpuCounts.filter(p, p.list == 'initContainers' && !p.sidecar)"
             f".map(p, {_effective('p', name)} + {before})")
    return f"([{running}] + {peaks}).max()"


def _pod_over_cap(ctx: Ctx) -> str:
    """The pod's GPU counts, every plain count of every container summed (more than any name's total, so never less
    than the rule's), over the cap; other spellings are the count trigger's."""
    per_pod = ctx.ns(lambda p: str(p.per_pod), live=params.expression("perPod"))
    limits = "c.resources.limits"
    plain_sum = (f"has(c.resources) && has({limits}) ? ([0] + {limits}.filter(k, {is_gpu(ctx, 'k')} && "
                 f"{matches(limits + '[k]', DIGITS)}).map(k, int({limits}[k]))).sum() : 0")
    return (f"{per_pod} != 0 && ([0] + {lits(('containers', 'initContainers'))}"
            f".map(l, l in t.spec ? ([0] + t.spec[l].map(c, {plain_sum})).sum() : 0))"
            f".sum() > {per_pod}")


@native("per-pod-limit", fires=(Trigger("template", _pod_over_cap, "pod-over-cap"),))
def per_pod_limit(ctx: Ctx) -> list[Finding]:
    if not ctx.any(lambda p: p.per_pod):
        return []
    cap = _cap(ctx, "per_pod")
    # Each name once: at the first container (app containers, then init containers) that counts it; the pod's
    # total is summed only there.
    first = ("!t.gpuCounts.exists(o, (o.list == c.list ? o.pos < c.pos : o.list == 'containers') && "
             "o.counts.exists(x, x.name == g.name))")
    loops = (Each("t", "variables.templates", f"{cap} != 0 && t.uses"), Each("c", "t.gpuCounts"),
             Each("g", "c.counts", first))
    message = f"'pod asks for ' + string(n) + ' ' + g.name + ', over the limit of ' + string({cap}) + ' per pod'"
    return [Finding("per-pod-limit", loops, f"n > {cap}", "t.path", "t.stable", "string(n) + ' ' + g.name",
                    message, (("n", _total("g.name")),))]


# --- the accelerator --------------------------------------------------------------------------------------


def _annotated(r: Reads) -> str:
    """The accelerator annotation when a non-empty string (``accelerator_of``), else null."""
    annotations = r.get("t.meta", "annotations", "map", "{}")
    key = lit(r.ctx.policy.annotation)
    if r.typed:
        return f"dyn({annotations}[?{key}].orValue('') != '' ? {annotations}[{key}] : null)"
    return (f"({key} in {annotations} && type({annotations}[{key}]) == string && {annotations}[{key}] != '' ? "
            f"{annotations}[{key}] : null)")


def _selected(r: Reads) -> str:
    selector = r.get("t.spec", "nodeSelector", "map", "{}")
    key = lit(r.ctx.policy.node_label)
    if r.typed:
        return f"dyn({selector}[?{key}].orValue(null))"
    return f"({key} in {selector} && type({selector}[{key}]) == string ? {selector}[{key}] : null)"


def _annotation_path(ctx: Ctx) -> str:
    return "t.metaPath + " + lit(".annotations[" + ctx.policy.annotation + "]")


ANNOTATED = Trigger("template", lambda ctx: f"has(t.metadata.annotations) && {lit(ctx.policy.annotation)} in "
                                            f"t.metadata.annotations", "annotation")


def _selector_not_allowed(ctx: Ctx) -> str:
    """A selected accelerator outside the namespace's allowed list (the mutation's own default is allowed)."""
    label = lit(ctx.policy.node_label)
    allowed = ctx.ns(lambda p: lits(p.allowed), live=params.expression("allowed"))
    return (f"has(t.spec.nodeSelector) && {label} in t.spec.nodeSelector && size({allowed}) > 0 "
            f"&& !(t.spec.nodeSelector[{label}] in {allowed})")


@native("accelerator-not-allowed",
        fires=(ANNOTATED, Trigger("template", _selector_not_allowed, "selector-not-allowed")))
def accelerator_not_allowed(ctx: Ctx) -> list[Finding]:
    if not ctx.any(lambda p: p.allowed):
        return []
    r = Reads(ctx)
    allowed = ctx.ns(lambda p: lits(p.allowed), live=params.of("allowed"))
    listed = ctx.ns(lambda p: lit(", ".join(p.allowed)), live=f"{params.of('allowed')}.join(', ')")
    message = f"'accelerator ' + {quoted('a')} + ' is not allowed here (allowed: ' + {listed} + ')'"
    where = f"a != null && size({allowed}) > 0 && !(a in {allowed})"
    loops = (Each("t", "variables.templates", "t.uses"),)
    return [Finding("accelerator-not-allowed", loops, where, path, stable, "a", message, (("a", value),))
            for path, stable, value in ((_annotation_path(ctx), _annotation_path(ctx), _annotated(r)),
                                        (selector_path(ctx), selector_path(ctx, "t.stable"), _selected(r)))]


@native("accelerator-conflict", fires=(ANNOTATED,))
def accelerator_conflict(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    annotation, label = ctx.policy.annotation, ctx.policy.node_label
    path = _annotation_path(ctx)
    message = (lit("annotation " + annotation + "=") + " + a + " + lit(" conflicts with nodeSelector " + label + "=")
               + " + s")
    return [Finding("accelerator-conflict", (Each("t", "variables.templates", "t.uses"),),
                    "a != null && s != null && a != s", path, path, "a + ' != ' + s", message,
                    (("a", _annotated(r)), ("s", _selected(r))))]


# --- odd shapes, ephemeral containers, pod-level resources -----------------------------------------------


def _not_a_mapping(loops: tuple[Each, ...], parent: str, key: str, base: str, stable: str) -> Finding:
    """``_mapping_at``: ``parent[key]`` is neither absent, null nor a mapping."""
    value = f"({lit(key)} in {parent} ? {parent}[{lit(key)}] : null)"
    return Finding("structure", loops, "v != null && type(v) != map", f"{base} + {lit('.' + key)}",
                   f"{stable} + {lit('.' + key)}", type_name("v"),
                   f"{lit('must be a mapping, not ')} + {type_name('v')}",
                   (("v", value),))


@native("structure", fires=(NEVER,), custom_only=True)
def structure(ctx: Ctx) -> list[Finding]:
    """``structure``: in custom resources (Pods have a schema): lists and mappings of the wrong type."""
    r = Reads(ctx)
    out = []
    for name in ("initContainers", "ephemeralContainers"):
        value = f"t.spec[{lit(name)}]"
        out.append(Finding("structure", (TEMPLATES,),
                           f"{lit(name)} in t.spec && {value} != null && type({value}) != list",
                           f"t.path + {lit('.' + name)}", f"t.stable + {lit('.' + name)}", "''",
                           lit("must be a list of containers")))
        item = f" + {lit('.' + name + '[')} + string(i) + ']'"
        items = Each("x", f"({lit(name)} in t.spec && type({value}) == list ? {value} : [])", index="i")
        out.append(Finding("structure", (TEMPLATES, items), "type(x) != map", "t.path" + item, "t.stable" + item, "''",
                           lit("must be a container mapping")))
    every = (TEMPLATES, *r.containers())
    out.append(_not_a_mapping(every, "c", "resources", Reads.PATH, r.stable))
    resources = r.get("c", "resources", "map", "{}")
    for key in ("limits", "requests"):
        out.append(_not_a_mapping(every, resources, key, r.resources_path, r.resources_stable))
    out.append(_not_a_mapping((TEMPLATES,), "t.spec", "resources", "t.path", "t.stable"))
    spec_resources = r.get("t.spec", "resources", "map", "{}")
    for key in ("limits", "requests"):
        out.append(_not_a_mapping((TEMPLATES,), spec_resources, key, "t.path + '.resources'",
                                  "t.stable + '.resources'"))
    gpu_pod = (Each("t", "variables.templates", "t.uses"),)
    out.append(_not_a_mapping(gpu_pod, "t.meta", "annotations", "t.metaPath", "t.metaPath"))
    out.append(_not_a_mapping(gpu_pod, "t.spec", "nodeSelector", "t.path", "t.stable"))
    annotations = r.get("t.meta", "annotations", "map", "{}")
    key = ctx.policy.annotation
    truthy = ("!(v == null || v == false || (type(v) == int && v == 0) || (type(v) == double && v == 0.0) || "
              "(type(v) == list && size(v) == 0) || (type(v) == map && size(v) == 0))")
    path = f"t.metaPath + '.annotations' + {lit('[' + key + ']')}"
    out.append(Finding("structure", gpu_pod, f"{truthy} && type(v) != string", path, path, type_name("v"),
                       lit("must be a string"),
                       (("v", f"({lit(key)} in {annotations} ? {annotations}[{lit(key)}] : null)"),)))
    selector = r.get("t.spec", "nodeSelector", "map", "{}")
    label = ctx.policy.node_label
    path = f"t.path + '.nodeSelector' + {lit('[' + label + ']')}"
    out.append(Finding("structure", gpu_pod, "v != null && type(v) != string", path, path, type_name("v"),
                       lit("must be a string"),
                       (("v", f"({lit(label)} in {selector} ? {selector}[{lit(label)}] : null)"),)))
    return out


@native("ephemeral-gpu", fires=(Trigger("name", "l == 'ephemeralContainers'", "ephemeral"),))
def ephemeral_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    loops = (Each("t", "variables.templates", "t.uses"), *r.containers(("ephemeralContainers",)))
    return [Finding("ephemeral-gpu", loops, "h != ''", r.resources_path, r.resources_stable, "h",
                    lit("ephemeral containers may not use GPUs"), (("h", held_counts(r, False)),))]


POD_LEVEL = " || ".join(f"(has(t.spec.resources.{s}) && t.spec.resources.{s}.exists(k, k.contains('/')))"
                      for s in ("limits", "requests"))


@native("pod-level-gpu", fires=(Trigger("template", f"has(t.spec.resources) && ({POD_LEVEL})", "pod-level"),))
def pod_level_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    out = []
    for section in ("limits", "requests"):
        values = r.at("t.spec", f"resources.{section}", "map", "{}")
        loops = (TEMPLATES, Each("k", values, "k in variables.gpus"))
        out.append(Finding("pod-level-gpu", loops, "", f"t.path + '.resources.{section}[' + k + ']'",
                           f"t.stable + '.resources.{section}[' + k + ']'", about("x"),
                           "k + ' cannot be set in pod-level resources; set it on a container'",
                           (("x", f"{values}[k]"),)))
    return out
