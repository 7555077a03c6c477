"""What the cluster view keeps of each kind: one Index per kind, each object reduced to what decisions read.

Nodes to their accelerator label and extended resources (:class:`NodeInfo`), DeviceClasses to their selectors,
ResourceSlices to their devices and the nodes they reach, ResourceClaims and ResourceClaimTemplates to their
device requests, RuntimeClasses to their node selector. An :class:`Index` is fed by an informer
(``webhook.kube.informer``) or, for ``gpu-webhook check``, by objects read from a file, and says when what it
keeps really changed (a Node heartbeat or a claim's status update changes nothing indexed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.podspecs import as_list, as_mapping
from webhook.core.quantity import QuantityError, gpu_count

# Set by the system on claims made from a template for one pod (KEP-4381).
GENERATED_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


def object_name(obj: Mapping[str, Any]) -> str:
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
        object_name(obj), extended if isinstance(extended, str) and extended else None, selectors,
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


def namespaced_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (_namespace(obj), object_name(obj))
