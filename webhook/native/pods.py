"""The pod-template rules as findings: each rule's check in ``webhook.rules``, read field by field.

Every finding starts from ``variables.templates``, the object's pod templates as records:

- ``t.path``, ``t.stable``, ``t.metaPath``: where the pod spec and its metadata are (``spec``,
  ``spec.template.spec``, ``spec.pytorchReplicaSpecs.Worker.template.spec``...), and the spec's path with list
  items by name;
- ``t.spec``, ``t.meta``: the pod spec and the template's metadata;
- what the rules share about the pod, computed once (:func:`template_facts`): ``t.uses`` (a container names a
  policy GPU: ``PodGPUs.uses_gpus``), ``t.holds`` (it holds a GPU of some kind or asks a fractional scheduler:
  ``GpuUse.any``), ``t.fractional``, ``t.trusted`` (``Policy.trusts``), ``t.declares`` (``spec.resourceClaims``
  is not empty), ``t.dra`` (it declares or references claims).

Then the container lists (``l``), the containers (``c``, at index ``i``, which only messages read) and their
resource names (``k``), read as they are: nothing is built for a container unless a rule's condition needs it.
Resource names are classified once per object (:data:`CLASSES`: ``variables.gpus``, ``variables.holding``...),
so a rule asks ``k in variables.gpus``. What a rule reads of a container is written with
:class:`~webhook.native.snippets.Shape`: plain optional reads for Pods and the built-in workloads, type-checked
reads for custom resources.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

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
from webhook.native import params
from webhook.native.celtext import boolean, every_policy, lit, lits, matches, record
from webhook.native.findings import SEPARATOR, Each, Finding
from webhook.native.registry import NEVER, Trigger, native
from webhook.native.snippets import (
    DIGITS,
    MONITORING,
    PERCENT,
    READ_BY_SHARING,
    SCHEDULER,
    SHARED,
    Ctx,
    about,
    count,
    escaped,
    holds_gpu,
    holds_name,
    is_gpu,
    is_zero,
    plain,
    quantity_error,
    quantity_reason,
    quoted,
    ranked,
    service_account,
    shown,
    stable_item,
    tolerates_gpu_taint,
    type_name,
    zero_counting,
)
from webhook.rules.isolation import HOST_PID_GPU

# Paths with more segments than this are normalised conservatively (see normalised_path).
MAX_PATH_SEGMENTS = 40

TEMPLATES = Each("t", "variables.templates")
# The registry's vendor names the sharing rules read, for Python's re (the same expression as the CEL literal).
READ_BY_SHARING_PY = READ_BY_SHARING


# --- reading a template, a container, a resource name ------------------------------------------------------


@dataclass(frozen=True)
class Reads:
    """Field reads for one shape of object (``webhook.native.snippets.Shape``), and the container ``c`` of list
    ``l`` at index ``i`` as the rules see it."""

    ctx: Ctx

    @property
    def typed(self) -> bool:
        return self.ctx.shape.typed

    def get(self, parent: str, key: str, kind: str, default: str) -> str:
        return self.ctx.shape.get(parent, key, kind, default)

    def at(self, parent: str, keys: str, kind: str, default: str) -> str:
        return self.ctx.shape.path(parent, keys, kind, default)

    def is_map(self, value: str) -> str:
        """``type(value) == map && `` for custom resources, nothing for typed ones (a prefix for a condition)."""
        return "" if self.typed else f"type({value}) == map && "

    def items(self, parent: str, key: str) -> str:
        """The mappings of the list ``parent.key``."""
        values = self.get(parent, key, "list", "[]")
        return values if self.typed else f"{values}.filter(x, type(x) == map)"

    def containers(self, lists: tuple[str, ...] = CONTAINER_LISTS, where: str = "") -> tuple[Each, Each]:
        """The loops over the container lists named and their containers (``c``, index ``i``)."""
        if self.typed:
            items = "t.spec[?l].orValue([])"
        else:
            items = "(l in t.spec && type(t.spec[l]) == list ? t.spec[l] : [])"
        tests = [] if self.typed else ["type(c) == map"]
        return Each("l", lits(lists)), Each("c", items, " && ".join([*tests, *([where] if where else [])]), "i")

    def section(self, name: str, container: str = "c") -> str:
        """The container's ``resources.limits`` or ``resources.requests`` (``{}`` when absent or not a map)."""
        return self.at(container, f"resources.{name}", "map", "{}")

    def names(self, section: str, where: str) -> Each:
        """The loop over the resource names (``k``) of a section of ``c``."""
        return Each("k", self.section(section), where)

    PATH = "t.path + '.' + l + '[' + string(i) + ']'"

    @property
    def stable(self) -> str:
        if self.typed:
            return "t.stable + '.' + l + '[name=' + c.name + ']'"
        return stable_item("t.stable + '.' + l", "i", "c", "name")

    @property
    def label(self) -> str:
        """``Container.label``: ``container "name"``, or ``container <path>`` without a name."""
        if self.typed:
            return "'container \"' + c.name + '\"'"
        has_name = "('name' in c && type(c.name) == string && c.name != '')"
        shown_name = f"({matches('c.name', '^[-a-z0-9.]*$')} ? c.name : {escaped('c.name')})"
        return f"({has_name} ? 'container \"' + {shown_name} + '\"' : 'container ' + {self.PATH})"

    @property
    def name(self) -> str:
        """The container's ``name`` as it is (null when absent)."""
        return "c.name" if self.typed else "('name' in c ? c.name : null)"

    def entry_path(self, section: str) -> str:
        return f"{self.PATH} + '.resources.{section}[' + k + ']'"

    def entry_stable(self, section: str) -> str:
        return f"{self.stable} + '.resources.{section}[' + k + ']'"

    @property
    def resources_path(self) -> str:
        return f"{self.PATH} + '.resources'"

    @property
    def resources_stable(self) -> str:
        return f"{self.stable} + '.resources'"

    def claims(self, container: str = "c") -> str:
        return self.at(container, "resources.claims", "list", "[]")

    def sidecar(self, container: str = "c") -> str:
        if self.typed:
            return f"({container}.?restartPolicy.orValue('') == 'Always')"
        return f"('restartPolicy' in {container} && {container}.restartPolicy == 'Always')"

    def valid(self, value: str) -> str:
        """The value is a GPU count (``gpu_count`` accepts it)."""
        return f"{quantity_reason(value, self.typed)} == ''"

    def error(self, value: str) -> str:
        """``gpu_count``'s message for the value, ``''`` when it is a count."""
        return quantity_error(value, self.typed)

    def zero(self, value: str) -> str:
        """The value is a valid count of 0."""
        return is_zero(value, self.typed)

    def shown(self, value: str) -> str:
        """A resource value as ``shown`` words it."""
        return shown(value, self.typed)

    def about(self, value: str) -> str:
        """A resource value as ``about`` words it."""
        return about(value, self.typed)

    def each_section(self, where: str = "") -> tuple[Each, Each]:
        """The loops over the container's two sections (``s``: limits, requests) and their names (``k``)."""
        values = "c.?resources[?s].orValue({})" if self.typed else \
            "(type(c) == map && 'resources' in c && type(c.resources) == map && s in c.resources && " \
            "type(c.resources[s]) == map ? c.resources[s] : {})"
        return Each("s", "['limits', 'requests']"), Each("k", values, where)

    def counts(self, container: str = "c") -> str:
        """The container's policy GPUs with a valid count, each once, as ``{name, count}``: requests, else limits
        (what the scheduler holds)."""
        sections = f"[{self.section('limits', container)}, {self.section('requests', container)}]"
        valid = (f"{sections}.map(M, M.filter(k, k in variables.gpus && {self.valid('M[k]')}).map(k, "
                 f"{record(name='k', count=count('M[k]'))}))")
        return f"[{valid}].map(P, P[0].filter(x, !P[1].exists(y, y.name == x.name)) + P[1])[0]"

    def holds(self, container: str = "c") -> str:
        """The container holds a GPU of some kind (``context.container_gpus``): a holding name not a valid 0, or a
        claim."""
        def held(section: str) -> tuple[str, str]:
            values = self.section(section, container)
            return values, f"k in variables.holding && !{self.zero(values + '[k]')}"
        return holds_gpu(held, self.claims(container))


# --- names and templates: what is computed once per object --------------------------------------------------

# The classes of a resource name, each a list of the object's names: a name is classified once per object.
CLASSES: dict[str, Callable[[Ctx], str]] = {
    "gpus": lambda ctx: is_gpu(ctx, "k"),  # Policy.is_gpu: a GPU count of the policy
    "holding": lambda ctx: holds_name(ctx, "k"),  # it holds a GPU of some kind (context.container_gpus)
    "zero_counting": lambda ctx: zero_counting(ctx, "k"),  # zero-gpu-limit reads it
    "vendor": lambda ctx: matches("k", READ_BY_SHARING),  # the vendor-name checks read it (sharing.requested)
    "shared": lambda ctx: f"k in variables.vendor && {matches('k', SHARED)}",
    "percent": lambda ctx: f"k in variables.vendor && {matches('k', PERCENT)}",
    "scheduler": lambda ctx: matches("k", SCHEDULER),
    "monitoring": lambda ctx: f"k in variables.vendor && {matches('k', MONITORING)}",
}


def name_variables(ctx: Ctx, pods: str = "variables.pod_specs[0]") -> list[tuple[str, str]]:
    """``resource_names``: every resource name with a domain (every GPU name has one) in the containers and pod-level
    resources of the object's templates, and one list per class of :data:`CLASSES`. The names are collected by
    joining and splitting again on the separator (a name that holds one only adds names no container has), each
    once where the target has ``distinct()``, and before that once when every container names the same (the
    usual pod): a name classified twice is classified alike."""
    r = Reads(ctx)
    sep = lit(SEPARATOR)
    lists = "[" + ", ".join(r.items("n.spec", name) for name in CONTAINER_LISTS) + ", " + (
        "dyn([n.spec])" if r.typed else "[n.spec]") + "]"
    lim, req = r.section("limits"), r.section("requests")
    per_container = (f"({lim}.filter(k, k.contains('/')) + {req}.filter(k, k.contains('/') && !(k in {lim})))"
                     f".join({sep})")
    found = (f"{pods}.map(n, {lists}.map(L, L.map(c, {per_container}).join({sep})).join({sep})).join({sep})"
             f".split({sep}).filter(k, k != '')")
    once = f"{found}.distinct()" if ctx.lists else f"[{found}].map(N, N.all(k, k == N[0]) ? N.slice(0, 1) : N)[0]"
    if not ctx.lists:
        once = f"[{found}].map(N, size(N) > 0 && N.all(k, k == N[0]) ? [N[0]] : N)[0]"
    return [("resource_names", once)] + [(name, f"variables.resource_names.filter(k, {test(ctx)})")
                                         for name, test in CLASSES.items()]


def _some_container(r: Reads, spec: str, test: str, lists: tuple[str, ...] = CONTAINER_LISTS) -> str:
    """Some container ``c`` of the pod spec ``spec`` passes ``test``."""
    containers = "[" + ", ".join(r.items(spec, name) for name in lists) + "]"
    return f"{containers}.exists(L, L.exists(c, {test}))"


def trusted(ctx: Ctx, spec: str) -> str:
    """``Policy.trusts``: the namespace, or the service account of the pod spec ``spec``, is in
    ``isolation.trusted``."""
    account = service_account(ctx.shape, spec)

    def text(policy: Policy) -> str:
        if policy.trusted:
            return "true"
        if policy.trusted_accounts:
            return f"({account} in {lits(sorted(policy.trusted_accounts))})"
        return "false"
    return ctx.ns(text, live=params.trusted_pod(account))


def template_facts(ctx: Ctx, spec: str, meta: str) -> dict[str, str]:
    """What the rules share about a pod spec, as CEL reading ``spec`` and its template's ``meta``; each short-cuts
    when the object names no resource of the class it asks about. ``holds`` reads ``fractional`` as ``F``."""
    r = Reads(ctx)
    annotations = r.get(meta, "annotations", "map", "{}")

    def names(test: str) -> str:
        return " || ".join(f"{r.section(s)}.exists(k, {test.replace('X', r.section(s) + '[k]')})"
                           for s in ("limits", "requests"))

    scheduler = _some_container(r, spec, names(f"k in variables.scheduler && !{r.zero('X')}"))
    fractional = (f"((size(variables.scheduler) > 0 && {scheduler}) || "
                  f"{lits(FRACTION_ANNOTATIONS)}.exists(a, a in {annotations}))")
    claims = r.claims() if r.typed else f"{r.claims()}.filter(x, type(x) == map)"
    declared = r.get(spec, "resourceClaims", "list", "[]")
    return {
        "uses": f"size(variables.gpus) > 0 && {_some_container(r, spec, names('k in variables.gpus'))}",
        "fractional": fractional,
        "holds": f"F || {_some_container(r, spec, r.holds())}",
        "trusted": trusted(ctx, spec),
        "declares": f"size({declared}) > 0",
        "dra": f"size({declared}) > 0 || {_some_container(r, spec, f'size({claims}) > 0', LISTS_WITH_CLAIMS)}",
        "gpuCounts": gpu_counts(r, spec),
    }


LISTS_WITH_CLAIMS = ("containers", "initContainers")


# --- the builders -----------------------------------------------------------------------------------------------

def _cap(ctx: Ctx, attribute: str) -> str:
    return ctx.ns(lambda p: str(getattr(p, attribute)),
                  live=params.of({"per_container": "perContainer", "per_pod": "perPod"}[attribute]))


def _per_name(r: Reads, rule: str, sections: tuple[str, ...], names: str, where: str, message: str, value: str,
              let: tuple[tuple[str, str], ...] = (), template: str = "", container: str = "",
              requests_only: bool = False) -> list[Finding]:
    """The finding on the resource names (``k``, value ``x``) of the ``sections`` (``s``) of every container: the
    names passing ``names`` (cheap: class lists) are read, then ``where``. With ``requests_only``, a name in
    requests counts only when limits lack it (``sharing.requested``)."""
    test = names
    if requests_only and "requests" in sections:
        test = f"(s == 'limits' || !(k in {r.section('limits')})) && {names}"
    section_loop, names_loop = r.each_section(test)
    if sections != ("limits", "requests"):
        section_loop = Each("s", lits(sections))
    loops = (Each("t", "variables.templates", template), *r.containers(where=container), section_loop, names_loop)
    path = f"{Reads.PATH} + '.resources.' + s + '[' + k + ']'"
    stable = f"{r.stable} + '.resources.' + s + '[' + k + ']'"
    return [Finding(rule, loops, where, path, stable, value, message, (("x", f"{names_loop.over}[k]"), *let))]


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
    return _per_name(r, "invalid-quantity", ("limits", "requests"), "k in variables.gpus", "e != ''",
                     f"{r.label} + ': ' + e", r.about("x"), (("e", r.error("x")),), template="t.uses")


@native("requests-without-limits", fires=(NEVER,), custom_only=True)
def requests_without_limits(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = f"{r.label} + ': ' + k + ' is requested without a limit, set it in limits (requests default to limits)'"
    return _per_name(r, "requests-without-limits", ("requests",),
                     f"k in variables.gpus && !(k in {r.section('limits')})", "", message, r.about("x"),
                     template="t.uses")


@native("requests-differ", fires=(NEVER,), custom_only=True)
def requests_differ(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = f"{r.label} + ': ' + k + ' requests (' + {r.about('x')} + ') must equal limits (' + {r.about('y')} + ')'"
    return _per_name(r, "requests-differ", ("requests",), f"k in variables.gpus && k in {r.section('limits')}",
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
    return _per_name(r, "per-container-limit", ("limits",), "k in variables.gpus", f"n > {cap}", message,
                     "string(n)", (("n", f"{r.valid('x')} ? {count('x')} : 0"),), template=f"{cap} != 0 && t.uses")


def gpu_counts(r: Reads, spec: str) -> str:
    """``t.gpuCounts``: per app and init container, in order, its list, place, whether it is a sidecar, and its
    counts (:meth:`Reads.counts`)."""
    out = []
    for name in ("containers", "initContainers"):
        values = r.items(spec, name)
        sidecar = r.sidecar("c") if name == "initContainers" else "false"
        one = record(list=lit(name), pos="p", sidecar=sidecar, counts=r.counts("c"))
        out.append(f"[{values}].map(L, L.map(c, [L.indexOf(c)].map(p, {one})[0]))[0]")
    return " + ".join(out)


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


def _selector_path(ctx: Ctx, base: str = "t.path") -> str:
    return base + " + " + lit(".nodeSelector[" + ctx.policy.node_label + "]")


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
                                        (_selector_path(ctx), _selector_path(ctx, "t.stable"), _selected(r)))]


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


def _sorted(ctx: Ctx, records: str) -> str:
    """Records with a ``name``, in the order of their names (distinct)."""
    return f"{records}.sortBy(x, x.name)" if ctx.lists else ranked(records, "name")


def _held(r: Reads, nonzero: bool) -> str:
    """``"1 nvidia.com/gpu, 2 …"``: the container's GPU counts by name, sorted (zeros dropped if asked)."""
    counts = f"{r.counts()}.filter(x, x.count != 0)" if nonzero else r.counts()
    return f"{_sorted(r.ctx, counts)}.map(x, string(x.count) + ' ' + x.name).join(', ')"


@native("ephemeral-gpu", fires=(Trigger("name", "l == 'ephemeralContainers'", "ephemeral"),))
def ephemeral_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    loops = (Each("t", "variables.templates", "t.uses"), *r.containers(("ephemeralContainers",)))
    return [Finding("ephemeral-gpu", loops, "h != ''", r.resources_path, r.resources_stable, "h",
                    lit("ephemeral containers may not use GPUs"), (("h", _held(r, False)),))]


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


# --- the opt-in cross-field checks -------------------------------------------------------------------------


@native("mixed-gpu-and-mig", fires=(Trigger("name", "k.startsWith('nvidia.com/mig-')", "mig"),))
def mixed_gpu_and_mig(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    slices = _sorted(ctx, "G.filter(x, x.name.startsWith('nvidia.com/mig-'))")
    message = f"'container ' + {quoted(r.name)} + ' mixes nvidia.com/gpu with MIG slices (' + S + ')'"
    loops = (Each("t", "variables.templates", "t.uses"), *r.containers())
    return [Finding("mixed-gpu-and-mig", loops, "G.exists(x, x.name == 'nvidia.com/gpu') && S != ''",
                    r.resources_path, r.resources_stable, "S", message,
                    (("G", r.counts()), ("S", f"{slices}.map(x, x.name).join(', ')")))]


@native("init-container-gpus", fires=(Trigger("name", "l == 'initContainers'", "init"),))
def init_container_gpus(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    loops = (Each("t", "variables.templates", "t.uses && !t.trusted"),
             *r.containers(("initContainers",), f"!{r.sidecar()}"))
    message = "'an init container asks for GPUs (' + h + '); they stay reserved for the pod\\'s lifetime'"
    return [Finding("init-container-gpus", loops, "h != ''", r.resources_path, r.resources_stable, "h", message,
                    (("h", _held(r, True)),))]


def _on_gpu_nodes(ctx: Ctx) -> str:
    """A template that tolerates a GPU taint or selects the accelerator label and names no GPU: cpu-pod-on-gpu-nodes
    speaks only of pods that name none (a GPU pod carries the accelerator selector the MutatingAdmissionPolicy
    injected)."""
    taints = sorted({t.key for t in ctx.policy.gpu_taints})
    toleration = "has(x.key) && (x.key.contains('/')" + (f" || x.key in {lits(taints)}" if taints else "") + ")"
    gpu_named = " || ".join(f"(has(c.resources.{s}) && c.resources.{s}.exists(k, {is_gpu(ctx, 'k')}))"
                            for s in ("limits", "requests"))
    label = lit(ctx.policy.node_label)
    return (f"((has(t.spec.tolerations) && t.spec.tolerations.exists(x, {toleration})) || "
            f"(has(t.spec.nodeSelector) && {label} in t.spec.nodeSelector)) && "
            f"!{_any_container(f'has(c.resources) && ({gpu_named})')}")


@native("cpu-pod-on-gpu-nodes", fires=(Trigger("template", _on_gpu_nodes, "gpu-nodes"),))
def cpu_pod_on_gpu_nodes(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    cpu_pod = Each("t", "variables.templates", "!t.uses && !t.declares && !t.holds && !t.trusted")
    tolerations = Each("x", r.get("t.spec", "tolerations", "list", "[]"),
                       f"{r.is_map('x')}{tolerates_gpu_taint(ctx, 'x')}", "i")
    path = "t.path + '.tolerations[' + string(i) + ']'"
    stable = stable_item("t.stable + '.tolerations'", "i", "x", "key")
    tolerated = Finding("cpu-pod-on-gpu-nodes", (cpu_pod, tolerations), "", path, stable, "x.key",
                        "'the pod uses no GPU but tolerates the ' + x.key + ' taint, so it can land on a GPU node'")
    selector = r.get("t.spec", "nodeSelector", "map", "{}")
    label = lit(ctx.policy.node_label)
    message = lit("the pod uses no GPU but selects " + ctx.policy.node_label + "=") + " + " + plain("v")
    selects = Finding("cpu-pod-on-gpu-nodes", (cpu_pod,), f"{label} in {selector}", _selector_path(ctx),
                      _selector_path(ctx, "t.stable"), plain("v"), message, (("v", f"{selector}[{label}]"),))
    return [tolerated, selects]


# --- isolation ---------------------------------------------------------------------------------------------


def _hidden(ctx: Ctx) -> str:
    """``isolation.hides_gpus``: hideGpus applies in this namespace and the pod is no fractional scheduler's."""
    hides = ctx.ns(lambda p: boolean(p.hide_gpus != 'off'), live=f"{params.of('hideGpus')} != 'off'")
    return f"({hides} && !t.fractional)"


# Where an env source takes its variables from, in the order isolation._source looks.
_REFERENCES = (("configMapRef", "ConfigMap"), ("secretRef", "Secret"), ("configMapKeyRef", "ConfigMap"),
               ("secretKeyRef", "Secret"))


def _env_source(r: Reads, source: str) -> str:
    """``isolation._source``: where a valueFrom or envFrom entry takes its variables from (``ConfigMap "name"``...)."""
    pairs = "[" + ", ".join(f"[{lit(key)}, {lit(kind)}]" for key, kind in _REFERENCES) + "]"
    found = "R.filter(p, p[0] in S && type(S[p[0]]) == map && size(S[p[0]]) > 0)"
    name = "S[F[0][0]].name"
    named = f"'name' in S[F[0][0]] && type({name}) == string ? F[0][1] + ' ' + {shown(name, r.typed)} : F[0][1]"
    other = "'fieldRef' in S ? 'a field of the pod' : 'resourceFieldRef' in S ? 'a resource field' : 'a source'"
    return (f"[{source}].map(S, type(S) != map ? 'a source' : [{pairs}].map(R, [{found}].map(F, size(F) > 0 ? "
            f"({named}) : {other})[0])[0])[0]")


def _device_env(r: Reads, where: str) -> Each:
    """The device variables of container ``c``'s env (``e``, at index ``n``)."""
    env = r.get("c", "env", "list", "[]")
    named = "" if r.typed else "type(e) == map && 'name' in e && "
    return Each("e", env, f"{named}e.name in {lits(DEVICE_VARIABLES)} && {where}", "n")


def _untrusted_without_gpu(r: Reads, where: str = "") -> tuple[Each, ...]:
    """Containers of untrusted pods that hold no GPU (``GpuUse.holds``; a fractional scheduler's pod holds one)."""
    test = f"!(t.fractional || {r.holds()})" + (f" && {where}" if where else "")
    return (Each("t", "variables.templates", "!t.trusted"), *r.containers(where=test))


@native("visible-devices-without-gpu",
        fires=(Trigger("container", f"has(c.env) && c.env.exists(e, e.name in {lits(DEVICE_VARIABLES)})", "devices"),))
def visible_devices_without_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    value = "e.?value.orValue('')" if r.typed else "('value' in e ? e.value : '')"
    unset = "!has(e.valueFrom)" if r.typed else "!('valueFrom' in e && e.valueFrom != null)"
    message = (f"{r.label} + ' uses no GPU but sets ' + e.name + '=' + {shown('v')} + "
               f"': the NVIDIA runtime would show it ' + "
               f"(v == 'all' ? 'every GPU of its node' : 'the GPUs it names') + "
               f"', outside the scheduler\\'s accounting; remove it or set it to void'")
    env = r.get("c", "env", "list", "[]")
    has_device_env = f"{env}.exists(e, {r.is_map('e')}'name' in e && e.name in {lits(DEVICE_VARIABLES)})"
    return [Finding("visible-devices-without-gpu", (*_untrusted_without_gpu(r, has_device_env), _device_env(r, unset)),
                    f"!(type(v) == string && v in {lits(NO_DEVICES)})",
                    f"{Reads.PATH} + '.env[' + string(n) + '].value'",
                    f"{r.stable} + '.env[name=' + e.name + '].value'", shown("v"), message, (("v", value),))]


@native("visible-devices-unread", fires=(Trigger(
    "container", f"(has(c.envFrom) && size(c.envFrom) > 0) || (has(c.env) && c.env.exists(e, "
                 f"e.name in {lits(DEVICE_VARIABLES)} && has(e.valueFrom)))", "unread"),))
def visible_devices_unread(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    computed = "has(e.valueFrom)" if r.typed else "'valueFrom' in e && e.valueFrom != null"
    message = (f"{r.label} + ' uses no GPU and takes ' + e.name + ' from ' + {_env_source(r, 'e.valueFrom')} + "
               f"', which admission cannot read; anything but void or none there shows it GPUs it was not given'")
    env = r.get("c", "env", "list", "[]")
    from_value = Finding("visible-devices-unread", (*_untrusted_without_gpu(r, f"size({env}) > 0"),
                                                    _device_env(r, computed)), "",
                         f"{Reads.PATH} + '.env[' + string(n) + '].valueFrom'",
                         f"{r.stable} + '.env[name=' + e.name + '].valueFrom'", "e.name", message)
    named = (f"{env}.exists(e, {r.is_map('e')}{'' if r.typed else chr(39) + 'name' + chr(39) + ' in e && '}"
             f"e.name == {lit(VISIBLE_DEVICES)})")
    prefix = ("x.?prefix.orValue('')" if r.typed
              else "('prefix' in x && x.prefix != null && x.prefix != '' ? x.prefix : '')")
    usable = (f"{r.is_map('x')}{'' if r.typed else 'type(' + prefix + ') == string && '}"
              f"{lit(VISIBLE_DEVICES)}.startsWith({prefix}) && {prefix} != {lit(VISIBLE_DEVICES)}")
    env_from = r.get("c", "envFrom", "list", "[]")
    from_message = (f"{r.label} + ' uses no GPU and imports variables from ' + {_env_source(r, 'x')} + "
                    f"', which admission "
                    f"cannot read; if one is {VISIBLE_DEVICES} it may show it GPUs it was not given (set "
                    f"{VISIBLE_DEVICES}=void in env, or isolation.hideGpus)'")
    loops = (Each("t", "variables.templates", f"!t.trusted && !{_hidden(ctx)}"),
             *r.containers(where=f"size({env_from}) > 0 && !(t.fractional || {r.holds()}) && !{named}"),
             Each("x", env_from, usable, "j"))
    imports = Finding("visible-devices-unread", loops, "", f"{Reads.PATH} + '.envFrom[' + string(j) + ']'",
                      f"{r.stable} + '.envFrom[' + string(j) + ']'", _env_source(r, "x"), from_message)
    return [from_value, imports]


# A value that is not a positive count of at most 6 digits (a 0, an odd spelling): what zero-gpu-limit reads.
@native("zero-gpu-limit", fires=(Trigger("name", "!" + matches("v", "^[1-9][0-9]{0,5}$"), "zero"),))
def zero_gpu_limit(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + k + ': 0 allocates no GPU but may still tolerate GPU taints and select GPU "
               f"nodes; leave the resource out'")
    return _per_name(r, "zero-gpu-limit", ("limits", "requests"), "k in variables.zero_counting", r.zero("x"),
                     message, "k", requests_only=True)


def _gpu_node_reasons(r: Reads) -> str:
    """``isolation.gpu_node_reasons`` of template ``t``, joined by ', ' (``''`` for none)."""
    ctx = r.ctx
    label = ctx.policy.node_label
    selector = r.get("t.spec", "nodeSelector", "map", "{}")
    selected = f"{selector}[{lit(label)}]"
    terms = r.at("t.spec", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
                 "list", "[]")
    expressions = r.get("term", "matchExpressions", "list", "[]")
    keyed = "" if r.typed else "type(x) == map && 'key' in x && type(x.key) == string && "
    by_affinity = f"{terms}.exists(term, {expressions}.exists(x, {keyed}x.key == {lit(label)}))"
    string = "" if r.typed else f" && type({selected}) == string"
    selects = (f"({lit(label)} in {selector}{string} ? {lit('selects ' + label + '=')} + {selected} : "
               f"{by_affinity} ? {lit('requires ' + label + ' by node affinity')} : '')")
    tolerations = r.get("t.spec", "tolerations", "list", "[]")
    key_unset = "!has(x.key) || x.key == ''" if r.typed else "!('key' in x) || x.key == null || x.key == ''"
    operator = "x.?operator.orValue('')" if r.typed else "('operator' in x ? x.operator : null)"
    every = f"({key_unset}) && {operator} == 'Exists'"
    blanket = f"({tolerations}.exists(x, {r.is_map('x')}{every}) ? ['tolerates every taint'] : [])"
    tolerates = (f"{tolerations}.filter(x, {r.is_map('x')}{tolerates_gpu_taint(ctx, 'x')})"
                 f".map(x, 'tolerates the ' + x.key + ' taint')")
    return f"([{selects}] + {blanket} + {tolerates}).filter(s, s != '').join(', ')"


@native("privileged-gpu", fires=(Trigger("container", "has(c.securityContext) && has(c.securityContext.privileged) && "
                                                          "c.securityContext.privileged", "privileged"),))
def privileged_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    privileged = r.at("c", "securityContext.privileged", "bool", "false")
    # Why it matters: the container's own GPU, its pod's, or the pod's way onto a GPU node (the reasons after
    # 'node:', none when it has no way there).
    why = f"(t.fractional || {r.holds()} ? 'holds' : t.holds ? 'pod' : 'node:' + {_gpu_node_reasons(r)})"
    said = (f"(w == 'holds' ? {r.label} + ' is privileged and holds a GPU: it sees every GPU of its node, not only "
            f"its own' : w == 'pod' ? {r.label} + ' is privileged in a pod with GPUs: it runs on a GPU node and sees "
            f"every GPU of it' : {r.label} + ' is privileged and its pod ' + w.substring(5) + ': on a GPU node it "
            f"sees every GPU, outside the scheduler\\'s accounting')")
    message = f"{said} + '; only trusted namespaces and service accounts (isolation.trusted) may'"
    loops = (Each("t", "variables.templates", "!t.trusted"), *r.containers(where=f"{privileged} == true"))
    return [Finding("privileged-gpu", loops, "w != 'node:'", f"{Reads.PATH} + '.securityContext.privileged'",
                    f"{r.stable} + '.securityContext.privileged'", lit("true"), message, (("w", why),))]


def normalised_path(path: str) -> str:
    """``isolation._normal``: ``posixpath.normpath("/" + path.lstrip("/"))`` in CEL (needs the lists library).

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


@native("gpu-device-mount", needs=("lists", "two-variable comprehensions"), fires=(
    Trigger("template", "has(t.spec.volumes) && t.spec.volumes.exists(v, has(v.hostPath))", "host-paths"),
    Trigger("container", "has(c.volumeMounts) && c.volumeMounts.exists(v, "
                         "v.mountPath.contains('nvidia-container-devices'))", "mounts")))
def gpu_device_mount(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    host = r.at("x", "hostPath.path", "string", "null")
    exposes = (f"(N == '/' || N == '/dev' || N.startsWith({lit(NVIDIA_DEVICE_PREFIX)}) || "
               f"{_under('N', DEVICE_DIRECTORIES)})")
    # Only a path that names dev, climbs (..) or is all slashes and dots can normalise to a device directory or /.
    suspect = f"(h.contains('dev') || h.contains('..') || !{matches('h', '[^/.]')})"
    volumes = Each("x", r.get("t.spec", "volumes", "list", "[]"), f"{r.is_map('x')}{host} != null", "i")
    vmessage = ("'hostPath ' + " + shown("h") + " + ' exposes the node\\'s GPU devices to the pod, outside the "
                "scheduler\\'s accounting; GPUs come from resources'")
    untrusted = Each("t", "variables.templates", "!t.trusted")
    host_paths = Finding("gpu-device-mount", (untrusted, volumes), f"{suspect} && {exposes}",
                         "t.path + '.volumes[' + string(i) + '].hostPath.path'",
                         stable_item("t.stable + '.volumes'", "i", "x", "name") + " + '.hostPath.path'", "h", vmessage,
                         (("h", host), ("N", normalised_path("h"))))
    mount_path = r.get("x", "mountPath", "string", "null")
    mounts = Each("x", r.get("c", "volumeMounts", "list", "[]"),
                  f"{r.is_map('x')}{mount_path} != null && {mount_path}.contains('nvidia-container-devices')", "k")
    mmessage = (f"{r.label} + ': a mount at ' + {shown('h')} + ' asks the NVIDIA runtime (volume-mounts device list "
                f"strategy) for the GPUs it names, outside the scheduler\\'s accounting'")
    mount_list = Finding("gpu-device-mount", (untrusted, *r.containers(), mounts), _under("N", DEVICE_LIST_DIRECTORIES),
                         f"{Reads.PATH} + '.volumeMounts[' + string(k) + '].mountPath'",
                         stable_item(f"{r.stable} + '.volumeMounts'", "k", "x", "mountPath") + " + '.mountPath'", "h",
                         mmessage, (("h", mount_path), ("N", normalised_path("h"))))
    return [host_paths, mount_list]


CDI_KEY = " || ".join([f"k.startsWith({lit(p)})" for p in CDI_PREFIXES] + [f"k == {lit(k)}" for k in CDI_KEYS])


@native("cdi-annotation", fires=(
    Trigger("template", f"has(t.metadata.annotations) && t.metadata.annotations.exists(k, {CDI_KEY})", "cdi"),))
def cdi_annotation(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    annotations = r.get("t.meta", "annotations", "map", "{}")
    extra = ("(type(x) == string && x.contains('management.nvidia.com/') ? "
             "' (management.nvidia.com/gpu opens every GPU of the node)' : '')")
    message = (f"'annotation ' + k + '=' + {shown('x')} + ' asks the container runtime to inject CDI devices' + "
               f"{extra} + ', outside the scheduler\\'s accounting; only trusted namespaces and service accounts "
               f"(isolation.trusted) may'")
    path = "t.metaPath + '.annotations[' + k + ']'"
    loops = (Each("t", "variables.templates", "!t.trusted"), Each("k", annotations, CDI_KEY))
    return [Finding("cdi-annotation", loops, "", path, path, shown("x"), message, (("x", f"{annotations}[k]"),))]


@native("host-pid-gpu", fires=(Trigger("template", "has(t.spec.hostPID) && t.spec.hostPID"),))
def host_pid_gpu(ctx: Ctx) -> list[Finding]:
    host_pid = Reads(ctx).get("t.spec", "hostPID", "bool", "false")
    loops = (Each("t", "variables.templates", f"!t.trusted && t.holds && {host_pid} == true"),)
    return [Finding("host-pid-gpu", loops, "", "t.path + '.hostPID'", "t.stable + '.hostPID'", lit("true"),
                    lit(HOST_PID_GPU))]


@native("runtime-class-without-gpu", fires=(Trigger(
    "template", f"has(t.spec.runtimeClassName) && t.spec.runtimeClassName.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})",
    "runtime"),))
def runtime_class_without_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    name = r.get("t.spec", "runtimeClassName", "string", "''")
    message = (f"'runtimeClassName ' + n + ' on a pod that uses no GPU: the NVIDIA runtime shows it the GPUs its "
               f"image\\'s {VISIBLE_DEVICES} names (all, in CUDA images); use the default runtime'")
    loops = (Each("t", "variables.templates", "!t.trusted && !t.holds"),)
    return [Finding("runtime-class-without-gpu", loops, f"n.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})",
                    "t.path + '.runtimeClassName'", "t.stable + '.runtimeClassName'", "n", message, (("n", name),))]


# --- the vendor names (webhook.rules.sharing) -------------------------------------------------------------


# A name the vendor-name checks may read: anything but the policy's plain GPU names.
VENDOR_NAME = Trigger("name", lambda ctx: f"!(k in {lits(_literal_gpu_names(ctx))})", "vendor")


@native("shared-gpu-over-one", fires=(VENDOR_NAME,))
def shared_gpu_over_one(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + string({count('x')}) + ' ' + k + ' asks for several replicas of a shared GPU, "
               f"which give no more compute than one (the kubelet refuses it with failRequestsGreaterThanOne); "
               f"ask for 1'")
    return _per_name(r, "shared-gpu-over-one", ("limits", "requests"), "k in variables.shared",
                     f"{r.valid('x')} && {count('x')} > 1", message, f"string({count('x')})",
                     template="size(variables.shared) > 0", requests_only=True)


def _seen(r: Reads) -> str:
    """The fractional schedulers' names the container asks for (``sharing.requested``)."""
    lim, req = r.section("limits"), r.section("requests")
    test = "k in variables.vendor && k in variables.scheduler"
    return f"({lim}.filter(k, {test}) + {req}.filter(k, !(k in {lim}) && {test}))"


@native("fractional-gpu-request", fires=(VENDOR_NAME,))
def fractional_gpu_request(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = f"{r.label} + ': ' + k + ' is a percentage, 0 to 100, not ' + {r.shown('x')}"
    out = _per_name(r, "fractional-gpu-request", ("limits", "requests"), "k in variables.percent",
                    f"!({r.valid('x')}) || {count('x')} > 100", message, r.shown("x"),
                    template="size(variables.percent) > 0", requests_only=True)
    containers = (Each("t", "variables.templates", "size(variables.scheduler) > 0"), *r.containers())
    for absolute, percentage in EXCLUSIVE:
        both = lit(f": {absolute} and {percentage} both size the GPU memory; set one of them")
        out.append(Finding("fractional-gpu-request", containers, f"{lit(absolute)} in V && {lit(percentage)} in V",
                           r.resources_path, r.resources_stable, lit(absolute + " + " + percentage),
                           f"{r.label} + {both}",
                           (("V", _seen(r)),)))
    volcano = f"V.filter(k, k.startsWith('volcano.sh/vgpu-') && k != {lit(VOLCANO_COUNT)}).map(k, {{'name': k}})"
    message = (f"{r.label} + ': ' + W + "
               + lit(" without " + VOLCANO_COUNT + ": Volcano mounts no GPU without a vGPU count"))
    out.append(Finding("fractional-gpu-request", containers, f"W != '' && !({lit(VOLCANO_COUNT)} in V)",
                       r.resources_path, r.resources_stable, "W", message,
                       (("V", _seen(r)), ("W", f"{_sorted(ctx, volcano)}.map(x, x.name).join(', ')"))))
    return out


@native("gpu-monitoring-resource", fires=(VENDOR_NAME,))
def gpu_monitoring_resource(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + k + ' gives access to every GPU of the node; only trusted namespaces and "
               f"service accounts (isolation.trusted) may ask for it'")
    return _per_name(r, "gpu-monitoring-resource", ("limits", "requests"), "k in variables.monitoring",
                     f"!{r.zero('x')}", message, "k", template="size(variables.monitoring) > 0 && !t.trusted",
                     requests_only=True)


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


def _any_container(test: str, lists: tuple[str, ...] = CONTAINER_LISTS) -> str:
    """Some container of template ``t`` (in ``lists``), ``c``, passes ``test``."""
    return f"{lits(lists)}.exists(l, l in t.spec && t.spec[l].exists(c, {test}))"


def _literal_gpu_names(ctx: Ctx) -> list[str]:
    """The policy's GPU names written without a glob in every namespace that are no vendor name the sharing rules
    read: a container naming only these (with plain counts) gives those rules nothing to find."""
    names = set.intersection(*(set(p.resources) for p in every_policy(ctx.policies)))
    return sorted(n for n in names if not any(c in n for c in "*?[") and not re.fullmatch(READ_BY_SHARING_PY, n))

