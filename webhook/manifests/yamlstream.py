"""A YAML stream read a piece at a time (from one document marker to the next), with the alias guard."""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Collection, Iterable, Iterator
from typing import Any

import yaml
from yaml.composer import Composer

from webhook.core.policyfile import yaml_error_line
from webhook.manifests.parts import Document, DuplicateKey, NotUtf8, Part
from webhook.manifests.positions import YamlLocator

# With its aliases expanded, a document may have this many nodes, or twice its own, whichever is more:
# enough for anchors shared by a few containers, and a bound on what an alias bomb makes the rules walk.
ALIAS_NODE_FLOOR = 10_000

_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
LIBYAML = _SafeLoader is not yaml.SafeLoader


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


_MERGE = "tag:yaml.org,2002:merge"


class _Written(DuplicateKey):
    """A duplicate key with the nodes of its two writings."""

    def __init__(self, key: str, first: yaml.Node, again: yaml.Node):
        super().__init__(key)
        self.first, self.again = first, again


class _UniqueKeys:
    """A constructor mixin that refuses a key written twice in one mapping, as kubectl's strict decoding does.
    Keys a merge (``<<: *anchor``) brings in may still be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode) and len(node.value) > 1:
            seen: dict[tuple[str, str], yaml.Node] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE:
                    written = (key_node.tag, key_node.value)
                    if written in seen:
                        raise _Written(key_node.value, seen[written], key_node)
                    seen[written] = key_node
        return super().construct_mapping(node, deep)  # type: ignore[misc]  # the loader's, after this mixin


@functools.cache
def _strict(loader: type) -> type:
    """``loader`` refusing duplicate keys."""
    return type(f"Unique{loader.__name__}", (_UniqueKeys, loader), {})


def _mark(node: yaml.Node, first_line: int) -> tuple[int, int]:
    return node.start_mark.line + first_line + 1, node.start_mark.column + 1


def _build(loader: Any, node: yaml.Node, aliases: bool, first_line: int) -> tuple[object, str]:
    """(value, "") of a composed node, or (None, why not): its aliases expand too far, or the constructor
    refuses a value."""
    problem = alias_problem(node) if aliases else None
    if problem is not None:
        return None, problem
    try:
        return loader.construct_document(node), ""
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        # A value the constructor refuses (a timestamp 2024-13-45, an int too long to convert, a key written
        # twice): reset the constructor so the next document starts clean.
        loader.constructed_objects, loader.recursive_objects, loader.state_generators = {}, {}, []
        loader.deep_construct = False
        if isinstance(exc, _Written):
            return None, exc.text(_mark(exc.again, first_line), _mark(exc.first, first_line))
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
        raise NotUtf8(data[exc.start], offset + exc.start) from None


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
    loader = _strict(_event_loader(_SafeLoader) if events else _SafeLoader)(piece)
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
    document does not hide the others. Raises :class:`NotUtf8` at bytes that are not UTF-8."""
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

