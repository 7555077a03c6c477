"""The read-only cluster view the checks decide from: Nodes, ResourceSlices, DeviceClasses,
ResourceClaims, ResourceClaimTemplates and RuntimeClasses.

Each kind is kept in an :class:`Index` fed by an informer (``webhook.kube.informer``) or, for
``gpu-webhook check``, by objects read from a file. Readers get a :class:`ClusterView`: an
immutable summary, rebuilt only when something it depends on changed (a Node heartbeat or a
claim's status update changes nothing indexed) and swapped in whole, so a decision never sees
half an update and a lost watch only makes the view older, never missing.

Capacity is counted as the scheduler would: a node offers an extended resource through its device
plugin (``status.allocatable``) and through DRA, where a DeviceClass with
``spec.extendedResourceName`` (and every class, under ``deviceclass.resource.kubernetes.io/<class>``)
is served by the devices its selectors match in the ResourceSlices published for that node.
Selectors are evaluated with cel-python (``webhook.core.cel``); a class whose selectors cannot be
evaluated counts its driver's devices, and the view says so in :attr:`ClusterView.notes`.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.core import cel
from webhook.core.podspecs import as_list, as_mapping
from webhook.core.quantity import QuantityError, gpu_count

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
# Set by the system on claims made from a template for one pod (KEP-4381).
GENERATED_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


def _name(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("name") or "")


def _namespace(obj: Mapping[str, Any]) -> str:
    return str(as_mapping(obj.get("metadata")).get("namespace") or "")


# --- Nodes ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeInfo:
    accelerator: str | None
    extended: tuple[tuple[str, int], ...]  # allocatable extended resources (names with a "/"), whole counts
    labels: tuple[tuple[str, str], ...] = ()  # for ResourceSlices that select nodes by label


def node_info(node: Mapping[str, Any], node_label: str) -> NodeInfo:
    labels = as_mapping(as_mapping(node.get("metadata")).get("labels"))
    allocatable = as_mapping(as_mapping(node.get("status")).get("allocatable"))
    extended = []
    for name, value in allocatable.items():
        if isinstance(name, str) and "/" in name:
            try:
                extended.append((name, gpu_count(value)))
            except QuantityError:
                continue
    accelerator = labels.get(node_label)
    kept = tuple(sorted((k, v) for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)))
    return NodeInfo(accelerator if isinstance(accelerator, str) else None, tuple(sorted(extended)), kept)


@dataclass(frozen=True)
class Capacity:
    nodes: int = 0
    largest: Mapping[str, int] = field(default_factory=dict)  # resource -> largest allocatable on one node


@dataclass(frozen=True)
class NodeSummary:
    """Counts and largest allocatable per accelerator value and over all nodes."""

    node_label: str
    total: Capacity
    by_accelerator: Mapping[str, Capacity]

    def describe(self) -> str:
        models = ", ".join(f"{a}: {c.nodes}" for a, c in sorted(self.by_accelerator.items())) or "none"
        return f"nodes by {self.node_label}: {models}"


def summarize(infos: Iterable[NodeInfo], node_label: str) -> NodeSummary:
    total_nodes = 0
    total: dict[str, int] = {}
    counts: dict[str, int] = {}
    largest: dict[str, dict[str, int]] = {}
    for info in infos:
        total_nodes += 1
        for name, n in info.extended:
            total[name] = max(total.get(name, 0), n)
        if info.accelerator is not None:
            counts[info.accelerator] = counts.get(info.accelerator, 0) + 1
            mine = largest.setdefault(info.accelerator, {})
            for name, n in info.extended:
                mine[name] = max(mine.get(name, 0), n)
    return NodeSummary(
        node_label,
        Capacity(total_nodes, total),
        {a: Capacity(counts[a], largest[a]) for a in counts},
    )


# --- DeviceClasses and ResourceSlices -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceClassInfo:
    name: str
    extended_resource_name: str | None
    selectors: tuple[str, ...]
    created: str  # metadata.creationTimestamp (RFC 3339 sorts as text)


def cel_expressions(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The CEL expressions of ``spec.selectors[].cel.expression``: a DeviceClass's spec, or a device request."""
    found = (as_mapping(as_mapping(s).get("cel")).get("expression") for s in as_list(spec.get("selectors")))
    return tuple(e for e in found if isinstance(e, str))


def device_class_info(obj: Mapping[str, Any]) -> DeviceClassInfo:
    spec = as_mapping(obj.get("spec"))
    selectors = cel_expressions(spec)
    extended = spec.get("extendedResourceName")
    created = as_mapping(obj.get("metadata")).get("creationTimestamp")
    return DeviceClassInfo(
        _name(obj), extended if isinstance(extended, str) and extended else None, selectors,
        created if isinstance(created, str) else "",
    )


@dataclass(frozen=True, slots=True)
class Placement:
    """Which nodes a slice's (or one device's) devices are reachable from."""

    node_name: str | None = None
    all_nodes: bool = False
    node_selector: Any = None  # the NodeSelector as a hashable tuple form, see _selector_terms


def _selector_terms(selector: object) -> tuple[Any, ...]:
    terms = []
    for term in as_list(as_mapping(selector).get("nodeSelectorTerms")):
        term = as_mapping(term)
        exprs = tuple(
            (str(e.get("key")), str(e.get("operator")), tuple(str(v) for v in as_list(e.get("values"))))
            for e in as_list(term.get("matchExpressions")) if isinstance(e, Mapping)
        )
        fields = tuple(
            (str(e.get("key")), str(e.get("operator")), tuple(str(v) for v in as_list(e.get("values"))))
            for e in as_list(term.get("matchFields")) if isinstance(e, Mapping)
        )
        terms.append((exprs, fields))
    return tuple(terms)


def _placement(spec: Mapping[str, Any]) -> Placement | None:
    if isinstance(spec.get("nodeName"), str) and spec["nodeName"]:
        return Placement(node_name=spec["nodeName"])
    if spec.get("allNodes") is True:
        return Placement(all_nodes=True)
    if isinstance(spec.get("nodeSelector"), Mapping):
        return Placement(node_selector=_selector_terms(spec["nodeSelector"]))
    return None


@dataclass(frozen=True, slots=True)
class Device:
    name: str
    driver: str
    attributes: tuple[tuple[str, str, Any], ...]  # (domain, id, value)
    capacity: tuple[tuple[str, str, str], ...]
    tainted: bool  # a NoSchedule or NoExecute taint: the scheduler hands it out only to requests that tolerate it
    placement: Placement | None = None  # perDeviceNodeSelection

    def for_cel(self) -> dict[str, Any]:
        attributes: dict[str, dict[str, Any]] = {}
        for domain, ident, value in self.attributes:
            attributes.setdefault(domain, {})[ident] = value
        capacity: dict[str, dict[str, str]] = {}
        for domain, ident, value in self.capacity:
            capacity.setdefault(domain, {})[ident] = value
        return {"driver": self.driver, "attributes": attributes, "capacity": capacity,
                "allowMultipleAllocations": False}


def _qualified(name: str, driver: str) -> tuple[str, str]:
    """``gpu.nvidia.com/type`` -> (gpu.nvidia.com, type); a bare ``type`` is in the driver's domain."""
    if "/" in name:
        domain, ident = name.split("/", 1)
        return domain, ident
    return driver, name


def _attribute_value(value: Mapping[str, Any]) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    for kind in ("strings", "ints", "bools", "versions"):  # alpha list-typed attributes
        if isinstance(value.get(kind), list):
            return tuple(value[kind])
    return None


def _device(raw: Mapping[str, Any], driver: str, per_device: bool) -> Device:
    attributes = []
    for name, value in as_mapping(raw.get("attributes")).items():
        if isinstance(name, str) and isinstance(value, Mapping):
            domain, ident = _qualified(name, driver)
            attributes.append((domain, ident, _attribute_value(value)))
    capacity = []
    for name, value in as_mapping(raw.get("capacity")).items():
        if isinstance(name, str):
            domain, ident = _qualified(name, driver)
            capacity.append((domain, ident, str(as_mapping(value).get("value", ""))))
    tainted = any(
        isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute") for t in as_list(raw.get("taints"))
    )
    return Device(
        str(raw.get("name") or ""), driver, tuple(sorted(attributes, key=lambda a: (a[0], a[1]))),
        tuple(sorted(capacity)), tainted, _placement(raw) if per_device else None,
    )


@dataclass(frozen=True, slots=True)
class SliceInfo:
    driver: str
    pool: str
    generation: int
    placement: Placement | None
    devices: tuple[Device, ...]


def slice_info(obj: Mapping[str, Any]) -> SliceInfo:
    spec = as_mapping(obj.get("spec"))
    driver = str(spec.get("driver") or "")
    pool = as_mapping(spec.get("pool"))
    generation = pool.get("generation")
    per_device = spec.get("perDeviceNodeSelection") is True
    return SliceInfo(
        driver, str(pool.get("name") or ""), generation if isinstance(generation, int) else 0,
        None if per_device else _placement(spec),
        tuple(_device(d, driver, per_device) for d in as_list(spec.get("devices")) if isinstance(d, Mapping)),
    )


# --- ResourceClaims and ResourceClaimTemplates --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """One device request of a claim, as capacity and caps see it."""

    name: str
    classes: tuple[str, ...]  # one class, or the alternatives of firstAvailable
    count: int  # devices asked for (the most over firstAvailable alternatives); 0 with allocationMode All
    all_devices: bool  # allocationMode: All in the request or one of its alternatives
    admin_access: bool


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    requests: tuple[Request, ...]
    generated: bool = False  # made from a template for one pod


def device_count(value: object) -> int:
    """A device request's ``count``: 1 when absent or not a positive integer, as the apiserver defaults it."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def claim_requests(claim_spec: Mapping[str, Any]) -> tuple[Request, ...]:
    """The requests of a ResourceClaimSpec (``spec`` of a claim, ``spec.spec`` of a template)."""
    out = []
    for raw in as_list(as_mapping(claim_spec.get("devices")).get("requests")):
        if not isinstance(raw, Mapping):
            continue
        name = str(raw.get("name") or "")
        exactly = raw.get("exactly")
        if not isinstance(exactly, Mapping) and isinstance(raw.get("deviceClassName"), str):
            exactly = raw  # the v1beta1 shape, for files written against the old API
        if isinstance(exactly, Mapping):
            every = exactly.get("allocationMode") == "All"
            out.append(Request(
                name, (str(exactly.get("deviceClassName") or ""),), 0 if every else device_count(exactly.get("count")),
                every, exactly.get("adminAccess") is True,
            ))
            continue
        alternatives = [s for s in as_list(raw.get("firstAvailable")) if isinstance(s, Mapping)]
        if alternatives:
            every = any(s.get("allocationMode") == "All" for s in alternatives)
            out.append(Request(
                name, tuple(str(s.get("deviceClassName") or "") for s in alternatives),
                max(device_count(s.get("count")) for s in alternatives if s.get("allocationMode") != "All")
                if not all(s.get("allocationMode") == "All" for s in alternatives) else 0,
                every, False,
            ))
    return tuple(out)


def claim_info(obj: Mapping[str, Any]) -> ClaimInfo:
    annotations = as_mapping(as_mapping(obj.get("metadata")).get("annotations"))
    return ClaimInfo(claim_requests(as_mapping(obj.get("spec"))), GENERATED_CLAIM_ANNOTATION in annotations)


def template_info(obj: Mapping[str, Any]) -> ClaimInfo:
    return ClaimInfo(claim_requests(as_mapping(as_mapping(obj.get("spec")).get("spec"))))


# --- RuntimeClasses ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RuntimeClassInfo:
    handler: str
    node_selector: tuple[tuple[str, str], ...]


def runtime_class_info(obj: Mapping[str, Any]) -> RuntimeClassInfo:
    selector = as_mapping(as_mapping(obj.get("scheduling")).get("nodeSelector"))
    return RuntimeClassInfo(
        str(obj.get("handler") or ""),
        tuple(sorted((k, v) for k, v in selector.items() if isinstance(k, str) and isinstance(v, str))),
    )


# --- The view -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClassDevices:
    """What one DeviceClass can hand out: the most devices on one node, and how they were counted."""

    largest: int
    nodes: int
    counted_by: str  # "its selectors" or "the devices of driver X (...why...)"
    # the devices counted, each with the nodes it reaches, for requests that narrow the class with selectors
    devices: tuple[tuple[Device, tuple[str, ...]], ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class ClusterView:
    nodes: NodeSummary
    classes: Mapping[str, DeviceClassInfo] = field(default_factory=dict)
    class_devices: Mapping[str, ClassDevices] = field(default_factory=dict)
    # extended resource name -> the DeviceClass that serves it (the newest, when several claim it)
    extended_classes: Mapping[str, str] = field(default_factory=dict)
    claims: Mapping[tuple[str, str], ClaimInfo] = field(default_factory=dict)  # (namespace, name)
    templates: Mapping[tuple[str, str], ClaimInfo] = field(default_factory=dict)
    runtime_classes: Mapping[str, RuntimeClassInfo] = field(default_factory=dict)
    # What is known at all: a kind the apiserver does not serve, or a file did not hold, is not judged.
    known: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    _memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    def devices_matching(self, device_class: str, selectors: tuple[str, ...]) -> tuple[int, int] | None:
        """(most on one node, nodes) of a class's devices that also pass a request's own selectors; None when
        the class is unknown or cel-python cannot evaluate the selectors. Memoised per view."""
        key = (device_class, selectors)
        if key not in self._memo:
            counted = self.class_devices.get(device_class)
            result: tuple[int, int] | None = None
            if counted is not None:
                try:
                    on_node: dict[str, int] = {}
                    for device, reach in counted.devices:
                        if _device_matches(selectors, device):
                            for node in reach:
                                on_node[node] = on_node.get(node, 0) + 1
                    result = (max(on_node.values(), default=0), len(on_node))
                except cel.Unevaluable:
                    result = None
            if len(self._memo) < 4096:
                self._memo[key] = result
            return result
        return self._memo[key]

    def resource_of_class(self, device_class: str) -> str:
        """The extended resource name a class's devices count under: its extendedResourceName when it
        serves that name, else the implicit ``deviceclass.resource.kubernetes.io/<class>``."""
        info = self.classes.get(device_class)
        if info is not None and info.extended_resource_name is not None:
            if self.extended_classes.get(info.extended_resource_name) == device_class:
                return info.extended_resource_name
        return IMPLICIT_PREFIX + device_class

    @functools.cached_property
    def runtime_class_node_selectors(self) -> Mapping[str, Mapping[str, str]]:
        """RuntimeClass name -> its scheduling.nodeSelector (empty when it has none)."""
        return {name: dict(info.node_selector) for name, info in self.runtime_classes.items()}


def _matches_terms(terms: tuple[Any, ...], name: str, labels: Mapping[str, str]) -> bool:
    def holds(key: str, op: str, values: tuple[str, ...], have: Mapping[str, str]) -> bool:
        present = key in have
        if op == "In":
            return present and have[key] in values
        if op == "NotIn":
            return not present or have[key] not in values
        if op == "Exists":
            return present
        if op == "DoesNotExist":
            return not present
        if op in ("Gt", "Lt") and present and values:
            try:
                a, b = int(have[key]), int(values[0])
            except ValueError:
                return False
            return a > b if op == "Gt" else a < b
        return False

    fields = {"metadata.name": name}
    return any(
        all(holds(k, op, v, labels) for k, op, v in exprs) and all(holds(k, op, v, fields) for k, op, v in flds)
        for exprs, flds in terms
    )


def _reached(placement: Placement | None, nodes: Mapping[str, NodeInfo]) -> list[str]:
    if placement is None:
        return []
    if placement.node_name is not None:
        return [placement.node_name]
    if placement.all_nodes:
        return list(nodes)
    return [n for n, info in nodes.items() if _matches_terms(placement.node_selector, n, dict(info.labels))]


_MACROS = re.compile(r"\.(exists|exists_one|all|map|filter)\s*\(|\bin\s+device\.")
_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|'[^']*'|\"[^\"]*\"")


@functools.lru_cache(maxsize=512)
def _mentioned(selectors: tuple[str, ...]) -> frozenset[str] | None:
    """Every identifier and string literal the selectors mention; None when they iterate over a device's
    attributes (then every attribute may matter)."""
    text = " ".join(selectors)
    if _MACROS.search(text):
        return None
    return frozenset(w.strip("'\"") for w in _WORDS.findall(text))


def _projection(selectors: tuple[str, ...], device: Device) -> Device:
    """The device with only the attributes the selectors can name. A selector reaches an attribute as
    ``device.attributes['domain'].id`` (or ``['id']``), so one whose domain and id it never mentions cannot
    change the result; devices that differ only in a UUID or bus ID then share one evaluation."""
    mentioned = _mentioned(selectors)
    if mentioned is None:
        return device
    return Device(
        "", device.driver,
        tuple(a for a in device.attributes if a[0] in mentioned and a[1] in mentioned),
        tuple(c for c in device.capacity if c[0] in mentioned and c[1] in mentioned),
        False,
    )


@functools.lru_cache(maxsize=65536)
def _evaluate(selectors: tuple[str, ...], device: Device) -> bool:
    return cel.matches(selectors, device.for_cel())


def _device_matches(selectors: tuple[str, ...], device: Device) -> bool:
    return _evaluate(selectors, _projection(selectors, device))


def _driver_hint(info: DeviceClassInfo, drivers: set[str]) -> str | None:
    """The driver a class's selectors name (``device.driver == 'x'``), or a driver named like the class."""
    for expression in info.selectors:
        found = re.search(r"device\.driver\s*==\s*['\"]([^'\"]+)['\"]", expression)
        if found:
            return found.group(1)
    return info.name if info.name in drivers else None


def _winners(classes: Mapping[str, DeviceClassInfo]) -> dict[str, str]:
    """extended resource name -> class; the class created last wins, ties by name (KEP-5004)."""
    winners: dict[str, DeviceClassInfo] = {}
    for info in sorted(classes.values(), key=lambda c: (c.created, c.name)):
        if info.extended_resource_name is not None:
            winners[info.extended_resource_name] = info
    return {name: info.name for name, info in winners.items()}


def dra_capacity(
    nodes: Mapping[str, NodeInfo], slices: Iterable[SliceInfo], classes: Mapping[str, DeviceClassInfo]
) -> tuple[dict[str, dict[str, int]], dict[str, ClassDevices], dict[str, str], list[str]]:
    """Per node, the devices each class can hand out as extended resources; per class, the most on a node."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    # (device, nodes it reaches) for the current generation of every pool; tainted devices are not offered
    placed: list[tuple[Device, list[str]]] = []
    for s in slices:
        if s.generation != newest[(s.driver, s.pool)]:
            continue  # an older generation of the pool, being replaced by the driver
        slice_nodes = _reached(s.placement, nodes) if s.placement is not None else None
        for device in s.devices:
            if device.tainted:
                continue
            reach = slice_nodes if slice_nodes is not None else _reached(device.placement, nodes)
            if reach:
                placed.append((device, reach))
    drivers = {d.driver for d, _ in placed}
    winners = _winners(classes)
    per_node: dict[str, dict[str, int]] = {}
    class_devices: dict[str, ClassDevices] = {}
    notes: list[str] = []
    for info in classes.values():
        counted_by = "its selectors (cel-python)" if info.selectors else "every device (no selectors)"
        try:
            matched = [(d, reach) for d, reach in placed if _device_matches(info.selectors, d)]
        except cel.Unevaluable as exc:
            driver = _driver_hint(info, drivers)
            if driver is not None:
                matched = [(d, reach) for d, reach in placed if d.driver == driver]
                counted_by = f"every device of driver {driver} (selectors not evaluated: {exc})"
            else:
                matched = list(placed)
                counted_by = f"every published device (selectors not evaluated: {exc}; no driver named)"
            notes.append(f"DeviceClass {info.name}: counted {counted_by}")
        on_node: dict[str, int] = {}
        for _, reach in matched:
            for node in reach:
                on_node[node] = on_node.get(node, 0) + 1
        class_devices[info.name] = ClassDevices(
            max(on_node.values(), default=0), len(on_node), counted_by,
            tuple((d, tuple(reach)) for d, reach in matched),
        )
        names = [IMPLICIT_PREFIX + info.name]
        if info.extended_resource_name is not None and winners.get(info.extended_resource_name) == info.name:
            names.append(info.extended_resource_name)
        for node, n in on_node.items():
            mine = per_node.setdefault(node, {})
            for name in names:
                mine[name] = mine.get(name, 0) + n
    return per_node, class_devices, winners, notes


@dataclass(frozen=True)
class _Capacity:
    nodes: NodeSummary
    class_devices: Mapping[str, ClassDevices]
    winners: Mapping[str, str]
    notes: tuple[str, ...]


def _capacity(
    node_label: str, nodes: Mapping[str, NodeInfo], slices: Iterable[SliceInfo], classes: Mapping[str, DeviceClassInfo]
) -> _Capacity:
    per_node, class_devices, winners, notes = dra_capacity(nodes, slices, classes)
    merged = []
    for name in set(nodes) | set(per_node):
        info = nodes.get(name, NodeInfo(None, ()))
        extra = per_node.get(name)
        if extra:
            counts = dict(info.extended)
            for resource, n in extra.items():
                counts[resource] = counts.get(resource, 0) + n
            info = NodeInfo(info.accelerator, tuple(sorted(counts.items())), info.labels)
        merged.append(info)
    return _Capacity(summarize(merged, node_label), class_devices, winners, tuple(notes))


def build_view(
    node_label: str,
    nodes: Mapping[str, NodeInfo],
    slices: Iterable[SliceInfo] = (),
    classes: Mapping[str, DeviceClassInfo] | None = None,
    claims: Mapping[tuple[str, str], ClaimInfo] | None = None,
    templates: Mapping[tuple[str, str], ClaimInfo] | None = None,
    runtime_classes: Mapping[str, RuntimeClassInfo] | None = None,
    known: Iterable[str] = (),
    capacity: _Capacity | None = None,
) -> ClusterView:
    classes = classes or {}
    capacity = capacity or _capacity(node_label, nodes, slices, classes)
    return ClusterView(
        capacity.nodes, dict(classes), capacity.class_devices, capacity.winners, dict(claims or {}),
        dict(templates or {}), dict(runtime_classes or {}), frozenset(known), capacity.notes,
    )


# --- Indices fed by informers -------------------------------------------------------------------------


class Index:
    """One kind's objects by key, reduced to what decisions read; marks the view dirty on real change."""

    def __init__(self, key: Callable[[Mapping[str, Any]], Any], info: Callable[[Mapping[str, Any]], Any],
                 changed: Callable[[], None] = lambda: None):
        self._key = key
        self._info = info
        self._changed = changed
        self._items: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self.loaded = False

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> dict[Any, Any]:
        with self._lock:
            return dict(self._items)

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        fresh = {self._key(o): self._info(o) for o in objects if isinstance(o, Mapping)}
        with self._lock:
            self._items = fresh
            self.loaded = True
        self._changed()

    def apply(self, event_type: str, obj: Mapping[str, Any]) -> None:
        key = self._key(obj)
        with self._lock:
            if event_type == "DELETED":
                changed = self._items.pop(key, None) is not None
            else:
                info = self._info(obj)
                changed = self._items.get(key) != info  # heartbeats and status updates change nothing indexed
                self._items[key] = info
        if changed:
            self._changed()


def _namespaced(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (_namespace(obj), _name(obj))


@dataclass(frozen=True)
class ClusterKind:
    """A kind the view is built from: its plural (the index key and the metrics label), its kind, and the
    path it is listed and watched at."""

    name: str
    kind: str
    path: str


# The one table of the kinds a view is built from, in the order the server starts their informers.
CLUSTER_KINDS = (
    ClusterKind("nodes", "Node", "/api/v1/nodes"),
    ClusterKind("resourceslices", "ResourceSlice", "/apis/resource.k8s.io/v1/resourceslices"),
    ClusterKind("deviceclasses", "DeviceClass", "/apis/resource.k8s.io/v1/deviceclasses"),
    ClusterKind("resourceclaims", "ResourceClaim", "/apis/resource.k8s.io/v1/resourceclaims"),
    ClusterKind("resourceclaimtemplates", "ResourceClaimTemplate", "/apis/resource.k8s.io/v1/resourceclaimtemplates"),
    ClusterKind("runtimeclasses", "RuntimeClass", "/apis/node.k8s.io/v1/runtimeclasses"),
)
KINDS = tuple(k.name for k in CLUSTER_KINDS)
KIND_OF = {k.kind: k.name for k in CLUSTER_KINDS}


# What node capacity depends on; a change elsewhere (a new claim) does not recount devices.
CAPACITY_KINDS = frozenset({"nodes", "resourceslices", "deviceclasses"})


class ClusterState:
    """Every index, and the view built from them: cached until an index changes, then rebuilt on read."""

    def __init__(self, node_label: str):
        self.node_label = node_label
        self._lock = threading.Lock()
        self._view: ClusterView | None = None
        self._capacity: _Capacity | None = None
        self._dirty: set[str] = set(KINDS)
        self._changed = threading.Event()
        self._background = False
        self.known: frozenset[str] = frozenset(KINDS)

        def index(kind: str, key: Callable[[Mapping[str, Any]], Any], info: Callable[[Mapping[str, Any]], Any],
                  ) -> Index:
            def changed() -> None:
                self._dirty.add(kind)
                self._changed.set()

            return Index(key, info, changed)

        self.indices: dict[str, Index] = {
            "nodes": index("nodes", _name, lambda o: node_info(o, node_label)),
            "resourceslices": index("resourceslices", _name, slice_info),
            "deviceclasses": index("deviceclasses", _name, device_class_info),
            "resourceclaims": index("resourceclaims", _namespaced, claim_info),
            "resourceclaimtemplates": index("resourceclaimtemplates", _namespaced, template_info),
            "runtimeclasses": index("runtimeclasses", _name, runtime_class_info),
        }

    @property
    def loaded(self) -> bool:
        return all(index.loaded for index in self.indices.values())

    def waiting_for(self) -> list[str]:
        return [name for name, index in self.indices.items() if not index.loaded]

    def load(self, objects: Iterable[Mapping[str, Any]], known: Iterable[str] | None = None) -> None:
        """Fill the indices from objects read from files (``check --cluster-state``). Kinds the files
        do not hold stay unknown: nothing is judged missing for want of them. ``known`` overrides which
        kinds count as complete."""
        by_kind: dict[str, list[Mapping[str, Any]]] = {k: [] for k in KINDS}
        for obj in objects:
            kind = KIND_OF.get(str(obj.get("kind")))
            if kind is not None:
                by_kind[kind].append(obj)
        for kind, found in by_kind.items():
            self.indices[kind].replace(found)
        self.known = frozenset(known if known is not None else (k for k, found in by_kind.items() if found))

    def start_refresher(self, stop: threading.Event) -> None:
        """Rebuild the view on a thread of its own as changes arrive, so no admission waits for a rebuild
        (236 ms after a slice change with 16,000 devices); :meth:`view` then answers the last one built."""
        self._background = True

        def loop() -> None:
            while not stop.is_set():
                self._changed.wait(1.0)
                self._changed.clear()  # a change after this sets it again; its kind is in _dirty either way
                if self._dirty and self.loaded:
                    self._rebuild()

        threading.Thread(target=loop, name="cluster-view", daemon=True).start()

    def view(self) -> ClusterView | None:
        """The current view; None until every index has loaded once."""
        if not self.loaded:
            return None
        if self._background and self._view is not None:
            return self._view
        return self._rebuild()

    def _rebuild(self) -> ClusterView:
        with self._lock:
            if self._dirty or self._view is None:
                dirty, self._dirty = self._dirty, set()  # changes during the build mark it dirty again
                i = self.indices
                if self._capacity is None or dirty & CAPACITY_KINDS:
                    self._capacity = _capacity(
                        self.node_label, i["nodes"].items(), i["resourceslices"].items().values(),
                        i["deviceclasses"].items(),
                    )
                self._view = build_view(
                    self.node_label, {}, (), i["deviceclasses"].items(), i["resourceclaims"].items(),
                    i["resourceclaimtemplates"].items(), i["runtimeclasses"].items(), self.known, self._capacity,
                )
            assert self._view is not None
            return self._view
