"""The inputs of `check`: files, directories and stdin, their objects (Lists expanded), the saved cluster state."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from webhook.core.cluster import KIND_OF, ClusterState
from webhook.core.clusterview import ClusterView
from webhook.core.podspecs import as_mapping, group_of
from webhook.manifests.jsonstream import JSON_CHUNK, JsonInput, is_json
from webhook.manifests.parts import NotUtf8, Part, UnreadableInput
from webhook.manifests.positions import Locator, steps
from webhook.manifests.yamlstream import looks_like_object, yaml_parts
from webhook.rules.admission import CHECKED_OPERATIONS

STDIN = "<stdin>"  # the source name of standard input
# What --cluster-state reads, and the command that saves all of it: the claims and templates too, or a pod's
# missing claim template is never found missing (a kind the files lack is not judged missing).
CLUSTER_STATE_KINDS = "nodes,resourceslices,deviceclasses,resourceclaims,resourceclaimtemplates,runtimeclasses"
SAVE_CLUSTER_STATE = f"kubectl get {CLUSTER_STATE_KINDS} -A -o yaml"
SUFFIXES = (".yaml", ".yml", ".json")  # what kubectl -f reads from a directory
MAX_LIST_DEPTH = 8  # Lists inside Lists are expanded this deep
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")

# A namespace is a DNS label (RFC 1123), as the apiserver and the policy's namespace keys hold it.
NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
NAMESPACE_RULE = "lowercase letters, digits and '-', at most 63"


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
    line: int = 0  # the file's line where the object starts; 0 when not known
    request: Mapping[str, Any] | None = None  # set for an AdmissionReview: decided as /validate decides it
    locator: Locator | None = None  # where the fields of its document are
    base: tuple[str, ...] = ()  # the object's own path in that document (a List item, a review's request.object)

    def position(self, path: str) -> tuple[int, int]:
        """(line, column) of a field of the object, or of its closest ancestor that exists; column 0 when the
        object's position is not known."""
        return self.position_at(steps(path))

    def position_at(self, keys: Sequence[str]) -> tuple[int, int]:
        """(line, column) of the field at ``keys`` (``spec``, ``limits``, ``perPod``) in the object, as
        :meth:`position`."""
        if self.locator is None:
            return self.line, 0
        return self.locator.at(self.base + tuple(keys))


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


def _at(locator: Locator | None, base: tuple[str, ...]) -> int:
    return locator.at(base)[0] if locator is not None else 0


def _expand(
    value: Mapping[str, Any], prefix: str, trail: str, locator: Locator | None, base: tuple[str, ...]
) -> Iterator[Item | str]:
    """``value`` as an :class:`Item`, or the items of a List, recursively but only so deep; a problem as a line.

    A mapping whose ``items`` is a list is a List, whatever its kind, as apimachinery decodes one. ``trail``
    numbers the item (``item 2.1`` is the first item of the List that is item 2); ``base`` is its path.
    """
    items = value.get("items")
    where = f"{prefix}item {trail}: " if trail else prefix
    if isinstance(items, list):
        if trail and trail.count(".") + 1 >= MAX_LIST_DEPTH:
            yield f"{where}Lists nested more than {MAX_LIST_DEPTH} deep"
            return
        for number, item in enumerate(items, 1):
            label = f"{trail}.{number}" if trail else str(number)
            if _is_object(item):
                yield from _expand(item, prefix, label, locator, (*base, "items", str(number - 1)))
            else:
                yield f"{prefix}item {label} is not a Kubernetes object (no kind)"
    elif value["kind"] == "AdmissionReview" and group_of(value.get("apiVersion")) == "admission.k8s.io":
        request = value.get("request")
        operation = as_mapping(request).get("operation")
        if not isinstance(request, Mapping):
            yield f"{where}AdmissionReview without a request"
        elif operation in CHECKED_OPERATIONS and not isinstance(request.get("object"), Mapping):
            yield f"{where}AdmissionReview of a {operation} without request.object"
        else:
            path = (*base, "request", "object")
            yield Item(as_mapping(request.get("object")), _at(locator, path), request, locator, path)
    else:
        problem = namespace_problem(value)
        if problem:
            yield f"{where}{problem}"
        else:
            yield Item(value, _at(locator, base), None, locator, base)


@dataclass
class Reading:
    """What reading one input found besides its objects and problems."""

    skip_others: bool = False  # skip documents that are not meant as Kubernetes objects
    kubernetes: bool = False  # a document that is a Kubernetes object (an empty List is one)
    skipped: int = 0  # documents skipped


def _part_items(parts: Iterable[Part], reading: Reading) -> Iterator[Item | str]:
    """The objects of an input's documents (a List's as they are read), and its problems as lines. A document's
    problems are named by document when the file has several: those of the first document's items wait for its
    end, where it is known whether other documents follow."""
    held: list[str] = []
    for part in parts:
        number = part.number
        prefix = f"document {number}: " if number > 1 else ""
        found: Iterable[Item | str] = ()
        if part.kind == "item" and _is_object(part.value):
            assert isinstance(part.value, Mapping)
            found = _expand(part.value, prefix, str(part.index), part.locator, ())
        elif part.kind == "item":
            found = [f"{prefix}item {part.index} is not a Kubernetes object (no kind)"]
        elif part.kind == "broken-item":
            found = [f"{prefix}item {part.index}: {part.value}"]
        elif part.kind == "list":
            yield from (f"document 1: {p}" if part.more else p for p in held)
            held = []
            if _is_object(part.value):
                reading.kubernetes = True
            else:
                yield f"document {number} is not a Kubernetes object (no kind)"
        elif part.kind == "problem":
            yield from held
            held = []
            yield f"document {number}: {part.value}"
        elif part.kind == "skipped":
            reading.skipped += 1
        else:
            yield from _document_items(part, number > 1 or part.more, reading)
        for entry in found:
            if isinstance(entry, str) and number == 1:
                held.append(entry)
            else:
                yield entry
    yield from held


def _document_items(part: Part, several: bool, reading: Reading) -> Iterator[Item | str]:
    """The objects of one whole document, and its problems as lines."""
    value = part.value
    if value is None:
        return  # an empty document, as between two "---"
    if reading.skip_others and not (isinstance(value, Mapping) and looks_like_object(value)):
        reading.skipped += 1
        return
    if not _is_object(value):
        yield f"document {part.number} is not a Kubernetes object (no kind)"
        return
    assert isinstance(value, Mapping)
    reading.kubernetes = True
    yield from _expand(value, f"document {part.number}: " if several else "", "", part.locator, ())


def read_items(stream: IO[bytes], source: str, reading: Reading) -> Iterator[Item | str]:
    """The objects of one input as they are read (``List`` kinds expanded, AdmissionReviews opened), and each
    problem as a line. A JSON item's positions hold until the next one is read."""
    start = stream.read(4096)
    stream.seek(0)
    if problem := other_encoding(start):
        yield problem
        return
    try:
        if is_json(start.decode("utf-8", "replace"), "" if source == STDIN else source):
            yield from _part_items(JsonInput(stream).parts(), reading)
        else:
            yield from _part_items(yaml_parts(stream, reading.skip_others), reading)
    except NotUtf8 as exc:
        line, column = _byte_position(stream, exc.offset)
        yield f"not UTF-8: byte 0x{exc.byte:02x} at line {line}, column {column}: save it as UTF-8"
    except UnreadableInput as exc:
        yield str(exc)


# Byte order marks of the encodings a Windows editor saves in, longest first (UTF-32 LE starts as UTF-16 LE does).
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32 LE"), (b"\x00\x00\xfe\xff", "UTF-32 BE"), (b"\xff\xfe", "UTF-16 LE"),
         (b"\xfe\xff", "UTF-16 BE"))


def other_encoding(start: bytes) -> str:
    """Why an input that starts with ``start`` is read as no UTF-8 at all: a UTF-16 or UTF-32 byte order mark,
    or text with a zero every other byte (UTF-16 without one); "" when it may be UTF-8."""
    for mark, name in _BOMS:
        if start.startswith(mark):
            return f"not UTF-8 but {name} (it starts with a byte order mark): save it as UTF-8"
    head = start[:min(64, len(start) - len(start) % 2)]  # whole pairs
    even, odd = head[0::2], head[1::2]
    if len(head) >= 4:
        if not odd.strip(b"\x00") and even.strip(b"\x00"):
            return "not UTF-8 but likely UTF-16 LE (every other byte is zero): save it as UTF-8"
        if not even.strip(b"\x00") and odd.strip(b"\x00"):
            return "not UTF-8 but likely UTF-16 BE (every other byte is zero): save it as UTF-8"
    return ""


def _byte_position(stream: IO[bytes], offset: int) -> tuple[int, int]:
    """(line, column), 1-based, of the byte at ``offset`` (the column counted in bytes)."""
    stream.seek(0)
    line, line_start, done = 1, 0, 0
    while done < offset:
        chunk = stream.read(min(JSON_CHUNK, offset - done))
        if not chunk:
            break
        newlines = chunk.count(b"\n")
        if newlines:
            line += newlines
            line_start = done + chunk.rfind(b"\n") + 1
        done += len(chunk)
    return line, offset - line_start + 1


def manifest_files(directory: Path, recursive: bool) -> Iterator[Path]:
    """``*.yaml``, ``*.yml`` and ``*.json`` in ``directory`` by name, and in its subdirectories if recursive."""
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.is_dir():
            if recursive and not entry.is_symlink():
                yield from manifest_files(Path(entry.path), recursive)
        elif entry.name.endswith(SUFFIXES):
            yield Path(entry.path)


def input_files(path: str, recursive: bool = False) -> tuple[list[str], str]:
    """The files ``path`` stands for (itself, or a directory's manifest files, as ``kubectl -f``), or a problem."""
    if path == "-" or not os.path.isdir(path):
        return [path], ""
    try:
        files = [str(f) for f in manifest_files(Path(path), recursive)]
    except OSError as exc:
        return [], f"cannot read: {exc}"
    if files:
        return files, ""
    try:  # a hint only: a subdirectory that cannot be read hides nothing asked for
        deeper = not recursive and next(manifest_files(Path(path), True), None) is not None
    except OSError:
        deeper = False
    none = f"no {', '.join('*' + s for s in SUFFIXES)} files"
    return [], f"{none}; its subdirectories hold some: add -R to read them" if deeper else none


class Opened:
    """A file to read in binary, or standard input spooled to a temporary file (read twice when it holds
    ResourceClaims, so that pods are judged with the claims beside them)."""

    def __init__(self, path: str):
        self.path = path
        self.stream: IO[bytes] | None = None

    def __enter__(self) -> IO[bytes]:
        if self.path != "-":
            self.stream = open(self.path, "rb")  # noqa: SIM115  # closed by __exit__
            return self.stream
        self.stream = tempfile.TemporaryFile()
        stdin = getattr(sys.stdin, "buffer", None)
        if stdin is not None:
            shutil.copyfileobj(stdin, self.stream)
        else:  # a text stream without bytes under it (tests replace sys.stdin)
            for chunk in iter(lambda: sys.stdin.read(JSON_CHUNK), ""):
                self.stream.write(chunk.encode("utf-8", "surrogateescape"))
        self.stream.seek(0)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            self.stream.close()


def read_manifest(path: str) -> Manifest:
    """The objects of one file (``-`` is stdin), all at once; a file with none is a problem."""
    manifest = Manifest(STDIN if path == "-" else path)
    reading = Reading()
    try:
        with Opened(path) as stream:
            for entry in read_items(stream, manifest.source, reading):
                if isinstance(entry, str):
                    manifest.problems.append(entry)
                else:
                    manifest.items.append(dataclasses.replace(entry, locator=None))
    except OSError as exc:
        manifest.problems.append(f"cannot read: {exc}")
    if not reading.kubernetes and not manifest.problems:
        manifest.problems.append("no Kubernetes objects")
    return manifest


def read_manifests(path: str, recursive: bool = False) -> list[Manifest]:
    """One manifest per file: ``path`` itself, or the manifest files of a directory (as ``kubectl -f``)."""
    files, problem = input_files(path, recursive)
    if problem:
        return [Manifest(path, problems=[problem])]
    return [read_manifest(f) for f in files]


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
    objects.extend(o for o in manifests if o.get("kind") in CLAIM_KINDS)
    cluster = ClusterState(node_label)
    cluster.load(objects, known)
    view = cluster.view()
    assert view is not None
    return view


def manifest_view(objects: list[Mapping[str, Any]], namespace: str, node_label: str) -> ClusterView | None:
    """Without --cluster-state: the claims and templates in the checked files, so a pod and the template it
    names, checked together, are judged together. None when the files hold none."""
    found = [o for o in objects if o.get("kind") in CLAIM_KINDS]
    if not found:
        return None
    return cluster_view([], node_label, [with_namespace(o, namespace) for o in found])


def with_namespace(obj: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    metadata = as_mapping(obj.get("metadata"))
    if metadata.get("namespace"):
        return obj
    return {**obj, "metadata": {**metadata, "namespace": namespace}}


def helm_template(path: str) -> bool:
    """Whether ``path`` is a Helm chart's template: a file under ``templates/`` beside the chart's Chart.yaml.
    Templates are not YAML until rendered (``{{ .Values.x }}``)."""
    if path == "-":
        return False
    return any(parent.name == "templates" and (parent.parent / "Chart.yaml").is_file()
               for parent in Path(os.path.abspath(path)).parents)


def mentions_claims(stream: IO[bytes]) -> bool:
    """Whether the input names a ResourceClaim kind anywhere (then it is read twice: claims first)."""
    tail = b""
    found = False
    for chunk in iter(lambda: stream.read(JSON_CHUNK), b""):
        if b"ResourceClaim" in tail + chunk[:16] or b"ResourceClaim" in chunk:
            found = True
            break
        tail = chunk[-16:]
    stream.seek(0)
    return found
