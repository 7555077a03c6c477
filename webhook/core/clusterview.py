"""The immutable ClusterView decisions read, and how it is built from the indices: node summary, DRA capacity.

A :class:`ClusterView` is rebuilt only when something it depends on changed and swapped in whole
(``webhook.core.cluster``), so a decision never sees half an update and a lost watch only makes the view older,
never missing.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.core import cel
from webhook.core.clusterindex import (
    ClaimInfo,
    Device,
    DeviceClassInfo,
    NodeInfo,
    Placement,
    RuntimeClassInfo,
    SliceInfo,
)

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


# --- Nodes by accelerator --------------------------------------------------------------------------


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


# --- The view -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClassDevices:
    """What one DeviceClass can hand out: the most devices on one node, and how they were counted."""

    largest: int
    nodes: int
    counted_by: str  # "its selectors" or "the devices of driver X (...why...)"
    # the devices counted, each with the nodes it reaches, for requests that narrow the class with selectors
    devices: tuple[tuple[Device, tuple[str, ...]], ...] = field(default=(), compare=False, repr=False)
    evaluated: bool = True  # False: cel-python could not evaluate the selectors, a driver's devices were counted


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
        evaluated = True
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
            evaluated = False
            notes.append(f"DeviceClass {info.name}: counted {counted_by}")
        on_node: dict[str, int] = {}
        for _, reach in matched:
            for node in reach:
                on_node[node] = on_node.get(node, 0) + 1
        class_devices[info.name] = ClassDevices(
            max(on_node.values(), default=0), len(on_node), counted_by,
            tuple((d, tuple(reach)) for d, reach in matched), evaluated,
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
class CountedCapacity:
    """What Nodes, ResourceSlices and DeviceClasses count to; kept from one view to the next until one of them
    changes (a new claim recounts no device)."""

    nodes: NodeSummary
    class_devices: Mapping[str, ClassDevices]
    winners: Mapping[str, str]
    notes: tuple[str, ...]


def count_capacity(
    node_label: str, nodes: Mapping[str, NodeInfo], slices: Iterable[SliceInfo], classes: Mapping[str, DeviceClassInfo]
) -> CountedCapacity:
    """The node summary with each node's DRA devices added as extended resources, and each class's devices."""
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
    return CountedCapacity(summarize(merged, node_label), class_devices, winners, tuple(notes))


def build_view(
    node_label: str,
    nodes: Mapping[str, NodeInfo],
    slices: Iterable[SliceInfo] = (),
    classes: Mapping[str, DeviceClassInfo] | None = None,
    claims: Mapping[tuple[str, str], ClaimInfo] | None = None,
    templates: Mapping[tuple[str, str], ClaimInfo] | None = None,
    runtime_classes: Mapping[str, RuntimeClassInfo] | None = None,
    known: Iterable[str] = (),
    capacity: CountedCapacity | None = None,
) -> ClusterView:
    classes = classes or {}
    capacity = capacity or count_capacity(node_label, nodes, slices, classes)
    return ClusterView(
        capacity.nodes, dict(classes), capacity.class_devices, capacity.winners, dict(claims or {}),
        dict(templates or {}), dict(runtime_classes or {}), frozenset(known), capacity.notes,
    )
