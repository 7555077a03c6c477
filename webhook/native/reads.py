"""Pod templates as the rules read them: field reads, and what is computed once per object.

Every finding starts from ``variables.templates``, the object's pod templates as records:

- ``pod.path``, ``pod.stable``, ``pod.metaPath``: where the pod spec and its metadata are (``spec``,
  ``spec.template.spec``, ``spec.pytorchReplicaSpecs.Worker.template.spec``...), and the spec's path with list
  items by name;
- ``pod.spec``, ``pod.meta``: the pod spec and the template's metadata;
- what the rules share about the pod, computed once (:func:`template_facts`): ``pod.uses`` (a container names a
  policy GPU: ``PodGPUs.uses_gpus``), ``pod.counted`` (one asks for a policy GPU: ``GpuUse.counted``), ``pod.holds``
  (it holds a GPU of some kind or asks a fractional scheduler: ``GpuUse.any``), ``pod.fractional``, ``pod.trusted``
  (``Policy.trusts``), ``pod.declares`` (``spec.resourceClaims`` is not empty), ``pod.dra`` (it declares or
  references claims).

Then the container lists (``field``), the containers (``container``, at index ``i``, which only messages read) and their
resource names (``name``), read as they are: nothing is built for a container unless a rule's condition needs it.
Resource names are classified once per object (:data:`CLASSES`: ``variables.gpus``, ``variables.holding``...),
so a rule asks ``name in variables.gpus``. What a rule reads of a container is written with
:class:`~webhook.native.snippets.Shape`: plain optional reads for Pods and the built-in workloads, type-checked
reads for custom resources. The helpers at the end write what several rule families share.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from webhook.core.podspecs import CONTAINER_LISTS
from webhook.core.policy import Policy
from webhook.core.resources import FRACTION_ANNOTATIONS
from webhook.native import params
from webhook.native.celtext import lit, lits, matches, record
from webhook.native.findings import SEPARATOR, Each, Finding
from webhook.native.snippets import (
    GPU_TAINT_KEYS,
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
    quantity_error,
    quantity_reason,
    ranked,
    service_account,
    shown,
    stable_item,
    taint_names,
    zero_counting,
)

TEMPLATES = Each("pod", "variables.templates")


# --- reading a template, a container, a resource name ------------------------------------------------------


@dataclass(frozen=True)
class Reads:
    """Field reads for one shape of object (``webhook.native.snippets.Shape``), and the container ``container`` of list
    ``field`` at index ``i`` as the rules see it."""

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
        return values if self.typed else f"{values}.filter(item, type(item) == map)"

    def containers(self, lists: tuple[str, ...] = CONTAINER_LISTS, where: str = "") -> tuple[Each, Each]:
        """The loops over the container lists named and their containers (``container``, index ``i``)."""
        if self.typed:
            items = "pod.spec[?field].orValue([])"
        else:
            items = "(field in pod.spec && type(pod.spec[field]) == list ? pod.spec[field] : [])"
        tests = [] if self.typed else ["type(container) == map"]
        conditions = " && ".join([*tests, *([where] if where else [])])
        return Each("field", lits(lists)), Each("container", items, conditions, "i")

    def section(self, name: str, container: str = "container") -> str:
        """The container's ``resources.limits`` or ``resources.requests`` (``{}`` when absent or not a map)."""
        return self.at(container, f"resources.{name}", "map", "{}")

    def names(self, section: str, where: str) -> Each:
        """The loop over the resource names (``name``) of a section of ``container``."""
        return Each("name", self.section(section), where)

    PATH = "pod.path + '.' + field + '[' + string(i) + ']'"

    @property
    def stable(self) -> str:
        if self.typed:
            return "pod.stable + '.' + field + '[name=' + container.name + ']'"
        return stable_item("pod.stable + '.' + field", "i", "container", "name")

    @property
    def label(self) -> str:
        """``Container.label``: ``container "name"``, or ``container <path>`` without a name."""
        if self.typed:
            return "'container \"' + container.name + '\"'"
        has_name = "('name' in container && type(container.name) == string && container.name != '')"
        shown_name = f"({matches('container.name', '^[-a-z0-9.]*$')} ? container.name : {escaped('container.name')})"
        return f"({has_name} ? 'container \"' + {shown_name} + '\"' : 'container ' + {self.PATH})"

    @property
    def name(self) -> str:
        """The container's ``name`` as it is (null when absent)."""
        return "container.name" if self.typed else "('name' in container ? container.name : null)"

    def entry_path(self, section: str) -> str:
        return f"{self.PATH} + '.resources.{section}[' + name + ']'"

    def entry_stable(self, section: str) -> str:
        return f"{self.stable} + '.resources.{section}[' + name + ']'"

    @property
    def resources_path(self) -> str:
        return f"{self.PATH} + '.resources'"

    @property
    def resources_stable(self) -> str:
        return f"{self.stable} + '.resources'"

    def claims(self, container: str = "container") -> str:
        return self.at(container, "resources.claims", "list", "[]")

    def sidecar(self, container: str = "container") -> str:
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
        """The loops over the container's two sections (``section``: limits, requests) and their names (``name``)."""
        values = "container.?resources[?section].orValue({})" if self.typed else \
            "(type(container) == map && 'resources' in container && type(container.resources) == map && " \
            "section in container.resources && type(container.resources[section]) == map ? " \
            "container.resources[section] : {})"
        return Each("section", "['limits', 'requests']"), Each("name", values, where)

    def counts(self, container: str = "container") -> str:
        """The container's policy GPUs with a valid count, each once, as ``{name, count}``: requests, else limits
        (what the scheduler holds)."""
        sections = f"[{self.section('limits', container)}, {self.section('requests', container)}]"
        valid = (f"{sections}.map(values, values.filter(name, name in variables.gpus && "
                 f"{self.valid('values[name]')}).map(name, {record(name='name', count=count('values[name]'))}))")
        return (f"[{valid}].map(counted, counted[0].filter(limited, !counted[1].exists(requested, "
                f"requested.name == limited.name)) + counted[1])[0]")

    def holds(self, container: str = "container") -> str:
        """The container holds a GPU of some kind (``context.container_gpus``): a holding name not a valid 0, or a
        claim."""
        def held(section: str) -> tuple[str, str]:
            values = self.section(section, container)
            return values, f"name in variables.holding && !{self.zero(values + '[name]')}"
        return holds_gpu(held, self.claims(container))


# --- names and templates: what is computed once per object --------------------------------------------------

# The classes of a resource name, each a list of the object's names: a name is classified once per object.
CLASSES: dict[str, Callable[[Ctx], str]] = {
    "gpus": lambda ctx: is_gpu(ctx, "name"),  # Policy.is_gpu: a GPU count of the policy
    "holding": lambda ctx: holds_name(ctx, "name"),  # it holds a GPU of some kind (context.container_gpus)
    "zero_counting": lambda ctx: zero_counting(ctx, "name"),  # zero-gpu-limit reads it
    "vendor": lambda ctx: matches("name", READ_BY_SHARING),  # the vendor-name checks read it (sharing.requested)
    "shared": lambda ctx: f"name in variables.vendor && {matches('name', SHARED)}",
    "percent": lambda ctx: f"name in variables.vendor && {matches('name', PERCENT)}",
    "scheduler": lambda ctx: matches("name", SCHEDULER),
    "monitoring": lambda ctx: f"name in variables.vendor && {matches('name', MONITORING)}",
}


def name_variables(ctx: Ctx, pods: str = "variables.pod_specs[0]") -> list[tuple[str, str]]:
    """``resource_names``: every resource name with a domain (every GPU name has one) in the containers and pod-level
    resources of the object's templates, and one list per class of :data:`CLASSES`. The names are collected by
    joining and splitting again on the separator (a name that holds one only adds names no container has), each
    once where the target has ``distinct()``, and before that once when every container names the same (the
    usual pod): a name classified twice is classified alike."""
    r = Reads(ctx)
    sep = lit(SEPARATOR)
    lists = "[" + ", ".join(r.items("pod.spec", name) for name in CONTAINER_LISTS) + ", " + (
        "dyn([pod.spec])" if r.typed else "[pod.spec]") + "]"
    lim, req = r.section("limits"), r.section("requests")
    per_container = (f"({lim}.filter(name, name.contains('/')) + "
                     f"{req}.filter(name, name.contains('/') && !(name in {lim})))"
                     f".join({sep})")
    found = (f"{pods}.map(pod, {lists}.map(containers, containers.map(container, {per_container}).join({sep}))"
             f".join({sep})).join({sep}).split({sep}).filter(name, name != '')")
    once = (f"{found}.distinct()" if ctx.lists
            else f"[{found}].map(names, size(names) > 0 && names.all(name, name == names[0]) ? [names[0]] : names)[0]")
    return [("resource_names", once)] + [(name, f"variables.resource_names.filter(name, {test(ctx)})")
                                         for name, test in CLASSES.items()]


def taint_variable(ctx: Ctx, pods: str) -> tuple[str, str]:
    """``gpu_taint_keys`` (:data:`snippets.GPU_TAINT_KEYS`): per pod spec of ``pods``, the keys of its tolerations
    that name a GPU, each classified once however many rules read it."""
    r = Reads(ctx)
    keyed = ("has(toleration.key)" if r.typed
             else "type(toleration) == map && 'key' in toleration && type(toleration.key) == string")
    tolerations = r.get("pod.spec", "tolerations", "list", "[]")
    keys = (f"{tolerations}.filter(toleration, {keyed}).map(toleration, toleration.key)"
            f".filter(key, {taint_names(ctx, 'key')})")
    return GPU_TAINT_KEYS.removeprefix("variables."), f"{pods}.map(pod, {keys})"


def some_container(r: Reads, spec: str, test: str, lists: tuple[str, ...] = CONTAINER_LISTS) -> str:
    """Some container ``container`` of the pod spec ``spec`` passes ``test``."""
    containers = "[" + ", ".join(r.items(spec, name) for name in lists) + "]"
    return f"{containers}.exists(containers, containers.exists(container, {test}))"


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
    when the object names no resource of the class it asks about. ``holds`` reads ``fractional``, bound once."""
    r = Reads(ctx)
    annotations = r.get(meta, "annotations", "map", "{}")

    def names(test: Callable[[str], str]) -> str:
        """Some name of a container's limits or requests passes ``test`` (given the CEL of its value)."""
        return " || ".join(f"{r.section(s)}.exists(name, {test(r.section(s) + '[name]')})"
                           for s in ("limits", "requests"))

    def counted(value: str) -> str:
        return f"name in variables.gpus && !{r.zero(value)}"

    scheduler = some_container(r, spec, names(lambda value: f"name in variables.scheduler && !{r.zero(value)}"))
    fractional = (f"((size(variables.scheduler) > 0 && {scheduler}) || "
                  f"{lits(FRACTION_ANNOTATIONS)}.exists(annotation, annotation in {annotations}))")
    claims = r.claims() if r.typed else f"{r.claims()}.filter(claim, type(claim) == map)"
    declared = r.get(spec, "resourceClaims", "list", "[]")
    return {
        "uses": f"size(variables.gpus) > 0 && {some_container(r, spec, names(lambda _: 'name in variables.gpus'))}",
        "counted": f"size(variables.gpus) > 0 && {some_container(r, spec, names(counted))}",
        "fractional": fractional,
        "holds": f"fractional || {some_container(r, spec, r.holds())}",
        "trusted": trusted(ctx, spec),
        "declares": f"size({declared}) > 0",
        "dra": f"size({declared}) > 0 || {some_container(r, spec, f'size({claims}) > 0', LISTS_WITH_CLAIMS)}",
        "gpuCounts": gpu_counts(r, spec),
    }


LISTS_WITH_CLAIMS = ("containers", "initContainers")


def gpu_counts(r: Reads, spec: str) -> str:
    """``pod.gpuCounts``: per app and init container, in order, its list, place, whether it is a sidecar, and its
    counts (:meth:`Reads.counts`)."""
    out = []
    for name in ("containers", "initContainers"):
        values = r.items(spec, name)
        sidecar = r.sidecar("container") if name == "initContainers" else "false"
        one = record(list=lit(name), pos="position", sidecar=sidecar, counts=r.counts("container"))
        out.append(f"[{values}].map(containers, containers.map(container, "
                   f"[containers.indexOf(container)].map(position, {one})[0]))[0]")
    return " + ".join(out)


# --- what several families' builders share ---------------------------------------------------------------


def per_name(r: Reads, rule: str, sections: tuple[str, ...], names: str, where: str, message: str, value: str,
             let: tuple[tuple[str, str], ...] = (), template: str = "", container: str = "",
             requests_only: bool = False) -> list[Finding]:
    """The finding on the resource names (``name``, value ``value``) of the ``sections`` (``section``) of every
    container: the names passing ``names`` (cheap: class lists) are read, then ``where``. With ``requests_only``, a
    name in requests counts only when limits lack it (``sharing.requested``)."""
    test = names
    if requests_only and "requests" in sections:
        test = f"(section == 'limits' || !(name in {r.section('limits')})) && {names}"
    section_loop, names_loop = r.each_section(test)
    if sections != ("limits", "requests"):
        section_loop = Each("section", lits(sections))
    loops = (Each("pod", "variables.templates", template), *r.containers(where=container), section_loop, names_loop)
    path = f"{Reads.PATH} + '.resources.' + section + '[' + name + ']'"
    stable = f"{r.stable} + '.resources.' + section + '[' + name + ']'"
    return [Finding(rule, loops, where, path, stable, value, message, (("value", f"{names_loop.over}[name]"), *let))]


def selector_path(ctx: Ctx, base: str = "pod.path") -> str:
    """Where the accelerator label stands in the nodeSelector of the pod spec at ``base``."""
    return base + " + " + lit(".nodeSelector[" + ctx.policy.node_label + "]")


def sorted_by_name(ctx: Ctx, records: str) -> str:
    """Records with a ``name``, in the order of their names (distinct)."""
    return f"{records}.sortBy(record, record.name)" if ctx.lists else ranked(records, "name")


def held_counts(r: Reads, nonzero: bool) -> str:
    """``"1 nvidia.com/gpu, 2 …"``: the container's GPU counts by name, sorted (zeros dropped if asked)."""
    counts = f"{r.counts()}.filter(held, held.count != 0)" if nonzero else r.counts()
    return f"{sorted_by_name(r.ctx, counts)}.map(held, string(held.count) + ' ' + held.name).join(', ')"
