"""Find every pod spec inside an object, with the field path a user would write.

Built-in workload kinds are looked up by table (fast, and the path is exact). Any other
kind, custom resources included, is walked: a mapping whose ``containers`` is a list of
mappings is a pod spec. Built-in validation never looks inside custom resources, so this
walk is what lets a PyTorchJob or RayCluster template be checked at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.field import ROOT, FieldPath

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
    return value if isinstance(value, Mapping) else {}


def group_of(api_version: object) -> str:
    """``apps/v1`` -> ``apps``; ``v1`` -> the core group ``""``."""
    if not isinstance(api_version, str) or "/" not in api_version:
        return ""
    return api_version.split("/", 1)[0]


CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def raw_containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(list name, index, container) of every container mapping in a pod spec; odd shapes are skipped here
    (the rules in ``rules`` report them once)."""
    for list_name in CONTAINER_LISTS:
        items = spec.get(list_name)
        if isinstance(items, list):
            for i, container in enumerate(items):
                if isinstance(container, Mapping):
                    yield list_name, i, container


def container_path(path: FieldPath, list_name: str, index: int, container: Mapping[str, Any]) -> FieldPath:
    """The path of a container, known by name (built only where a violation needs it)."""
    return path.child(list_name).item(index, "name", container.get("name"))


def containers(
    spec: Mapping[str, Any], path: FieldPath = ROOT
) -> Iterator[tuple[str, int, FieldPath, Mapping[str, Any]]]:
    """(list name, index, path, container) of every container mapping in a pod spec, items known by name."""
    for list_name, i, container in raw_containers(spec):
        yield list_name, i, container_path(path, list_name, i, container), container


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
