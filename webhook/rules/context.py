"""What every rule family reads about one pod spec, gathered once per pod spec.

The containers are read once (``webhook.core.podspecs.read_containers``: their paths and resources),
who holds a GPU of any kind is worked out once from them (:class:`GpuUse`), and the families
(``isolation``, ``claims``, ``sharing``, ``crossfield``, ``capacity``) are handed the result in a
:class:`PodContext` instead of walking the spec again each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core import resources as registry
from webhook.core.cluster import ClusterView
from webhook.core.field import FieldPath
from webhook.core.podspecs import Container, PodSpecRef, as_mapping, read_containers
from webhook.core.policy import Policy
from webhook.core.quantity import QuantityError, gpu_count


@dataclass(frozen=True)
class GpuUse:
    """Which containers of a pod spec hold a GPU of any kind, by (list name, index)."""

    holders: frozenset[tuple[str, int]]
    # Some container holds a non-zero count of a policy GPU resource: the pods runtimeClass goes to.
    counted: bool
    # A fractional scheduler's pod (HAMi or Volcano names, KAI/Run:ai annotations): it sets the env itself.
    fractional: bool

    @property
    def any(self) -> bool:
        return self.fractional or bool(self.holders)

    def holds(self, list_name: str, index: int) -> bool:
        return self.fractional or (list_name, index) in self.holders


def nonzero(raw: object) -> bool:
    """Whether a quantity asks for something: not a count at all still asks for the device (the quantity
    rule says what is wrong with it)."""
    try:
        return gpu_count(raw) != 0
    except QuantityError:
        return True


def container_gpus(container: Container, policy: Policy) -> tuple[bool, bool, bool]:
    """(holds a GPU of any kind, holds a counted policy GPU, asks a fractional scheduler) for one container.

    Any kind: a policy GPU resource or a registered vendor name (shared, partition, memory, cores,
    monitoring) with a non-zero quantity, or a DRA claim (``resources.claims``).
    """
    holds = counted = fractional = False
    for section in (container.limits, container.requests):
        for name, raw in section.items():
            if not isinstance(name, str):
                continue
            entry = registry.lookup(name)
            if entry is None and not (policy.names_gpu(name) or policy.is_gpu(name)):
                continue
            if (entry is not None and entry.kind is registry.Kind.PRIORITY) or not nonzero(raw):
                continue
            holds = True
            counted = counted or policy.is_gpu(name)
            fractional = fractional or bool(entry is not None and entry.scheduler)
    claims = container.resources.get("claims")
    if isinstance(claims, list) and claims:
        holds = True
    return holds, counted, fractional


def use_of(containers: Iterable[Container], metadata: Mapping[str, Any], policy: Policy) -> GpuUse:
    """Who holds a GPU among containers already read."""
    holders: set[tuple[str, int]] = set()
    counted = fractional = False
    for container in containers:
        holds, counts, asks = container_gpus(container, policy)
        if holds:
            holders.add(container.slot)
        counted = counted or counts
        fractional = fractional or asks
    annotations = as_mapping(metadata.get("annotations"))
    fractional = fractional or any(key in annotations for key in registry.FRACTION_ANNOTATIONS)
    return GpuUse(frozenset(holders), counted, fractional)


def gpu_use(spec: Mapping[str, Any], metadata: Mapping[str, Any], policy: Policy) -> GpuUse:
    """Who holds a GPU in a pod spec (for mutation, which has no context of its own)."""
    return use_of(read_containers(spec), metadata, policy)


@dataclass(frozen=True, slots=True)
class PodContext:
    """One pod spec as every rule on it sees it: the spec and its metadata (``ref``), the policy of the
    namespace, the cluster view (None when cluster checks are off), the namespace, its containers read once,
    who holds GPUs, and whether the pod runs trusted (isolation.trusted)."""

    ref: PodSpecRef
    policy: Policy
    view: ClusterView | None
    namespace: str
    containers: tuple[Container, ...]
    use: GpuUse
    trusted: bool

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.ref.spec

    @property
    def path(self) -> FieldPath:
        return self.ref.path


def pod_context(
    ref: PodSpecRef, policy: Policy, view: ClusterView | None = None, namespace: str = "",
    containers: tuple[Container, ...] | None = None,
) -> PodContext:
    """The context of one pod spec; ``containers`` when the caller has read them already."""
    if containers is None:
        containers = read_containers(ref.spec, ref.path)
    return PodContext(
        ref, policy, view, namespace, containers, use_of(containers, ref.metadata, policy), policy.trusts(ref.spec)
    )
