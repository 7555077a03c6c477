"""DRA on a pod: the claims a pod spec references, resolved and counted through the cluster view.

Every rule has the shape ``check_x(thing, path, policy[, view]) -> list[Violation]`` and its own
``deny|warn|off`` setting (``dra.*`` for what the pod alone shows, ``cluster.*`` for what needs
the cluster view). Paths are the ones users write: ``spec.containers[0].resources.claims[0].name`` in a pod.

A pod names its claims (``spec.resourceClaims``) but their device requests live in other objects; the
cluster view (``webhook.core.clusterview``) holds those, so counting a pod's GPUs through claims, and the
checks built on it, need the view. Rules about the pod's own fields do not. The claims and templates
themselves, and DeviceClasses, are ``webhook.rules.draobjects``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.core.clusterindex import ClaimInfo, Request
from webhook.core.clusterview import IMPLICIT_PREFIX, ClusterView
from webhook.core.field import FieldPath, Violation
from webhook.core.podspecs import Container, as_list, as_mapping, read_containers
from webhook.core.policy import Policy
from webhook.core.quantity import quoted
from webhook.rules.context import PodContext
from webhook.rules.draobjects import exceeds_devices

CLAIM_CONTAINER_LISTS = ("containers", "initContainers")  # ephemeral containers may not use claims


@dataclass
class PodClaims:
    """A pod spec's claims, resolved through the cluster view where it can be."""

    declared: dict[str, int] = field(default_factory=dict)  # spec.resourceClaims[].name -> index
    sources: dict[str, ClaimInfo | None] = field(default_factory=dict)  # name -> claim or template, if known
    containers: tuple[Container, ...] = ()  # every container that may reference claims


def _source(entry: Mapping[str, Any], namespace: str, view: ClusterView | None) -> ClaimInfo | None:
    if view is None:
        return None
    if isinstance(entry.get("resourceClaimTemplateName"), str):
        return view.templates.get((namespace, entry["resourceClaimTemplateName"]))
    if isinstance(entry.get("resourceClaimName"), str):
        return view.claims.get((namespace, entry["resourceClaimName"]))
    return None


def pod_claims(
    spec: Mapping[str, Any], containers: tuple[Container, ...], namespace: str, view: ClusterView | None
) -> PodClaims:
    found = PodClaims(containers=tuple(c for c in containers if c.list_name in CLAIM_CONTAINER_LISTS))
    for i, entry in enumerate(as_list(spec.get("resourceClaims"))):
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            found.declared.setdefault(entry["name"], i)
            found.sources[entry["name"]] = _source(entry, namespace, view)
    return found


def _container_claims(container: Container) -> list[tuple[int, Mapping[str, Any]]]:
    return [(k, c) for k, c in enumerate(as_list(container.resources.get("claims"))) if isinstance(c, Mapping)]


def _requests_used(info: ClaimInfo, request: object) -> tuple[Request, ...]:
    if not isinstance(request, str) or not request:
        return info.requests
    top = request.split("/", 1)[0]
    return tuple(r for r in info.requests if r.name == top)


def gpu_class_of(request: Request, policy: Policy) -> str | None:
    return next((c for c in request.classes if policy.is_gpu_class(c)), None)


def resource_of(device_class: str, view: ClusterView | None) -> str:
    return view.resource_of_class(device_class) if view is not None else IMPLICIT_PREFIX + device_class


CLAIM_SOURCES = ("resourceClaimName", "resourceClaimTemplateName")


def moved_source(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (key, name) an entry still names under ``source:``, the form Kubernetes 1.31 removed (until 1.30
    ``source: {resourceClaimName: x}``, since then ``resourceClaimName: x`` in the entry itself), when exactly one
    of the two is a non-empty string there."""
    source = entry.get("source")
    if not isinstance(source, Mapping):
        return None
    named = [(k, source[k]) for k in CLAIM_SOURCES if isinstance(source.get(k), str) and source[k]]
    return named[0] if len(named) == 1 else None


def check_claim_sources(spec: Mapping[str, Any], path: FieldPath, policy: Policy) -> list[Violation]:
    """D2: each spec.resourceClaims[] entry names exactly one of resourceClaimName, resourceClaimTemplateName
    (one named only under the pre-1.31 ``source:`` is told to move up)."""
    if not policy.checks("claim-source"):
        return []
    out = []
    for i, entry in enumerate(as_list(spec.get("resourceClaims"))):
        if not isinstance(entry, Mapping):
            continue
        named = [k for k in CLAIM_SOURCES if entry.get(k)]
        moved = moved_source(entry) if not named else None
        if moved is not None:
            key, name = moved
            out.append(Violation(
                path.child("resourceClaims").item(i, "name", entry.get("name")), "claim-source",
                f"claim {quoted(entry.get('name'))} uses source:, the pre-1.31 form Kubernetes removed; move the "
                f"name up into the entry: {key}: {name}",
                "source",
            ))
        elif len(named) != 1:
            what = "both" if named else "neither"
            out.append(Violation(
                path.child("resourceClaims").item(i, "name", entry.get("name")), "claim-source",
                f"claim {quoted(entry.get('name'))} names {what} of resourceClaimName and resourceClaimTemplateName; "
                "exactly one is required",
                what,
            ))
    return out


def check_claim_references(claims: PodClaims, path: FieldPath, policy: Policy) -> list[Violation]:
    """D1: a container's resources.claims[].name that no spec.resourceClaims[] entry declares (the apiserver
    checks this for Pods and built-in templates, never inside custom resources); D3: a declared claim no
    container uses (its devices are allocated for nothing)."""
    out = []
    used: set[str] = set()
    for container in claims.containers:
        for k, ref in _container_claims(container):
            name = ref.get("name")
            if isinstance(name, str):
                used.add(name)
            if name not in claims.declared and policy.checks("undeclared-claim"):
                declared = ", ".join(claims.declared) or "none"
                out.append(Violation(
                    container.path.child("resources").child("claims").item(k, "name", name).child("name"),
                    "undeclared-claim",
                    f"claim {quoted(name)} is not declared in {path.child('resourceClaims')} (declared: {declared})",
                    str(name),
                ))
    if policy.checks("unused-claim"):
        for name, i in claims.declared.items():
            if name not in used:
                out.append(Violation(
                    path.child("resourceClaims").item(i, "name", name), "unused-claim",
                    f"claim {quoted(name)} is declared but no container uses it; its devices would be allocated "
                    "for nothing",
                    name,
                ))
    return out


def check_missing_sources(
    spec: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None, namespace: str
) -> list[Violation]:
    """D5: a ResourceClaim or ResourceClaimTemplate that does not exist in the pod's namespace."""
    if view is None or not policy.checks("missing-claim-source"):
        return []
    out = []
    for i, entry in enumerate(as_list(spec.get("resourceClaims"))):
        if not isinstance(entry, Mapping):
            continue
        for key, kind, known, index in (
            ("resourceClaimTemplateName", "ResourceClaimTemplate", "resourceclaimtemplates", view.templates),
            ("resourceClaimName", "ResourceClaim", "resourceclaims", view.claims),
        ):
            name = entry.get(key)
            if isinstance(name, str) and name and known in view.known and (namespace, name) not in index:
                out.append(Violation(
                    path.child("resourceClaims").item(i, "name", entry.get("name")).child(key),
                    "missing-claim-source",
                    f"{kind} {quoted(name)} does not exist in namespace {quoted(namespace)}; the pod stays "
                    "Pending until it does",
                    name,
                ))
    return out


def check_generated_claims(
    spec: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None, namespace: str
) -> list[Violation]:
    """D6: resourceClaimName naming a claim generated from a template for another pod: it lives and dies
    with that pod."""
    if view is None or not policy.checks("generated-claim-reference"):
        return []
    out = []
    for i, entry in enumerate(as_list(spec.get("resourceClaims"))):
        name = as_mapping(entry).get("resourceClaimName")
        info = view.claims.get((namespace, name)) if isinstance(name, str) else None
        if info is not None and info.generated:
            out.append(Violation(
                path.child("resourceClaims").item(i, "name", as_mapping(entry).get("name")).child("resourceClaimName"),
                "generated-claim-reference",
                f"ResourceClaim {quoted(name)} was generated from a template for another pod and is deleted with it; "
                "name the template, or a claim made for sharing",
                str(name),
            ))
    return out


def check_claim_requests(claims: PodClaims, path: FieldPath, policy: Policy) -> list[Violation]:
    """D4: a container's resources.claims[].request that the claim it names does not have."""
    if not policy.checks("unknown-claim-request"):
        return []
    out = []
    for container in claims.containers:
        for k, ref in _container_claims(container):
            info = claims.sources.get(str(ref.get("name")))
            request = ref.get("request")
            if info is None or not isinstance(request, str) or not request or _requests_used(info, request):
                continue
            names = ", ".join(r.name for r in info.requests) or "none"
            out.append(Violation(
                container.path.child("resources").child("claims").item(k, "name", ref.get("name")).child("request"),
                "unknown-claim-request",
                f"claim {quoted(ref.get('name'))} has no request {quoted(request)} (requests: {names})",
                request,
            ))
    return out


@dataclass
class ClaimGPUs:
    """GPUs a pod gets through claims, by extended resource name: per container, and for the pod once per
    claim request (a claim shared by several containers is allocated once)."""

    per_container: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    pod: dict[str, int] = field(default_factory=dict)
    per_class: dict[str, tuple[int, int]] = field(default_factory=dict)  # class -> (devices, resourceClaims index)
    # containers referencing a GPU claim: (list name, index) -> [(k of resources.claims[k], claim name, class)]
    gpu_refs: dict[tuple[str, int], list[tuple[int, str, str]]] = field(default_factory=dict)


def claim_gpus(claims: PodClaims, policy: Policy, view: ClusterView | None) -> ClaimGPUs:
    out = ClaimGPUs()
    for_pod: set[tuple[str, str]] = set()  # (claim, request) already counted for the pod
    for container in claims.containers:
        mine: dict[str, int] = {}
        for k, ref in _container_claims(container):
            name = str(ref.get("name"))
            info = claims.sources.get(name)
            if info is None:
                continue
            for request in _requests_used(info, ref.get("request")):
                device_class = gpu_class_of(request, policy)
                if device_class is not None:
                    out.gpu_refs.setdefault(container.slot, []).append((k, name, device_class))
                first = (name, request.name) not in for_pod
                for_pod.add((name, request.name))
                if request.all_devices:
                    continue  # no count: the allocation-mode rule speaks for it
                if first and len(request.classes) == 1:
                    before = out.per_class.get(request.classes[0], (0, claims.declared.get(name, 0)))
                    out.per_class[request.classes[0]] = (before[0] + request.count, before[1])
                if device_class is None:
                    continue
                resource = resource_of(device_class, view)
                mine[resource] = mine.get(resource, 0) + request.count
                if first:
                    out.pod[resource] = out.pod.get(resource, 0) + request.count
        if mine:
            out.per_container[container.slot] = mine
    return out


def check_claim_caps(
    claims: PodClaims, gpus: ClaimGPUs, limit_counts: Mapping[tuple[str, int], Mapping[str, int]],
    pod_totals: Mapping[str, int], path: FieldPath, policy: Policy,
) -> list[Violation]:
    """D9 caps: claims and extended resources add up; reported where the claims push a count over the cap."""
    out = []
    if policy.per_container:
        for container in claims.containers:
            through_claims = gpus.per_container.get(container.slot, {})
            limits = limit_counts.get(container.slot, {})
            for resource, n in sorted(through_claims.items()):
                total = n + limits.get(resource, 0)
                if total > policy.per_container >= limits.get(resource, 0):
                    out.append(Violation(
                        container.path.child("resources").child("claims"), "per-container-limit",
                        f"{container.label}: {total} {resource} ({n} through claims) is over "
                        f"the limit of {policy.per_container} per container",
                        str(total),
                    ))
    if policy.per_pod:
        for resource, n in sorted(gpus.pod.items()):
            total = n + pod_totals.get(resource, 0)
            if total > policy.per_pod >= pod_totals.get(resource, 0):
                out.append(Violation(
                    path, "per-pod-limit",
                    f"pod asks for {total} {resource} ({n} through claims), over the limit of {policy.per_pod} per pod",
                    f"{total} {resource}",
                ))
    return out


def check_pod_device_capacity(
    gpus: ClaimGPUs, path: FieldPath, policy: Policy, view: ClusterView | None
) -> list[Violation]:
    """D9 capacity: the devices of one class a pod's claims ask for, against the most on any node."""
    out = []
    for device_class, (count, index) in sorted(gpus.per_class.items()):
        out.extend(exceeds_devices(device_class, count, path.child("resourceClaims").index(index), policy, view))
    return out


def check_gpu_limit_and_claim(
    claims: PodClaims, gpus: ClaimGPUs, limit_counts: Mapping[tuple[str, int], Mapping[str, int]], policy: Policy
) -> list[Violation]:
    """D15: a container with a GPU in its limits that also references a claim on a GPU class gets both."""
    if not policy.checks("gpu-limit-and-claim"):
        return []
    out = []
    for container in claims.containers:
        limits = {r: n for r, n in limit_counts.get(container.slot, {}).items() if n}
        refs = gpus.gpu_refs.get(container.slot, [])
        if not limits or not refs:
            continue
        k, claim, device_class = refs[0]
        held = ", ".join(f"{n} {r}" for r, n in sorted(limits.items()))
        out.append(Violation(
            container.path.child("resources").child("claims").item(k, "name", claim), "gpu-limit-and-claim",
            f"{container.label} asks for {held} in limits and for class {device_class} "
            "through a claim: it would be given both",
            device_class,
        ))
    return out


def check_node_name(
    spec: Mapping[str, Any], path: FieldPath, policy: Policy, uses_gpus: bool
) -> list[Violation]:
    """D16: spec.nodeName skips the scheduler, which is what allocates claims and checks GPU capacity."""
    node = spec.get("nodeName")
    has_claims = bool(as_list(spec.get("resourceClaims")))
    if not isinstance(node, str) or not node or not (uses_gpus or has_claims):
        return []
    if not policy.checks("node-name-with-gpus"):
        return []
    lost = "its claims are never allocated" if has_claims else "no GPU capacity is checked"
    return [Violation(
        path.child("nodeName"), "node-name-with-gpus",
        f"nodeName {node} bypasses the scheduler, so {lost}; use nodeSelector kubernetes.io/hostname: {node}",
        node,
    )]


def pod_violations(
    ctx: PodContext, *, limit_counts: Mapping[tuple[str, int], Mapping[str, int]], pod_totals: Mapping[str, int],
    uses_gpus: bool,
) -> tuple[list[Violation], set[str]]:
    """Every DRA rule for one pod spec, and the GPU resources it gets through claims (empty when the claims
    cannot be resolved). ``limit_counts`` are the GPUs each container asks for in its resources, by
    (list, index), ``pod_totals`` the pod's, and ``uses_gpus`` whether it names a GPU resource at all, all from
    ``webhook.rules.pods``."""
    spec, path, policy, view, namespace = ctx.spec, ctx.path, ctx.policy, ctx.view, ctx.namespace
    out = [] if ctx.trusted else check_node_name(spec, path, policy, uses_gpus)
    if not as_list(spec.get("resourceClaims")) and not any(
        _container_claims(c) for c in ctx.containers if "claims" in c.resources and c.list_name in CLAIM_CONTAINER_LISTS
    ):
        return out, set()
    claims = pod_claims(spec, ctx.containers, namespace, view)
    gpus = claim_gpus(claims, policy, view)
    out += check_claim_sources(spec, path, policy)
    out += check_claim_references(claims, path, policy)
    out += check_missing_sources(spec, path, policy, view, namespace)
    out += check_generated_claims(spec, path, policy, view, namespace)
    out += check_claim_requests(claims, path, policy)
    out += check_claim_caps(claims, gpus, limit_counts, pod_totals, path, policy)
    out += check_pod_device_capacity(gpus, path, policy, view)
    out += check_gpu_limit_and_claim(claims, gpus, limit_counts, policy)
    resources = {r for mine in gpus.per_container.values() for r in mine}
    resources |= {resource_of(c, view) for refs in gpus.gpu_refs.values() for _, _, c in refs}
    return out, resources


def claim_gpu_resources(
    spec: Mapping[str, Any], namespace: str, policy: Policy, view: ClusterView | None
) -> set[str]:
    """Extended resource names of the GPUs a pod gets through claims (for mutation's selector and tolerations)."""
    if view is None or not as_list(spec.get("resourceClaims")):
        return set()
    gpus = claim_gpus(pod_claims(spec, read_containers(spec), namespace, view), policy, view)
    return {resource_of(c, view) for refs in gpus.gpu_refs.values() for _, _, c in refs}
