"""The pod-template rules in CEL: one builder per rule id, each the webhook's check read field by field.

The variables every builder reads (``Ctx.v``), computed once per admission and only when read:

- ``tpl``: the object's pod templates, ``{p, sp, mp, s, m}`` (spec path, stable spec path, metadata path,
  spec, metadata);
- ``ctr``: every container of every template, ``{t, l, i, p, sp, lab, c, lim, req, side}`` (template index,
  list, index, path, stable path, the webhook's label, the container, its limits and requests, sidecar);
- ``gx``: aligned with ``ctr``: ``{t, l, i, side, vl, vr, named, holds, counted, frac}`` (valid GPU counts
  in limits and requests, whether it names a GPU, holds a GPU of any kind, holds a counted one, asks a
  fractional scheduler: ``webhook.rules.isolation.container_gpus``);
- ``px``: aligned with ``tpl``: ``{uses, any, frac, counted, trusted, claims, dra}`` (``PodGPUs.uses_gpus``,
  ``GpuUse``, ``Policy.trusts``, whether it declares claims, and whether it declares or references any).

Each builder returns a CEL list of violation records (``snippets.violation``), worded as the Python rule
words them, at the same paths.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from webhook.core.podspecs import CONTAINER_LISTS
from webhook.core.policy import Policy
from webhook.core.resources import (
    CDI_KEYS,
    CDI_PREFIXES,
    DEVICE_DIRECTORIES,
    DEVICE_LIST_DIRECTORIES,
    DEVICE_VARIABLES,
    EXCLUSIVE,
    FRACTION_ANNOTATIONS,
    NO_DEVICES,
    NVIDIA_DEVICE_PREFIX,
    NVIDIA_RUNTIME_PREFIX,
    VISIBLE_DEVICES,
    VOLCANO_COUNT,
)
from webhook.native.celtext import boolean, lit, lits, matches, record
from webhook.native.snippets import (
    COUNTING_REGISTERED,
    MONITORING,
    NOT_COUNTING,
    PERCENT,
    PRIORITY,
    READ_BY_SHARING,
    REGISTERED,
    SCHEDULER,
    SHARED,
    Ctx,
    about,
    count,
    escaped,
    guarded,
    implicit_gpu,
    is_gpu,
    names_gpu,
    plain,
    quantity_error,
    quoted,
    shown,
    stable_item,
    tolerates_gpu_taint,
    type_name,
    violation,
)

# Paths with more segments than this are normalised conservatively (see normalised_path).
MAX_PATH_SEGMENTS = 40


# --- variables ------------------------------------------------------------------------------------------------


def roots() -> str:
    """``roots``: the object, and on UPDATE the old object (index 1): violations of the old one excuse."""
    return "request.operation == 'UPDATE' && oldObject != null ? [object, oldObject] : [object]"


def template_list(templates: str) -> str:
    """``tpl`` from the CEL text of a root's template nodes (reading ``R``, the root)."""
    from webhook.native.kinds import template_records

    return f"variables.roots.transformList(o, R, {template_records(templates, 'o')}).flatten()"


def container_records(ctx: Ctx) -> str:
    """``ctr``: every container mapping of every template."""
    t, c = "T", "c"
    path = f"{t}.p + '.' + l + '[' + string(i) + ']'"
    named = f"('name' in {c} && type({c}.name) == string && {c}.name != '')"
    resources = guarded(c, "resources", "map", "{}")
    # Pods' container names need no escaping (DNS labels): only other names pay for it.
    shown_name = f"({matches(c + '.name', '^[-a-z0-9.]*$')} ? {c}.name : {escaped(c + '.name')})"
    label = f"({named} ? 'container \"' + {shown_name} + '\"' : 'container ' + {path})"
    fields = record(
        t="t", o=f"{t}.o", l="l", i="i", p=path,
        sp=stable_item(f"{t}.sp + '.' + l", "i", c, "name"),
        lab=label,
        c=c,
        lim=guarded(resources, "limits", "map", "{}"),
        req=guarded(resources, "requests", "map", "{}"),
        side=f"('restartPolicy' in {c} && {c}.restartPolicy == 'Always')",
    )
    return (f"{ctx.v('tpl')}.transformList(t, {t}, {lits(CONTAINER_LISTS)}.map(l, l in {t}.s && "
            f"type({t}.s[l]) == list ? {t}.s[l].transformList(i, {c}, type({c}) == map, {fields}) : []))"
            f".flatten().flatten()")


def classes(ctx: Ctx) -> str:
    """``cls``: every resource name with a domain in the object's containers (every GPU name, registered or in
    ``resources``, has one; cpu and memory do not), once, to what the rules ask of a name: ``g`` a policy GPU count
    (``Policy.is_gpu``), ``h`` a name that holds a GPU of some kind, ``zc`` a name ``zero-gpu-limit`` reads, ``rd``
    a name the vendor-name checks read, ``sch``/``shr``/``mon``/``pct`` its registry kind. A name repeats in every
    container; its regular expressions run once."""
    facts = record(named=names_gpu(ctx, "k"), implicit=implicit_gpu(ctx, "k"), reg=matches("k", REGISTERED))
    fields = record(
        g=f"((F.named && !(F.reg && {matches('k', NOT_COUNTING)})) || F.implicit)",
        h=f"(F.reg ? !{matches('k', PRIORITY)} : (F.named || F.implicit))",
        rd=f"(F.reg && {matches('k', READ_BY_SHARING)})",
        zc=f"(((F.named && !(F.reg && {matches('k', NOT_COUNTING)})) || F.implicit) || "
           f"(F.reg && {matches('k', COUNTING_REGISTERED)}))",  # zero_counting
        sch=f"(F.reg && {matches('k', SCHEDULER)})", shr=f"(F.reg && {matches('k', SHARED)})",
        mon=f"(F.reg && {matches('k', MONITORING)})", pct=f"(F.reg && {matches('k', PERCENT)})",
    )
    names = (f"{ctx.v('ctr')}.map(r, r.lim.map(k, k) + r.req.map(k, k)).flatten()"
             f".filter(k, type(k) == string && k.contains('/')).distinct()")
    return f"{names}.transformMapEntry(i, k, {{k: [{facts}].map(F, {fields})[0]}})"


def entry(ctx: Ctx) -> str:
    """One resource name ``k`` with a domain and its value ``x``: its classes (``cls``), ``e`` the quantity error
    (``gpu_count``'s message, '' when valid) and ``c`` the count for the names a rule reads, ``z`` a valid 0, and
    ``x`` the value."""
    relevant = "(C.g || C.h || C.rd)"
    fields = record(
        g="C.g", h="C.h", rd="C.rd", zc="C.zc", sch="C.sch", shr="C.shr", mon="C.mon", pct="C.pct",
        e="E", c=f"(E == '' && {relevant} ? {count('x')} : 0)", z=f"(E == '' && {relevant} && {count('x')} == 0)",
        x="x",
    )
    return f"[{ctx.v('cls')}[k]].map(C, [{relevant} ? {quantity_error('x')} : ''].map(E, {fields})[0])[0]"


def entries(ctx: Ctx) -> str:
    """``ent``: aligned with ``ctr``, ``{l, r}``: the entries of its limits and of its requests, by name (names
    with a domain only: no rule reads cpu or memory)."""
    one = entry(ctx)
    return (f"{ctx.v('ctr')}.map(r, [r.lim, r.req].map(m, m.transformMap(k, x, type(k) == string && "
            f"k.contains('/'), {one}))).map(L, {{'l': L[0], 'r': L[1]}})")


def gpu_facts(ctx: Ctx) -> str:
    """``gx``: per container, aligned with ``ctr`` (``isolation.container_gpus`` and the valid counts)."""
    sections = ("E.l", "E.r")
    holds = " || ".join([*(f"{s}.exists(k, {s}[k].h && !{s}[k].z)" for s in sections),
                         f"size({guarded(guarded('r.c', 'resources', 'map', '{}'), 'claims', 'list', '[]')}) > 0"])
    fields = record(
        t="r.t", o="r.o", l="r.l", i="r.i", side="r.side",
        vl="E.l.transformMap(k, e, e.g && e.e == '', e.c)",
        vr="E.r.transformMap(k, e, e.g && e.e == '', e.c)",
        named=" || ".join(f"{s}.exists(k, {s}[k].g)" for s in sections),
        holds=holds,
        counted=" || ".join(f"{s}.exists(k, {s}[k].g && !{s}[k].z)" for s in sections),
        frac=" || ".join(f"{s}.exists(k, {s}[k].sch && !{s}[k].z)" for s in sections),
    )
    return f"{ctx.v('ctr')}.transformList(j, r, [{ctx.v('ent')}[j]].map(E, {fields})[0])"


def _account(spec: str) -> str:
    name = f"{spec}.serviceAccountName"
    first = f"('serviceAccountName' in {spec} && type({name}) == string && {name} != '')"
    second = f"('serviceAccount' in {spec} && type({spec}.serviceAccount) == string && {spec}.serviceAccount != '')"
    return f"({first} ? {spec}.serviceAccountName : {second} ? {spec}.serviceAccount : 'default')"


def trusted(ctx: Ctx, spec: str) -> str:
    """``Policy.trusts``: the namespace, or the pod's service account, is in ``isolation.trusted``."""
    def text(policy: Policy) -> str:
        if policy.trusted:
            return "true"
        if policy.trusted_accounts:
            return f"({_account(spec)} in {lits(sorted(policy.trusted_accounts))})"
        return "false"
    return ctx.ns(text)


def pod_facts(ctx: Ctx) -> str:
    """``px``: per template, aligned with ``tpl``."""
    gx = ctx.v("gx")
    annotations = guarded("T.m", "annotations", "map", "{}")
    frac = f"({gx}.exists(g, g.t == t && g.frac) || {lits(FRACTION_ANNOTATIONS)}.exists(a, a in {annotations}))"
    fields = record(
        uses=f"{gx}.exists(g, g.t == t && g.named)",
        frac=frac,
        any=f"({frac} || {gx}.exists(g, g.t == t && g.holds))",
        counted=f"{gx}.exists(g, g.t == t && g.counted)",
        trusted=trusted(ctx, "T.s"),
        claims=f"size({guarded('T.s', 'resourceClaims', 'list', '[]')}) > 0",
        dra=_has_claims(),
    )
    return f"{ctx.v('tpl')}.transformList(t, T, {fields})"


def variables(ctx: Ctx, templates: str, with_roots: bool = True) -> list[tuple[str, str]]:
    """(name, expression) of the pod variables, in dependency order; ``templates`` reads the root ``R``."""
    out = [("roots", roots())] if with_roots else []
    return out + [
        ("tpl", template_list(templates)),
        ("ctr", container_records(ctx)),
        ("cls", classes(ctx)),
        ("ent", entries(ctx)),
        ("gx", gpu_facts(ctx)),
        ("px", pod_facts(ctx)),
    ]


# --- helpers for the builders ----------------------------------------------------------------------------


def _per_container(ctx: Ctx, body: str, where: str = "true") -> str:
    """``body`` (a list of records, reading ``r``, ``j``, ``g`` = gx[j], ``P`` = px[r.t], ``T`` = tpl[r.t],
    ``E`` = ent[j]) for each container."""
    inner = body
    # Only what the body reads is bound (each binding is a list and a comprehension per container and rule).
    for name, value in (("E", f"{ctx.v('ent')}[j]"), ("T", f"{ctx.v('tpl')}[r.t]"), ("P", f"{ctx.v('px')}[r.t]"),
                        ("g", f"{ctx.v('gx')}[j]")):
        if re.search(rf"(?<![\w.]){name}\.", inner):
            inner = f"[{value}].map({name}, {inner})[0]"
    return f"{ctx.v('ctr')}.transformList(j, r, {where}, {inner}).flatten()"


def _per_template(ctx: Ctx, body: str, where: str = "true") -> str:
    """``body`` for each template (``T``, its index ``t``, ``P`` = px[t])."""
    inner = f"[{ctx.v('px')}[t]].map(P, {body})[0]" if re.search(r"(?<![\w.])P\.", body) else body
    return f"{ctx.v('tpl')}.transformList(t, T, {where}, {inner}).flatten()"


def _res_path(section: str) -> str:
    return f"r.p + '.resources.{section}[' + k + ']'"


def _res_stable(section: str) -> str:
    return f"r.sp + '.resources.{section}[' + k + ']'"


def tviolation(rule: str, path: str, stable: str, value: str, message: str) -> str:
    """A violation found in template ``T``."""
    return violation(rule, path, stable, value, message, "T.o")


# --- the quantity rules --------------------------------------------------------------------------------------

RESOURCES_PATH = "r.p + '.resources'"
RESOURCES_STABLE = "r.sp + '.resources'"


def invalid_quantity(ctx: Ctx) -> str:
    parts = []
    for section, field in (("limits", "l"), ("requests", "r")):
        found = violation("invalid-quantity", _res_path(section), _res_stable(section), about("e.x"),
                          "r.lab + ': ' + e.e")
        parts.append(f"E.{field}.transformList(k, e, e.g && e.e != '', {found})")
    return _per_container(ctx, " + ".join(parts))


def requests_without_limits(ctx: Ctx) -> str:
    message = "r.lab + ': ' + k + ' is requested without a limit, set it in limits (requests default to limits)'"
    found = violation("requests-without-limits", _res_path("requests"), _res_stable("requests"), about("e.x"), message)
    body = f"E.r.transformList(k, e, e.g && !(k in r.lim), {found})"
    return _per_container(ctx, body)


def requests_differ(ctx: Ctx) -> str:
    message = ("r.lab + ': ' + k + ' requests (' + " + about("x") + " + ') must equal limits (' + "
               + about("r.lim[k]") + " + ')'")
    value = "string(g.vr[k]) + ' != ' + string(g.vl[k])"
    found = violation("requests-differ", _res_path("requests"), _res_stable("requests"), value, message)
    body = f"r.req.transformList(k, x, k in g.vr && k in g.vl && g.vr[k] != g.vl[k], {found})"
    return _per_container(ctx, body)


def _cap(ctx: Ctx, attribute: str) -> str:
    return ctx.ns(lambda p: str(getattr(p, attribute)))


def _policies(ctx: Ctx) -> list[Policy]:
    return [ctx.policies.default, *ctx.policies.by_namespace.values()]


def per_container_limit(ctx: Ctx) -> str:
    if not any(p.per_container for p in _policies(ctx)):
        return "[]"
    cap = _cap(ctx, "per_container")
    message = f"r.lab + ': ' + string(n) + ' ' + k + ' is over the limit of ' + string({cap}) + ' per container'"
    found = violation("per-container-limit", _res_path("limits"), _res_stable("limits"), "string(n)", message)
    body = f"g.vl.transformList(k, n, {cap} != 0 && n > {cap}, {found})"
    return _per_container(ctx, body)


def _effective(g: str, name: str) -> str:
    """The count the scheduler holds for ``name`` in container ``g``: requests, defaulted from limits."""
    return f"({name} in {g}.vr ? {g}.vr[{name}] : {name} in {g}.vl ? {g}.vl[{name}] : 0)"


def pod_totals(ctx: Ctx) -> str:
    """Per template (inside ``_per_template``): a list of ``{n: name, c: count}``, ``pod_gpu_totals``."""
    gx = ctx.v("gx")
    mine = f"{gx}.filter(g, g.t == t && g.l != 'ephemeralContainers')"
    names = f"{mine}.map(g, g.vl.map(k, k) + g.vr.map(k, k)).flatten().distinct()"
    app = f"{gx}.filter(g, g.t == t && g.l == 'containers').map(g, {_effective('g', 'R')}).sum()"
    sidecars = f"{gx}.filter(g, g.t == t && g.l == 'initContainers' && g.side).map(g, {_effective('g', 'R')}).sum()"
    before = (f"{gx}.filter(h, h.t == t && h.l == 'initContainers' && h.side && h.i < g.i)"
              f".map(h, {_effective('h', 'R')}).sum()")
    peaks = (f"{gx}.filter(g, g.t == t && g.l == 'initContainers' && !g.side)"
             f".map(g, {_effective('g', 'R')} + {before})")
    return f"{names}.map(R, {{'n': dyn(R), 'c': dyn(([{app} + {sidecars}] + {peaks}).max())}})"


def per_pod_limit(ctx: Ctx) -> str:
    if not any(p.per_pod for p in _policies(ctx)):
        return "[]"
    cap = _cap(ctx, "per_pod")
    message = "'pod asks for ' + string(e.c) + ' ' + e.n + ', over the limit of ' + string(" + cap + ") + ' per pod'"
    found = tviolation("per-pod-limit", "T.p", "T.sp", "string(e.c) + ' ' + e.n", message)
    body = f"{pod_totals(ctx)}.filter(e, e.c > {cap}).map(e, {found})"
    return _per_template(ctx, body, f"{cap} != 0 && {ctx.v('px')}[t].uses")


# --- the accelerator --------------------------------------------------------------------------------------


def _annotated(ctx: Ctx) -> str:
    """The accelerator annotation when a non-empty string (``accelerator_of``), else null."""
    annotations = guarded("T.m", "annotations", "map", "{}")
    key = lit(ctx.policy.annotation)
    return (f"({key} in {annotations} && type({annotations}[{key}]) == string && {annotations}[{key}] != '' ? "
            f"{annotations}[{key}] : null)")


def _selected(ctx: Ctx) -> str:
    selector = guarded("T.s", "nodeSelector", "map", "{}")
    key = lit(ctx.policy.node_label)
    return f"({key} in {selector} && type({selector}[{key}]) == string ? {selector}[{key}] : null)"


def _annotation_path(ctx: Ctx) -> str:
    return "T.mp + " + lit(".annotations[" + ctx.policy.annotation + "]")


def _selector_path(ctx: Ctx, base: str = "T.p") -> str:
    return base + " + " + lit(".nodeSelector[" + ctx.policy.node_label + "]")


def accelerator_not_allowed(ctx: Ctx) -> str:
    if not any(p.allowed for p in _policies(ctx)):
        return "[]"
    allowed = ctx.ns(lambda p: lits(p.allowed))
    listed = ctx.ns(lambda p: lit(", ".join(p.allowed)))
    message = f"'accelerator ' + {quoted('a')} + ' is not allowed here (allowed: ' + {listed} + ')'"
    pairs = [(_annotation_path(ctx), _annotation_path(ctx), _annotated(ctx)),
             (_selector_path(ctx), _selector_path(ctx, "T.sp"), _selected(ctx))]
    parts = []
    for path, stable, value in pairs:
        found = tviolation("accelerator-not-allowed", path, stable, "a", message)
        parts.append(f"[{value}].filter(a, a != null && size({allowed}) > 0 && !(a in {allowed})).map(a, {found})")
    return _per_template(ctx, " + ".join(parts), f"{ctx.v('px')}[t].uses")


def accelerator_conflict(ctx: Ctx) -> str:
    annotation, label = ctx.policy.annotation, ctx.policy.node_label
    path = _annotation_path(ctx)
    message = (lit("annotation " + annotation + "=") + " + a + " + lit(" conflicts with nodeSelector " + label + "=")
               + " + s")
    found = tviolation("accelerator-conflict", path, path, "a + ' != ' + s", message)
    body = (f"[[{_annotated(ctx)}, {_selected(ctx)}]].filter(v, v[0] != null && v[1] != null && v[0] != v[1])"
            f".map(v, [v[0]].map(a, [v[1]].map(s, {found})[0])[0])")
    return _per_template(ctx, body, f"{ctx.v('px')}[t].uses")


# --- odd shapes, ephemeral containers, pod-level resources -----------------------------------------------


def _mapping_problem(parent: str, key: str, base: str, stable: str, origin: str = "T.o") -> str:
    """``_mapping_at``: ``parent[key]`` is neither absent, null nor a mapping."""
    path = base + " + " + lit("." + key)
    stable_path = stable + " + " + lit("." + key)
    found = violation("structure", path, stable_path, type_name("sv"), lit("must be a mapping, not ") + " + "
                      + type_name("sv"), origin)
    return (f"[{parent}].map(sp, type(sp) == map && {lit(key)} in sp ? [sp[{lit(key)}]] : [])[0]"
            f".filter(sv, sv != null && type(sv) != map).map(sv, {found})")


def _string_problem(mapping: str, key: str, base: str, truthy: bool = False) -> str:
    """``accelerator_of``: the annotation (when truthy) or the selector value is not a string."""
    present = "sv != null"
    if truthy:
        present = ("!(sv == null || sv == false || (type(sv) == int && sv == 0) || (type(sv) == double && sv == 0.0) "
                   "|| (type(sv) == list && size(sv) == 0) || (type(sv) == map && size(sv) == 0))")
    path = base + " + " + lit("[" + key + "]")
    found = tviolation("structure", path, path, type_name("sv"), lit("must be a string"))
    return (f"[{mapping}].map(sp, {lit(key)} in sp ? [sp[{lit(key)}]] : [])[0]"
            f".filter(sv, {present} && type(sv) != string).map(sv, {found})")


def structure(ctx: Ctx) -> str:
    """``structure``: in custom resources (Pods have a schema): lists and mappings of the wrong type."""
    parts = []
    for name in ("initContainers", "ephemeralContainers"):
        value = f"T.s[{lit(name)}]"
        not_list = tviolation("structure", "T.p + " + lit("." + name), "T.sp + " + lit("." + name), lit(""),
                             lit("must be a list of containers"))
        item = " + " + lit("." + name + "[") + " + string(i) + ']'"
        not_map = tviolation("structure", "T.p" + item, "T.sp" + item, lit(""), lit("must be a container mapping"))
        parts.append(f"({lit(name)} in T.s && {value} != null && type({value}) != list ? [{not_list}] : [])")
        parts.append(f"({lit(name)} in T.s && type({value}) == list ? "
                     f"{value}.transformList(i, x, type(x) != map, {not_map}) : [])")
    per_template = _per_template(ctx, " + ".join(parts))
    resources = guarded("r.c", "resources", "map", "{}")
    shapes = [_mapping_problem("r.c", "resources", "r.p", "r.sp", "r.o")]
    for key in ("limits", "requests"):
        shapes.append(_mapping_problem(resources, key, RESOURCES_PATH, RESOURCES_STABLE, "r.o"))
    per_container = _per_container(ctx, " + ".join(shapes))
    spec_resources = guarded("T.s", "resources", "map", "{}")
    pod_level = [_mapping_problem("T.s", "resources", "T.p", "T.sp")]
    for key in ("limits", "requests"):
        pod_level.append(_mapping_problem(spec_resources, key, "T.p + '.resources'", "T.sp + '.resources'"))
    per_pod = _per_template(ctx, " + ".join(pod_level))
    gpu_pod = [
        _mapping_problem("T.m", "annotations", "T.mp", "T.mp"),
        _mapping_problem("T.s", "nodeSelector", "T.p", "T.sp"),
        _string_problem(guarded("T.m", "annotations", "map", "{}"), ctx.policy.annotation, "T.mp + '.annotations'",
                        truthy=True),
        _string_problem(guarded("T.s", "nodeSelector", "map", "{}"), ctx.policy.node_label, "T.p + '.nodeSelector'"),
    ]
    gpu_part = _per_template(ctx, " + ".join(gpu_pod), f"{ctx.v('px')}[t].uses")
    return f"{per_template} + {per_container} + {per_pod} + {gpu_part}"


def _names(g: str) -> str:
    return f"({g}.vl.map(k, k) + {g}.vr.map(k, k)).distinct()"


def _held(g: str, nonzero: bool) -> str:
    """``"1 nvidia.com/gpu, 2 …"``: the container's valid counts by name, sorted (zeros dropped if asked)."""
    names = f"{_names(g)}.sort()"
    if nonzero:
        names = f"{names}.filter(k, {_effective(g, 'k')} != 0)"
    return f"{names}.map(k, string({_effective(g, 'k')}) + ' ' + k).join(', ')"


def ephemeral_gpu(ctx: Ctx) -> str:
    found = violation("ephemeral-gpu", RESOURCES_PATH, RESOURCES_STABLE, "h",
                      lit("ephemeral containers may not use GPUs"))
    body = f"[{_held('g', False)}].map(h, {found})"
    gx = ctx.v("gx")
    return _per_container(ctx, body, f"r.l == 'ephemeralContainers' && (size({gx}[j].vl) > 0 || size({gx}[j].vr) > 0)")


def pod_level_gpu(ctx: Ctx) -> str:
    resources = guarded("T.s", "resources", "map", "{}")
    parts = []
    for section in ("limits", "requests"):
        values = guarded(resources, section, "map", "{}")
        path = f"T.p + '.resources.{section}[' + k + ']'"
        stable = f"T.sp + '.resources.{section}[' + k + ']'"
        found = tviolation("pod-level-gpu", path, stable, about("x"),
                          "k + ' cannot be set in pod-level resources; set it on a container'")
        parts.append(f"{values}.transformList(k, x, type(k) == string && {is_gpu(ctx, 'k')}, {found})")
    return _per_template(ctx, " + ".join(parts))


# --- the opt-in cross-field checks -------------------------------------------------------------------------


def mixed_gpu_and_mig(ctx: Ctx) -> str:
    names = _names("g")
    slices = f"{names}.filter(k, k.startsWith('nvidia.com/mig-')).sort()"
    name = "('name' in r.c ? r.c.name : null)"
    message = f"'container ' + {quoted('N')} + ' mixes nvidia.com/gpu with MIG slices (' + S.join(', ') + ')'"
    found = violation("mixed-gpu-and-mig", RESOURCES_PATH, RESOURCES_STABLE, "S.join(', ')", message)
    body = f"[{slices}].filter(S, 'nvidia.com/gpu' in {names} && size(S) > 0).map(S, [{name}].map(N, {found})[0])"
    return _per_container(ctx, body)


def init_container_gpus(ctx: Ctx) -> str:
    message = "'an init container asks for GPUs (' + h + '); they stay reserved for the pod\\'s lifetime'"
    found = violation("init-container-gpus", RESOURCES_PATH, RESOURCES_STABLE, "h", message)
    body = f"[{_held('g', True)}].filter(h, h != '').map(h, {found})"
    return _per_container(ctx, body, "r.l == 'initContainers' && !r.side")


def cpu_pod_on_gpu_nodes(ctx: Ctx) -> str:
    tolerations = guarded("T.s", "tolerations", "list", "[]")
    path = "T.p + '.tolerations[' + string(i) + ']'"
    stable = stable_item("T.sp + '.tolerations'", "i", "x", "key")
    found = tviolation("cpu-pod-on-gpu-nodes", path, stable, "x.key",
                      "'the pod uses no GPU but tolerates the ' + x.key + ' taint, so it can land on a GPU node'")
    tolerated = f"{tolerations}.transformList(i, x, type(x) == map && {tolerates_gpu_taint(ctx, 'x')}, {found})"
    selector = guarded("T.s", "nodeSelector", "map", "{}")
    label = lit(ctx.policy.node_label)
    selected = f"{selector}[{label}]"
    message = lit("the pod uses no GPU but selects " + ctx.policy.node_label + "=") + " + " + plain(selected)
    selects_found = tviolation("cpu-pod-on-gpu-nodes", _selector_path(ctx), _selector_path(ctx, "T.sp"),
                              plain(selected), message)
    selects = f"({label} in {selector} ? [{selects_found}] : [])"
    px = f"{ctx.v('px')}[t]"
    return _per_template(ctx, f"{tolerated} + {selects}", f"!{px}.uses && !{px}.claims && !{px}.any")


# --- isolation ---------------------------------------------------------------------------------------------


def _hidden(ctx: Ctx) -> str:
    """``isolation.hides_gpus``: hideGpus applies in this namespace and the pod is no fractional scheduler's."""
    return f"({ctx.ns(lambda p: boolean(p.hide_gpus != 'off'))} && !P.frac)"


def _env_source(source: str) -> str:
    """``isolation._source``: where a valueFrom or envFrom entry takes its variables from."""
    branches = []
    for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret"), ("configMapKeyRef", "ConfigMap"),
                      ("secretKeyRef", "Secret")):
        ref = f"{source}.{key}"
        test = f"({lit(key)} in {source} && type({ref}) == map && size({ref}) > 0)"
        named = lit(kind + " ") + " + " + shown(ref + ".name")
        branches.append((test, f"('name' in {ref} && type({ref}.name) == string ? {named} : {lit(kind)})"))
    branches.append((f"'fieldRef' in {source}", lit("a field of the pod")))
    branches.append((f"'resourceFieldRef' in {source}", lit("a resource field")))
    expression = lit("a source")
    for test, value in reversed(branches):
        expression = f"({test} ? {value} : {expression})"
    return f"(type({source}) == map ? {expression} : {lit('a source')})"


def _env() -> str:
    return guarded("r.c", "env", "list", "[]")


def _device_env(condition: str, body: str) -> str:
    """Over the device variables of container ``r``'s env: ``e`` the item, ``n`` its index."""
    return (f"{_env()}.transformList(n, e, type(e) == map && 'name' in e && e.name in {lits(DEVICE_VARIABLES)}"
            f" && {condition}, {body})")


def _without_gpu(ctx: Ctx) -> str:
    """Container ``j`` of an untrusted pod holds no GPU (``GpuUse.holds`` is false)."""
    px, gx = ctx.v("px"), ctx.v("gx")
    return f"!{px}[r.t].trusted && !({px}[r.t].frac || {gx}[j].holds)"


def visible_devices_without_gpu(ctx: Ctx) -> str:
    value = "('value' in e ? e.value : '')"
    path = "r.p + '.env[' + string(n) + '].value'"
    stable = "r.sp + '.env[name=' + e.name + '].value'"
    message = (f"r.lab + ' uses no GPU but sets ' + e.name + '=' + {shown('v')} + "
               f"': the NVIDIA runtime would show it ' + "
               f"(v == 'all' ? 'every GPU of its node' : 'the GPUs it names') + "
               f"', outside the scheduler\\'s accounting; remove it or set it to void'")
    found = violation("visible-devices-without-gpu", path, stable, shown("v"), message)
    body = f"[{value}].filter(v, !(type(v) == string && v in {lits(NO_DEVICES)})).map(v, {found})"
    uncomputed = "!('valueFrom' in e && e.valueFrom != null)"
    return _per_container(ctx, f"{_device_env(uncomputed, body)}.flatten()", _without_gpu(ctx))


def visible_devices_unread(ctx: Ctx) -> str:
    path = "r.p + '.env[' + string(n) + '].valueFrom'"
    stable = "r.sp + '.env[name=' + e.name + '].valueFrom'"
    message = (f"r.lab + ' uses no GPU and takes ' + e.name + ' from ' + {_env_source('e.valueFrom')} + "
               f"', which admission cannot read; anything but void or none there shows it GPUs it was not given'")
    from_value = _device_env("'valueFrom' in e && e.valueFrom != null",
                             violation("visible-devices-unread", path, stable, "e.name", message))
    env_from = guarded("r.c", "envFrom", "list", "[]")
    prefix = "('prefix' in x && x.prefix != null && x.prefix != '' ? x.prefix : '')"
    usable = (f"type({prefix}) == string && {lit(VISIBLE_DEVICES)}.startsWith({prefix}) && "
              f"{prefix} != {lit(VISIBLE_DEVICES)}")
    named = f"{_env()}.exists(e, type(e) == map && 'name' in e && e.name == {lit(VISIBLE_DEVICES)})"
    from_message = (f"r.lab + ' uses no GPU and imports variables from ' + {_env_source('x')} + ', which admission "
                    f"cannot read; if one is {VISIBLE_DEVICES} it may show it GPUs it was not given (set "
                    f"{VISIBLE_DEVICES}=void in env, or isolation.hideGpus)'")
    found = violation("visible-devices-unread", "r.p + '.envFrom[' + string(k) + ']'",
                      "r.sp + '.envFrom[' + string(k) + ']'", _env_source("x"), from_message)
    imports = (f"(!{named} && !{_hidden(ctx)} ? {env_from}.transformList(k, x, type(x) == map && {usable}, {found}) "
               f": [])")
    return _per_container(ctx, f"{from_value} + {imports}", _without_gpu(ctx))


def zero_gpu_limit(ctx: Ctx) -> str:
    parts = []
    message = ("r.lab + ': ' + k + ': 0 allocates no GPU but may still tolerate GPU taints and select GPU nodes; "
               "leave the resource out'")
    for section, field in (("limits", "l"), ("requests", "r")):
        extra = "!(k in r.lim) && " if field == "r" else ""
        found = violation("zero-gpu-limit", _res_path(section), _res_stable(section), "k", message)
        parts.append(f"E.{field}.transformList(k, e, {extra}e.zc && e.z, {found})")
    return _per_container(ctx, " + ".join(parts))


def _affinity_keys(spec: str) -> str:
    """The label keys a required node affinity matches on (``isolation._affinity_keys``)."""
    affinity = guarded(spec, "affinity", "map", "{}")
    node = guarded(affinity, "nodeAffinity", "map", "{}")
    required = guarded(node, "requiredDuringSchedulingIgnoredDuringExecution", "map", "{}")
    terms = guarded(required, "nodeSelectorTerms", "list", "[]")
    expressions = guarded("term", "matchExpressions", "list", "[]")
    return (f"{terms}.map(term, {expressions}.filter(x, type(x) == map && 'key' in x && type(x.key) == string)"
            f".map(x, x.key)).flatten()")


def _gpu_node_reasons(ctx: Ctx) -> str:
    """``isolation.gpu_node_reasons`` of template ``T``, as a list of strings."""
    label = ctx.policy.node_label
    selector = guarded("T.s", "nodeSelector", "map", "{}")
    selected = f"{selector}[{lit(label)}]"
    selects = (f"({lit(label)} in {selector} && type({selected}) == string ? "
               f"[{lit('selects ' + label + '=')} + {selected}] : "
               f"{lit(label)} in {_affinity_keys('T.s')} ? [{lit('requires ' + label + ' by node affinity')}] : [])")
    tolerations = guarded("T.s", "tolerations", "list", "[]")
    every = "(!('key' in x) || x.key == null || x.key == '') && 'operator' in x && x.operator == 'Exists'"
    tolerates = (f"{tolerations}.filter(x, type(x) == map).map(x, {every} ? ['tolerates every taint'] : "
                 f"{tolerates_gpu_taint(ctx, 'x')} ? ['tolerates the ' + x.key + ' taint'] : []).flatten()")
    return f"({selects} + {tolerates})"


def privileged_gpu(ctx: Ctx) -> str:
    context = guarded("r.c", "securityContext", "map", "{}")
    privileged = f"{guarded(context, 'privileged', 'bool', 'false')} == true"
    why = (f"((P.frac || g.holds) ? [r.lab + ' is privileged and holds a GPU: it sees every GPU of its node, not only "
           f"its own'] : P.any ? [r.lab + ' is privileged in a pod with GPUs: it runs on a GPU node and sees every GPU "
           f"of it'] : [{_gpu_node_reasons(ctx)}].filter(w, size(w) > 0).map(w, "
           f"r.lab + ' is privileged and its pod ' + "
           f"w.join(', ') + ': on a GPU node it sees every GPU, outside the scheduler\\'s accounting'))")
    message = "w + '; only trusted namespaces and service accounts (isolation.trusted) may'"
    found = violation("privileged-gpu", "r.p + '.securityContext.privileged'", "r.sp + '.securityContext.privileged'",
                      lit("true"), message)
    return _per_container(ctx, f"{why}.map(w, {found})", f"!{ctx.v('px')}[r.t].trusted && {privileged}")


def normalised_path(path: str) -> str:
    """``isolation._normal``: ``posixpath.normpath("/" + path.lstrip("/"))`` in CEL.

    Empty and ``.`` segments are dropped; ``..`` pops the segment before it (never above ``/``): a
    segment survives when no later point of the walk goes below its level, where the level after step
    k is the prefix sum minus its running minimum (the walk reflected at the root). Quadratic in the
    number of segments, so a path of more than MAX_PATH_SEGMENTS segments is taken as ``/`` (which
    every GPU rule treats as exposing the devices): no legitimate path is that deep.
    """
    segments = f"{path}.split('/').filter(s1, s1 != '' && s1 != '.')"
    steps = "SG.map(s1, s1 == '..' ? -1 : 1)"
    sums = f"[0] + {steps}.transformList(k1, d1, {steps}.slice(0, k1 + 1).sum())"
    levels = "PS.transformList(k1, d1, d1 - PS.slice(0, k1 + 1).min())"
    kept = "SG.transformList(k1, s1, s1 != '..' && HS.slice(k1 + 1, size(HS)).min() >= HS[k1 + 1], s1)"
    return (f"[{segments}].map(SG, size(SG) > {MAX_PATH_SEGMENTS} ? '/' : [{sums}].map(PS, [{levels}].map(HS, "
            f"'/' + {kept}.join('/'))[0])[0])[0]")


def _under(path: str, directories: tuple[str, ...]) -> str:
    return " || ".join(f"({path} == {lit(d)} || {path}.startsWith({lit(d + '/')}))" for d in directories)


def gpu_device_mount(ctx: Ctx) -> str:
    volumes = guarded("T.s", "volumes", "list", "[]")
    host = guarded(guarded("x", "hostPath", "map", "{}"), "path", "string", "null")
    exposes = (f"(N == '/' || N == '/dev' || N.startsWith({lit(NVIDIA_DEVICE_PREFIX)}) || "
               f"{_under('N', DEVICE_DIRECTORIES)})")
    vpath = "T.p + '.volumes[' + string(i) + '].hostPath.path'"
    vstable = stable_item("T.sp + '.volumes'", "i", "x", "name") + " + '.hostPath.path'"
    vmessage = ("'hostPath ' + " + shown("h") + " + ' exposes the node\\'s GPU devices to the pod, outside the "
                "scheduler\\'s accounting; GPUs come from resources'")
    vfound = tviolation("gpu-device-mount", vpath, vstable, "h", vmessage)
    # Only a path that names dev, climbs (..) or is all slashes and dots can normalise to a device directory or /.
    suspect = f"(h.contains('dev') || h.contains('..') || !{matches('h', '[^/.]')})"
    host_paths = (f"{volumes}.transformList(i, x, type(x) == map && {host} != null, [{host}].map(h, {suspect} ? "
                  f"[{normalised_path('h')}].filter(N, {exposes}).map(N, {vfound}) : [])[0]).flatten()")
    per_template = _per_template(ctx, host_paths, f"!{ctx.v('px')}[t].trusted")
    mounts = guarded("r.c", "volumeMounts", "list", "[]")
    mount_path = guarded("x", "mountPath", "string", "null")
    mpath = "r.p + '.volumeMounts[' + string(k) + '].mountPath'"
    mstable = stable_item("r.sp + '.volumeMounts'", "k", "x", "mountPath") + " + '.mountPath'"
    mmessage = ("r.lab + ': a mount at ' + " + shown("h") + " + ' asks the NVIDIA runtime (volume-mounts device list "
                "strategy) for the GPUs it names, outside the scheduler\\'s accounting'")
    mfound = violation("gpu-device-mount", mpath, mstable, "h", mmessage)
    # A path under the device-list directory names it (normalising keeps the segments that survive).
    mount_list = (f"{mounts}.transformList(k, x, type(x) == map && {mount_path} != null && "
                  f"{mount_path}.contains('nvidia-container-devices'), [{mount_path}].map(h, "
                  f"[{normalised_path('h')}].filter(N, {_under('N', DEVICE_LIST_DIRECTORIES)}).map(N, {mfound}))[0])"
                  f".flatten()")
    per_container = _per_container(ctx, mount_list, f"!{ctx.v('px')}[r.t].trusted")
    return f"{per_template} + {per_container}"


def cdi_annotation(ctx: Ctx) -> str:
    annotations = guarded("T.m", "annotations", "map", "{}")
    is_cdi = " || ".join([f"k.startsWith({lit(p)})" for p in CDI_PREFIXES] + [f"k == {lit(k)}" for k in CDI_KEYS])
    extra = ("(type(x) == string && x.contains('management.nvidia.com/') ? "
             "' (management.nvidia.com/gpu opens every GPU of the node)' : '')")
    message = (f"'annotation ' + k + '=' + {shown('x')} + ' asks the container runtime to inject CDI devices' + "
               f"{extra} + ', outside the scheduler\\'s accounting; only trusted namespaces and service accounts "
               f"(isolation.trusted) may'")
    path = "T.mp + '.annotations[' + k + ']'"
    found = tviolation("cdi-annotation", path, path, shown("x"), message)
    body = f"{annotations}.transformList(k, x, type(k) == string && ({is_cdi}), {found})"
    return _per_template(ctx, body, f"!{ctx.v('px')}[t].trusted")


def runtime_class_without_gpu(ctx: Ctx) -> str:
    name = guarded("T.s", "runtimeClassName", "string", "''")
    message = (f"'runtimeClassName ' + n + ' on a pod that uses no GPU: the NVIDIA runtime shows it the GPUs its "
               f"image\\'s {VISIBLE_DEVICES} names (all, in CUDA images); use the default runtime'")
    found = tviolation("runtime-class-without-gpu", "T.p + '.runtimeClassName'", "T.sp + '.runtimeClassName'", "n",
                      message)
    body = f"[{name}].filter(n, n.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})).map(n, {found})"
    px = f"{ctx.v('px')}[t]"
    return _per_template(ctx, body, f"!{px}.trusted && !{px}.any")


# --- the vendor names (webhook.rules.sharing) -------------------------------------------------------------


def _section(section: str) -> str:
    return "E.l" if section == "limits" else "E.r"


def _read(section: str, test: str) -> str:
    """Names of ``sharing._requested`` entries of one section (in requests, where limits lack the name) whose
    entry ``e`` passes ``test``."""
    field = _section(section)
    extra = "!(k in r.lim) && " if section == "requests" else ""
    return f"{field}.filter(k, {extra}{field}[k].rd && [{field}[k]].exists(e, {test}))"


def shared_gpu_over_one(ctx: Ctx) -> str:
    parts = []
    message = ("r.lab + ': ' + string(n) + ' ' + k + ' asks for several replicas of a shared GPU, which give no "
               "more compute than one (the kubelet refuses it with failRequestsGreaterThanOne); ask for 1'")
    for section in ("limits", "requests"):
        found = violation("shared-gpu-over-one", _res_path(section), _res_stable(section), "string(n)", message)
        test = "e.shr && e.e == '' && e.c > 1"
        parts.append(f"{_read(section, test)}.map(k, [{_section(section)}[k].c].map(n, {found})[0])")
    return _per_container(ctx, " + ".join(parts))


def fractional_gpu_request(ctx: Ctx) -> str:
    parts = []
    message = f"r.lab + ': ' + k + ' is a percentage, 0 to 100, not ' + {shown('x')}"
    for section in ("limits", "requests"):
        found = violation("fractional-gpu-request", _res_path(section), _res_stable(section), shown("x"), message)
        test = "e.pct && (e.e != '' || e.c > 100)"
        parts.append(f"{_read(section, test)}.map(k, [{_section(section)}[k].x].map(x, {found})[0])")
    seen = f"({_read('limits', 'e.sch')} + {_read('requests', 'e.sch')})"
    for absolute, percentage in EXCLUSIVE:
        both = lit(f": {absolute} and {percentage} both size the GPU memory; set one of them")
        found = violation("fractional-gpu-request", RESOURCES_PATH, RESOURCES_STABLE,
                          lit(absolute + " + " + percentage), "r.lab + " + both)
        parts.append(f"({lit(absolute)} in {seen} && {lit(percentage)} in {seen} ? [{found}] : [])")
    volcano = f"{seen}.filter(k, k.startsWith('volcano.sh/vgpu-') && k != {lit(VOLCANO_COUNT)}).sort()"
    message = ("r.lab + ': ' + V.join(', ') + "
               + lit(" without " + VOLCANO_COUNT + ": Volcano mounts no GPU without a vGPU count"))
    found = violation("fractional-gpu-request", RESOURCES_PATH, RESOURCES_STABLE, "V.join(', ')", message)
    parts.append(f"[{volcano}].filter(V, size(V) > 0 && !({lit(VOLCANO_COUNT)} in {seen})).map(V, {found})")
    return _per_container(ctx, " + ".join(parts))


def gpu_monitoring_resource(ctx: Ctx) -> str:
    parts = []
    message = ("r.lab + ': ' + k + ' gives access to every GPU of the node; only trusted namespaces and service "
               "accounts (isolation.trusted) may ask for it'")
    for section in ("limits", "requests"):
        found = violation("gpu-monitoring-resource", _res_path(section), _res_stable(section), "k", message)
        parts.append(f"{_read(section, 'e.mon && !e.z')}.map(k, {found})")
    return _per_container(ctx, " + ".join(parts), f"!{ctx.v('px')}[r.t].trusted")


# --- the pod's own DRA fields (webhook.rules.claims, what needs no other object) ---------------------------


def _declared() -> str:
    """``spec.resourceClaims[].name`` in order, first occurrence."""
    claims = guarded("T.s", "resourceClaims", "list", "[]")
    return f"{claims}.filter(x, type(x) == map && 'name' in x && type(x.name) == string).map(x, x.name).distinct()"


def _container_claims(container: str) -> str:
    return guarded(guarded(container, "resources", "map", "{}"), "claims", "list", "[]")


def _has_claims() -> str:
    """``claims.pod_violations`` looks at all: claims declared, or referenced by a container."""
    claims = guarded("T.s", "resourceClaims", "list", "[]")
    containers = (f"{lits(('containers', 'initContainers'))}.exists(l, l in T.s && type(T.s[l]) == list && "
                  f"T.s[l].exists(c, type(c) == map && {_container_claims('c')}.exists(x, type(x) == map)))")
    return f"(size({claims}) > 0 || {containers})"


def node_name_with_gpus(ctx: Ctx) -> str:
    node = guarded("T.s", "nodeName", "string", "''")
    claims = guarded("T.s", "resourceClaims", "list", "[]")
    lost = f"(size({claims}) > 0 ? 'its claims are never allocated' : 'no GPU capacity is checked')"
    message = (f"'nodeName ' + n + ' bypasses the scheduler, so ' + {lost} + '; use nodeSelector "
               f"kubernetes.io/hostname: ' + n")
    found = tviolation("node-name-with-gpus", "T.p + '.nodeName'", "T.sp + '.nodeName'", "n", message)
    body = f"[{node}].filter(n, n != '' && (P.uses || size({claims}) > 0)).map(n, {found})"
    return _per_template(ctx, body)


def _truthy(field: str) -> str:
    return f"({lit(field)} in x && x.{field} != null && x.{field} != '' && x.{field} != false && x.{field} != 0)"


def claim_source(ctx: Ctx) -> str:
    claims = guarded("T.s", "resourceClaims", "list", "[]")
    named = f"[{_truthy('resourceClaimName')}, {_truthy('resourceClaimTemplateName')}].filter(b, b)"
    name = "('name' in x ? x.name : null)"
    path = "T.p + '.resourceClaims[' + string(i) + ']'"
    stable = stable_item("T.sp + '.resourceClaims'", "i", "x", "name")
    message = (f"'claim ' + {quoted('N')} + ' names ' + w + ' of resourceClaimName and resourceClaimTemplateName; "
               f"exactly one is required'")
    found = tviolation("claim-source", path, stable, "w", message)
    body = (f"{claims}.transformList(i, x, type(x) == map && size({named}) != 1, "
            f"[size({named}) == 2 ? 'both' : 'neither'].map(w, [{name}].map(N, {found})[0])[0])")
    return _per_template(ctx, body, f"{ctx.v('px')}[t].dra")


def undeclared_claim(ctx: Ctx) -> str:
    declared = _declared()
    listed = f"(size({declared}) > 0 ? {declared}.join(', ') : 'none')"
    name = "('name' in x ? x.name : null)"
    path = "r.p + '.resources.claims[' + string(k) + '].name'"
    stable = stable_item("r.sp + '.resources.claims'", "k", "x", "name") + " + '.name'"
    message = (f"'claim ' + {quoted('N')} + ' is not declared in ' + T.p + '.resourceClaims (declared: ' + "
               f"{listed} + ')'")
    found = violation("undeclared-claim", path, stable, plain("N"), message)
    body = (f"(P.dra ? {_container_claims('r.c')}.transformList(k, x, type(x) == map && "
            f"!({name} in {declared}), [{name}].map(N, {found})[0]) : [])")
    return _per_container(ctx, body, "r.l != 'ephemeralContainers'")


def unused_claim(ctx: Ctx) -> str:
    claims = guarded("T.s", "resourceClaims", "list", "[]")
    references = _container_claims("c")
    used = (f"{lits(('containers', 'initContainers'))}.map(l, l in T.s && type(T.s[l]) == list ? "
            f"T.s[l].filter(c, type(c) == map).map(c, {references}.filter(x, type(x) == map && 'name' in x)"
            f".map(x, x.name)).flatten() : []).flatten()")
    path = "T.p + '.resourceClaims[' + string(i) + ']'"
    stable = "T.sp + '.resourceClaims[name=' + x.name + ']'"
    message = ("'claim ' + " + quoted("x.name") + " + ' is declared but no container uses it; its devices would be "
               "allocated for nothing'")
    found = tviolation("unused-claim", path, stable, "x.name", message)
    first = f"{claims}.transformList(i2, y, type(y) == map && 'name' in y && y.name == x.name, i2)[0] == i"
    body = (f"[{used}].map(U, {claims}.transformList(i, x, type(x) == map && 'name' in x && type(x.name) == string && "
            f"{first} && !(x.name in U), {found}))[0]")
    return _per_template(ctx, body, f"{ctx.v('px')}[t].dra")


# Builders of the pod-template rules, by rule id.
BUILDERS: dict[str, Callable[[Ctx], str]] = {
    "invalid-quantity": invalid_quantity,
    "requests-without-limits": requests_without_limits,
    "requests-differ": requests_differ,
    "per-container-limit": per_container_limit,
    "per-pod-limit": per_pod_limit,
    "accelerator-not-allowed": accelerator_not_allowed,
    "accelerator-conflict": accelerator_conflict,
    "structure": structure,
    "ephemeral-gpu": ephemeral_gpu,
    "pod-level-gpu": pod_level_gpu,
    "mixed-gpu-and-mig": mixed_gpu_and_mig,
    "init-container-gpus": init_container_gpus,
    "cpu-pod-on-gpu-nodes": cpu_pod_on_gpu_nodes,
    "visible-devices-without-gpu": visible_devices_without_gpu,
    "visible-devices-unread": visible_devices_unread,
    "zero-gpu-limit": zero_gpu_limit,
    "privileged-gpu": privileged_gpu,
    "gpu-device-mount": gpu_device_mount,
    "cdi-annotation": cdi_annotation,
    "runtime-class-without-gpu": runtime_class_without_gpu,
    "shared-gpu-over-one": shared_gpu_over_one,
    "fractional-gpu-request": fractional_gpu_request,
    "gpu-monitoring-resource": gpu_monitoring_resource,
    "node-name-with-gpus": node_name_with_gpus,
    "claim-source": claim_source,
    "undeclared-claim": undeclared_claim,
    "unused-claim": unused_claim,
}

# Rules the apiserver already enforces on Pods and built-in templates (validateResourceRequirements; their shape is
# the schema's): only custom resources need them from us.
CUSTOM_ONLY = frozenset({"requests-without-limits", "requests-differ", "structure"})


# --- what can matter at all (matchConditions) -------------------------------------------------------------------

_BUILTIN_TEMPLATE = (
    "request.kind.kind == 'Pod' ? [object] : request.kind.kind == 'PodTemplate' ? (has(object.template) ? "
    "[object.template] : []) : request.kind.kind == 'CronJob' ? (has(object.spec.jobTemplate.spec.template) ? "
    "[object.spec.jobTemplate.spec.template] : []) : (has(object.spec.template) ? [object.spec.template] : [])"
)


def _any_container(test: str, lists: tuple[str, ...] = CONTAINER_LISTS) -> str:
    """Some container of template ``t`` (in ``lists``), ``c``, passes ``test``."""
    return f"{lits(lists)}.exists(l, l in t.spec && t.spec[l].exists(c, {test}))"


def _extended(resources: str, value_test: str = "true") -> str:
    """A resource map in ``resources`` (limits or requests) names an extended resource (every GPU name has a
    domain) whose value ``v`` passes ``value_test``."""
    return " || ".join(f"(has({resources}.{s}) && {resources}.{s}.exists(k, k.contains('/') && "
                       f"[{resources}.{s}[k]].exists(v, {value_test})))" for s in ("limits", "requests"))


def _triggers(ctx: Ctx) -> dict[str, str]:
    """Per kind of thing a rule reads, a cheap test on template ``t`` of a Pod or built-in workload that is true
    whenever the rule could find something (false may skip it: matchConditions)."""
    taints = sorted({t.key for t in ctx.policy.gpu_taints})
    toleration = "has(x.key) && (x.key.contains('/')" + (f" || x.key in {lits(taints)}" if taints else "") + ")"
    cdi = " || ".join([f"k.startsWith({lit(p)})" for p in CDI_PREFIXES] + [f"k == {lit(k)}" for k in CDI_KEYS])
    extended = _any_container(f"has(c.resources) && ({_extended('c.resources')})")
    positive = "!" + matches("string(v)", "^[1-9][0-9]{0,5}$")
    gpu_named = " || ".join(f"(has(c.resources.{s}) && c.resources.{s}.exists(k, {is_gpu(ctx, 'k')}))"
                            for s in ("limits", "requests"))
    claims = ("(has(t.spec.resourceClaims) && size(t.spec.resourceClaims) > 0) || "
              + _any_container("has(c.resources) && has(c.resources.claims) && size(c.resources.claims) > 0",
                               ("containers", "initContainers")))
    return {
        "extended": f"({extended} || (has(t.spec.resources) && ({_extended('t.spec.resources')})))",
        # A value that is not a positive count of at most 6 digits (a 0, an odd spelling): what zero-gpu-limit reads.
        "zero": _any_container(f"has(c.resources) && ({_extended('c.resources', positive)})"),
        "init": _any_container(f"has(c.resources) && ({_extended('c.resources')})", ("initContainers",)),
        "claims": f"({claims})",
        "devices": _any_container(f"has(c.env) && c.env.exists(e, e.name in {lits(DEVICE_VARIABLES)})"),
        "unread": _any_container(f"(has(c.envFrom) && size(c.envFrom) > 0) || (has(c.env) && c.env.exists(e, "
                                 f"e.name in {lits(DEVICE_VARIABLES)} && has(e.valueFrom)))"),
        "privileged": _any_container("has(c.securityContext) && has(c.securityContext.privileged) && "
                                     "c.securityContext.privileged"),
        "mounts": ("(has(t.spec.volumes) && t.spec.volumes.exists(v, has(v.hostPath))) || "
                   + _any_container("has(c.volumeMounts) && c.volumeMounts.exists(v, "
                                    "v.mountPath.contains('nvidia-container-devices'))")),
        "cdi": f"(has(t.metadata.annotations) && t.metadata.annotations.exists(k, {cdi}))",
        "runtime": (f"(has(t.spec.runtimeClassName) && "
                    f"t.spec.runtimeClassName.startsWith({lit(NVIDIA_RUNTIME_PREFIX)}))"),
        # cpu-pod-on-gpu-nodes speaks only of pods that name no GPU (a GPU pod carries the accelerator selector the
        # MutatingAdmissionPolicy injected).
        "gpu-nodes": (f"((has(t.spec.tolerations) && t.spec.tolerations.exists(x, {toleration})) || "
                      f"(has(t.spec.nodeSelector) && {lit(ctx.policy.node_label)} in t.spec.nodeSelector)) && "
                      f"!{_any_container(f'has(c.resources) && ({gpu_named})')}"),
        "node-name": "(has(t.spec.nodeName) && t.spec.nodeName != '')",
        "never": "false",
    }


# What each pod rule reads, as _triggers names it: a Pod or built-in template none of them matches is skipped.
READS: dict[str, tuple[str, ...]] = {
    "invalid-quantity": ("extended",), "requests-without-limits": ("extended",), "requests-differ": ("extended",),
    "per-container-limit": ("extended",), "per-pod-limit": ("extended",), "accelerator-not-allowed": ("extended",),
    "accelerator-conflict": ("extended",), "ephemeral-gpu": ("extended",), "pod-level-gpu": ("extended",),
    "mixed-gpu-and-mig": ("extended",), "shared-gpu-over-one": ("extended",), "fractional-gpu-request": ("extended",),
    "gpu-monitoring-resource": ("extended",),
    "structure": ("never",),  # custom resources only: Pods have a schema
    "zero-gpu-limit": ("zero",), "init-container-gpus": ("init",),
    "visible-devices-without-gpu": ("devices",), "visible-devices-unread": ("unread",),
    "privileged-gpu": ("privileged",), "gpu-device-mount": ("mounts",), "cdi-annotation": ("cdi",),
    "runtime-class-without-gpu": ("runtime",), "cpu-pod-on-gpu-nodes": ("gpu-nodes",),
    "claim-source": ("claims",), "undeclared-claim": ("claims",), "unused-claim": ("claims",),
    "node-name-with-gpus": ("node-name",),
}


def matters(ctx: Ctx, rules: list[str]) -> str:
    """A ``matchConditions`` expression for a policy holding ``rules``: false only for a Pod or built-in workload
    whose template has nothing those rules read, so the ordinary CPU pods of a cluster (and, for the warn policy,
    most GPU pods) cost the policy one cheap expression. Custom kinds and claims always go on: CEL cannot tell
    without reading their templates."""
    triggers = _triggers(ctx)
    wanted = sorted({name for rule in rules for name in READS.get(rule, ("extended",))} - {"never"})
    checks = " || ".join(f"({triggers[name]})" for name in wanted) or "false"
    builtin = " || ".join(f"(request.kind.group == {lit(g)} && request.kind.kind in {lits(ks)})"
                          for g, ks in _builtin_by_group().items())
    return f"!({builtin}) || ({_BUILTIN_TEMPLATE}).exists(t, has(t.spec) && ({checks}))"


def _builtin_by_group() -> dict[str, list[str]]:
    from webhook.native.kinds import BUILTIN_KINDS

    out: dict[str, list[str]] = {}
    for group, kind, _, _ in BUILTIN_KINDS:
        out.setdefault(group, []).append(kind)
    return out
