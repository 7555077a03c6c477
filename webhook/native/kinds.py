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

from webhook.core.podspecs import RAY_CLUSTER_SPECS
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


def _ray(kind: str, resource: str, extra: tuple[str, ...] = ()) -> CustomKind:
    """A Ray kind: the head's and the worker groups' templates in its RayCluster spec, where
    ``webhook.core.podspecs.RAY_CLUSTER_SPECS`` says the kind keeps it."""
    cluster = ".".join(RAY_CLUSTER_SPECS[("ray.io", kind)])
    templates = (f"{cluster}.headGroupSpec.template", f"{cluster}.workerGroupSpecs[*].template", *extra)
    return CustomKind("ray.io", resource, templates, "*", kind)


KNOWN_KINDS: tuple[CustomKind, ...] = (
    _kubeflow("PyTorchJob", "pytorchjobs", "pytorchReplicaSpecs"),
    _kubeflow("TFJob", "tfjobs", "tfReplicaSpecs"),
    _kubeflow("MPIJob", "mpijobs", "mpiReplicaSpecs"),
    _kubeflow("XGBoostJob", "xgboostjobs", "xgbReplicaSpecs"),
    _kubeflow("PaddleJob", "paddlejobs", "paddleReplicaSpecs"),
    _ray("RayCluster", "rayclusters"),
    _ray("RayJob", "rayjobs", ("spec.submitterPodTemplate",)),
    _ray("RayService", "rayservices"),
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


def _select(x: str, name: str) -> str:
    return f"{x}.{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"{x}[{lit(name)}]"


def _guarded(x: str, names: Sequence[str], kind: str) -> tuple[str, str]:
    """(the condition that ``x.a.b`` exists and is a ``kind``, ``x.a.b``): every step a map holding the next name."""
    tests = []
    for name in names:
        tests.append(f"type({x}) == map && {lit(name)} in {x}")
        x = _select(x, name)
    tests.append(f"type({x}) == {kind}")
    return " && ".join(tests), x


def is_node(n: str) -> str:
    """A pod template (``{metadata, spec}`` with a pod spec) or a bare pod spec (``webhook.core.podspecs``)."""
    return f"(type({n}) == map && (('spec' in {n} && {is_pod_spec(n + '.spec')}) || {is_pod_spec(n)}))"


def node_record(n: str) -> str:
    """The template record of the node record ``n`` (``{path, stable, node}``): a pod template or a bare pod spec."""
    def child(p: str, name: str) -> str:
        return f"({p} == '' ? {lit(name)} : {p} + {lit('.' + name)})"
    template = _record(child("n.path", "spec"), child("n.stable", "spec"), child("n.path", "metadata"), "n.node.spec",
                       guarded("n.node", "metadata", "map", "{}"))
    bare = _record("n.path", "n.stable", child("n.path", "metadata"), "n.node", "{}")
    return f"('spec' in n.node && {is_pod_spec('n.node.spec')} ? {template} : {bare})".replace("n.", f"{n}.")


def _list_stable(prefix: str, i: str, x: str) -> str:
    """``podspecs._walk``: list items known by ``name`` when it is a string, else by ``groupName``."""
    by_name = stable_item(prefix, i, x, "name")
    by_group = stable_item(prefix, i, x, "groupName")
    return f"(type({x}) == map && 'name' in {x} && type({x}.name) == string ? {by_name} : {by_group})"


def _join(path: str, text: str) -> str:
    """The CEL string ``path`` followed by the literal ``text`` (``path`` empty: ``text`` without its dot)."""
    if path == "''":
        return lit(text.removeprefix("."))
    return f"{path} + {lit(text)}"


def _candidate(path: str, stable: str, node: str) -> str:
    return record(path=path, stable=stable, node=node)


def _walk(x: str, path: str, stable: str, segments: list[str], depth: int, two_variable: bool) -> str:
    """The candidate nodes ``{path, stable, node}`` under ``x`` (whose path so far is the CEL string ``path``) along
    ``segments``, as a list; a node that is no pod template is dropped later (``templates``). One wildcard is one
    comprehension; a second needs flatten."""
    fixed: list[str] = []
    while segments and segments[0] != "*" and not segments[0].endswith("[*]"):
        fixed.append(segments.pop(0))
    suffix = "".join("." + f for f in fixed)
    if not segments:
        cond, node = _guarded(x, fixed, "map")
        return f"({cond} ? [{_candidate(_join(path, suffix), _join(stable, suffix), node)}] : [])"
    wildcard = segments.pop(0)
    last = not any(s == "*" or s.endswith("[*]") for s in segments)
    if wildcard == "*":
        cond, values = _guarded(x, fixed, "map")
        k = f"k{depth}"
        here = f"{_join(path, suffix)} + '.' + {k}" if (path, suffix) != ("''", "") else k
        stable_here = f"{_join(stable, suffix)} + '.' + {k}" if (stable, suffix) != ("''", "") else k
        item = f"{values}[{k}]"
        if last:
            leaf_cond, node = _guarded(item, segments, "map")
            tail = "." + ".".join(segments)
            found = _candidate(_join(here, tail) if segments else here,
                               _join(stable_here, tail) if segments else stable_here, node)
            return f"({cond} ? {values}.filter({k}, {leaf_cond}).map({k}, {found}) : [])"
        inner = _walk(item, here, stable_here, segments, depth + 1, two_variable)
        return f"({cond} ? {values}.map({k}, {inner}).flatten() : [])"
    name = wildcard[:-3]
    cond, values = _guarded(x, [*fixed, name], "list")
    i, item = f"i{depth}", f"x{depth}"
    here = f"{_join(path, suffix + '.' + name)} + '[' + string({i}) + ']'"
    stable_here = _list_stable(_join(stable, suffix + "." + name), i, item)
    if last:
        leaf_cond, node = _guarded(item, segments, "map")
        tail = "." + ".".join(segments)
        found = _candidate(_join(here, tail) if segments else here,
                           f"{stable_here} + {lit(tail)}" if segments else stable_here, node)
        if two_variable:
            return f"({cond} ? {values}.transformList({i}, {item}, {leaf_cond}, {found}) : [])"
        return (f"({cond} ? {values}.filter({item}, {leaf_cond}).map({item}, "
                f"[{values}.indexOf({item})].map({i}, {found})[0]) : [])")
    inner = _walk(item, here, stable_here, segments, depth + 1, two_variable)
    if two_variable:
        return f"({cond} ? {values}.transformList({i}, {item}, {inner}).flatten() : [])"
    return f"({cond} ? {values}.map({item}, [{values}.indexOf({item})].map({i}, {inner})[0]).flatten() : [])"


def nodes(root: str, path: str, two_variable: bool) -> str:
    """The candidate nodes at ``path`` under ``root``: ``{path, stable, node}``."""
    return _walk(root, "''", "''", path.split("."), 0, two_variable)


def custom_templates(root: str, kinds: Sequence[CustomKind], two_variable: bool) -> str:
    """The custom kinds' template records of ``root`` (``object`` or ``oldObject``), chosen by
    ``variables.group_resource`` (``group/resource``)."""
    expression = "[]"
    for k in reversed(kinds):
        parts = " + ".join(nodes(root, path, two_variable) for path in k.templates)
        expression = f"variables.group_resource == {lit(k.group + '/' + k.resource)} ? {parts} :\n{expression}"
    return expression


def builtin_templates(root: str) -> str:
    """The candidate node of a Pod or a built-in workload (``root``: ``object`` or ``oldObject``): the Pod itself, or
    its template."""
    def one(at: str) -> str:
        node = f"{root}.{at}"
        return f"({_present(node)} ? [{_candidate(lit(at), lit(at), node)}] : [])"
    branches = [
        ("Pod", f"[{_candidate(lit(''), lit(''), root)}]"),
        ("PodTemplate", one("template")),
        ("CronJob", one("spec.jobTemplate.spec.template")),
    ]
    expression = one("spec.template")
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
