"""A rule's violations as data, and the CEL forms a policy needs of them.

A :class:`Finding` says where a rule looks (nested loops over the object: templates, container lists,
containers, resource names...), what must hold there for a violation, and how the webhook words it (path,
stable path, value, message: ``webhook.core.field.Violation``). The generator renders each finding into:

- :func:`exists`: whether the object has such a violation, stopping at the first. A validation's
  ``expression`` is made of these, so an object that passes pays only for the cheap tests;
- :func:`found`: its violations as the webhook prints them (``path: message``), joined by a separator,
  without those an UPDATE's old object had too;
- :func:`keys`: what the old object's violations are about, for an UPDATE.

On UPDATE a violation the old object had too (same rule, same stable path, same value, as
``webhook.rules.admission.decide`` compares them) is not held against it: each rule's ``<rule>_old_keys`` variable
holds the old object's keys, read only when the object has such a violation on an UPDATE.

The forms are written for the CEL every apiserver from 1.30 accepts: ``exists``, ``filter``, ``map``,
``join``. Where a :class:`Dialect` has two-variable comprehensions (1.33+), the index of a list item in a
message comes from ``transformList``; before, from ``indexOf``, which is exact except for two identical items
of one list (both then report the first one's index; the verdict is the same).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from webhook.native.celtext import lit

# Between violations inside a variable (the unit separator: no message or key of ours holds one; a value that holds
# one loses it in the key). Messages show "; " instead, as webhook.rules.admission.describe joins violations.
SEPARATOR = "\u001f"


@dataclass(frozen=True)
class Each:
    """A loop: ``var`` over the CEL list or map ``over`` (a map's keys), items where ``where`` holds; ``index``
    names the item's position, for paths and messages only."""

    var: str
    over: str
    where: str = ""
    index: str = ""


@dataclass(frozen=True)
class Finding:
    """One shape of violation of one rule."""

    rule: str
    loops: tuple[Each, ...]
    where: str  # at the innermost level: a violation when true
    path: str  # CEL string expressions, as the webhook writes them
    stable: str
    value: str
    message: str
    let: tuple[tuple[str, str], ...] = ()  # (name, CEL) bound at the innermost level, before ``where``

    def __post_init__(self) -> None:
        # An index is known only on the way to a message: a condition that read one could not be rendered as exists.
        indices = [e.index for e in self.loops if e.index]
        conditions = " ".join([e.where for e in self.loops] + [self.where] + [v for _, v in self.let])
        for name in indices:
            if _mentions(conditions, name):
                raise ValueError(f"{self.rule}: the index {name!r} is read by a condition")

    @property
    def key(self) -> str:
        """What the violation is about (``Violation.subject``), as one CEL string."""
        return f"{lit(self.rule + '|')} + {self.stable} + '|' + ({self.value}).replace({lit(SEPARATOR)}, '')"


@dataclass(frozen=True)
class Dialect:
    """What the target's CEL offers the renderer beyond the 1.30 floor."""

    two_variable: bool = False


# Roots: the variable every finding starts from, and the same for the old object of an UPDATE.
OLD_ROOTS = {"variables.templates": "variables.old_templates", "variables.requests": "variables.old_requests"}
UPDATE = "variables.update"


def variable(rule: str) -> str:
    """The name of a rule's variable in a policy (``invalid-quantity`` -> ``invalid_quantity``)."""
    return re.sub(r"[^A-Za-z0-9]", "_", rule)


def old_keys(rule: str) -> str:
    """The variable that holds the keys of the rule's violations in the old object of an UPDATE."""
    return f"variables.{variable(rule)}_old_keys"


_LITERALS = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')


def _mentions(text: str, name: str) -> bool:
    """``text`` reads the CEL identifier ``name`` (outside string literals, not as a field)."""
    code = _LITERALS.sub("''", text)
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", code) is not None


def _and(*parts: str) -> str:
    kept = [p for p in parts if p and p != "true"]
    if "false" in kept:
        return "false"
    return " && ".join(f"({p})" if " || " in p and not p.startswith("(") else p for p in kept) or "true"


def _bind(lets: Sequence[tuple[str, str]], body: str, reads: str, boolean: bool) -> str:
    """``body`` with the ``lets`` it (or ``reads``) mentions bound, innermost last."""
    for name, value in reversed(lets):
        if _mentions(body, name) or _mentions(reads, name):
            body = f"[{value}].exists({name}, {body})" if boolean else f"[{value}].map({name}, {body})[0]"
            reads = reads + " " + value
    return body


def _old(f: Finding) -> tuple[Each, ...]:
    first = f.loops[0]
    root = OLD_ROOTS.get(first.over)
    if root is None:
        raise ValueError(f"{f.rule}: a finding starts from one of {sorted(OLD_ROOTS)}, not {first.over}")
    return (Each(first.var, root, first.where, first.index), *f.loops[1:])


def _indexed(loops: Sequence[Each], body: str) -> str:
    """``body`` with the indices it reads bound by ``indexOf`` (only the UPDATE comparison reads one in a condition,
    for a list item that has no name)."""
    for e in reversed(loops):
        if e.index and _mentions(body, e.index):
            body = f"[{e.over}.indexOf({e.var})].exists({e.index}, {body})"
    return body


def _exists(loops: Sequence[Each], leaf: str) -> str:
    if not loops:
        return leaf
    first, rest = loops[0], loops[1:]
    return f"{first.over}.exists({first.var}, {_and(first.where, _exists(rest, leaf))})"


def excused(f: Finding) -> str:
    """On UPDATE, the old object had this violation too (read inside the innermost loop of ``f``, its names
    bound)."""
    test = f"{old_keys(f.rule)}.contains({lit(SEPARATOR)} + {f.key} + {lit(SEPARATOR)})"
    return f"({UPDATE} && {_indexed(f.loops, test)})"


def exists(f: Finding) -> str:
    """Whether the object has such a violation, excused or not (on UPDATE, :func:`found` says which are new)."""
    return _exists(f.loops, _bind(f.let, f.where, "", boolean=True) if f.where else "true")


def _with_index(e: Each, dialect: Dialect, body: str, boolean_filter: str = "") -> str:
    """``e.over`` mapped to ``body`` (reading ``e.var`` and ``e.index``), items passing ``boolean_filter``."""
    if not e.index or not _mentions(body, e.index):
        if boolean_filter:
            return f"{e.over}.filter({e.var}, {boolean_filter}).map({e.var}, {body})"
        return f"{e.over}.map({e.var}, {body})"
    if dialect.two_variable:
        if boolean_filter:
            return f"{e.over}.transformList({e.index}, {e.var}, {boolean_filter}, {body})"
        return f"{e.over}.transformList({e.index}, {e.var}, {body})"
    indexed = f"[{e.over}.indexOf({e.var})].map({e.index}, {body})[0]"
    if boolean_filter:
        return f"{e.over}.filter({e.var}, {boolean_filter}).map({e.var}, {indexed})"
    return f"{e.over}.map({e.var}, {indexed})"


def joined(items: str) -> str:
    """A CEL list of strings, the empty ones left out, joined by the separator."""
    return f"{items}.filter(s, s != '').join({lit(SEPARATOR)})"


def _collect(loops: Sequence[Each], leaf: str, dialect: Dialect) -> str:
    """The string ``leaf`` of every innermost item (``''`` where there is none), joined by the separator."""
    first, rest = loops[0], loops[1:]
    inner = leaf if not rest else _collect(rest, leaf, dialect)
    return joined(_with_index(first, dialect, inner, first.where))


def _needed(lets: Sequence[tuple[str, str]], text: str) -> set[str]:
    """The names of ``lets`` that ``text`` reads, directly or through another name's value."""
    needed: set[str] = set()
    reads = text
    for name, value in reversed(lets):
        if _mentions(reads, name):
            needed.add(name)
            reads += " " + value
    return needed


def _leaf(f: Finding, text: str, excusable: bool) -> str:
    """``text`` for a violation at the innermost level, ``''`` otherwise. The names the condition reads are bound
    first; the others (the words, the key) only once it holds."""
    needed = _needed(f.let, f.where)
    outer = [(n, v) for n, v in f.let if n in needed]
    inner = [(n, v) for n, v in f.let if n not in needed]
    said = f"({excused(f)} ? '' : {text})" if excusable else text
    body = _bind(inner, said, "", boolean=False)
    return _bind(outer, f"({f.where} ? {body} : '')" if f.where else body, "", boolean=False)


def found(f: Finding, dialect: Dialect) -> str:
    """The violations, ``path: message`` as the webhook prints them, joined by the separator (``''``: none),
    without those an UPDATE's old object had too."""
    return _collect(f.loops, _leaf(f, f"{f.path} + ': ' + {f.message}", excusable=True), dialect)


def keys(f: Finding, dialect: Dialect) -> str:
    """What the old object's violations are about (their keys), joined by the separator (:func:`old_keys`)."""
    return _collect(_old(f), _leaf(f, f.key, excusable=False), dialect)


__all__ = ["SEPARATOR", "Dialect", "Each", "Finding", "exists", "found", "joined", "keys", "old_keys", "variable"]
