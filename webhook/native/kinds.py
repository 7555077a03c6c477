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

from webhook.native.celtext import lit, record
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


# --- CEL: the templates of an object -----------------------------------------------------------------------


def is_pod_spec(x: str) -> str:
    """``podspecs._is_pod_spec``: ``containers`` a non-empty list of mappings."""
    return (f"(type({x}) == map && 'containers' in {x} && type({x}.containers) == list && "
            f"size({x}.containers) > 0 && {x}.containers.all(c0, type(c0) == map))")


def shape(path: str) -> tuple[str, ...]:
    """The structure of a template path: ``field``, ``items`` (``name[*]``) or ``values`` (``*``) per segment."""
    if not path:
        return ()
    return tuple("values" if s == "*" else "items" if s.endswith("[*]") else "field" for s in path.split("."))


def wildcards(kind: CustomKind) -> int:
    """The most wildcards (``*``, ``[*]``) in one of the kind's template paths."""
    return max(sum(1 for s in shape(p) if s != "field") for p in kind.templates)


def _record(path: str, stable: str, meta_path: str, spec: str, meta: str) -> str:
    return record(path=path, stable=stable, metaPath=meta_path, spec=spec, meta=meta)


def _node_record(n: str, path: str, stable: str) -> str:
    """The template record of node ``n`` at ``path``: a pod template (``{metadata, spec}``), or a bare pod spec."""
    template = _record(f"{path} + '.spec'", f"{stable} + '.spec'", f"{path} + '.metadata'", f"{n}.spec",
                       guarded(n, "metadata", "map", "{}"))
    bare = _record(path, stable, f"{path} + '.metadata'", n, "{}")
    return f"('spec' in {n} && {is_pod_spec(n + '.spec')} ? {template} : {bare})"


def _is_node(n: str) -> str:
    return f"({n} != null && (('spec' in {n} && {is_pod_spec(n + '.spec')}) || {is_pod_spec(n)}))"


def _fields(x: str, names: list[str]) -> str:
    """``x.a.b``: the map at those fields, or null."""
    for name in names:
        x = f"[{x}].map(w, type(w) == map && {lit(name)} in w && type(w[{lit(name)}]) == map ? w[{lit(name)}] : null)[0]"
    return x


def _list_stable(prefix: str, i: str, x: str) -> str:
    """``podspecs._walk``: list items known by ``name`` when it is a string, else by ``groupName``."""
    by_name = stable_item(prefix, i, x, "name")
    by_group = stable_item(prefix, i, x, "groupName")
    return f"(type({x}) == map && 'name' in {x} && type({x}.name) == string ? {by_name} : {by_group})"


def _walk(x: str, path: str, stable: str, segments: list[str], depth: int, two_variable: bool) -> str:
    """The template records under ``x`` (whose path so far is the CEL string ``path``) along ``segments``."""
    fixed: list[str] = []
    while segments and segments[0] != "*" and not segments[0].endswith("[*]"):
        fixed.append(segments.pop(0))
    node = _fields(x, fixed[:-1]) if fixed else x
    here = path + (" + " + lit("." + ".".join(fixed)) if fixed and path != "''" else
                   " + " + lit(".".join(fixed)) if fixed else "")
    here = lit(".".join(fixed)) if path == "''" and fixed else here
    stable_here = here if stable == path else (stable + (" + " + lit("." + ".".join(fixed)) if fixed else ""))
    if not segments:
        target = f"[{node}].map(w, type(w) == map && {lit(fixed[-1])} in w ? w[{lit(fixed[-1])}] : null)[0]" \
            if fixed else node
        n = f"n{depth}"
        return f"[{target}].filter({n}, {_is_node(n)}).map({n}, {_node_record(n, here, stable_here)})"
    wildcard = segments.pop(0)
    if fixed:
        parent = f"[{node}].map(w, type(w) == map && {lit(fixed[-1])} in w ? w[{lit(fixed[-1])}] : null)[0]"
    else:
        parent = node
    if wildcard.endswith("[*]"):
        name = wildcard[:-3]
        parent = f"[{parent}].map(w, type(w) == map && {lit(name)} in w && type(w[{lit(name)}]) == list ? " \
                 f"w[{lit(name)}] : [])[0]"
        prefix = (f"{here} + {lit('.' + name)}" if here != "''" else lit(name))
        stable_prefix = (f"{stable_here} + {lit('.' + name)}" if stable_here != "''" else lit(name))
        i, item = f"i{depth}", f"x{depth}"
        item_path = f"{prefix} + '[' + string({i}) + ']'"
        item_stable = _list_stable(stable_prefix, i, item)
        inner = _walk(item, item_path, item_stable, segments, depth + 1, two_variable)
        if two_variable:
            return f"{parent}.transformList({i}, {item}, {inner}).flatten()" if False else \
                _items(parent, i, item, inner, two_variable)
        return _items(parent, i, item, inner, two_variable)
    k = f"k{depth}"
    parent = f"[{parent}].map(w, type(w) == map ? w : {{}})[0]"
    key_path = f"{here} + '.' + {k}" if here != "''" else k
    key_stable = f"{stable_here} + '.' + {k}" if stable_here != "''" else k
    inner = _walk(f"{parent}[{k}]", key_path, key_stable, segments, depth + 1, two_variable)
    return _flat(f"{parent}.map({k}, {inner})")


_FLATTEN = "flatten"


def _items(parent: str, i: str, item: str, inner: str, two_variable: bool) -> str:
    if two_variable:
        return _flat(f"{parent}.transformList({i}, {item}, {inner})")
    return _flat(f"{parent}.map({item}, [{parent}.indexOf({item})].map({i}, {inner})[0])")


def _flat(nested: str) -> str:
    """A list of lists made one list. Only here: a path with one wildcard is walked without it (see nodes)."""
    return f"{nested}.{_FLATTEN}()"


def nodes(root: str, path: str, two_variable: bool) -> str:
    """The template records at ``path`` under ``root``: ``{path, stable, metaPath, spec, meta}``."""
    text = _walk(root, "''", "''", path.split("."), 0, two_variable)
    if wildcards(CustomKind("", "", (path,))) <= 1:
        # One wildcard: its inner walk yields at most one record per item; filter instead of flatten.
        text = _single(text)
    return text


def _single(text: str) -> str:
    """Rewrite ``X.map(v, [n].filter(...).map(...)).flatten()`` for a one-wildcard path so it needs no flatten:
    keep the items whose list is not empty, then take each one's record."""
    if not text.endswith(".flatten()"):
        return text
    body = text[: -len(".flatten()")]
    return f"{body}.filter(r0, size(r0) > 0).map(r0, r0[0])"


def custom_templates(root: str, kinds: Sequence[CustomKind], two_variable: bool) -> str:
    """The custom kinds' template records of ``root`` (``object`` or ``oldObject``), chosen by ``variables.kind``
    (``group/resource``)."""
    expression = "[]"
    for k in reversed(kinds):
        parts = " + ".join(nodes(root, path, two_variable) for path in k.templates)
        expression = f"variables.kind == {lit(k.group + '/' + k.resource)} ? ({parts}) :\n{expression}"
    return expression


def builtin_templates(root: str) -> str:
    """The template record of a Pod or a built-in workload (``root``: ``object`` or ``oldObject``)."""
    def one(template: str, at: str) -> str:
        spec, meta = f"{template}.spec", f"{template}.?metadata.orValue({{}})"
        rec = _record(lit(at + ".spec"), lit(at + ".spec"), lit(at + ".metadata"), spec, meta)
        return f"({template.replace('.', '.?', 1) if False else _present(template)} ? [{rec}] : [])"
    branches = [
        ("Pod", f"[{_record(lit('spec'), lit('spec'), lit('metadata'), root + '.spec', root + '.metadata')}]"),
        ("PodTemplate", one(f"{root}.template", "template")),
        ("CronJob", one(f"{root}.spec.jobTemplate.spec.template", "spec.jobTemplate.spec.template")),
    ]
    expression = one(f"{root}.spec.template", "spec.template")
    for kind, text in reversed(branches):
        expression = f"request.kind.kind == {lit(kind)} ? {text} :\n{expression}"
    return expression


def _present(template: str) -> str:
    """``has()`` of every step of a dotted field path below the root."""
    root, *fields = template.split(".")
    return root + "".join(f".?{f}" for f in fields) + ".?spec.hasValue()"


KIND = "request.resource.group + '/' + request.resource.resource"


__all__ = ["BUILTIN_KINDS", "KIND", "KNOWN_KINDS", "CustomKind", "builtin_templates", "custom_kinds",
           "custom_templates", "is_pod_spec", "path_problem", "wildcards"]
