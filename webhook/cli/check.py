"""``gpu-webhook check``: the webhook's validation, offline, for manifests in a CI pipeline.

Each object goes through ``admission.decide``, the very function behind ``/validate``,
so a manifest that passes here is admitted by the server with the same policy.

Input is refused document by document: a broken document is reported by file and number and
the others are still checked. Documents are loaded with libyaml when PyYAML has it, and a
document whose aliases would expand past a bound is refused before it is built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from webhook.core.cluster import KIND_OF, ClusterState, ClusterView
from webhook.core.podspecs import as_mapping, group_of
from webhook.core.policy import PolicySet
from webhook.rules.admission import decide

EXIT_ADMITTED, EXIT_DENIED, EXIT_UNREADABLE = 0, 1, 2
SUFFIXES = (".yaml", ".yml", ".json")  # what kubectl -f reads from a directory
MAX_LIST_DEPTH = 8  # Lists inside Lists are expanded this deep
# With its aliases expanded, a document may have this many nodes, or twice its own, whichever is more:
# enough for anchors shared by a few containers, and a bound on what an alias bomb makes the rules walk.
ALIAS_NODE_FLOOR = 10_000

_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LIBYAML = _SafeLoader is not yaml.SafeLoader


class UnreadableInput(ValueError):
    pass


# ---------------------------------------------------------------------------------------------- YAML


def expansion(root: yaml.Node) -> tuple[int, int] | None:
    """(nodes, nodes with every alias expanded) under ``root``; None if an alias contains itself.

    Aliases are shared nodes, so this is one pass over the distinct collections, however far they
    expand; scalars count once per place they appear.
    """
    sizes: dict[int, int] = {}  # id of a collection -> its size expanded
    open_nodes: set[int] = set()  # the current node's ancestors
    nodes = 0
    stack: list[tuple[yaml.Node, list[yaml.Node] | None]] = [(root, None)]
    while stack:
        node, children = stack.pop()
        key = id(node)
        if children is not None:  # every child is done
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
        elif key in open_nodes:
            return None
        elif key not in sizes:
            nodes += 1
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                sizes[key] = 1
                continue
            open_nodes.add(key)
            stack.append((node, children))
            for child in children:
                if isinstance(child, yaml.ScalarNode):
                    nodes += 1
                else:
                    stack.append((child, None))
    return nodes, sizes[id(root)]


def alias_problem(root: yaml.Node) -> str | None:
    counted = expansion(root)
    if counted is None:
        return "a YAML alias refers to itself"
    distinct, expanded = counted
    limit = max(ALIAS_NODE_FLOOR, 2 * distinct)
    if expanded > limit:
        return f"too many YAML aliases ({distinct} nodes expand to {expanded}, more than {limit})"
    return None


@dataclass(frozen=True)
class Document:
    """One YAML document of a file: its value, or why it could not be loaded."""

    number: int  # 1-based, counting every document of the file
    value: object = None
    problem: str = ""


_DOCUMENT_START = re.compile(r"^---(?=[ \t\r\n]|$)", re.MULTILINE)
# An anchor (&a) or alias (*a) is a token, so it follows a line start, a space or an indicator.
_ANCHOR = re.compile(r"&[^\s\[\]{},]")
_ALIAS = re.compile(r"\*[^\s\[\]{},]")
_TOKEN_STARTS = frozenset(" \t\r\n[{,:?-\ufeff")


def _has_token(text: str, pattern: re.Pattern[str]) -> bool:
    return any(m.start() == 0 or text[m.start() - 1] in _TOKEN_STARTS for m in pattern.finditer(text))


def may_alias(text: str) -> bool:
    """False when ``text`` surely has no alias, so most files skip the alias count."""
    return _has_token(text, _ALIAS) and _has_token(text, _ANCHOR)


def _mark(mark: Any, first_line: int) -> str:
    return f"line {mark.line + first_line + 1}, column {mark.column + 1}"


def yaml_problem(exc: yaml.YAMLError, first_line: int = 0) -> str:
    """A parser error on one line, its marks counted from the start of the file."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())
    parts = []
    if exc.context:
        where = f" ({_mark(exc.context_mark, first_line)})" if exc.context_mark else ""
        parts.append(f"{exc.context}{where}")
    if exc.problem:
        where = f" ({_mark(exc.problem_mark, first_line)})" if exc.problem_mark else ""
        parts.append(f"{exc.problem}{where}")
    return " ".join(": ".join(parts).split())


def _stream(text: str, first_line: int, before: int) -> tuple[list[Document], bool]:
    """The documents of one YAML stream, numbered after ``before``, and whether a syntax error cut it short."""
    loader = _SafeLoader(text)
    aliases = may_alias(text)
    out: list[Document] = []
    try:
        while True:
            number = before + len(out) + 1
            try:
                node = loader.get_node() if loader.check_node() else None
            except yaml.YAMLError as exc:
                out.append(Document(number, problem=f"not valid YAML: {yaml_problem(exc, first_line)}"))
                return out, True
            except RecursionError:
                out.append(Document(number, problem="not valid YAML: nested too deeply"))
                return out, True
            if node is None:
                return out, False
            out.append(_build(loader, node, number, aliases, first_line))
    finally:
        loader.dispose()


def _build(loader: Any, node: yaml.Node, number: int, aliases: bool, first_line: int) -> Document:
    """The document's value, unless its aliases expand too far or the constructor refuses a value."""
    problem = alias_problem(node) if aliases else None
    if problem is not None:
        return Document(number, problem=problem)
    try:
        return Document(number, loader.construct_document(node))
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # A value the constructor refuses (a timestamp 2024-13-45, an int too long to convert):
        # reset the constructor so the next document starts clean.
        loader.constructed_objects, loader.recursive_objects, loader.state_generators = {}, {}, []
        loader.deep_construct = False
        reason = yaml_problem(exc, first_line) if isinstance(exc, yaml.YAMLError) else str(exc) or type(exc).__name__
        return Document(number, problem=f"not valid YAML: {' '.join(reason.split())}")


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each part of ``text`` that starts at a document marker ``---``."""
    starts = [0] + [m.start() for m in _DOCUMENT_START.finditer(text) if m.start() > 0] + [len(text)]
    line = 0
    for start, end in zip(starts, starts[1:], strict=False):
        yield line, text[start:end]
        line += text.count("\n", start, end)


def load(text: str) -> list[Document]:
    """Every document in a YAML or JSON stream; one broken document does not hide the others."""
    documents, broken = _stream(text, 0, 0)
    if not broken:
        return documents
    # A syntax error ends a YAML stream: parse again piece by piece, each from its own "---".
    documents = []
    for first_line, piece in _pieces(text):
        documents.extend(_stream(piece, first_line, len(documents))[0])
    return documents


# ------------------------------------------------------------------------------------------- objects


@dataclass
class Manifest:
    """What one file holds: its Kubernetes objects and, one line each, what could not be read."""

    source: str
    objects: list[Mapping[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _is_object(value: object) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("kind"), str) and bool(value["kind"])


def _expand(
    value: Mapping[str, Any], prefix: str, trail: str, objects: list[Mapping[str, Any]], problems: list[str]
) -> None:
    """Add ``value`` to ``objects``, or the items of a ``List``, recursively but only so deep.

    ``trail`` numbers the item (``item 2.1`` is the first item of the List that is item 2).
    """
    items = value.get("items")
    if not (str(value["kind"]).endswith("List") and isinstance(items, list)):
        objects.append(value)
        return
    if trail and trail.count(".") + 1 >= MAX_LIST_DEPTH:
        problems.append(f"{prefix}item {trail}: Lists nested more than {MAX_LIST_DEPTH} deep")
        return
    for number, item in enumerate(items, 1):
        label = f"{trail}.{number}" if trail else str(number)
        if _is_object(item):
            _expand(item, prefix, label, objects, problems)
        else:
            problems.append(f"{prefix}item {label} is not a Kubernetes object (no kind)")


def objects_of(documents: list[Document]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The Kubernetes objects in a file's documents (``List`` kinds expanded), and the problems found."""
    objects: list[Mapping[str, Any]] = []
    problems: list[str] = []
    several = len(documents) > 1
    for document in documents:
        if document.problem:
            problems.append(f"document {document.number}: {document.problem}")
        elif document.value is None:
            continue  # an empty document, as between two "---"
        elif not _is_object(document.value):
            problems.append(f"document {document.number} is not a Kubernetes object (no kind)")
        else:
            assert isinstance(document.value, Mapping)
            _expand(document.value, f"document {document.number}: " if several else "", "", objects, problems)
    return objects, problems


def manifest_files(directory: Path, recursive: bool) -> Iterator[Path]:
    """``*.yaml``, ``*.yml`` and ``*.json`` in ``directory`` by name, and in its subdirectories if recursive."""
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_dir():
            if recursive and not entry.is_symlink():
                yield from manifest_files(Path(entry.path), recursive)
        elif entry.name.endswith(SUFFIXES):
            yield Path(entry.path)


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    return Path(path).read_text(encoding="utf-8")


def read_manifest(path: str) -> Manifest:
    """The objects of one file (``-`` is stdin); a file with none is a problem."""
    manifest = Manifest("<stdin>" if path == "-" else path)
    try:
        text = _read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        manifest.problems.append(f"cannot read: {exc}")
        return manifest
    manifest.objects, manifest.problems = objects_of(load(text))
    if not manifest.objects and not manifest.problems:
        manifest.problems.append("no Kubernetes objects")
    return manifest


def read_manifests(path: str, recursive: bool = False) -> list[Manifest]:
    """One manifest per file: ``path`` itself, or the manifest files of a directory (as ``kubectl -f``)."""
    if path == "-" or not os.path.isdir(path):
        return [read_manifest(path)]
    try:
        files = list(manifest_files(Path(path), recursive))
    except OSError as exc:
        return [Manifest(path, problems=[f"cannot read: {exc}"])]
    if not files:
        return [Manifest(path, problems=[f"no {', '.join('*' + s for s in SUFFIXES)} files"])]
    return [read_manifest(str(f)) for f in files]


def read_cluster_state(paths: list[str]) -> list[Mapping[str, Any]]:
    """Saved objects (``kubectl get nodes,resourceslices,deviceclasses,runtimeclasses -o yaml``) for the
    cluster view. Without a Node among them every GPU pod would be refused for want of one: an error."""
    objects: list[Mapping[str, Any]] = []
    problems: list[str] = []
    for path in paths:
        for manifest in read_manifests(path):
            problems.extend(f"{manifest.source}: {p}" for p in manifest.problems)
            objects.extend(manifest.objects)
    if problems:
        raise UnreadableInput("; ".join(problems))
    if not any(o.get("kind") == "Node" for o in objects):
        raise UnreadableInput(
            f"{', '.join(paths)}: no Node objects (save them with kubectl get nodes,resourceslices,deviceclasses,"
            "runtimeclasses -o yaml)"
        )
    return objects


def cluster_view(
    state: Sequence[Mapping[str, Any]], node_label: str, manifests: Sequence[Mapping[str, Any]] = ()
) -> ClusterView:
    """A cluster view from saved objects, for the cluster-aware checks offline. ResourceClaims and
    ResourceClaimTemplates among the manifests being checked join it, so pods are judged with the claims
    they come with."""
    objects = list(state)
    # The state files say which kinds are complete; claims beside the pods only help resolve them.
    known = {KIND_OF[str(o.get("kind"))] for o in objects if o.get("kind") in KIND_OF}
    objects.extend(o for o in manifests if o.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"))
    cluster = ClusterState(node_label)
    cluster.load(objects, known)
    view = cluster.view()
    assert view is not None
    return view


def manifest_view(objects: list[Mapping[str, Any]], namespace: str, node_label: str) -> ClusterView | None:
    """Without --cluster-state: the claims and templates in the checked files, so a pod and the template it
    names, checked together, are judged together. None when the files hold none."""
    found = [o for o in objects if o.get("kind") in ("ResourceClaim", "ResourceClaimTemplate")]
    if not found:
        return None
    return cluster_view([], node_label, [_with_namespace(o, namespace) for o in found])


def _with_namespace(obj: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    metadata = as_mapping(obj.get("metadata"))
    if metadata.get("namespace"):
        return obj
    return {**obj, "metadata": {**metadata, "namespace": namespace}}


def with_cluster_checks(policies: PolicySet) -> PolicySet:
    """``policies`` with the cluster-aware checks on everywhere (``--nodes`` asks for them)."""
    document = {**policies.document, "cluster": {**policies.document["cluster"], "enabled": True}}
    return PolicySet(
        default=dataclasses.replace(policies.default, cluster_enabled=True),
        by_namespace={ns: dataclasses.replace(p, cluster_enabled=True) for ns, p in policies.by_namespace.items()},
        document=document,
    )


# ---------------------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Finding:
    """One violation of one object, as ``check`` reports it."""

    file: str
    kind: str
    name: str
    namespace: str
    path: str
    rule: str
    action: str  # deny or warn
    message: str

    def line(self) -> str:
        note = "" if self.action == "deny" else "warning: "
        return f"{self.file}: {self.kind}/{self.name}: {self.path}: {note}{self.message}"

    def json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def _identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = as_mapping(obj.get("metadata"))
    name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
    namespace = metadata.get("namespace")
    return str(name), namespace if isinstance(namespace, str) else ""


def findings(
    obj: Mapping[str, Any], source: str, policies: PolicySet, namespace: str, view: ClusterView | None = None
) -> list[Finding]:
    """The violations of one object, each with the action ``admission.decide`` took on it."""
    kind = str(obj["kind"])
    name, own_namespace = _identity(obj)
    target = own_namespace or namespace
    answer = decide(obj, group_of(obj.get("apiVersion")), kind, target, policies, view)
    return [
        Finding(source, kind, name, target, str(v.path), v.rule, action, v.message) for v, action in answer.judged()
    ]


def check_objects(
    objects: list[Mapping[str, Any]],
    source: str,
    policies: PolicySet,
    namespace: str,
    view: ClusterView | None = None,
) -> Iterator[tuple[bool, str]]:
    """(denied?, line) for every violation, in the ``FILE: Kind/name: path: message`` form."""
    for obj in objects:
        for finding in findings(obj, source, policies, namespace, view):
            yield finding.action == "deny", finding.line()


@dataclass
class Tally:
    objects: int = 0
    denied: int = 0
    warned: int = 0

    def add(self, found: list[Finding]) -> None:
        self.objects += 1
        if any(f.action == "deny" for f in found):
            self.denied += 1
        elif found:
            self.warned += 1

    def __str__(self) -> str:
        objects = f"{self.objects} object{'' if self.objects == 1 else 's'}"
        return f"{objects} checked, {self.denied} denied, {self.warned} warned"


def run(
    paths: list[str],
    policies: PolicySet,
    namespace: str = "default",
    out: TextIO | None = None,
    output: str = "text",
    recursive: bool = False,
    err: TextIO | None = None,
    cluster_state: list[Mapping[str, Any]] | None = None,
) -> int:
    """Check every file; print each violation (text or JSON lines) on ``out``, problems and a summary on ``err``.
    ``cluster_state`` holds Nodes, ResourceSlices, DeviceClasses, ... (from :func:`read_cluster_state`) for the
    cluster-aware checks."""
    out, err = out or sys.stdout, err or sys.stderr
    node_label = policies.default.node_label
    status = EXIT_ADMITTED
    tally = Tally()
    for path in paths:
        for manifest in read_manifests(path, recursive):
            for problem in manifest.problems:
                print(f"{manifest.source}: {problem}", file=err)
                status = EXIT_UNREADABLE
            view: ClusterView | None
            if cluster_state is not None:
                objects = [_with_namespace(o, namespace) for o in manifest.objects]
                view = cluster_view(cluster_state, node_label, objects)
            else:
                view = manifest_view(manifest.objects, namespace, node_label)
            for obj in manifest.objects:
                found = findings(obj, manifest.source, policies, namespace, view)
                tally.add(found)
                for finding in found:
                    print(finding.json() if output == "json" else finding.line(), file=out)
                    if finding.action == "deny" and status == EXIT_ADMITTED:
                        status = EXIT_DENIED
    print(tally, file=err)
    return status
