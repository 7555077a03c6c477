"""The CEL that lists an object's pod templates, kind by kind, from the registry of kinds.

The webhook walks any object for mappings whose ``containers`` is a list (``webhook.core.podspecs``).
CEL cannot walk an unknown object, so each kind the policies match names its template paths in the one registry
of kinds (``webhook.core.kinds``: built-in kinds, the known custom kinds, ``nativePolicies.customKinds``). A
template path points at a pod template (``{metadata, spec}``); a bare pod spec there is taken too, as the
webhook's walk does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from webhook.core.kinds import BUILTIN_KINDS, KNOWN_KINDS, CustomKind, custom_kinds, path_problem, shape, wildcards
from webhook.native.celtext import lit, record
from webhook.native.snippets import guarded, stable_item

# --- CEL: the templates of an object -----------------------------------------------------------------------


def is_pod_spec(x: str) -> str:
    """``podspecs._is_pod_spec``: ``containers`` a non-empty list of mappings."""
    return (f"(type({x}) == map && 'containers' in {x} && type({x}.containers) == list && "
            f"size({x}.containers) > 0 && {x}.containers.all(container, type(container) == map))")


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
    path, stable, node = f"{n}.path", f"{n}.stable", f"{n}.node"
    template = _record(child(path, "spec"), child(stable, "spec"), child(path, "metadata"), f"{node}.spec",
                       guarded(node, "metadata", "map", "{}"))
    bare = _record(path, stable, child(path, "metadata"), node, "{}")
    return f"('spec' in {node} && {is_pod_spec(node + '.spec')} ? {template} : {bare})"


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
        k = f"key{depth}"
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
    i, item = f"index{depth}", f"item{depth}"
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
           "custom_templates", "is_pod_spec", "path_problem", "shape", "wildcards"]
