"""Find every pod spec inside an object, with the field path a user would write.

Built-in workload kinds are looked up by table (fast, and the path is exact). Any other
kind, custom resources included, is walked: a mapping whose ``containers`` is a list of
mappings is a pod spec. Built-in validation never looks inside custom resources, so this
walk is what lets a PyTorchJob or RayCluster template be checked at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from webhook.core.field import ROOT, FieldPath, Violation
from webhook.core.kinds import COUNT_FIELDS, CustomKind
from webhook.core.quantity import shown

# (API group, kind) -> keys from the object to its pod template (a mapping holding metadata and spec).
_TEMPLATE_KEYS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): (),
    ("", "PodTemplate"): ("template",),
    ("", "ReplicationController"): ("spec", "template"),
    ("apps", "Deployment"): ("spec", "template"),
    ("apps", "ReplicaSet"): ("spec", "template"),
    ("apps", "StatefulSet"): ("spec", "template"),
    ("apps", "DaemonSet"): ("spec", "template"),
    ("batch", "Job"): ("spec", "template"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}

_MAX_DEPTH = 64  # deeper than any real manifest; a bound so hostile input cannot recurse without end


@dataclass(frozen=True, slots=True)
class PodSpecRef:
    """A pod spec found in an object, its path, and the metadata that travels with it."""

    path: FieldPath
    spec: Mapping[str, Any]
    metadata_path: FieldPath
    metadata: Mapping[str, Any]


def as_mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else empty: objects from the wire may have any shape."""
    if type(value) is dict:  # what JSON and YAML give; the abstract check below costs several times more
        return value
    return value if value is not None and isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    """``value`` if it is a list, else empty."""
    return value if isinstance(value, list) else []


def _is_mapping(value: object) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def group_of(api_version: object) -> str:
    """``apps/v1`` -> ``apps``; ``v1`` -> the core group ``""``."""
    if not isinstance(api_version, str) or "/" not in api_version:
        return ""
    return api_version.split("/", 1)[0]


def container_label(container: Mapping[str, Any], path: FieldPath) -> str:
    """How a message names a container: ``container "main"``, or its path when it has no name."""
    name = container.get("name")
    return f"container {shown(name)}" if isinstance(name, str) and name else f"container {path}"


def affinity_keys(spec: Mapping[str, Any]) -> set[str]:
    """Label keys the pod's required node affinity matches on (in any of its terms)."""
    required = as_mapping(as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"))
    keys = set()
    for term in as_list(required.get("nodeSelectorTerms")):
        for expression in as_list(as_mapping(term).get("matchExpressions")):
            key = as_mapping(expression).get("key")
            if isinstance(key, str):
                keys.add(key)
    return keys


CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


class Container(NamedTuple):
    """One container of a pod spec, read once for every rule: where it is, and its resources as mappings
    (empty where the container has none, or has something else there). A tuple: built for every container
    of every request, it costs a fifth of a frozen dataclass."""

    list_name: str  # containers | initContainers | ephemeralContainers
    position: int  # in its list
    fields: Mapping[str, Any]  # the container as written
    list_path: FieldPath  # spec.containers
    resources: Mapping[str, Any]
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]
    # A resource block's own path (``spec.predictor.model.resources``): a container's resources outside any pod spec
    at: FieldPath | None = None

    @property
    def slot(self) -> tuple[str, int]:
        return (self.list_name, self.position)

    @property
    def path(self) -> FieldPath:
        """Known by name (``spec.containers[name=main]``), so that a container inserted before this one
        changes no violation's subject. Built when asked: most containers never need it."""
        if self.at is not None:
            return self.at
        return self.list_path.item(self.position, "name", self.fields.get("name"))

    @property
    def resources_path(self) -> FieldPath:
        """Where its ``limits`` and ``requests`` are: ``…containers[name=main].resources``, or the block's path."""
        return self.at if self.at is not None else self.path.child("resources")

    @property
    def label(self) -> str:
        if self.at is not None:
            return "the resource block"
        return container_label(self.fields, self.path)


def read_containers(
    spec: Mapping[str, Any], path: FieldPath = ROOT, problems: list[Violation] | None = None
) -> tuple[Container, ...]:
    """Every container mapping of a pod spec, in order, each read once. Odd shapes (a list that is not one,
    an item that is no mapping, no ``containers`` list at all) are skipped, and told in ``problems`` when
    it is given."""
    found: list[Container] = []
    for list_name in CONTAINER_LISTS:
        items = spec.get(list_name)
        if not isinstance(items, list):
            # A pod spec needs its containers; the other two lists may be absent.
            if problems is not None and (items is not None or list_name == "containers"):
                problems.append(Violation(path.child(list_name), "structure", "must be a list of containers"))
            continue
        list_path = path.child(list_name)
        for i, container in enumerate(items):
            if not _is_mapping(container):
                if problems is not None:
                    problems.append(Violation(list_path.index(i), "structure", "must be a container mapping"))
                continue
            resources = as_mapping(container.get("resources"))
            found.append(Container(
                list_name, i, container, list_path,
                resources, as_mapping(resources.get("limits")), as_mapping(resources.get("requests")),
            ))
    return tuple(found)


def is_builtin(group: str, kind: str) -> bool:
    return (group, kind) in _TEMPLATE_KEYS


def find_pod_specs(obj: Mapping[str, Any], group: str, kind: str) -> Iterator[PodSpecRef]:
    keys = _TEMPLATE_KEYS.get((group, kind))
    if keys is None:
        yield from _walk(obj, ROOT, 0)
        return
    template: object = obj
    path = ROOT
    for key in keys:
        if not isinstance(template, Mapping):
            return
        template = template.get(key)
        path = path.child(key)
    if isinstance(template, Mapping) and isinstance(template.get("spec"), Mapping):
        yield _ref(template, path)


def _ref(template: Mapping[str, Any], path: FieldPath) -> PodSpecRef:
    return PodSpecRef(
        path=path.child("spec"),
        spec=template["spec"],
        metadata_path=path.child("metadata"),
        metadata=as_mapping(template.get("metadata")),
    )


def _is_pod_spec(value: Mapping[str, Any]) -> bool:
    containers = value.get("containers")
    return isinstance(containers, list) and bool(containers) and all(isinstance(c, Mapping) for c in containers)


def _walk(node: object, path: FieldPath, depth: int) -> Iterator[PodSpecRef]:
    """Yield pod specs under ``node``; a spec found is not searched further (pods do not nest)."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, Mapping):
        spec = node.get("spec")
        if isinstance(spec, Mapping) and _is_pod_spec(spec):
            # The usual template shape {metadata, spec}: the metadata carries the annotations.
            yield _ref(node, path)
        elif _is_pod_spec(node):
            yield PodSpecRef(path=path, spec=node, metadata_path=path.child("metadata"), metadata={})
            return
        for key, value in node.items():
            if key == "spec" and value is spec and isinstance(spec, Mapping) and _is_pod_spec(spec):
                continue
            if isinstance(value, (Mapping, list)) and isinstance(key, str):
                yield from _walk(value, path.child(key), depth + 1)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            if isinstance(item, Mapping):
                # Items known by name (a RayCluster's worker groups) keep their violations' subjects when
                # an update inserts an item before them; the path shown is still by index.
                by = "name" if isinstance(item.get("name"), str) else "groupName"
                yield from _walk(item, path.item(i, by, item.get(by)), depth + 1)
            elif isinstance(item, list):
                yield from _walk(item, path.index(i), depth + 1)


def _follow(node: object, path: FieldPath, segments: list[str]) -> Iterator[tuple[FieldPath, Mapping[str, Any]]]:
    """The mappings at a registry path (``spec.predictor.*.resources``, ``values[*].spec``) under ``node``."""
    if not segments:
        if isinstance(node, Mapping):
            yield path, node
        return
    if not isinstance(node, Mapping):
        return
    head, rest = segments[0], segments[1:]
    if head == "*":
        for key, value in node.items():
            if isinstance(key, str):
                yield from _follow(value, path.child(key), rest)
    elif head.endswith("[*]"):
        name = head[:-3]
        for i, item in enumerate(as_list(node.get(name))):
            by = "name" if isinstance(as_mapping(item).get("name"), str) else "groupName"
            yield from _follow(item, path.child(name).item(i, by, as_mapping(item).get(by)), rest)
    else:
        yield from _follow(node.get(head), path.child(head), rest)


def resource_blocks(obj: Mapping[str, Any], group: str, kind: str,
                    kinds: tuple[CustomKind, ...]) -> Iterator[Container]:
    """The resource blocks of ``obj`` that its kind's registry entry names, each read as a container's resources
    (``Container.at``: the mapping that holds it, so a violation's path is the block's own)."""
    for entry in kinds:
        if not entry.blocks or entry.group != group or entry.kind != kind:
            continue
        for block_path in entry.blocks:
            *holder, last = block_path.split(".")
            for at, holds in _follow(obj, ROOT, holder):
                resources = holds.get(last)
                if not isinstance(resources, Mapping):
                    continue
                yield Container("containers", 0, holds, at, resources, as_mapping(resources.get("limits")),
                                as_mapping(resources.get("requests")), at.child(last))


def count_fields(obj: Mapping[str, Any], group: str, kind: str) -> Iterator[tuple[FieldPath, Any, str]]:
    """A kind's GPU count fields (``kinds.COUNT_FIELDS``): (path of the count, its value, the GPU resource it
    counts)."""
    entry = COUNT_FIELDS.get((group, kind))
    if entry is None:
        return
    block_path, count_key, name_key, default_name = entry
    for at, holds in _follow(obj, ROOT, block_path.split(".")):
        if count_key not in holds or holds[count_key] in (None, ""):
            continue
        name = holds.get(name_key)
        yield at.child(count_key), holds[count_key], name if isinstance(name, str) and name else default_name
