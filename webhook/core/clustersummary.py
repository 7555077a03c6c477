"""The cluster's facts as GPUPolicy/default's ``status.cluster``: aggregates of the cluster view, never per node.

:func:`summarize` turns a :class:`~webhook.core.clusterview.ClusterView` into a JSON-ready dict, sorted, with:

- ``nodeLabel``: the policy's accelerator node label, which ``models`` are keyed by;
- ``models``: each value of that label with its node count (``nodes``) and, per GPU resource, the most of it on
  one node (``largest``), counted as the webhook's capacity checks count it (``status.allocatable`` plus the
  devices DRA serves under an extended resource name);
- ``extendedResources``: every extended resource a node offers, with the most of it on one node;
- ``runtimeClasses``: each RuntimeClass and its ``scheduling.nodeSelector``;
- ``deviceClasses``: each DeviceClass and the devices of the ResourceSlices its selectors match (``devices``;
  ``largest`` on one node; ``nodes`` reached), with the selector evaluation the webhook's own checks use
  (``webhook.core.clusterview``); ``selectorsEvaluated`` false when cel-python could not evaluate them and the
  driver's devices were counted instead;
- ``truncated``: the sections that hit a bound below and kept only part of the cluster (absent when none did).

A section whose kinds the writer could not read (no RBAC, an API the apiserver does not serve) is absent: not
empty, which says there are none. The writer adds ``writtenAt`` and ``writer`` (:data:`STAMPS`), which
:func:`facts_of` drops to compare.

**The bound.** Every map is capped (:data:`MAX_MODELS` and the rest); what is cut is the least of it (the models
with the fewest nodes, the classes with the fewest devices, the resources last by name) and its section is named
in ``truncated``. The size therefore grows with the number of distinct models, resources and classes, never with
the number of nodes, and with every name at its Kubernetes maximum length and every map at its cap it stays
under :data:`MAX_BYTES` of JSON (tests/test_clustersummary.py builds that worst case). :data:`SCHEMA` is the
same bound as an OpenAPI schema, for the CRD.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from webhook.core.cluster import ClusterState
from webhook.core.clusterview import ClusterView, build_view, count_capacity

MAX_MODELS = 64  # the CRD's bound of accelerator.allowed
MAX_MODEL_RESOURCES = 8  # GPU resources per model (a MIG mixed strategy has a handful)
MAX_RESOURCES = 64
MAX_DEVICE_CLASSES = 64
MAX_RUNTIME_CLASSES = 32
MAX_SELECTOR_LABELS = 16  # a RuntimeClass with more keeps no nodeSelector here
MAX_BYTES = 512 * 1024  # the JSON of a summary at every cap, names at their longest; real clusters: a few KB
MAX_WRITER = 253

# Kubernetes' own lengths: a label value, an object name, a qualified name (253-character prefix, '/', 63).
LABEL_VALUE, NAME, QUALIFIED_NAME = 63, 253, 317

# The kinds the summary is made of, and which sections need which.
KINDS = ("nodes", "resourceslices", "deviceclasses", "runtimeclasses")
SECTION_KINDS: Mapping[str, frozenset[str]] = {
    "models": frozenset({"nodes"}),
    "extendedResources": frozenset({"nodes"}),
    "deviceClasses": frozenset({"nodes", "resourceslices", "deviceclasses"}),
    "runtimeClasses": frozenset({"runtimeclasses"}),
}
STAMPS = ("writtenAt", "writer")

# How the native policies judge the summary's age (CEL has no clock): the writer stamps ``writtenAt`` again at least
# every HEARTBEAT seconds while it runs, even when no fact changed, and a policy that reads the summary acts on it
# only for a request at most FRESH_FOR seconds after ``writtenAt`` (the request's time: ``creationTimestamp`` on
# CREATE, the newest ``managedFields`` time on UPDATE, both written by the apiserver before admission). Older, or
# missing, and the cluster rules the policies carry refuse nothing: a writer down for longer than FRESH_FOR can no
# longer keep out a model, a RuntimeClass or a DeviceClass added since.
HEARTBEAT = 120
FRESH_FOR = 300


def _every(name: str) -> bool:
    return True


def view_of(state: ClusterState, known: Collection[str]) -> ClusterView:
    """The view of ``state`` built from the kinds in ``known`` alone (the others as if empty): a kind that could
    not be read leaves its sections out instead of holding the rest back."""
    def items(kind: str) -> dict[Any, Any]:
        return state.indices[kind].items() if kind in known else {}

    classes = items("deviceclasses")
    capacity = count_capacity(state.node_label, items("nodes"), items("resourceslices").values(), classes)
    return build_view(state.node_label, {}, (), classes, runtime_classes=items("runtimeclasses"),
                      known=frozenset(known), capacity=capacity)


def _capped(items: list[tuple[str, Any]], cap: int, section: str, truncated: set[str]) -> dict[str, Any]:
    if len(items) > cap:
        truncated.add(section)
    return dict(sorted(items[:cap]))


def summarize(view: ClusterView, known: Collection[str] = KINDS,
              is_gpu: Callable[[str], bool] = _every) -> dict[str, Any]:
    """The facts of ``view`` (no ``writtenAt``, no ``writer``), each section present when the kinds it is made of
    are in ``known``; ``is_gpu`` picks the resources kept per model (the policy's ``Policy.is_gpu``)."""
    def has(section: str) -> bool:
        return SECTION_KINDS[section] <= set(known)

    truncated: set[str] = set()
    out: dict[str, Any] = {}
    if has("models"):
        out["nodeLabel"] = view.nodes.node_label
        ranked = sorted(view.nodes.by_accelerator.items(), key=lambda m: (-m[1].nodes, m[0]))
        models = []
        for model, capacity in ranked:
            gpus = sorted((r, n) for r, n in capacity.largest.items() if is_gpu(r))
            models.append((model, {"nodes": capacity.nodes,
                                   "largest": _capped(gpus, MAX_MODEL_RESOURCES, "models", truncated)}))
        out["models"] = _capped(models, MAX_MODELS, "models", truncated)
    if has("extendedResources"):
        resources = sorted(view.nodes.total.largest.items(), key=lambda r: (not is_gpu(r[0]), r[0]))
        out["extendedResources"] = _capped(resources, MAX_RESOURCES, "extendedResources", truncated)
    if has("deviceClasses"):
        classes = []
        for name, counted in view.class_devices.items():
            entry: dict[str, Any] = {"devices": len(counted.devices), "largest": counted.largest,
                                     "nodes": counted.nodes,
                                     "selectorsEvaluated": counted.evaluated}
            serves = view.resource_of_class(name)
            if not serves.startswith("deviceclass.resource.kubernetes.io/"):
                entry["extendedResourceName"] = serves
            classes.append((name, entry))
        classes.sort(key=lambda c: (-c[1]["devices"], c[0]))
        out["deviceClasses"] = _capped(classes, MAX_DEVICE_CLASSES, "deviceClasses", truncated)
    if has("runtimeClasses"):
        runtime = []
        for name, info in sorted(view.runtime_classes.items()):
            entry = {}
            if len(info.node_selector) > MAX_SELECTOR_LABELS:
                truncated.add("runtimeClasses")
            else:
                entry["nodeSelector"] = dict(info.node_selector)
            runtime.append((name, entry))
        out["runtimeClasses"] = _capped(runtime, MAX_RUNTIME_CLASSES, "runtimeClasses", truncated)
    if truncated:
        out["truncated"] = sorted(truncated)
    return out


def facts_of(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A written summary without its stamps: what two summaries are compared on (a new ``writtenAt`` alone is no
    change)."""
    if not isinstance(summary, Mapping):
        return None
    return {k: v for k, v in summary.items() if k not in STAMPS}


# -- the schema: the same bounds, for the CRD's status -----------------------------------------------------


def _string(length: int) -> dict[str, Any]:
    return {"type": "string", "maxLength": length}


def _count() -> dict[str, Any]:
    return {"type": "integer", "format": "int64", "minimum": 0}


def _map(values: dict[str, Any], cap: int) -> dict[str, Any]:
    return {"type": "object", "maxProperties": cap, "additionalProperties": values}


SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The cluster's facts, kept current by the webhook's status writer: aggregates, never per node. "
                   "A section it could not read is absent.",
    "properties": {
        "nodeLabel": _string(QUALIFIED_NAME),
        "models": {**_map({"type": "object", "properties": {
            "nodes": _count(), "largest": _map(_count(), MAX_MODEL_RESOURCES)}}, MAX_MODELS),
            "description": "Accelerator models (values of nodeLabel): node count, the most of each GPU resource "
                           "on one node."},
        "extendedResources": {**_map(_count(), MAX_RESOURCES),
                              "description": "Extended resources the nodes offer: the most on one node."},
        "deviceClasses": {**_map({"type": "object", "properties": {
            "devices": _count(), "largest": _count(), "nodes": _count(),
            "selectorsEvaluated": {"type": "boolean"}, "extendedResourceName": _string(QUALIFIED_NAME)}},
            MAX_DEVICE_CLASSES),
            "description": "DeviceClasses: the devices of the ResourceSlices their selectors match."},
        "runtimeClasses": {**_map({"type": "object", "properties": {
            "nodeSelector": _map(_string(LABEL_VALUE), MAX_SELECTOR_LABELS)}}, MAX_RUNTIME_CLASSES),
            "description": "RuntimeClasses and their scheduling.nodeSelector."},
        "truncated": {"type": "array", "maxItems": len(SECTION_KINDS), "items": _string(32),
                      "x-kubernetes-list-type": "set",
                      "description": "The sections that hit their bound and hold only part of the cluster."},
        "writtenAt": {"type": "string", "format": "date-time"},
        "writer": _string(MAX_WRITER),
    },
}
