"""``gpu-webhook check``: the webhook's validation, offline, for manifests in a CI pipeline.

Each object goes through ``admission.decide``, the very function behind ``/validate``,
so a manifest that passes here is admitted by the server with the same policy.

Input is refused document by document: a broken document is reported by file and number and
the others are still checked. YAML documents are loaded with libyaml when PyYAML has it, and a
document whose aliases would expand past a bound is refused before it is built. JSON (``*.json`` files,
and any input that starts as a JSON object does) is read by orjson, as strictly as kubectl reads it.
An AdmissionReview is decided as ``/validate`` decides it: its ``request.object``, in its namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson
import yaml

from webhook.cli import formats
from webhook.cli.formats import Checked, FileReport, Finding, Tally
from webhook.core.cluster import KIND_OF, ClusterState, ClusterView
from webhook.core.podspecs import as_mapping, group_of
from webhook.core.policy import PolicySet, yaml_error_line
from webhook.rules.admission import CHECKED_OPERATIONS, decide, object_name, validate

EXIT_ADMITTED, EXIT_DENIED, EXIT_UNREADABLE = formats.EXIT_CLEAN, formats.EXIT_FINDINGS, formats.EXIT_UNREADABLE
# What --cluster-state reads, and the command that saves all of it: the claims and templates too, or a pod's
# missing claim template is never found missing (a kind the files lack is not judged missing).
CLUSTER_STATE_KINDS = "nodes,resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates,runtimeclasses"
SAVE_CLUSTER_STATE = f"kubectl get {CLUSTER_STATE_KINDS} -A -o yaml"
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
    line: int = 1  # the file's line where the document starts, 1-based


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


# A parser error on one line, its marks counted from the start of the file.
yaml_problem = yaml_error_line


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
    line = node.start_mark.line + first_line + 1
    if problem is not None:
        return Document(number, problem=problem, line=line)
    try:
        return Document(number, loader.construct_document(node), line=line)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # A value the constructor refuses (a timestamp 2024-13-45, an int too long to convert):
        # reset the constructor so the next document starts clean.
        loader.constructed_objects, loader.recursive_objects, loader.state_generators = {}, {}, []
        loader.deep_construct = False
        reason = yaml_problem(exc, first_line) if isinstance(exc, yaml.YAMLError) else str(exc) or type(exc).__name__
        return Document(number, problem=f"not valid YAML: {' '.join(reason.split())}", line=line)


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each part of ``text`` that starts at a document marker ``---``."""
    starts = [0] + [m.start() for m in _DOCUMENT_START.finditer(text) if m.start() > 0] + [len(text)]
    line = 0
    for start, end in zip(starts, starts[1:], strict=False):
        yield line, text[start:end]
        line += text.count("\n", start, end)


def load(text: str) -> list[Document]:
    """Every document in a YAML stream; one broken document does not hide the others."""
    documents, broken = _stream(text, 0, 0)
    if not broken:
        return documents
    # A syntax error ends a YAML stream: parse again piece by piece, each from its own "---".
    documents = []
    for first_line, piece in _pieces(text):
        documents.extend(_stream(piece, first_line, len(documents))[0])
    return documents


# ---------------------------------------------------------------------------------------------- JSON

# kubectl reads input as JSON when it starts as JSON; so do we: an object ({"... or {}) or an array. A YAML
# flow mapping ({kind: Pod}) starts with an unquoted key and stays YAML.
_JSON_START = re.compile(r'[ \t\r\n]*(?:\{[ \t\r\n]*["}]|\[)')
_SPACE = re.compile(r"[ \t\r\n]*")


def is_json(text: str, source: str = "") -> bool:
    """Whether ``text`` is read as JSON: a ``*.json`` file, or input that starts as JSON does."""
    return source.endswith(".json") or _JSON_START.match(text.removeprefix("\ufeff")) is not None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a float64")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# Strict as RFC 8259 and kubectl: no NaN or Infinity, no number beyond a float64 (the standard library takes both).
_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)
# A \uD800-\uDFFF escape: the standard library decodes a lone one into a string nothing can print.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _json_problem(text: str, start: int, exc: Exception) -> str:
    """Why the value at ``start`` is not JSON, in orjson's words where it has them, with the line and column in
    the file."""
    at, reason = (exc.pos, exc.msg) if isinstance(exc, json.JSONDecodeError) else (start, str(exc))
    if isinstance(exc, RecursionError):
        reason = "nested too deeply"
    try:
        orjson.loads(text[start:])
    except orjson.JSONDecodeError as strict:
        if not isinstance(exc, json.JSONDecodeError) or start + strict.pos <= exc.pos:
            at, reason = start + strict.pos, strict.msg
    at = min(at, len(text))
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return f"invalid JSON: {reason} (line {line}, column {column})"


def load_json(text: str) -> list[Document]:
    """The JSON values in ``text``: one, or several one after the other as kubectl reads a JSON stream.

    As strict as kubectl: a trailing comma, a comment, NaN or a number beyond a float64 is refused, and a broken
    value ends the stream, as a syntax error ends a YAML stream. The standard library's decoder builds the values:
    on a 38 MB ``List`` it peaks at two thirds of orjson's memory (orjson holds its own parse tree beside the
    objects) for 20% more time. orjson, which refuses the same input, words the errors and vets escaped
    surrogates.
    """
    text = text.removeprefix("\ufeff")
    surrogates = _SURROGATE_ESCAPE.search(text) is not None
    documents: list[Document] = []
    line, counted = 1, 0
    start = _SPACE.match(text).end()  # type: ignore[union-attr]  # the pattern matches the empty string
    while start < len(text):
        line, counted = line + text.count("\n", counted, start), start
        number = len(documents) + 1
        try:
            value, end = _DECODER.raw_decode(text, start)
            if surrogates and _SURROGATE_ESCAPE.search(text, start, end):
                orjson.loads(text[start:end])  # a lone surrogate is refused; a pair is a character
        except (ValueError, RecursionError) as exc:
            documents.append(Document(number, problem=_json_problem(text, start, exc), line=line))
            return documents
        documents.append(Document(number, value, line=line))
        start = _SPACE.match(text, end).end()  # type: ignore[union-attr]
    return documents


def load_any(text: str, source: str = "") -> list[Document]:
    """The documents of one input, read as JSON or as YAML (:func:`is_json`)."""
    return load_json(text) if is_json(text, source) else load(text)


# ------------------------------------------------------------------------------------------- objects

# A namespace is a DNS label (RFC 1123), as the apiserver and the policy's namespace keys hold it.
NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
NAMESPACE_RULE = "lowercase letters, digits and '-', at most 63"


def namespace_arg(text: str) -> str:
    """``--namespace`` for argparse: a namespace name, or a one-line error."""
    if not NAMESPACE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name ({NAMESPACE_RULE})")
    return text


def namespace_problem(obj: Mapping[str, Any]) -> str | None:
    """What is wrong with an object's ``metadata.namespace``, which kubectl and the apiserver would refuse."""
    namespace = as_mapping(obj.get("metadata")).get("namespace")
    if namespace is None or namespace == "":
        return None
    if not isinstance(namespace, str):
        kind = "a boolean" if isinstance(namespace, bool) else (
            "a number" if isinstance(namespace, (int, float)) else f"a {type(namespace).__name__}")
        shown = json.dumps(namespace, default=str)
        return f"metadata.namespace: {shown} is {kind}, not a namespace name (quote it)"
    if not NAMESPACE.fullmatch(namespace):
        return f"metadata.namespace: {json.dumps(namespace)} is not a namespace name ({NAMESPACE_RULE})"
    return None


@dataclass(frozen=True)
class Item:
    """One object to decide on: a manifest, or the AdmissionReview ``request`` it arrived in."""

    obj: Mapping[str, Any]
    line: int = 1  # the file's line where its document starts
    request: Mapping[str, Any] | None = None  # set for an AdmissionReview: decided as /validate decides it



@dataclass
class Manifest:
    """What one file holds: its Kubernetes objects and, one line each, what could not be read."""

    source: str
    items: list[Item] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def objects(self) -> list[Mapping[str, Any]]:
        return [item.obj for item in self.items]


def _is_object(value: object) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("kind"), str) and bool(value["kind"])


def _expand(
    value: Mapping[str, Any], prefix: str, trail: str, line: int, found: list[Item], problems: list[str]
) -> None:
    """Add ``value`` to ``found``, or the items of a ``List``, recursively but only so deep.

    ``trail`` numbers the item (``item 2.1`` is the first item of the List that is item 2).
    """
    items = value.get("items")
    where = f"{prefix}item {trail}: " if trail else prefix
    if str(value["kind"]).endswith("List") and isinstance(items, list):
        if trail and trail.count(".") + 1 >= MAX_LIST_DEPTH:
            problems.append(f"{where}Lists nested more than {MAX_LIST_DEPTH} deep")
            return
        for number, item in enumerate(items, 1):
            label = f"{trail}.{number}" if trail else str(number)
            if _is_object(item):
                _expand(item, prefix, label, line, found, problems)
            else:
                problems.append(f"{prefix}item {label} is not a Kubernetes object (no kind)")
    elif value["kind"] == "AdmissionReview" and group_of(value.get("apiVersion")) == "admission.k8s.io":
        request = value.get("request")
        operation = as_mapping(request).get("operation")
        if not isinstance(request, Mapping):
            problems.append(f"{where}AdmissionReview without a request")
        elif operation in CHECKED_OPERATIONS and not isinstance(request.get("object"), Mapping):
            problems.append(f"{where}AdmissionReview of a {operation} without request.object")
        else:
            found.append(Item(as_mapping(request.get("object")), line, request))
    else:
        problem = namespace_problem(value)
        if problem:
            problems.append(f"{where}{problem}")
        else:
            found.append(Item(value, line))


def items_of(documents: list[Document]) -> tuple[list[Item], list[str]]:
    """The Kubernetes objects in a file's documents (``List`` kinds expanded, AdmissionReviews opened), and the
    problems found."""
    found: list[Item] = []
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
            prefix = f"document {document.number}: " if several else ""
            _expand(document.value, prefix, "", document.line, found, problems)
    return found, problems


def objects_of(documents: list[Document]) -> tuple[list[Mapping[str, Any]], list[str]]:
    """:func:`items_of`, the objects alone."""
    found, problems = items_of(documents)
    return [item.obj for item in found], problems


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
    manifest = Manifest(formats.STDIN if path == "-" else path)
    try:
        text = _read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        manifest.problems.append(f"cannot read: {exc}")
        return manifest
    manifest.items, manifest.problems = items_of(load_any(text, "" if path == "-" else path))
    if not manifest.items and not manifest.problems:
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
    """Saved objects (``kubectl get -A -o yaml`` of :data:`CLUSTER_STATE_KINDS`) for the cluster view. Without a
    Node among them every GPU pod would be refused for want of one: an error."""
    objects: list[Mapping[str, Any]] = []
    problems: list[str] = []
    for path in paths:
        for manifest in read_manifests(path):
            problems.extend(f"{manifest.source}: {p}" for p in manifest.problems)
            objects.extend(manifest.objects)
    if problems:
        raise UnreadableInput("; ".join(problems))
    if not any(o.get("kind") == "Node" for o in objects):
        raise UnreadableInput(f"{', '.join(paths)}: no Node objects (save them with {SAVE_CLUSTER_STATE})")
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


def _identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = as_mapping(obj.get("metadata"))
    name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
    namespace = metadata.get("namespace")
    return str(name), namespace if isinstance(namespace, str) else ""


def judge(item: Item, source: str, policies: PolicySet, namespace: str, view: ClusterView | None = None) -> Checked:
    """One object and its violations, each with the action the decision took on it: ``admission.decide`` for a
    manifest (in its namespace, else ``namespace``), ``admission.validate`` for an AdmissionReview."""
    obj = item.obj
    if item.request is not None:
        request = item.request
        requested = as_mapping(request.get("kind"))
        kind = str(requested.get("kind") or obj.get("kind") or "AdmissionReview")
        name = object_name(request, obj)
        target = request.get("namespace") or _identity(obj)[1]
        target = target if isinstance(target, str) else ""
        answer = validate(request, policies, view)
    else:
        kind = str(obj["kind"])
        name, own_namespace = _identity(obj)
        target = own_namespace or namespace
        answer = decide(obj, group_of(obj.get("apiVersion")), kind, target, policies, view)
    found = tuple(
        Finding(source, kind, name, target, str(v.path), v.rule, action, v.message, item.line)
        for v, action in answer.judged()
    )
    return Checked(kind, name, target, item.line, found)


def findings(
    obj: Mapping[str, Any], source: str, policies: PolicySet, namespace: str, view: ClusterView | None = None
) -> list[Finding]:
    """The violations of one object, each with the action ``admission.decide`` took on it."""
    return list(judge(Item(obj), source, policies, namespace, view).findings)


def check_objects(
    objects: list[Mapping[str, Any]],
    source: str,
    policies: PolicySet,
    namespace: str,
    view: ClusterView | None = None,
) -> Iterator[tuple[bool, str]]:
    """(denied?, line) for every violation, in the ``FILE: Kind namespace/name: path: message`` form."""
    for obj in objects:
        for finding in findings(obj, source, policies, namespace, view):
            yield finding.action == "deny", finding.text()


def run(
    paths: list[str],
    policies: PolicySet,
    namespace: str = "default",
    out: TextIO | None = None,
    output: str = "text",
    recursive: bool = False,
    err: TextIO | None = None,
    cluster_state: list[Mapping[str, Any]] | None = None,
    fail_on: str = "deny",
) -> int:
    """Check every file; write what was found on ``out`` in the ``output`` format (:mod:`webhook.cli.formats`),
    each input problem and a summary on ``err``. ``cluster_state`` holds Nodes, ResourceSlices, DeviceClasses,
    ... (from :func:`read_cluster_state`) for the cluster-aware checks. The exit code: 2 when an input could not
    be read, else 1 when a violation is denied (or with ``fail_on="warning"``, warned about), else 0."""
    out, err = out or sys.stdout, err or sys.stderr
    node_label = policies.default.node_label
    tally = Tally()
    writer = formats.writer(output, out, fail_on)
    for path in paths:
        for manifest in read_manifests(path, recursive):
            for problem in manifest.problems:
                print(f"{manifest.source}: {problem}", file=err)
            tally.problems += len(manifest.problems)
            view: ClusterView | None
            if cluster_state is not None:
                objects = [_with_namespace(o, namespace) for o in manifest.objects]
                view = cluster_view(cluster_state, node_label, objects)
            else:
                view = manifest_view(manifest.objects, namespace, node_label)
            report = FileReport(manifest.source, manifest.problems)
            for item in manifest.items:
                checked = judge(item, manifest.source, policies, namespace, view)
                tally.add(checked)
                report.objects.append(checked)
            writer.add(report)
    status = tally.status(fail_on)
    writer.finish(tally, status)
    print(tally, file=err)
    return status
