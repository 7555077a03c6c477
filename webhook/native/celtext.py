"""CEL text: literals, regular expressions from the policy's globs, and values that differ by namespace.

Everything the generator writes into an expression goes through here, so the pitfalls measured on
kube-apiserver v1.36 (``docs/native-policies.md``) are avoided in one place:

- the apiserver's CEL refuses mixed-type list and map literals (``HomogeneousAggregateLiterals``), so
  every value in a record literal is wrapped in ``dyn()`` (:func:`record`);
- a regular expression is always a literal argument of ``matches()`` (compiled once with the policy),
  never a variable (recompiled on every call) (:func:`matches`);
- policy values are CEL literals, chosen by ``request.namespace`` where a namespace overrides them
  (:func:`by_namespace`): no ``paramKind`` (ConfigMap params are broken in 1.36, kubernetes#130887).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

from webhook.core.policy import Policy, PolicySet


def lit(text: str) -> str:
    """A CEL string literal: single-quoted when nothing in it needs an escape (it reads better in YAML and JSON),
    else double-quoted with JSON's escapes, which are CEL's."""
    if all(c not in "'\\" and c.isprintable() for c in text):
        return f"'{text}'"
    return json.dumps(text, ensure_ascii=False)


def lits(items: Iterable[str]) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(lit(i) for i in items) + "]"


def boolean(value: bool) -> str:
    return "true" if value else "false"


def regex_literal(pattern: str) -> str:
    """A pattern as a CEL raw string when it can be one (no quote, no newline), else an escaped literal."""
    if "'" not in pattern and "\n" not in pattern and "\r" not in pattern:
        return f"r'{pattern}'"
    return lit(pattern)


def matches(subject: str, pattern: str) -> str:
    """``subject.matches(r'pattern')``: RE2, unanchored unless the pattern anchors itself."""
    return f"{subject}.matches({regex_literal(pattern)})"


RE2_SPECIAL = set("\\.+*?()|[]{}^$")
# fnmatch's wildcards: a pattern with none is a name; one whose only wildcard is a trailing "*" is a prefix.
GLOB_META = "*?["


def _escape(char: str) -> str:
    return "\\" + char if char in RE2_SPECIAL else char


def glob_to_regex(glob: str) -> str:
    """An fnmatch glob (``*``, ``?``, ``[seq]``, ``[!seq]``) as an RE2 expression, unanchored.

    ``fnmatch.fnmatchcase`` is what the webhook matches resource names, device classes and namespaces
    with; ``tests/test_native_cel.py`` holds the two to the same answers.
    """
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        char = glob[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            j = i
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                out.append("\\[")  # no closing bracket: a literal [
                continue
            body = glob[i:j]
            i = j + 1
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            escaped = "".join("\\" + c if c in "\\[]^" else c for c in body)  # never empty: "]" first is literal
            out.append(f"[{'^' if negate else ''}{escaped}]")
        else:
            out.append(_escape(char))
    return "".join(out)


def globs_regex(globs: Sequence[str]) -> str:
    """One anchored RE2 expression matching any of ``globs`` (an impossible one for none)."""
    if not globs:
        return "^\\b\\B$"  # matches nothing
    return "^(?:" + "|".join(glob_to_regex(g) for g in globs) + ")$"


def patterns_regex(patterns: Sequence[str]) -> str:
    """One anchored RE2 expression matching any of the (already regular) ``patterns`` whole."""
    if not patterns:
        return "^\\b\\B$"
    return "^(?:" + "|".join(patterns) + ")$"


def record(**fields: str) -> str:
    """A CEL map literal whose every value is ``dyn(...)``: homogeneous, as the apiserver requires."""
    return "{" + ", ".join(f"{lit(k)}: dyn({v})" for k, v in fields.items()) + "}"


def by_namespace(policies: PolicySet, text: Callable[[Policy], str]) -> str:
    """The CEL text ``text(policy)`` of the policy in force in the request's namespace.

    Namespaces that agree with the global policy are not named; the others are grouped by value into
    ``request.namespace in [...] ? X : ...`` branches, so one policy serves every namespace.
    """
    default = text(policies.default)
    groups: dict[str, list[str]] = {}
    for namespace in sorted(policies.by_namespace):
        value = text(policies.by_namespace[namespace])
        if value != default:
            groups.setdefault(value, []).append(namespace)
    expression = default
    for value, namespaces in reversed(list(groups.items())):
        test = f"request.namespace == {lit(namespaces[0])}" if len(namespaces) == 1 else (
            f"request.namespace in {lits(namespaces)}")
        expression = f"({test} ? {value} : {expression})"
    return expression


def every_policy(policies: PolicySet) -> list[Policy]:
    """The global policy and every namespace's."""
    return [policies.default, *policies.by_namespace.values()]


def either(condition: str, then: str, otherwise: str) -> str:
    """``condition ? then : otherwise``, folded when the condition is a literal."""
    if condition == "true":
        return then
    if condition == "false":
        return otherwise
    return f"({condition} ? {then} : {otherwise})"


def join_lists(parts: Sequence[str]) -> str:
    """Concatenation of CEL list expressions (``[]`` for none)."""
    kept = [p for p in parts if p != "[]"]
    return " + ".join(kept) if kept else "[]"


# --- layout: long expressions on several lines ------------------------------------------------------------------

# Lines are laid out to this width; a string literal longer than a line is never cut, it stands alone on its line.
WIDTH = 100
INDENT = 2

# CEL's tokens after any white space, the most frequent first: words (never running into a quote: ``r'...'`` is a
# raw string), operators, strings, raw strings, numbers. The generator writes no triple-quoted string: one is
# refused (a layout never guesses).
_TOKEN = re.compile(r"""(\s*)(
    [A-Za-z_][A-Za-z0-9_]*(?![A-Za-z0-9_'"])
  | \.\?|&&|\|\||==|!=|<=|>=|[-+*/%<>!?:,.()\[\]{}]
  | [bB]?'(?!'')(?:[^'\\\n\r]|\\.)*'|[bB]?"(?!"")(?:[^"\\\n\r]|\\.)*"
  | (?:[rR][bB]?|[bB][rR])(?:'(?!'')[^'\n\r]*'|"(?!"")[^"\n\r]*")
  | 0[xX][0-9a-fA-F]+[uU]?|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?[uU]?
)""", re.VERBOSE)

_CLOSING = {"(": ")", "[": "]", "{": "}"}
_UNSPACED = (".", ".?", ")", "]", "}")
# The operators a line may be cut before (after, for a comma), loosest first: at each level of an expression, the
# loosest that occurs there. ``?`` and ``:`` are a conditional's (a map key's ``:`` and an optional index's ``[?``
# are not).
_CLASSES = {",": 0, "?": 1, ":": 1, "||": 2, "&&": 3, "==": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4, "in": 4,
            "+": 5}


class _Token(NamedTuple):
    text: str
    spaced: bool  # written after white space
    start: int  # where it is in the expression on one line
    end: int


class _Group:
    """A bracketed part: its opening and closing tokens and what is between them."""

    __slots__ = ("open", "items", "close", "spaced", "start", "end")

    def __init__(self, open: _Token, items: list[_Token | _Group], close: _Token) -> None:
        self.open, self.items, self.close = open, items, close
        self.spaced, self.start, self.end = open.spaced, open.start, close.end


_Item = _Token | _Group


def tokens(expression: str) -> list[_Token]:
    """The CEL tokens of ``expression``, with whether white space came before each and where each is in the
    expression on one line (one space where there was any): what a layout may not change. Refuses what it cannot
    read, so a layout never guesses."""
    out: list[_Token] = []
    column = read = 0
    for space, text in _TOKEN.findall(expression):
        read += len(space) + len(text)
        # A line break where a layout cut after an opening bracket or before a member or a closing bracket stood
        # for no space: so one_line(layout(x)) is one_line(x).
        spaced = bool(space) and bool(out) and not (
            "\n" in space and (out[-1].text in _CLOSING or text in _UNSPACED))
        column += spaced
        out.append(_Token(text, spaced, column, column + len(text)))
        column += len(text)
    if read != len(expression.rstrip()):
        raise ValueError(f"cannot read CEL at {read}: {expression[read:read + 40]!r}")
    return out


def _tree(items: list[_Token]) -> list[_Item]:
    stack: list[tuple[_Token | None, list[_Item]]] = [(None, [])]
    for token in items:
        if token.text in _CLOSING:
            stack.append((token, []))
        elif token.text in ")]}":
            opened, inner = stack.pop()
            if opened is None or _CLOSING[opened.text] != token.text:
                raise ValueError(f"unbalanced {token.text!r}")
            stack[-1][1].append(_Group(opened, inner, token))
        else:
            stack[-1][1].append(token)
    if len(stack) != 1:
        raise ValueError("unbalanced brackets")
    return stack[0][1]


class _Layout:
    """One expression laid out: ``line`` is the expression on one line, which every item's ``start`` and ``end``
    point into."""

    def __init__(self, line: str, width: int) -> None:
        self.line, self.width = line, width

    def text(self, items: Sequence[_Item]) -> str:
        return self.line[items[0].start:items[-1].end] if items else ""

    def block(self, items: list[_Item], indent: int, inside: str = "") -> list[str]:
        """``items`` as lines at ``indent``: on one line when they fit, else cut at the loosest operator of their
        level (:meth:`operands`); what has no operator to cut at is cut inside its brackets (:meth:`chain`)."""
        if indent + items[-1].end - items[0].start <= self.width:
            return [" " * indent + self.text(items)]
        parts, ops = _split(items, inside)
        if not ops:
            return self.chain(items, indent)
        return self.operands(parts, ops, indent)

    def operands(self, parts: list[list[_Item]], ops: list[str], indent: int) -> list[str]:
        """Operands one below the other, each after its operator (``&& x``, ``? a``, ``: b``), or followed by its
        comma."""
        if ops and ops[0] == "+":
            return self.filled(parts, indent)
        out = self.block(parts[0], indent)
        for op, part in zip(ops, parts[1:], strict=True):
            if op == ",":
                out[-1] += ","
                out += self.block(part, indent)
            else:
                lead = len(op) + 1
                lines = self.block(part, indent + lead)
                lines[0] = " " * indent + op + " " + lines[0][indent + lead:]
                out += lines
        return out

    def filled(self, parts: list[list[_Item]], indent: int) -> list[str]:
        """A sum (a message built of strings, mostly) as text is: as many operands on a line as fit, each after its
        ``+``; one that fits on no line is laid out on lines of its own, one step in."""
        out: list[str] = []
        line = ""
        for n, part in enumerate(parts):
            piece = ("+ " if n else "") + self.text(part)
            if line and len(line) + 1 + len(piece) <= self.width:
                line += " " + piece
                continue
            if line:
                out.append(line)
            if indent + len(piece) <= self.width:
                line = " " * indent + piece
                continue
            lead = 2 if n else 0
            lines = self.block(part, indent + lead)
            if n:
                lines[0] = " " * indent + "+ " + lines[0][indent + lead:]
            out += lines
            line = ""
        if line:
            out.append(line)
        return out

    def chain(self, items: list[_Item], indent: int) -> list[str]:
        """Atoms with no operator between them to cut at (``a.b(x).c[0]``, ``!(x)``). A group that does not fit is
        cut inside: a call's arguments go one step in below it, its leading variables (``exists(container,``) stay
        on its line; a parenthesis or list that starts the line keeps its first item beside it. The closing bracket ends
        the last line; a member that no longer fits after it starts a line where the chain started."""
        out: list[str] = []
        line = " " * indent
        for n, item in enumerate(items):
            space = " " if item.spaced and len(line) > indent else ""
            if isinstance(item, _Token):
                if item.text in (".", ".?") and len(line) > indent and len(line) + _head(items, n) > self.width:
                    out.append(line)
                    line, space = " " * indent, ""
                line += space + item.text
                continue
            following = next((m for m in range(n + 1, len(items)) if isinstance(items[m], _Group)), len(items))
            tail = items[following - 1].end - item.end
            if len(line) + len(space) + item.end - item.start + tail <= self.width or not item.items:
                line += space + self.line[item.start:item.end]
                continue
            opening = item.open.text
            if len(line) == indent:
                column = indent + len(opening)
                inner = self.block(item.items, column, opening)
                inner[0] = line + opening + inner[0][column:]
            else:
                parts, ops = _split(item.items, opening)
                head = 0
                if ops and ops[0] == ",":
                    while head < len(parts) - 1 and _is_word(parts[head]):
                        head += 1
                words = "".join(f" {p[0].text}," for p in parts[:head])  # type: ignore[union-attr]
                out.append(line + space + opening + words.lstrip())
                inner = (self.operands(parts[head:], ops[head:], indent + INDENT) if ops
                         else self.block(item.items, indent + INDENT, opening))
            inner[-1] += item.close.text
            out += inner[:-1]
            line = inner[-1]
        out.append(line)
        return out


def _split(items: list[_Item], inside: str) -> tuple[list[list[_Item]], list[str]]:
    """``items`` cut at the loosest operator of their level: (operands, operators), or ([items], []) when there is
    none."""
    cuts: list[tuple[int, int]] = []  # (class, position)
    pending = 0  # conditionals whose ':' is still to come
    for n, item in enumerate(items):
        if not isinstance(item, _Token) or item.text not in _CLASSES:
            continue
        text = item.text
        if text == "?":
            if n == 0 and inside == "[":  # [?key]: an optional index
                continue
            pending += 1
        elif text == ":":
            if not pending:  # a map key's
                continue
            pending -= 1
        if n:
            cuts.append((_CLASSES[text], n))
    if not cuts:
        return [items], []
    loosest = min(c for c, _ in cuts)
    at = [n for c, n in cuts if c == loosest]
    parts = [items[a + 1:b] for a, b in zip([-1, *at], [*at, len(items)], strict=True)]
    ops = [items[n].text for n in at]  # type: ignore[union-attr]
    if any(not p for p in parts):  # an operator with nothing after it: not one to cut at
        return [items], []
    return parts, ops


def _head(items: list[_Item], n: int) -> int:
    """The width of ``items[n:]`` up to their first group, and its opening bracket (``.map(``)."""
    group = next((m for m in range(n, len(items)) if isinstance(items[m], _Group)), None)
    if group is None:
        return items[-1].end - items[n].start
    return items[group].start + 1 - items[n].start


def _is_word(part: list[_Item]) -> bool:
    return len(part) == 1 and isinstance(part[0], _Token) and part[0].text[:1].isalpha()


def layout(expression: str) -> str:
    """``expression`` on lines of at most :data:`WIDTH` characters where it can be cut (a long string literal
    cannot): the same tokens, only the white space between them changed, so it evaluates the same. Short
    expressions stay on one line."""
    if len(expression) <= WIDTH and "\n" not in expression:
        return expression
    return _layout(expression, WIDTH)


# Generating for several targets or policies in one process (the chart's helpers, the tests) meets the same
# expressions again: each is laid out once.
@lru_cache(maxsize=4096)
def _layout(expression: str, width: int) -> str:
    found = tokens(expression)
    text = one_line(expression, found)
    return "\n".join(line.rstrip() for line in _Layout(text, width).block(_tree(found), 0))


def one_line(expression: str, found: Sequence[_Token] | None = None) -> str:
    """``expression`` on one line: the inverse of :func:`layout` (the same tokens, one space where there was any)."""
    return "".join((" " if t.spaced else "") + t.text for t in (tokens(expression) if found is None else found))
