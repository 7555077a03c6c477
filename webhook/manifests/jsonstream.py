"""A JSON input read a chunk at a time: values one after another, a List's items one by one, and positions."""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

import orjson

from webhook.manifests.parts import DuplicateKey, NotUtf8, Part

JSON_CHUNK = 1 << 16  # JSON is read this many bytes at a time

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


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return members


# Strict as RFC 8259 and kubectl: no NaN or Infinity, no number beyond a float64 (the standard library takes both),
# no key written twice in an object (the standard library keeps the last).
_DECODER = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant, object_pairs_hook=_unique)
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
    """A JSON value that cannot be read: why, and where (an index of the text held); for a key written twice,
    the key and where it was first written."""

    def __init__(self, reason: str, at: int, duplicate: DuplicateKey | None = None, first: int = 0):
        super().__init__(reason)
        self.reason, self.at, self.duplicate, self.first = reason, at, duplicate, first


def _walk(text: str, at: int) -> tuple[int, tuple[str, int, int] | None]:
    """Past the JSON value at ``at``, and the first key written twice in one of its objects: (the key, where it
    was first written, where again)."""
    at = _skip_space(text, at)
    opener = text[at]
    if opener not in "{[":
        return _DECODER.raw_decode(text, at)[1], None
    closer = "}" if opener == "{" else "]"
    seen: dict[str, int] = {}
    at = _skip_space(text, at + 1)
    if text[at] == closer:
        return at + 1, None
    while True:
        if opener == "{":
            at = _skip_space(text, at)
            key, end = _DECODER.raw_decode(text, at)
            if key in seen:
                return at, (key, seen[key], at)
            seen[key] = at
            at = _skip_space(text, end) + 1  # past the colon
        at, found = _walk(text, at)
        if found is not None:
            return at, found
        at = _skip_space(text, at)
        if text[at] == closer:
            return at + 1, None
        at += 1  # the comma


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
            raise NotUtf8(exc.object[exc.start], at) from None
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
            except DuplicateKey as exc:
                raise self._duplicate(exc) from None
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

    def _duplicate(self, exc: DuplicateKey) -> BrokenJson:
        """Where the key of ``exc`` is written twice in the value at ``pos``."""
        try:
            found = _walk(self.text, self.pos)[1]
        except (ValueError, IndexError, RecursionError):
            found = None
        if found is None:
            return BrokenJson(str(exc), self.pos)
        key, first, again = found
        return BrokenJson(str(exc), again, DuplicateKey(key), first)

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
        written: dict[str, int] = {}  # where each key is, in the text held
        listed = False
        found = self._space()
        if found == "}":
            self.pos += 1
            return members, listed
        while True:
            if found != '"':
                raise BrokenJson("key must be a string" if found else "unexpected end of data", self.pos)
            at = self.pos
            key = self._value()
            assert isinstance(key, str)
            if key in written:
                raise BrokenJson(f"duplicate key {key!r}", at, DuplicateKey(key), written[key])
            written[key] = at
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
            if exc.duplicate is not None:
                first = self.position(self.absolute(exc.first))
                yield Part("problem", max(number, 1), exc.duplicate.text((line, column), first))
            else:
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

