"""A rule's violations as data, and the CEL forms a policy needs of them.

A :class:`Finding` says where a rule looks (nested loops over the object: templates, container lists,
containers, resource names...), what must hold there for a violation, and how the webhook words it (path,
stable path, value, message: ``webhook.core.field.Violation``). The generator renders each finding once, as
:func:`hits`: its violations in a list of templates (or claim requests), each as its key and its words, joined by
a separator. A policy holds one such variable per rule, over the object and, on UPDATE, the old object: the rule
holds when the object has a hit, and its message gives the words of the hits whose key the old object did not have
(:func:`new_words`; the same rule, stable path and value, as ``webhook.rules.admission.decide`` compares them).

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
        return f"{lit(self.rule + '|')} + {self.stable} + '|' + ({self.value})"


@dataclass(frozen=True)
class Dialect:
    """What the target's CEL offers the renderer beyond the 1.30 floor."""

    two_variable: bool = False


# Roots: the variable every finding starts from, and the same for the old object of an UPDATE.
OLD_ROOTS = {"variables.templates": "variables.old_templates", "variables.requests": "variables.old_requests"}
UPDATE = "variables.update"
# Between a hit's key and its words (no key holds one: it is taken out of them, as the separator is).
KEY_END = "\u001e"


def variable(rule: str) -> str:
    """The name of a rule's variable in a policy (``invalid-quantity`` -> ``invalid_quantity``)."""
    return re.sub(r"[^A-Za-z0-9]", "_", rule)


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


def _bind(lets: Sequence[tuple[str, str]], body: str, boolean: bool) -> str:
    """``body`` with the ``lets`` it mentions bound (directly or through another's value), innermost last."""
    reads = ""
    for name, value in reversed(lets):
        if _mentions(body, name) or _mentions(reads, name):
            body = f"[{value}].exists({name}, {body})" if boolean else f"[{value}].map({name}, {body})[0]"
            reads = reads + " " + value
    return body


def _with_index(e: Each, dialect: Dialect, body: str, boolean_filter: str) -> str:
    """``e.over`` mapped to ``body`` (reading ``e.var`` and ``e.index``), items passing ``boolean_filter``."""
    keep = "" if boolean_filter == "true" else boolean_filter
    if not e.index or not _mentions(body, e.index):
        if keep:
            return f"{e.over}.filter({e.var}, {keep}).map({e.var}, {body})"
        return f"{e.over}.map({e.var}, {body})"
    if dialect.two_variable:
        if keep:
            return f"{e.over}.transformList({e.index}, {e.var}, {keep}, {body})"
        return f"{e.over}.transformList({e.index}, {e.var}, {body})"
    indexed = f"[{e.over}.indexOf({e.var})].map({e.index}, {body})[0]"
    if keep:
        return f"{e.over}.filter({e.var}, {keep}).map({e.var}, {indexed})"
    return f"{e.over}.map({e.var}, {indexed})"


def joined(items: str) -> str:
    """A CEL list of strings, the empty ones left out, joined by the separator."""
    return f"{items}.filter(hit, hit != '').join({lit(SEPARATOR)})"


def _gather(f: Finding, loops: Sequence[Each], dialect: Dialect, text: str) -> str:
    """``text`` of every violation, joined by the separator. The innermost loop keeps only the items where ``f.where``
    holds, so an object that passes pays for the tests alone; where the test and the words read one name of
    ``f.let``, each item is mapped to its words or ``''``, so that the name is bound once."""
    first, rest = loops[0], loops[1:]
    if rest:
        return joined(_with_index(first, dialect, _gather(f, rest, dialect, text), first.where))
    if not f.where:
        return joined(_with_index(first, dialect, _bind(f.let, text, boolean=False), first.where))
    tested = _needed(f.let, f.where)
    if not tested & _needed(f.let, text):
        test = _bind(f.let, f.where, boolean=True)
        return joined(_with_index(first, dialect, _bind(f.let, text, boolean=False), _and(first.where, test)))
    inner = _bind([(n, v) for n, v in f.let if n not in tested], text, boolean=False)
    leaf = _bind([(n, v) for n, v in f.let if n in tested], f"({f.where} ? {inner} : '')", boolean=False)
    return joined(_with_index(first, dialect, leaf, first.where))


def _needed(lets: Sequence[tuple[str, str]], text: str) -> set[str]:
    """The names of ``lets`` that ``text`` reads, directly or through another name's value."""
    needed: set[str] = set()
    reads = text
    for name, value in reversed(lets):
        if _mentions(reads, name):
            needed.add(name)
            reads += " " + value
    return needed


def hits(f: Finding, dialect: Dialect, root: str) -> str:
    """The violations in ``root`` (the templates or requests, of the object or of an UPDATE's old object), each
    ``key KEY_END path: message`` (:attr:`Finding.key`; the words as the webhook prints them), joined by the
    separator; ``''``: none."""
    first = f.loops[0]
    if first.over not in OLD_ROOTS:
        raise ValueError(f"{f.rule}: a finding starts from one of {sorted(OLD_ROOTS)}, not {first.over}")
    loops = (Each(first.var, root, first.where, first.index), *f.loops[1:])
    key = f"({f.key}).replace({lit(SEPARATOR)}, '').replace({lit(KEY_END)}, '')"
    text = f"{key} + {lit(KEY_END)} + {f.path} + ': ' + {f.message}"
    if len(f.value) > _SHORT and f.value in f.message and not _mentions(text, _VALUE):
        # the value is worded in the message too: computed once
        text = f"[{f.value}].map({_VALUE}, {text.replace(f.value, _VALUE)})[0]"
    return _gather(f, loops, dialect, text)


# A value longer than this, read in the message too, is bound to _VALUE once.
_SHORT = 24
_VALUE = "said"


def new_words(found: str, old: str) -> str:
    """The words of the hits in ``found`` (joined by the separator), without those whose key is in ``old`` (an
    UPDATE's old object's hits, ``''`` otherwise)."""
    end = f"hit.indexOf({lit(KEY_END)})"
    kept = f"!({lit(SEPARATOR)} + {old}).contains({lit(SEPARATOR)} + hit.substring(0, {end} + 1))"
    return joined(f"{found}.split({lit(SEPARATOR)}).filter(hit, {kept}).map(hit, hit.substring({end} + 1))")


__all__ = ["KEY_END", "OLD_ROOTS", "SEPARATOR", "Dialect", "Each", "Finding", "hits", "joined", "new_words",
           "variable"]
