"""ClusterState: the indices of the six kinds the view is built from (CLUSTER_KINDS), and the view kept current.

The kinds are Nodes, ResourceSlices, DeviceClasses, ResourceClaims, ResourceClaimTemplates and RuntimeClasses,
each kept in an index of ``webhook.core.clusterindex``. Readers get a ``webhook.core.clusterview.ClusterView``:
an immutable summary, rebuilt only when an index really changed and swapped in whole, so a decision never sees
half an update and a lost watch only makes the view older, never missing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.clusterindex import (
    Index,
    claim_info,
    device_class_info,
    namespaced_name,
    node_info,
    object_name,
    runtime_class_info,
    slice_info,
    template_info,
)
from webhook.core.clusterview import ClusterView, CountedCapacity, build_view, count_capacity


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
        self._capacity: CountedCapacity | None = None
        self._dirty: set[str] = set(KINDS)
        self._changed = threading.Event()
        self._background = False
        self.known: frozenset[str] = frozenset(KINDS)
        # Counts the real changes of any index: a reader that keeps something derived (the status writer's
        # summary) recomputes it when this moved.
        self.changes = 0

        def index(kind: str, key: Callable[[Mapping[str, Any]], Any], info: Callable[[Mapping[str, Any]], Any],
                  ) -> Index:
            def changed() -> None:
                self.changes += 1
                self._dirty.add(kind)
                self._changed.set()

            return Index(key, info, changed)

        self.indices: dict[str, Index] = {
            "nodes": index("nodes", object_name, lambda o: node_info(o, node_label)),
            "resourceslices": index("resourceslices", object_name, slice_info),
            "deviceclasses": index("deviceclasses", object_name, device_class_info),
            "resourceclaims": index("resourceclaims", namespaced_name, claim_info),
            "resourceclaimtemplates": index("resourceclaimtemplates", namespaced_name, template_info),
            "runtimeclasses": index("runtimeclasses", object_name, runtime_class_info),
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
                    self._capacity = count_capacity(
                        self.node_label, i["nodes"].items(), i["resourceslices"].items().values(),
                        i["deviceclasses"].items(),
                    )
                self._view = build_view(
                    self.node_label, {}, (), i["deviceclasses"].items(), i["resourceclaims"].items(),
                    i["resourceclaimtemplates"].items(), i["runtimeclasses"].items(), self.known, self._capacity,
                )
            assert self._view is not None
            return self._view
