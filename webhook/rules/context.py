"""What every rule family reads about one pod spec, gathered once per pod spec.

The containers are read once (``webhook.core.podspecs.read_containers``: their paths and resources), the
resource names every rule reads are worked out once per container (:class:`Named`: the registry's entry, whether
the policy counts it as GPUs, the count asked for), who holds a GPU of any kind once from those
(:class:`GpuUse`), and the families (``isolation``, ``claims``, ``sharing``, ``crossfield``, ``capacity``) are
handed the result in a :class:`PodContext` instead of walking the spec, or a container's names, again each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.core import resources as registry
from webhook.core.clusterview import ClusterView
from webhook.core.field import FieldPath
from webhook.core.podspecs import Container, PodSpecRef, as_mapping, read_containers
from webhook.core.policy import Policy
from webhook.core.quantity import QuantityError, gpu_count
from webhook.core.resources import Kind, VendorResource


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


class Named(NamedTuple):
    """A resource name of a container that some rule reads: a policy GPU, or a name the vendor registry knows
    (cpu, memory and the like are no rule's business, and are left out)."""

    section: str  # limits | requests
    name: str
    raw: Any  # the value as written
    entry: VendorResource | None  # the registry's, None for a name no vendor here publishes
    gpu: bool  # a GPU count to the policy (policy.is_gpu)
    number: int | None  # the whole number asked for; None when the value is none
    problem: str  # why it is none (the quantity rule's message), else empty

    @property
    def nonzero(self) -> bool:
        """Whether it asks for something: a value that is no count still asks for the device."""
        return self.number != 0


def resource_names(container: Container, policy: Policy) -> tuple[Named, ...]:
    """The names of a container's limits, then its requests, that some rule reads, each worked out once."""
    found = []
    for section, values in (("limits", container.limits), ("requests", container.requests)):
        for name, raw in values.items():
            if not isinstance(name, str):
                continue
            entry = registry.lookup(name)
            gpu = policy.is_gpu(name)
            if entry is None and not gpu:
                continue
            try:
                found.append(Named(section, name, raw, entry, gpu, gpu_count(raw), ""))
            except QuantityError as exc:
                found.append(Named(section, name, raw, entry, gpu, None, str(exc)))
    return tuple(found)


def container_gpus(container: Container, names: tuple[Named, ...]) -> tuple[bool, bool, bool]:
    """(holds a GPU of any kind, holds a counted policy GPU, asks a fractional scheduler) for one container.

    Any kind: a policy GPU resource or a registered vendor name (shared, partition, memory, cores,
    monitoring) with a non-zero quantity, or a DRA claim (``resources.claims``).
    """
    holds = counted = fractional = False
    for n in names:
        if (n.entry is not None and n.entry.kind is Kind.PRIORITY) or not n.nonzero:
            continue
        holds = True
        counted = counted or n.gpu
        fractional = fractional or bool(n.entry is not None and n.entry.scheduler)
    claims = container.resources.get("claims")
    if isinstance(claims, list) and claims:
        holds = True
    return holds, counted, fractional


def use_of(
    containers: tuple[Container, ...], names: tuple[tuple[Named, ...], ...], metadata: Mapping[str, Any]
) -> GpuUse:
    """Who holds a GPU among containers already read (``names``: each one's, in the same order)."""
    holders: set[tuple[str, int]] = set()
    counted = fractional = False
    for container, mine in zip(containers, names, strict=True):
        holds, counts, asks = container_gpus(container, mine)
        if holds:
            holders.add(container.slot)
        counted = counted or counts
        fractional = fractional or asks
    annotations = as_mapping(metadata.get("annotations"))
    fractional = fractional or any(key in annotations for key in registry.FRACTION_ANNOTATIONS)
    return GpuUse(frozenset(holders), counted, fractional)


def gpu_use(spec: Mapping[str, Any], metadata: Mapping[str, Any], policy: Policy) -> GpuUse:
    """Who holds a GPU in a pod spec (for mutation, which has no context of its own)."""
    containers = read_containers(spec)
    return use_of(containers, tuple(resource_names(c, policy) for c in containers), metadata)


@dataclass(frozen=True, slots=True)
class PodContext:
    """One pod spec as every rule on it sees it: the spec and its metadata (``ref``), the policy of the
    namespace, the cluster view (None when cluster checks are off), the namespace, its containers read once and
    each one's resource names (``names[i]`` are ``containers[i]``'s), who holds GPUs, and whether the pod runs
    trusted (isolation.trusted)."""

    ref: PodSpecRef
    policy: Policy
    view: ClusterView | None
    namespace: str
    containers: tuple[Container, ...]
    names: tuple[tuple[Named, ...], ...]
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
    names = tuple(resource_names(c, policy) for c in containers)
    return PodContext(
        ref, policy, view, namespace, containers, names, use_of(containers, names, ref.metadata),
        policy.trusts(ref.spec),
    )
