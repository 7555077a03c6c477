"""``gpu-webhook check``: the webhook's validation, offline, for manifests in a CI pipeline.

Each object goes through ``admission.decide``, the very function behind ``/validate``,
so a manifest that passes here is admitted by the server with the same policy.

Input is read as a stream and decided object by object, so memory follows the largest document, not the
file: YAML a piece at a time (each piece starts at a document marker ``---``), JSON a value at a time and the
items of a JSON ``List`` one by one. A broken document is reported by file and number and the others are still
checked. YAML documents are loaded with libyaml when PyYAML has it, and a document whose aliases would expand
past a bound is refused before it is built. JSON (``*.json`` files, and any input that starts as a JSON object
does) is decoded by the standard library's decoder, as strictly as kubectl reads it (orjson words the errors).
An AdmissionReview is decided as ``/validate`` decides it: its ``request.object``, in its namespace.

Every violation is reported at the line and column of its field (the YAML node or JSON key of its field path,
or of the closest ancestor that exists when the field is missing).
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Collection, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, TextIO

import orjson
import yaml
from yaml.composer import Composer

from webhook.cli import formats
from webhook.cli.formats import Checked, Finding, Tally
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
JSON_CHUNK = 1 << 16  # JSON is read this many bytes at a time
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")

_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LIBYAML = _SafeLoader is not yaml.SafeLoader


class UnreadableInput(ValueError):
    pass


# ------------------------------------------------------------------------------------------ positions

_STEP = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")


def steps(path: str) -> tuple[str, ...]:
    """The keys and indexes of a field path: ``spec.containers[0].resources.limits[nvidia.com/gpu]`` ->
    ``spec``, ``containers``, ``0``, ``resources``, ``limits``, ``nvidia.com/gpu``."""
    return tuple(m[1] if m[1] is not None else m[2] for m in _STEP.finditer(path))


class Locator(Protocol):
    def at(self, path: Sequence[str]) -> tuple[int, int]:
        """(line, column), 1-based, of the field at ``path``, or of its closest ancestor that exists."""
        ...


@dataclass(frozen=True)
class YamlLocator:
    """Positions in a YAML document, from its composed nodes (``first_line``: the file's lines before them)."""

    root: yaml.Node
    first_line: int = 0

    def at(self, path: Sequence[str]) -> tuple[int, int]:
        node, mark = self.root, self.root.start_mark
        for step in path:
            if isinstance(node, yaml.MappingNode):
                found = next((pair for pair in node.value
                              if isinstance(pair[0], yaml.ScalarNode) and pair[0].value == step), None)
                if found is None:
                    break
                mark, node = found[0].start_mark, found[1]
            elif isinstance(node, yaml.SequenceNode) and step.isdigit() and int(step) < len(node.value):
                node = node.value[int(step)]
                mark = node.start_mark
            else:
                break
        return mark.line + self.first_line + 1, mark.column + 1


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
    """One document of a file: its value, or why it could not be loaded."""

    number: int  # 1-based, counting every document of the file
    value: object = None
    problem: str = ""
    line: int = 1  # the file's line where the document starts, 1-based
    locator: Locator | None = None  # where its fields are


@dataclass
class Part:
    """What a reader found, in the order of the input: a whole document (``document``), an item of a List read
    item by item (``item``, or ``broken-item`` with why it cannot be read), the rest of that List once its items
    are done (``list``), a document that cannot be read (``problem``), or one skipped (``skipped``)."""

    kind: str
    number: int  # the document's
    value: object = None
    locator: Locator | None = None
    index: int = 0  # an item's number in its List, from 1
    more: bool = False  # another document follows (for documents and Lists)


# An anchor (&a) or alias (*a) is a token, so it follows a line start, a space or an indicator.
_ANCHOR = re.compile(r"&[^\s\[\]{},]")
_ALIAS = re.compile(r"\*[^\s\[\]{},]")
_TOKEN_STARTS = frozenset(" \t\r\n[{,:?-\ufeff")


def _has_token(text: str, pattern: re.Pattern[str]) -> bool:
    return any(m.start() == 0 or text[m.start() - 1] in _TOKEN_STARTS for m in pattern.finditer(text))


# A parser error on one line, its marks counted from the start of the file.
yaml_problem = yaml_error_line


def looks_like_object(keys: Collection[object]) -> bool:
    """Whether a mapping with these keys is meant as a Kubernetes object: it has a kind, or an apiVersion with
    metadata or items. CI files, Helm values, Chart.yaml (an apiVersion, no kind) and package.json are not."""
    return "kind" in keys or ("apiVersion" in keys and ("metadata" in keys or "items" in keys))


def _node_keys(node: yaml.Node) -> list[str] | None:
    if not isinstance(node, yaml.MappingNode):
        return None
    return [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]


def _build(loader: Any, node: yaml.Node, aliases: bool, first_line: int) -> tuple[object, str]:
    """(value, "") of a composed node, or (None, why not): its aliases expand too far, or the constructor
    refuses a value."""
    problem = alias_problem(node) if aliases else None
    if problem is not None:
        return None, problem
    try:
        return loader.construct_document(node), ""
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # A value the constructor refuses (a timestamp 2024-13-45, an int too long to convert):
        # reset the constructor so the next document starts clean.
        loader.constructed_objects, loader.recursive_objects, loader.state_generators = {}, {}, []
        loader.deep_construct = False
        reason = yaml_problem(exc, first_line) if isinstance(exc, yaml.YAMLError) else str(exc) or type(exc).__name__
        return None, f"not valid YAML: {' '.join(reason.split())}"


def _is_marker(line: bytes) -> bool:
    """A document marker ``---`` at the start of a line."""
    return line.startswith(b"---") and line[3:4] in b" \t\r\n"


# A line before a document's content: blank, a comment or a directive (%YAML, %TAG).
_PREAMBLE = re.compile(rb"[ \t]*(?:#[^\n]*)?\r?\n?|%[^\n]*\n?")
# A List's items as a block sequence under a top-level key, as kubectl get -o yaml writes them.
_BLOCK_ITEMS = re.compile(rb"items:[ \t]*(?:#[^\n]*)?\r?\n?")
_LOOKAHEAD = 64  # lines of a piece looked at for a List


class _Lines:
    """The lines of a binary stream with one looked ahead, counted in lines and bytes."""

    def __init__(self, stream: Iterable[bytes]):
        self._lines = iter(stream)
        self.next: bytes | None = next(self._lines, None)
        self.number = 0  # lines taken
        self.offset = 0  # bytes taken

    def take(self) -> bytes:
        line = self.next
        assert line is not None
        self.next = next(self._lines, None)
        self.number += 1
        self.offset += len(line)
        return line


class YamlPiece:
    """One part of a YAML stream, from a document marker ``---`` to the next, given to the parser as it asks for
    it. A syntax error ends a YAML stream, so each piece is parsed on its own: a broken document does not hide
    the ones after it. Directives and comments before a marker stay with the document they precede. The piece
    notes whether it holds an anchor and an alias (only then are aliases counted), and whether it starts as a
    List whose items are a block sequence (read item by item)."""

    def __init__(self, lines: _Lines, errors: str = "strict"):
        self._lines, self._errors = lines, errors
        self.first_line, self.offset = lines.number, lines.offset
        self._content = False
        self._ahead: list[bytes] = []
        self.anchors = self.aliases = False

    def _line(self) -> bytes | None:
        return self._ahead.pop(0) if self._ahead else self._take()

    def _take(self) -> bytes | None:
        line = self._lines.next
        if line is None or (self._content and _is_marker(line)):
            return None
        self._lines.take()
        if not self._content and (_is_marker(line) or not _PREAMBLE.fullmatch(line)):
            self._content = True
        return line

    def listed(self) -> bool:
        """Whether a top-level ``items:`` opens a block in the piece's first lines."""
        while len(self._ahead) < _LOOKAHEAD and (line := self._take()) is not None:
            self._ahead.append(line)
        return any(_BLOCK_ITEMS.fullmatch(line) for line in self._ahead)

    def read(self, size: int = -1) -> str:
        start = self._lines.offset - sum(map(len, self._ahead))
        lines: list[bytes] = []
        count = 0
        while size < 0 or count < size:
            line = self._line()
            if line is None:
                break
            lines.append(line)
            count += len(line)
        text = _decode(b"".join(lines), start, self._errors)
        if not self.aliases and "*" in text:
            self.aliases = _has_token(text, _ALIAS)
        if not self.anchors and "&" in text:
            self.anchors = _has_token(text, _ANCHOR)
        return text

    @property
    def may_alias(self) -> bool:
        return self.aliases and self.anchors

    def drain(self) -> None:
        while self.read(1 << 16):
            pass

    def more(self) -> bool:
        """Whether another piece follows (once this one is read)."""
        return self._lines.next is not None


def _decode(data: bytes, offset: int, errors: str = "strict") -> str:
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        raise UnreadableInput(
            f"cannot read: 'utf-8' codec can't decode byte 0x{data[exc.start]:02x} in position {offset + exc.start}: "
            f"{exc.reason}"
        ) from None


def _event_loader(loader: type) -> type:
    """``loader`` with PyYAML's composer in Python, which composes a node at a time (libyaml composes only whole
    documents)."""
    if hasattr(loader, "compose_node"):
        return loader
    return type(f"Event{loader.__name__}", (loader, Composer), {})


def _piece_parts(piece: YamlPiece, before: int, skip: bool, lists: bool) -> Iterator[Part]:
    """The documents of one piece, numbered after ``before``; a List's items one at a time when ``lists`` and the
    piece starts as a List. With ``skip``, documents that are not meant as Kubernetes objects are skipped before
    they are built (a CI file's ``!reference`` tags need no constructor)."""
    events = lists and piece.listed()
    loader = (_event_loader(_SafeLoader) if events else _SafeLoader)(piece)
    number = before
    try:
        while True:
            number += 1
            try:
                if events:
                    yield from _event_document(loader, piece, number, skip)
                    if loader.check_event(yaml.StreamEndEvent):
                        return
                    continue
                node = loader.get_node() if loader.check_node() else None
                if node is None:
                    return
                more = _more(loader) or piece.more()
            except yaml.YAMLError as exc:
                yield Part("problem", number, f"not valid YAML: {yaml_problem(exc, piece.first_line)}")
                return
            except RecursionError:
                yield Part("problem", number, "not valid YAML: nested too deeply")
                return
            yield _whole(loader, node, number, piece, skip, more)
    finally:
        loader.dispose()
        piece.drain()


def _more(loader: Any) -> bool:
    """Whether the piece holds another document (a broken one is one: it is reported with its number)."""
    try:
        return bool(loader.check_node())
    except (yaml.YAMLError, RecursionError):
        return True


def _whole(loader: Any, node: yaml.Node, number: int, piece: YamlPiece, skip: bool, more: bool) -> Part:
    if skip and not (isinstance(node, yaml.ScalarNode) and node.value == ""):
        keys = _node_keys(node)
        if keys is None or not looks_like_object(keys):
            return Part("skipped", number)
    value, problem = _build(loader, node, piece.may_alias, piece.first_line)
    if problem:
        return Part("problem", number, problem)
    return Part("document", number, value, YamlLocator(node, piece.first_line), more=more)


def _event_document(loader: Any, piece: YamlPiece, number: int, skip: bool) -> Iterator[Part]:
    """One document from the parser's events: a List's items composed and yielded one at a time (as kubectl
    writes a List: apiVersion, then items), the rest as a whole document."""
    loader.anchors = {}
    if loader.check_event(yaml.StreamStartEvent):
        loader.get_event()
    loader.get_event()  # the document's start
    if not loader.check_event(yaml.MappingStartEvent):
        node = loader.compose_node(None, None)
        loader.get_event()
        yield _whole(loader, node, number, piece, skip, not loader.check_event(yaml.StreamEndEvent) or piece.more())
        return
    start = loader.get_event()
    pairs: list[tuple[yaml.Node, yaml.Node]] = []
    listed = False
    while not loader.check_event(yaml.MappingEndEvent):
        key = loader.compose_node(None, None)
        keys = [k.value for k, _ in pairs if isinstance(k, yaml.ScalarNode)]
        if (isinstance(key, yaml.ScalarNode) and key.value == "items" and loader.check_event(yaml.SequenceStartEvent)
                and ("kind" in keys or "apiVersion" in keys)):
            listed = True
            loader.get_event()
            index = 0
            while not loader.check_event(yaml.SequenceEndEvent):
                index += 1
                item = loader.compose_node(None, None)
                value, problem = _build(loader, item, piece.may_alias, piece.first_line)
                if problem:
                    yield Part("broken-item", number, problem, index=index)
                else:
                    yield Part("item", number, value, YamlLocator(item, piece.first_line), index)
            loader.get_event()
        else:
            pairs.append((key, loader.compose_node(None, None)))
    end = loader.get_event()
    loader.get_event()  # the document's end
    head = yaml.MappingNode(loader.resolve(yaml.MappingNode, None, True), pairs, start.start_mark, end.end_mark,
                            flow_style=start.flow_style)
    more = not loader.check_event(yaml.StreamEndEvent) or piece.more()
    if not listed:
        yield _whole(loader, head, number, piece, skip, more)
        return
    value, problem = _build(loader, head, piece.may_alias, piece.first_line)
    yield Part("problem", number, problem) if problem else Part("list", number, value, more=more)


def yaml_parts(stream: Iterable[bytes], skip: bool = False, lists: bool = True, errors: str = "strict") -> Iterator[
        Part]:
    """The documents of a YAML stream, a piece at a time (a List's items one at a time when ``lists``); one broken
    document does not hide the others. Raises :class:`UnreadableInput` at bytes that are not UTF-8."""
    lines = _Lines(stream)
    number = 0
    while lines.next is not None:
        for part in _piece_parts(YamlPiece(lines, errors), number, skip, lists):
            number = part.number
            yield part


def yaml_documents(stream: Iterable[bytes], errors: str = "strict") -> Iterator[Document]:
    """Every document of a YAML stream, whole, as it is read."""
    for part in yaml_parts(stream, lists=False, errors=errors):
        if part.kind == "document":
            locator = part.locator
            line = locator.root.start_mark.line + locator.first_line + 1 if isinstance(locator, YamlLocator) else 1
            yield Document(part.number, part.value, line=line, locator=locator)
        else:
            yield Document(part.number, problem=str(part.value))


def load(text: str) -> list[Document]:
    """Every document in a YAML stream; one broken document does not hide the others."""
    return list(yaml_documents(io.BytesIO(text.encode("utf-8", "surrogatepass")), errors="surrogatepass"))


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


def _json_problem(text: str, start: int, exc: Exception) -> tuple[int, str]:
    """Where in ``text`` and why the value at ``start`` is not JSON, in orjson's words where it has them."""
    at, reason = (exc.pos, exc.msg) if isinstance(exc, json.JSONDecodeError) else (start, str(exc))
    if isinstance(exc, RecursionError):
        reason = "nested too deeply"
    try:
        orjson.loads(text[start:])
    except orjson.JSONDecodeError as strict:
        if not isinstance(exc, json.JSONDecodeError) or start + strict.pos <= exc.pos:
            at, reason = start + strict.pos, strict.msg
    return min(at, len(text)), reason


class BrokenJson(ValueError):
    """A JSON value that cannot be read: why, and where (an index of the text held)."""

    def __init__(self, reason: str, at: int):
        super().__init__(reason)
        self.reason, self.at = reason, at


class JsonInput:
    """A JSON input read a chunk at a time: values one after the other (a stream, as kubectl reads it), and the
    ``items`` of a List one at a time, so only the value being decided is held.

    The standard library's decoder decodes each value where it starts (``raw_decode`` says where it ends); only
    the members of a value's outermost object are walked here. Lines and columns are counted forward from a
    mark set at each document and each List item: a text position is asked for at or after the mark.
    """

    def __init__(self, stream: IO[bytes], chunk: int = JSON_CHUNK):
        self._stream = stream
        self._chunk = chunk
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._bytes = 0  # read from the stream
        self._dropped = 0  # characters dropped from the front of ``text``
        self._first = True
        self.text = ""
        self.pos = 0
        self.eof = False
        self._mark, self._line, self._column = 0, 1, 1  # text[_mark] is at this line and column

    # -- the text held

    def _more(self, at_least: int = 0) -> bool:
        """Read on (at least ``at_least`` bytes more); False at the end of the input."""
        if self.eof:
            return False
        data = self._stream.read(max(self._chunk, at_least))
        pending = len(self._decoder.getstate()[0])
        try:
            part = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            at = self._bytes - pending + exc.start
            raise UnreadableInput(f"cannot read: 'utf-8' codec can't decode byte 0x{exc.object[exc.start]:02x} in "
                                  f"position {at}: {exc.reason}") from None
        self._bytes += len(data)
        self.eof = not data
        if self._first and part:
            part, self._first = part.removeprefix("\ufeff"), False
        if self._mark >= self._chunk:  # what is before the mark is done with: drop it
            self.text = self.text[self._mark:]
            self.pos -= self._mark
            self._dropped += self._mark
            self._mark = 0
        self.text += part
        return not self.eof

    def _set_mark(self, at: int) -> None:
        """Move the mark forward to ``at``, counting the lines it passes."""
        newlines = self.text.count("\n", self._mark, at)
        if newlines:
            self._line += newlines
            self._column = at - self.text.rfind("\n", self._mark, at)
        else:
            self._column += at - self._mark
        self._mark = at

    def position(self, absolute: int) -> tuple[int, int]:
        """(line, column), 1-based, of a character of the input (counted from its start, at or after the mark)."""
        at = absolute - self._dropped
        newlines = self.text.count("\n", self._mark, at)
        if not newlines:
            return self._line, self._column + at - self._mark
        return self._line + newlines, at - self.text.rfind("\n", self._mark, at)

    def absolute(self, at: int) -> int:
        return at + self._dropped

    # -- reading

    def _space(self) -> str:
        """Skip white space; the next character, or "" at the end."""
        while True:
            self.pos = _skip_space(self.text, self.pos)
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self._more():
                return ""

    def _cut(self, exc: json.JSONDecodeError) -> bool:
        """Whether a decode error may only be the end of what is held, with the rest of the value still unread."""
        return not self.eof and (exc.pos >= len(self.text) - 8 or exc.msg.startswith("Unterminated string"))

    def _value(self) -> object:
        """The value at ``pos``, which moves past it."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                if self._cut(exc) and self._more(len(self.text) - self.pos):
                    continue
                raise self._broken(exc) from None
            except (ValueError, RecursionError) as exc:
                raise self._broken(exc) from None
            if end == len(self.text) and not isinstance(value, dict | list | str) and self._more():
                continue  # a number or literal may go on in the next chunk
            break
        start = self.pos
        if _SURROGATE_ESCAPE.search(self.text, start, end):
            try:
                orjson.loads(self.text[start:end])  # a lone surrogate is refused; a pair is a character
            except orjson.JSONDecodeError as exc:
                raise BrokenJson(exc.msg, start + exc.pos) from None
        self.pos = end
        return value

    def _broken(self, exc: Exception) -> BrokenJson:
        at, reason = _json_problem(self.text, self.pos, exc)
        return BrokenJson(reason, at)

    def _expect(self, found: str, wanted: str) -> None:
        if found == "":
            raise BrokenJson("unexpected end of data", self.pos)
        if found not in wanted:
            raise BrokenJson(f"expected {' or '.join(repr(w) for w in wanted)}", self.pos)
        self.pos += 1

    def _members(self, number: int) -> Generator[Part, None, tuple[dict[str, object], bool]]:
        """Walk an object's members at ``pos``; its items, when it is a List, one at a time. Returns the other
        members and whether the items were read one by one (as the generator's return value)."""
        self.pos += 1  # {
        members: dict[str, object] = {}
        listed = False
        found = self._space()
        if found == "}":
            self.pos += 1
            return members, listed
        while True:
            if found != '"':
                raise BrokenJson("key must be a string" if found else "unexpected end of data", self.pos)
            key = self._value()
            assert isinstance(key, str)
            self._expect(self._space(), ":")
            found = self._space()
            if key == "items" and found == "[" and ("kind" in members or "apiVersion" in members):
                listed = True  # a List as kubectl writes one (apiVersion, items, kind): read item by item
                yield from self._items(number)
            else:
                members[key] = self._value()
            found = self._space()
            comma = self.pos
            self._expect(found, ",}")
            if found == "}":
                return members, listed
            found = self._space()
            if found == "}":
                raise BrokenJson("trailing comma is not allowed", comma)

    def _items(self, number: int) -> Iterator[Part]:
        self.pos += 1  # [
        found = self._space()
        index = 0
        while found != "]":
            index += 1
            self._set_mark(self.pos)
            start = self.absolute(self.pos)
            value = self._value()
            yield Part("item", number, value, JsonLocator(self, start), index)
            found = self._space()
            comma = self.pos
            self._expect(found, ",]")
            if found == ",":
                found = self._space()
                if found == "]":
                    raise BrokenJson("trailing comma is not allowed", comma)
            else:
                return
        self.pos += 1

    def parts(self) -> Iterator[Part]:
        """The documents of the input, a List's items one at a time; a broken value ends the input (as a syntax
        error ends a YAML stream), reported as a ``problem`` part."""
        number = 0
        try:
            found = self._space()
            while found:
                number += 1
                self._set_mark(self.pos)
                start = self.absolute(self.pos)
                value: object
                if found == "{":
                    value, listed = yield from self._members(number)
                else:
                    value, listed = self._value(), False
                found = self._space()
                if listed:
                    yield Part("list", number, value, more=bool(found))
                else:
                    yield Part("document", number, value, JsonLocator(self, start), more=bool(found))
        except BrokenJson as exc:
            line, column = self.position(self.absolute(exc.at))
            yield Part("problem", max(number, 1), f"invalid JSON: {exc.reason} (line {line}, column {column})")


@dataclass(frozen=True)
class JsonLocator:
    """Positions in a JSON value of a :class:`JsonInput`, read from its text: valid until the input reads on."""

    source: JsonInput
    start: int  # where the value starts, counted from the start of the input

    def at(self, path: Sequence[str]) -> tuple[int, int]:
        text, at = self.source.text, self.start - self.source.absolute(0)
        found = at
        try:
            for step in path:
                at = _skip_space(text, at)
                if text[at] == "{" and (key := _json_member(text, at + 1, step)) >= 0:
                    found = key
                    at = _skip_space(text, _DECODER.raw_decode(text, key)[1]) + 1  # past the colon
                elif text[at] == "[" and step.isdigit() and (element := _json_element(text, at + 1, int(step))) >= 0:
                    found = at = element
                else:
                    break
        except (ValueError, IndexError):
            pass
        return self.source.position(self.source.absolute(found))


def _skip_space(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # the pattern matches the empty string


def _json_member(text: str, at: int, key: str) -> int:
    """Where the member ``key`` of the object whose members start at ``at`` has its key, or -1."""
    while True:
        at = _skip_space(text, at)
        if text[at] != '"':
            return -1
        name, end = _DECODER.raw_decode(text, at)
        if name == key:
            return at
        end = _DECODER.raw_decode(text, _skip_space(text, _skip_space(text, end) + 1))[1]  # the value, past the colon
        at = _skip_space(text, end)
        if text[at] != ",":
            return -1
        at += 1


def _json_element(text: str, at: int, index: int) -> int:
    """Where element ``index`` of the array whose elements start at ``at`` starts, or -1."""
    for _ in range(index):
        at = _skip_space(text, at)
        if text[at] == "]":
            return -1
        at = _skip_space(text, _DECODER.raw_decode(text, at)[1])
        if text[at] != ",":
            return -1
        at += 1
    at = _skip_space(text, at)
    return -1 if text[at] == "]" else at


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
    line: int = 0  # the file's line where the object starts; 0 when not known
    request: Mapping[str, Any] | None = None  # set for an AdmissionReview: decided as /validate decides it
    locator: Locator | None = None  # where the fields of its document are
    base: tuple[str, ...] = ()  # the object's own path in that document (a List item, a review's request.object)

    def position(self, path: str) -> tuple[int, int]:
        """(line, column) of a field of the object, or of its closest ancestor that exists; column 0 when the
        object's position is not known."""
        if self.locator is None:
            return self.line, 0
        return self.locator.at(self.base + steps(path))


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
    try:
        if is_json(start.decode("utf-8", "replace"), "" if source == formats.STDIN else source):
            yield from _part_items(JsonInput(stream).parts(), reading)
        else:
            yield from _part_items(yaml_parts(stream, reading.skip_others), reading)
    except UnreadableInput as exc:
        yield str(exc)


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
    return files, "" if files else f"no {', '.join('*' + s for s in SUFFIXES)} files"


class _Opened:
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
    manifest = Manifest(formats.STDIN if path == "-" else path)
    reading = Reading()
    try:
        with _Opened(path) as stream:
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


def helm_template(path: str) -> bool:
    """Whether ``path`` is a Helm chart's template: a file under ``templates/`` beside the chart's Chart.yaml.
    Templates are not YAML until rendered (``{{ .Values.x }}``)."""
    if path == "-":
        return False
    return any(parent.name == "templates" and (parent.parent / "Chart.yaml").is_file()
               for parent in Path(os.path.abspath(path)).parents)


def _mentions_claims(stream: IO[bytes]) -> bool:
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


# ---------------------------------------------------------------------------------------- decisions


def _identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = as_mapping(obj.get("metadata"))
    name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
    namespace = metadata.get("namespace")
    return str(name), namespace if isinstance(namespace, str) else ""


def judge(item: Item, source: str, policies: PolicySet, namespace: str, view: ClusterView | None = None) -> Checked:
    """One object and its violations, each with the action the decision took on it and the position of its
    field: ``admission.decide`` for a manifest (in its namespace, else ``namespace``), ``admission.validate`` for
    an AdmissionReview."""
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
        Finding(source, kind, name, target, str(v.path), v.rule, action, v.message, *item.position(str(v.path)))
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


@dataclass
class _Run:
    """One ``check`` run: where its findings and problems go, and what it counted."""

    policies: PolicySet
    namespace: str
    writer: formats.Writer
    err: TextIO
    cluster_state: list[Mapping[str, Any]] | None
    skip_others: bool
    tally: Tally = field(default_factory=Tally)
    skipped: int = 0  # documents that are not Kubernetes objects
    templates: int = 0  # Helm chart templates

    def problem(self, source: str, problem: str) -> None:
        print(f"{source}: {problem}", file=self.err)
        self.tally.problems += 1
        self.writer.problem(source, problem)

    def view(self, stream: IO[bytes], source: str) -> ClusterView | None:
        """The claims of the input in the cluster view (the saved cluster's, or one of their own)."""
        claims: list[Mapping[str, Any]] = []
        if _mentions_claims(stream):
            claims = [entry.obj for entry in read_items(stream, source, Reading(self.skip_others))
                      if isinstance(entry, Item) and entry.obj.get("kind") in CLAIM_KINDS]
            stream.seek(0)
        node_label = self.policies.default.node_label
        if self.cluster_state is not None:
            return cluster_view(self.cluster_state, node_label, [_with_namespace(o, self.namespace) for o in claims])
        return manifest_view(claims, self.namespace, node_label)

    def check(self, path: str) -> None:
        """Read one input and decide on each object as it is read."""
        if self.skip_others and helm_template(path):
            self.templates += 1
            return
        source = formats.STDIN if path == "-" else path
        reading = Reading(self.skip_others)
        problems = self.tally.problems
        self.writer.begin(source)
        try:
            with _Opened(path) as stream:
                view = self.view(stream, source)
                for entry in read_items(stream, source, reading):
                    if isinstance(entry, str):
                        self.problem(source, entry)
                        continue
                    checked = judge(entry, source, self.policies, self.namespace, view)
                    self.tally.add(checked)
                    self.writer.object(source, checked)
        except OSError as exc:
            self.problem(source, f"cannot read: {exc}")
        self.skipped += reading.skipped
        lenient = self.skip_others and (path != "-" or reading.skipped)
        if self.tally.problems == problems and not reading.kubernetes and not lenient:
            self.problem(source, "no Kubernetes objects")
        self.writer.end(source)

    def skipped_note(self) -> str:
        parts = []
        if self.skipped:
            parts.append(f"{self.skipped} documents that are not Kubernetes objects" if self.skipped != 1
                         else "1 document that is not a Kubernetes object")
        if self.templates:
            parts.append(f"{self.templates} Helm chart template{'s' if self.templates != 1 else ''} (check what "
                         "helm template renders)")
        return f"skipped {' and '.join(parts)}" if parts else ""


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
    skip_others: bool = False,
) -> int:
    """Check every file, object by object as it is read; write what was found on ``out`` in the ``output``
    format (:mod:`webhook.cli.formats`) as it is found, each input problem and a summary on ``err``.
    ``cluster_state`` holds Nodes, ResourceSlices, DeviceClasses, ... (from :func:`read_cluster_state`) for the
    cluster-aware checks. ``skip_others`` skips documents that are not meant as Kubernetes objects and Helm chart
    templates instead of refusing them. The exit code: 2 when an input could not be read, else 1 when a violation
    is denied (or with ``fail_on="warning"``, warned about), else 0."""
    out, err = out or sys.stdout, err or sys.stderr
    checking = _Run(policies, namespace, formats.writer(output, out, fail_on), err, cluster_state, skip_others)
    for path in paths:
        files, problem = input_files(path, recursive)
        if problem:
            checking.writer.begin(path)
            checking.problem(path, problem)
            checking.writer.end(path)
        for file in files:
            checking.check(file)
    status = checking.tally.status(fail_on)
    checking.writer.finish(checking.tally, status)
    if note := checking.skipped_note():
        print(note, file=err)
    print(checking.tally, file=err)
    return status
