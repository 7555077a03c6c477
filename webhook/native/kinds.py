"""Where pod templates are, kind by kind, and the CEL that lists them.

The webhook walks any object for mappings whose ``containers`` is a list (``webhook.core.podspecs``).
CEL cannot walk an unknown object, so each kind the policies match names its template paths:

- built-in kinds: the paths ``webhook.core.podspecs`` knows (Pods: the object itself);
- known custom kinds (Kubeflow, Ray, JobSet, LeaderWorkerSet): :data:`KNOWN_KINDS`;
- more custom kinds from the policy: ``nativePolicies.customKinds``.

A template path is dot-separated field names, ``*`` for every value of a map (PyTorchJob's replica
types) and ``[*]`` after a name for every item of a list (RayCluster's worker groups). It points at a
pod template (``{metadata, spec}``); a bare pod spec there is taken too, as the webhook's walk does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.native.celtext import lit, lits, record
from webhook.native.snippets import guarded, stable_item


@dataclass(frozen=True)
class CustomKind:
    group: str
    resource: str  # the plural, as the apiserver serves it
    templates: tuple[str, ...]
    version: str = "*"
    kind: str = ""  # for the docs and stderr only; the policies match the resource

    @property
    def title(self) -> str:
        return f"{self.kind or self.resource}.{self.group}"


def _kubeflow(kind: str, resource: str, field: str, version: str = "*") -> CustomKind:
    return CustomKind("kubeflow.org", resource, (f"spec.{field}.*.template",), version, kind)


def _ray(kind: str, resource: str, cluster: str, extra: tuple[str, ...] = ()) -> CustomKind:
    prefix = f"spec.{cluster}." if cluster else "spec."
    return CustomKind("ray.io", resource, (f"{prefix}headGroupSpec.template", f"{prefix}workerGroupSpecs[*].template",
                                          *extra), "*", kind)


KNOWN_KINDS: tuple[CustomKind, ...] = (
    _kubeflow("PyTorchJob", "pytorchjobs", "pytorchReplicaSpecs"),
    _kubeflow("TFJob", "tfjobs", "tfReplicaSpecs"),
    _kubeflow("MPIJob", "mpijobs", "mpiReplicaSpecs"),
    _kubeflow("XGBoostJob", "xgboostjobs", "xgbReplicaSpecs"),
    _kubeflow("PaddleJob", "paddlejobs", "paddleReplicaSpecs"),
    _ray("RayCluster", "rayclusters", ""),
    _ray("RayJob", "rayjobs", "rayClusterSpec", ("spec.submitterPodTemplate",)),
    _ray("RayService", "rayservices", "rayClusterConfig"),
    CustomKind("jobset.x-k8s.io", "jobsets", ("spec.replicatedJobs[*].template.spec.template",), "*", "JobSet"),
    CustomKind("leaderworkerset.x-k8s.io", "leaderworkersets",
               ("spec.leaderWorkerTemplate.leaderTemplate", "spec.leaderWorkerTemplate.workerTemplate"), "*",
               "LeaderWorkerSet"),
)

# Built-in kinds: (group, kind, plural) -> template path; the Pod is its own template.
BUILTIN_KINDS: tuple[tuple[str, str, str, str], ...] = (
    ("", "Pod", "pods", ""),
    ("", "PodTemplate", "podtemplates", "template"),
    ("", "ReplicationController", "replicationcontrollers", "spec.template"),
    ("apps", "Deployment", "deployments", "spec.template"),
    ("apps", "ReplicaSet", "replicasets", "spec.template"),
    ("apps", "StatefulSet", "statefulsets", "spec.template"),
    ("apps", "DaemonSet", "daemonsets", "spec.template"),
    ("batch", "Job", "jobs", "spec.template"),
    ("batch", "CronJob", "cronjobs", "spec.jobTemplate.spec.template"),
)

_SEGMENT = re.compile(r"(?:[A-Za-z0-9_-]+(?:\[\*\])?|\*)")


def path_problem(path: object) -> str | None:
    """Why a template path cannot be used, or None."""
    if not isinstance(path, str) or not path:
        return "must be a non-empty string"
    segments = path.split(".")
    if not all(_SEGMENT.fullmatch(s) for s in segments):
        return (f"{path!r} is not a template path (field names separated by '.', '*' for every value of a map, "
                "'name[*]' for every item of a list)")
    if segments[0] == "*":
        return f"{path!r} must start with a field name"
    return None


def custom_kinds(document: Mapping[str, Any]) -> list[CustomKind]:
    """The known kinds and the policy's ``nativePolicies.customKinds`` (a kind given again replaces the known)."""
    extra = [
        CustomKind(entry["group"], entry["resource"], tuple(entry["templates"]), entry.get("version", "*"),
                   entry.get("kind", ""))
        for entry in (document.get("nativePolicies") or {}).get("customKinds", [])
    ]
    given = {(k.group, k.resource) for k in extra}
    return [k for k in KNOWN_KINDS if (k.group, k.resource) not in given] + extra


# --- CEL ---------------------------------------------------------------------------------------------------


def is_pod_spec(x: str) -> str:
    """``podspecs._is_pod_spec``: ``containers`` a non-empty list of mappings."""
    return (f"(type({x}) == map && 'containers' in {x} && type({x}.containers) == list && "
            f"size({x}.containers) > 0 && {x}.containers.all(c0, type(c0) == map))")


def shape(path: str) -> tuple[str, ...]:
    """The structure of a template path: ``field``, ``items`` (``name[*]``) or ``values`` (``*``) per segment."""
    if not path:
        return ()
    return tuple("values" if s == "*" else "items" if s.endswith("[*]") else "field" for s in path.split("."))


def field_names(path: str) -> list[str]:
    """The field names of a template path, in order (``*`` has none)."""
    return [s.removesuffix("[*]") for s in path.split(".") if s != "*"] if path else []


def _entries(root: str, segments: tuple[str, ...], names: str, depth: int = 0) -> str:
    """A CEL list of ``{p, sp, v}``: every node under ``root`` at a path of this shape whose field names are the
    CEL list ``names``, with its path and stable path. One text serves every path of a shape: the apiserver's
    compile time grew faster than the text with a comprehension chain per path of every kind (seconds)."""
    if not segments:
        return f"[{record(p=lit(''), sp=lit(''), v=root)}]"
    first = f"{names}[0]"
    start = f"[{record(p=first, sp=first, v=f'{root}[{first}]')}]"
    current = f"(type({root}) == map && {first} in {root} ? {start} : [])"
    field = 1
    if segments[0] == "items":
        current = _items(current, depth)
    for n, segment in enumerate(segments[1:], start=1):
        e = f"e{depth}_{n}"
        if segment == "values":
            k, x = f"k{depth}_{n}", f"x{depth}_{n}"
            value = record(p=e + ".p + '.' + " + k, sp=e + ".sp + '.' + " + k, v=x)
            current = (f"{current}.filter({e}, type({e}.v) == map).map({e}, {e}.v.transformList({k}, {x}, {value}))"
                       f".flatten()")
            continue
        name = f"{names}[{field}]"
        field += 1
        value = record(p=f"{e}.p + '.' + {name}", sp=f"{e}.sp + '.' + {name}", v=f"{e}.v[{name}]")
        current = f"{current}.filter({e}, type({e}.v) == map && {name} in {e}.v).map({e}, {value})"
        if segment == "items":
            current = _items(current, depth, n)
    return current


def _items(current: str, depth: int, n: int = 0) -> str:
    e, i, x = f"l{depth}_{n}", f"i{depth}_{n}", f"y{depth}_{n}"
    value = record(p=e + ".p + '[' + string(" + i + ") + ']'", sp=_stable(e, i, x), v=x)
    return f"{current}.filter({e}, type({e}.v) == list).map({e}, {e}.v.transformList({i}, {x}, {value})).flatten()"


def _stable(e: str, i: str, x: str) -> str:
    """``podspecs._walk``: list items known by ``name`` when it is a string, else by ``groupName``."""
    by_name = stable_item(f"{e}.sp", i, x, "name")
    by_group = stable_item(f"{e}.sp", i, x, "groupName")
    return f"(type({x}) == map && 'name' in {x} && type({x}.name) == string ? {by_name} : {by_group})"


def template_records(nodes: str, origin: str) -> str:
    """Template records ``{p, sp, mp, s, m, o}`` of the nodes that are pod templates (or bare pod specs)."""
    child = "(n.p == '' ? '' : n.p + '.')"
    stable_child = "(n.sp == '' ? '' : n.sp + '.')"
    template = record(p=child + " + 'spec'", sp=stable_child + " + 'spec'", mp=child + " + 'metadata'", s="n.v.spec",
                      m=guarded("n.v", "metadata", "map", "{}"), o=origin)
    bare = record(p="n.p", sp="n.sp", mp=child + " + 'metadata'", s="n.v", m="{}", o=origin)
    return (f"({nodes}).filter(n, type(n.v) == map).map(n, 'spec' in n.v && {is_pod_spec('n.v.spec')} ? [{template}] : "
            f"{is_pod_spec('n.v')} ? [{bare}] : []).flatten()")


def nodes(root: str, paths: Sequence[str]) -> str:
    """Every node at any of ``paths``, ``{p, sp, v}``; the empty path is the object itself."""
    return _by_shape(root, [(lit("*"), path) for path in paths], lit("*"))


def _by_shape(root: str, keyed: Sequence[tuple[str, str]], *keys: str) -> str:
    """The nodes at the paths of ``keyed`` ((key literal, path)) whose key is one of ``keys`` (CEL strings): per
    shape of path, a literal map from key to the field names of its paths of that shape, and one chain."""
    shapes: dict[tuple[str, ...], dict[str, list[list[str]]]] = {}
    for key, path in keyed:
        shapes.setdefault(shape(path), {}).setdefault(key, []).append(field_names(path))
    parts = []
    for depth, (segments, by_key) in enumerate(shapes.items()):
        table = "{" + ", ".join(f"{key}: [{', '.join(lits(n) for n in lists)}]" for key, lists in by_key.items()) + "}"
        names = f"N{depth}"
        found = f"[{', '.join(keys)}].map(key, {table}[?key].orValue([])).flatten()"
        parts.append(f"{found}.map({names}, {_entries(root, segments, names, depth)}).flatten()")
    return "(" + " + ".join(parts) + ")" if parts else "[]"


def dispatch(root: str, kinds: Sequence[CustomKind], builtin: bool = True) -> str:
    """The template nodes of the object ``root``: built-in kinds by ``request.kind``, custom kinds by
    ``request.resource`` (the variables ``kindkey`` and ``resourcekey``), through one table per path shape."""
    keyed: list[tuple[str, str]] = []
    if builtin:
        for group, kind, _, path in BUILTIN_KINDS:
            keyed.append((lit(f"kind:{group}/{kind}"), path))
    for k in kinds:
        for path in k.templates:
            keyed.append((lit(f"resource:{k.group}/{k.resource}"), path))
    return _by_shape(root, keyed, "variables.kindkey", "variables.resourcekey")


KIND_KEY = "'kind:' + request.kind.group + '/' + request.kind.kind"
RESOURCE_KEY = "'resource:' + request.resource.group + '/' + request.resource.resource"


def pod_template(root: str) -> str:
    """The Pod's own template node (for the MutatingAdmissionPolicy, which sees Pods only)."""
    return nodes(root, [""])


def is_custom(kinds: Sequence[CustomKind]) -> str:
    """The request is for one of the custom kinds (the quantity rules the apiserver leaves to us apply)."""
    if not kinds:
        return "false"
    return f"variables.resourcekey in {lits([f'resource:{k.group}/{k.resource}' for k in kinds])}"


__all__ = ["BUILTIN_KINDS", "KIND_KEY", "KNOWN_KINDS", "RESOURCE_KEY", "CustomKind", "custom_kinds", "dispatch",
           "is_custom", "nodes", "path_problem", "pod_template", "template_records"]
