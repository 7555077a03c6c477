"""The pass over pod specs: ``violations(obj, ...)`` is every GPU violation of an object.

Each pod spec is read once (``webhook.rules.context.pod_context``: its containers and who holds GPUs), then
one pass over its containers runs the per-container rules of every family (this module's resources rules,
``crossfield``, ``sharing``, ``isolation``), and the pod-wide rules follow (``isolation``, ``claims``,
``crossfield``, ``capacity``). Each check returns everything it found, so one denial names every problem.
Nothing here raises on odd input; odd shapes are violations of their own. Each violation carries
the value it is about, so an UPDATE that changes an old problem is held to it (see ``admission``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from webhook.core import resources as registry
from webhook.core.catalog import TENANT_RULES
from webhook.core.clusterview import ClusterView
from webhook.core.field import ROOT, FieldPath, Violation
from webhook.core.podspecs import (
    Container,
    PodSpecRef,
    count_fields,
    find_pod_specs,
    read_containers,
    resource_blocks,
)
from webhook.core.policy import Policy, gpu_entries
from webhook.core.quantity import QuantityError, gpu_count, quoted, shown
from webhook.rules import claims, draobjects, sharing
from webhook.rules.capacity import check_cluster
from webhook.rules.context import Named, PodContext, pod_context, resource_names
from webhook.rules.crossfield import (
    check_cpu_pod_on_gpu_nodes,
    check_init_container_gpus,
    check_mixed_gpu_and_mig,
    check_process_count,
    check_replica_accelerators,
)
from webhook.rules.isolation import check_container_isolation, check_isolation, hides_gpus, runtime_reads


@dataclass(slots=True)
class ContainerGPUs:
    """What one container asks for, as the scheduler will count it (requests, defaulted from limits)."""

    counts: dict[str, int] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)  # every GPU resource named, valid or not
    sidecar: bool = False
    slot: tuple[str, int] = ("", -1)  # (containers | initContainers | ephemeralContainers, index)


def about(raw: object) -> str:
    """A value as a violation records it: as written, cut short if long (``1`` and ``"1"`` are one quantity)."""
    return raw if isinstance(raw, str) else shown(raw)


def _mapping_at(parent: Mapping[str, Any], key: str, path: FieldPath, out: list[Violation]) -> Mapping[str, Any]:
    value = parent.get(key)
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        kind = type(value).__name__
        out.append(Violation(path.child(key), "structure", f"must be a mapping, not {kind}", kind))
        return {}
    return value


def _odd_resources(container: Container, out: list[Violation]) -> None:
    """``resources``, its ``limits`` and its ``requests`` that are there but are no mappings."""
    raw = container.fields.get("resources")
    if raw is None or (type(raw) is dict and type(raw.get("limits", {})) is dict
                       and type(raw.get("requests", {})) is dict):
        return  # the usual shapes, told apart without building a path
    if container.at is not None:  # a resource block: the registry found a mapping there
        resources = container.resources
    else:
        resources = _mapping_at(container.fields, "resources", container.path, out)
    _mapping_at(resources, "limits", container.resources_path, out)
    _mapping_at(resources, "requests", container.resources_path, out)


def _at(container: Container, section: str, name: str) -> FieldPath:
    return container.resources_path.child(section).key(name)


def _invalid(container: Container, n: Named) -> Violation:
    return Violation(_at(container, n.section, n.name), "invalid-quantity", f"{container.label}: {n.problem}",
                     about(n.raw))


def check_container(
    container: Container, names: tuple[Named, ...], policy: Policy, gpus: ContainerGPUs
) -> list[Violation]:
    """Requests and limits of every GPU resource in one container (``names``: its, from the context); fills
    ``gpus`` with valid counts. Paths and the container's label are built only for a violation."""
    out: list[Violation] = []
    _odd_resources(container, out)
    limits = {n.name: n for n in names if n.gpu and n.section == "limits"}
    requests = [n for n in names if n.gpu and n.section == "requests"]
    if not limits and not requests:
        return out
    gpus.named.update(limits, (n.name for n in requests))
    for n in limits.values():
        if n.number is None:
            out.append(_invalid(container, n))
    for n in requests:
        if n.number is None:
            out.append(_invalid(container, n))
        limit = limits.get(n.name)
        if limit is None:
            out.append(
                Violation(
                    _at(container, "requests", n.name),
                    "requests-without-limits",
                    f"{container.label}: {n.name} is requested without a limit, set it in limits (requests default "
                    "to limits)",
                    about(n.raw),
                )
            )
        elif n.number is not None and limit.number is not None and n.number != limit.number:
            out.append(
                Violation(
                    _at(container, "requests", n.name),
                    "requests-differ",
                    f"{container.label}: {n.name} requests ({about(n.raw)}) must equal limits ({about(limit.raw)})",
                    f"{n.number} != {limit.number}",
                )
            )
        if n.number is not None:
            gpus.counts[n.name] = n.number
    for n in limits.values():
        if n.number is None:
            continue
        gpus.counts.setdefault(n.name, n.number)
        if policy.per_container and n.number > policy.per_container:
            out.append(
                Violation(
                    _at(container, "limits", n.name),
                    "per-container-limit",
                    f"{container.label}: {n.number} {n.name} is over the limit of {policy.per_container} per container",
                    str(n.number),
                )
            )
    return out


def pod_gpu_totals(app: Iterable[ContainerGPUs], init: Iterable[ContainerGPUs]) -> dict[str, int]:
    """GPUs a pod holds at its peak, computed as the scheduler's resource helper does.

    App containers and restartable (sidecar) init containers run together; a plain init
    container runs alone beside the sidecars started before it; the pod needs the larger.
    """
    totals: dict[str, int] = {}
    for c in app:
        for name, n in c.counts.items():
            totals[name] = totals.get(name, 0) + n
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in init:
        for name, n in c.counts.items():
            if c.sidecar:
                totals[name] = totals.get(name, 0) + n
                sidecars[name] = sidecars.get(name, 0) + n
                peak = sidecars[name]
            else:
                peak = n + sidecars.get(name, 0)
            init_peak[name] = max(init_peak.get(name, 0), peak)
    for name, peak in init_peak.items():
        totals[name] = max(totals.get(name, 0), peak)
    return totals


@dataclass
class PodGPUs:
    """The GPU picture of one pod spec, shared by validation and mutation."""

    app: list[ContainerGPUs] = field(default_factory=list)
    init: list[ContainerGPUs] = field(default_factory=list)
    ephemeral: list[ContainerGPUs] = field(default_factory=list)
    ephemeral_paths: list[FieldPath] = field(default_factory=list)

    @property
    def uses_gpus(self) -> bool:
        # Naming a GPU resource is enough, even with a bad value: such a pod is no CPU pod.
        return any(c.named for c in (*self.app, *self.init, *self.ephemeral))

    def totals(self) -> dict[str, int]:
        return pod_gpu_totals(self.app, self.init)


def check_containers(ctx: PodContext, gpus: PodGPUs) -> list[Violation]:
    """Every container's resources, and the per-container rules of the other families, in one pass over the
    containers read once; fills ``gpus``."""
    out: list[Violation] = []
    policy = ctx.policy
    hidden = hides_gpus(policy, ctx.use)
    reads = runtime_reads(ctx.spec, policy, ctx.use)
    buckets = {"containers": gpus.app, "initContainers": gpus.init, "ephemeralContainers": gpus.ephemeral}
    for container, names in zip(ctx.containers, ctx.names, strict=True):
        list_name = container.list_name
        c = ContainerGPUs(sidecar=container.fields.get("restartPolicy") == "Always", slot=container.slot)
        out.extend(check_container(container, names, policy, c))
        if len(c.counts) > 1:  # whole GPUs and MIG slices: two names at least
            out.extend(check_mixed_gpu_and_mig(container.fields, container.path, set(c.counts), policy))
        out.extend(sharing.check_vendor_resources(container, names, policy, ctx.trusted))
        out.extend(check_container_isolation(container, names, ctx, hidden, reads))
        if list_name == "initContainers" and c.counts and not ctx.trusted:
            out.extend(check_init_container_gpus(container.path, c.counts, c.sidecar, policy))
        buckets[list_name].append(c)
        if list_name == "ephemeralContainers":
            gpus.ephemeral_paths.append(container.path)
    for where, c in zip(gpus.ephemeral_paths, gpus.ephemeral, strict=True):
        if c.counts:
            held = ", ".join(f"{n} {name}" for name, n in sorted(c.counts.items()))
            out.append(
                Violation(where.child("resources"), "ephemeral-gpu", "ephemeral containers may not use GPUs", held)
            )
    return out


def check_pod_level_resources(spec: Mapping[str, Any], path: FieldPath, policy: Policy) -> list[Violation]:
    """Pod-level ``spec.resources`` accepts no extended resources; a GPU there is a mistake."""
    out: list[Violation] = []
    resources = _mapping_at(spec, "resources", path, out)
    for kind in ("limits", "requests"):
        for name, raw in gpu_entries(_mapping_at(resources, kind, path.child("resources"), out), policy).items():
            out.append(
                Violation(
                    path.child("resources").child(kind).key(name),
                    "pod-level-gpu",
                    f"{name} cannot be set in pod-level resources; set it on a container",
                    about(raw),
                )
            )
    return out


def check_pod_limit(totals: Mapping[str, int], path: FieldPath, policy: Policy) -> list[Violation]:
    if not policy.per_pod:
        return []
    return [
        Violation(
            path, "per-pod-limit", f"pod asks for {n} {name}, over the limit of {policy.per_pod} per pod", f"{n} {name}"
        )
        for name, n in sorted(totals.items())
        if n > policy.per_pod
    ]


def accelerator_of(ref: PodSpecRef, policy: Policy, out: list[Violation]) -> tuple[str | None, str | None]:
    """(annotation value, nodeSelector value) of the pod's accelerator; odd shapes are reported."""
    annotations = _mapping_at(ref.metadata, "annotations", ref.metadata_path, out)
    node_selector = _mapping_at(ref.spec, "nodeSelector", ref.path, out)
    annotated = annotations.get(policy.annotation) or None  # an empty annotation asks for nothing
    selected = node_selector.get(policy.node_label)
    if annotated is not None and not isinstance(annotated, str):
        where = ref.metadata_path.child("annotations").key(policy.annotation)
        out.append(Violation(where, "structure", "must be a string", type(annotated).__name__))
        annotated = None
    if selected is not None and not isinstance(selected, str):
        where = ref.path.child("nodeSelector").key(policy.node_label)
        out.append(Violation(where, "structure", "must be a string", type(selected).__name__))
        selected = None
    return annotated, selected


def check_accelerator(ref: PodSpecRef, policy: Policy, annotated: str | None, selected: str | None) -> list[Violation]:
    out: list[Violation] = []
    annotation_path = ref.metadata_path.child("annotations").key(policy.annotation)
    selector_path = ref.path.child("nodeSelector").key(policy.node_label)
    for where, value in ((annotation_path, annotated), (selector_path, selected)):
        if value is not None and not policy.accelerator_allowed(value):
            out.append(
                Violation(
                    where,
                    "accelerator-not-allowed",
                    f"accelerator {quoted(value)} is not allowed here (allowed: {', '.join(policy.allowed)})",
                    value,
                )
            )
    if annotated is not None and selected is not None and annotated != selected:
        out.append(
            Violation(
                annotation_path,
                "accelerator-conflict",
                f"annotation {policy.annotation}={annotated} conflicts with "
                f"nodeSelector {policy.node_label}={selected}",
                f"{annotated} != {selected}",
            )
        )
    return out


def check_pod_spec(
    ref: PodSpecRef, policy: Policy, view: ClusterView | None = None, namespace: str = ""
) -> tuple[list[Violation], str | None]:
    """Violations of one pod spec, and the accelerator it names explicitly if it uses GPUs."""
    out: list[Violation] = []
    ctx = pod_context(ref, policy, view, namespace, read_containers(ref.spec, ref.path, out))
    gpus = PodGPUs()
    out.extend(check_containers(ctx, gpus))
    out.extend(check_pod_level_resources(ref.spec, ref.path, policy))
    out.extend(check_isolation(ctx))
    if not ctx.use.any:
        # The tenant rules' findings on a pod that asks for no GPU: decide() denies them in tenant namespaces only.
        out = [replace(v, no_gpu=True) if v.rule in TENANT_RULES else v for v in out]
    totals = gpus.totals()
    limit_counts = {c.slot: c.counts for c in (*gpus.app, *gpus.init)}
    found, claim_gpus = claims.pod_violations(ctx, limit_counts=limit_counts, pod_totals=totals,
                                              uses_gpus=gpus.uses_gpus)
    out.extend(found)
    if not gpus.uses_gpus and not claim_gpus:
        # A pod with claims may hold GPUs we cannot see; a time-sliced or HAMi pod is no CPU pod either,
        # though its names are not policy GPUs.
        claimed = isinstance(ref.spec.get("resourceClaims"), list) and bool(ref.spec["resourceClaims"])
        if not claimed and not ctx.use.any and not ctx.trusted:
            out.extend(check_cpu_pod_on_gpu_nodes(ref, policy))
        return out, None
    out.extend(check_pod_limit(totals, ref.path, policy))
    annotated, selected = accelerator_of(ref, policy, out)
    out.extend(check_accelerator(ref, policy, annotated, selected))
    explicit = annotated or selected
    if view is not None and policy.cluster_enabled and "nodes" in view.known:
        # The default is what mutation will inject, so the pod is judged as it will be scheduled.
        out.extend(check_cluster(ref.path, explicit or policy.default or None, totals, view.nodes, policy))
    return out, explicit


def violations(
    obj: Mapping[str, Any],
    group: str,
    kind: str,
    policy: Policy,
    view: ClusterView | None = None,
    namespace: str = "",
) -> list[Violation]:
    """Every GPU violation in every pod spec of ``obj``, and across its replicas; or, for a ResourceClaim,
    ResourceClaimTemplate or DeviceClass, in its device requests."""
    if draobjects.is_dra_object(group, kind):
        return draobjects.object_violations(obj, kind, policy, view, namespace)
    out: list[Violation] = []
    named: list[tuple[PodSpecRef, str]] = []
    read: set[int] = set()  # the pod specs and resource blocks the rules read, by identity
    for ref in find_pod_specs(obj, group, kind):
        read.add(id(ref.spec))
        found, accelerator = check_pod_spec(ref, policy, view, namespace)
        out.extend(found)
        if accelerator is not None:
            named.append((ref, accelerator))
    out.extend(check_resource_blocks(obj, group, kind, policy, read))
    out.extend(check_count_fields(obj, group, kind, policy))
    out.extend(check_replica_accelerators(named, group, kind, policy))
    out.extend(check_process_count(obj, group, kind, policy))
    out.extend(check_unchecked(obj, kind, policy, read))
    return out


def looks_into(obj: Mapping[str, Any], group: str, kind: str, policy: Policy) -> bool:
    """Whether the rules have something to read in ``obj``: a pod spec, a resource block, or device requests (a
    ResourceClaim, ResourceClaimTemplate or DeviceClass). A GPU quantity elsewhere is a finding of its own."""
    if draobjects.is_dra_object(group, kind):
        return True
    return any(True for _ in find_pod_specs(obj, group, kind)) or any(
        True for _ in resource_blocks(obj, group, kind, policy.kinds))


def check_resource_blocks(obj: Mapping[str, Any], group: str, kind: str, policy: Policy,
                          read: set[int]) -> list[Violation]:
    """The quantity and vendor-name rules on the resource blocks the registry of kinds names for this kind (an
    InferenceService's model, a NIMService's ``spec.resources``): what an operator copies into the containers of the
    pods it makes. Adds each block to ``read``."""
    out: list[Violation] = []
    for block in resource_blocks(obj, group, kind, policy.kinds):
        read.add(id(block.resources))
        names = resource_names(block, policy)
        out.extend(check_container(block, names, policy, ContainerGPUs()))
        out.extend(sharing.check_vendor_resources(block, names, policy, policy.trusted))
    return out


def check_count_fields(obj: Mapping[str, Any], group: str, kind: str, policy: Policy) -> list[Violation]:
    """A kind's GPU count fields (a VLLMRuntime's ``deploymentConfig.resources.gpu``, its resource in ``gpuType``):
    a whole count, within ``limits.perContainer``; the operator copies it into one container's requests and limits."""
    out: list[Violation] = []
    for where, value, name in count_fields(obj, group, kind):
        if not policy.is_gpu(name):
            continue
        try:
            number = gpu_count(value)
        except QuantityError as problem:
            out.append(Violation(where, "invalid-quantity", f"{kind} {name}: {problem}", about(value)))
            continue
        if policy.per_container and number > policy.per_container:
            out.append(Violation(where, "per-container-limit",
                                 f"{kind}: {number} {name} is over the limit of {policy.per_container} per container",
                                 str(number)))
    return out


# Kinds whose GPU quantities are the cluster's own record, not a request: never "not checked".
_RECORDS = frozenset({"Node"})
_MAX_DEPTH = 64


def _holds_gpus(name: object, policy: Policy) -> bool:
    if not isinstance(name, str) or "/" not in name:
        return False
    entry = registry.lookup(name)
    return policy.is_gpu(name) or (entry is not None and entry.kind.counts)


def check_unchecked(obj: Mapping[str, Any], kind: str, policy: Policy, read: set[int]) -> list[Violation]:
    """Every GPU quantity of ``obj`` (a GPU resource name with a value) outside what the rules read (``read``:
    pod specs and resource blocks, by identity), ``metadata`` and ``status``: a place no rule reads, so nothing
    was checked there."""
    if kind in _RECORDS or not policy.checks("unchecked-gpu"):
        return []
    out: list[Violation] = []

    def walk(node: object, path: FieldPath, depth: int) -> None:
        if depth > _MAX_DEPTH or id(node) in read:
            return
        if isinstance(node, Mapping):
            for key, value in node.items():
                if depth == 0 and key in ("metadata", "status"):
                    continue
                if isinstance(value, (Mapping, list)):
                    walk(value, path.child(str(key)), depth + 1)
                elif isinstance(value, (str, int, float)) and not isinstance(value, bool) and _holds_gpus(key, policy):
                    out.append(Violation(
                        path.key(key), "unchecked-gpu",
                        f"{about(value)} {key} is in a place no GPU rule reads, so it was not checked; if it reaches "
                        "a pod, name this kind's pod templates or resource blocks in nativePolicies.customKinds",
                        f"{key}={about(value)}",
                    ))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, path.index(i), depth + 1)

    walk(obj, ROOT, 0)
    return out
