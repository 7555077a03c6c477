"""CEL fragments the rule builders share: GPU names, quantities, the wording of values, field reads.

Each fragment takes the CEL text of its operands, which must be plain identifiers or cheap field reads:
a fragment may read an operand several times.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from webhook.core import quantity
from webhook.core.policy import IMPLICIT_PREFIX, Policy, PolicySet
from webhook.core.resources import REGISTRY, Kind
from webhook.native.celtext import (
    GLOB_META,
    RE2_SPECIAL,
    by_namespace,
    every_policy,
    glob_to_regex,
    globs_regex,
    lit,
    matches,
    patterns_regex,
)

CEILING = quantity.CEILING
MAX_LENGTH = quantity.MAX_LENGTH
MAX_EXPONENT = quantity.MAX_EXPONENT

# The apimachinery grammar as webhook.core.quantity holds strings to it before parsing (RE2 reads it alike).
QUANTITY_GRAMMAR = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
EXPONENT = r"[eE][+-]?[0-9]+$"
# A template's placeholder never substituted, as webhook.core.quantity tells it from other strings.
PLACEHOLDER = "^(?:" + quantity.PLACEHOLDER + ")$"


def _at_most(n: int) -> str:
    """An RE2 alternation of the decimal numbers 0..n (n < 100), leading zeros allowed before it."""
    assert 0 <= n < 100
    tens, units = divmod(n, 10)
    parts = ["[0-9]"] if n >= 9 else [f"[0-{n}]"]
    if tens >= 2:
        parts.append(f"[1-{tens - 1}][0-9]")
    elif tens == 1 and n >= 19:
        parts.append("1[0-9]")
    if tens >= 1:
        parts.append(f"{tens}[0-{units}]")
    return "(?:" + "|".join(parts) + ")"


SENSIBLE_EXPONENT = r"[eE][+-]?0*" + _at_most(MAX_EXPONENT) + "$"


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Shape:
    """How fields are read. ``typed``: objects of a built-in kind, which the apiserver decoded into its types, so
    every field has its schema's type (an absent one is absent): an optional read is enough. Otherwise
    (custom resources) any field may hold any JSON value, and every read checks the type it needs."""

    typed: bool

    def get(self, parent: str, key: str, kind: str, default: str) -> str:
        """``parent.key`` when present (and, untyped, of CEL type ``kind``), else ``default``."""
        if self.typed:
            field = f".?{key}" if _IDENTIFIER.fullmatch(key) else f"[?{lit(key)}]"
            return f"{parent}{field}.orValue({default})"
        return guarded(parent, key, kind, default)

    def path(self, parent: str, keys: str, kind: str, default: str) -> str:
        """``parent.a.b.c`` (``keys`` dot-separated, each level a map) when present, else ``default``."""
        *maps, last = keys.split(".")
        if self.typed:
            return f"{parent}{''.join(f'.?{k}' for k in keys.split('.'))}.orValue({default})"
        for k in maps:
            parent = guarded(parent, k, "map", "{}")
        return guarded(parent, last, kind, default)

    def is_map(self, value: str) -> str:
        return "" if self.typed else f"type({value}) == map"

    def is_string(self, value: str) -> str:
        return "" if self.typed else f"type({value}) == string"


@dataclass(frozen=True)
class Ctx:
    """What a builder writes against: the policies, the shape of the objects (built-in or custom kinds) and the
    target's CEL (``two_variable``: two-variable comprehensions; ``lists``: flatten, slice, sort)."""

    policies: PolicySet
    shape: Shape = Shape(typed=False)
    two_variable: bool = True
    lists: bool = True
    # nativePolicies.params live: the values of webhook.native.params.LIVE are read from GPUPolicy/default through
    # params at each admission, not written from ``policies``
    live: bool = False

    def v(self, name: str) -> str:
        return f"variables.{name}"

    @property
    def policy(self) -> Policy:
        return self.policies.default

    def ns(self, text, live: str | None = None) -> str:  # type: ignore[no-untyped-def]
        """``text(policy)`` of the policy in force in the request's namespace, as literals; live, the CEL ``live``
        that reads it through params."""
        if self.live:
            if live is None:
                raise ValueError("a value read per namespace needs its live CEL (webhook.native.params)")
            return live
        return by_namespace(self.policies, text)

    def compiled(self, text) -> str:  # type: ignore[no-untyped-def]
        """``text(policy)`` as literals in both modes: a key of ``webhook.native.params.COMPILED``."""
        return by_namespace(self.policies, text)

    def any(self, test) -> bool:  # type: ignore[no-untyped-def]
        """Whether ``test(policy)`` holds in some namespace; live, always (an edit may make it so)."""
        return self.live or any(test(p) for p in every_policy(self.policies))


# --- the vendor registry and the policy's GPU names ----------------------------------------------------------


def registry_regex(select) -> str:  # type: ignore[no-untyped-def]
    return patterns_regex([e.pattern for e in REGISTRY if select(e)])


REGISTERED = registry_regex(lambda e: True)
COUNTING_REGISTERED = registry_regex(lambda e: e.kind.counts)
PRIORITY = registry_regex(lambda e: e.kind is Kind.PRIORITY)
SCHEDULER = registry_regex(lambda e: bool(e.scheduler) and e.kind is not Kind.PRIORITY)
SHARED = registry_regex(lambda e: e.kind is Kind.SHARED)
MONITORING = registry_regex(lambda e: e.kind is Kind.MONITORING)
PERCENT = registry_regex(lambda e: e.percent)
READ_BY_SHARING = registry_regex(lambda e: e.kind in (Kind.SHARED, Kind.MONITORING) or bool(e.scheduler))


def names_gpu(ctx: Ctx, key: str) -> str:
    """The name matches ``policy.resources`` (globs), whatever it counts."""
    return matches(key, globs_regex(ctx.policy.resources))


def implicit_gpu(ctx: Ctx, key: str) -> str:
    """``deviceclass.resource.kubernetes.io/<class>`` of a ``dra.gpuClasses`` class."""
    classes = ctx.policy.gpu_classes
    if not classes:
        return "false"
    prefix = "".join("\\" + c if c in RE2_SPECIAL else c for c in IMPLICIT_PREFIX)
    return matches(key, f"^{prefix}(?:" + "|".join(glob_to_regex(g) for g in classes) + ")$")


def _literal_prefix(pattern: str) -> str:
    """What every string a registry ``pattern`` (RE2, matched whole) matches starts with: its characters up to the
    first that is not plain, less one that a quantifier makes optional; ``""`` for a top-level alternation."""
    depth, i = 0, 0
    while i < len(pattern):
        depth += {"(": 1, ")": -1}.get(pattern[i], 0) if pattern[i - 1:i] != "\\" else 0
        if pattern[i] == "|" and depth == 0:
            return ""
        i += 1
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            out.append(pattern[i + 1])
            i += 2
        elif char in RE2_SPECIAL:
            if char in "?*{" and out:
                out.pop()
            break
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _may_meet(glob: str, pattern: str) -> bool:
    """Whether some name matches both the fnmatch ``glob`` and the registry ``pattern``: exactly for a glob without
    wildcards, else by their literal prefixes (never False for names they share)."""
    if not any(c in glob for c in GLOB_META):
        return re.fullmatch(pattern, glob) is not None
    head = re.split("[" + re.escape(GLOB_META) + "]", glob, maxsplit=1)[0]
    fixed = _literal_prefix(pattern)
    return head.startswith(fixed) or fixed.startswith(head)


def not_counting(ctx: Ctx) -> str:
    """The registry's names that count no devices, less those no glob of ``policy.resources`` can name: what
    :func:`is_gpu` must leave out of ``resources`` (the same answers, a regex a tenth as long)."""
    return _not_counting(tuple(ctx.policy.resources))


@lru_cache(maxsize=64)
def _not_counting(resources: tuple[str, ...]) -> str:
    return patterns_regex([e.pattern for e in REGISTRY if not e.kind.counts
                           and any(_may_meet(g, e.pattern) for g in resources)])


def is_gpu(ctx: Ctx, key: str) -> str:
    """``Policy.is_gpu``: listed in ``resources`` and a count by the registry, or a GPU class's implicit name."""
    left_out = not_counting(ctx)
    named = (names_gpu(ctx, key) if left_out == patterns_regex([])
             else f"{names_gpu(ctx, key)} && !{matches(key, left_out)}")
    return f"(({named}) || {implicit_gpu(ctx, key)})"


def holds_name(ctx: Ctx, key: str) -> str:
    """A name ``context.container_gpus`` counts as holding a GPU of some kind (not HAMi's priority)."""
    return (f"({matches(key, REGISTERED)} ? !{matches(key, PRIORITY)} : "
            f"({names_gpu(ctx, key)} || {implicit_gpu(ctx, key)}))")


def zero_counting(ctx: Ctx, key: str) -> str:
    """A name ``zero-gpu-limit`` reads: a policy GPU, or a registered name that counts devices."""
    return f"({is_gpu(ctx, key)} || {matches(key, COUNTING_REGISTERED)})"


def holds_gpu(held: Callable[[str], tuple[str, str]], claims: str) -> str:
    """``context.container_gpus``: a container holds a GPU of some kind: a name ``name`` of its limits or requests that
    holds one and is not a valid 0 (``held(section)``: the section's map and that test), or a claim (``claims``: the
    container's list of them)."""
    tests = [f"{values}.exists(name, {test})" for values, test in map(held, ("limits", "requests"))]
    return f"({' || '.join(tests)} || size({claims}) > 0)"


def service_account(shape: Shape, spec: str) -> str:
    """The service account of the pod spec ``spec``: ``serviceAccountName``, else ``serviceAccount``, else
    ``default``."""
    if shape.typed:
        return (f"({spec}.?serviceAccountName.orValue('') != '' ? {spec}.serviceAccountName : "
                f"{spec}.?serviceAccount.orValue('') != '' ? {spec}.serviceAccount : 'default')")
    name = f"{spec}.serviceAccountName"
    first = f"('serviceAccountName' in {spec} && type({name}) == string && {name} != '')"
    second = f"('serviceAccount' in {spec} && type({spec}.serviceAccount) == string && {spec}.serviceAccount != '')"
    return f"({first} ? {spec}.serviceAccountName : {second} ? {spec}.serviceAccount : 'default')"


# The toleration keys of the templates (the object's and an UPDATE's old object's) that name a GPU (taint_names),
# one list per template.
GPU_TAINT_KEYS = "variables.gpu_taint_keys"


def taint_names(ctx: Ctx, key: str) -> str:
    """A toleration key that is a GPU's name (``Policy.tolerates_gpu_taint``: ``is_gpu`` or registered; the
    registered names ``is_gpu`` leaves out are registered, so any name of ``resources`` will do)."""
    parts = [names_gpu(ctx, key), matches(key, REGISTERED)] + [t for t in [implicit_gpu(ctx, key)] if t != "false"]
    return "(" + " || ".join(parts) + ")"


def tolerates_gpu_taint(ctx: Ctx, t: str) -> str:
    """``Policy.tolerates_gpu_taint`` on the toleration ``t`` (a map) of the object's or the old object's
    templates: its key is in :data:`GPU_TAINT_KEYS`, classified once per request, or it tolerates a ``gpuTaints``
    taint."""
    key = f"{t}.key"
    parts = [f"{GPU_TAINT_KEYS}.exists(keys, {key} in keys)"]
    for taint in ctx.policy.gpu_taints:
        effect = (f"(!has({t}.effect) || {t}.effect == '' || {t}.effect == {lit(taint.effect)})" if taint.effect
                  else "true")
        operator = f"(has({t}.operator) && {t}.operator != '' ? {t}.operator : 'Equal')"
        value = (f"({operator} == 'Exists' || (has({t}.value) && {t}.value == {lit(taint.value)}))"
                 if taint.value is not None else f"{operator} == 'Exists'")
        parts.append(f"({effect} && {key} == {lit(taint.key)} && {value})")
    return f"(has({t}.key) && type({t}.key) == string && {t}.key != '' && ({' || '.join(parts)}))"


# --- values as the webhook words them ----------------------------------------------------------------------


def escaped(s: str) -> str:
    """A string's characters as JSON would write them inside quotes (the ones that matter on one line)."""
    return (f"{s}.replace('\\\\', '\\\\\\\\').replace('\"', '\\\\\"').replace('\\n', '\\\\n')"
            f".replace('\\r', '\\\\r').replace('\\t', '\\\\t')")


def quoted(v: str) -> str:
    """``webhook.core.quantity.quoted``: strings in double quotes, ``true``/``false``/``null`` as JSON spells
    them, numbers as they are."""
    return (f"(type({v}) == string ? '\"' + {escaped(v)} + '\"' : {plain(v)})")


def plain(v: str) -> str:
    """A scalar as JSON spells it (strings unquoted); a short stand-in for lists and maps."""
    return (f"(type({v}) == string ? {v} : type({v}) == null_type ? 'null' : type({v}) == bool || type({v}) == int "
            f"|| type({v}) == uint || type({v}) == double ? string({v}) : type({v}) == list ? '[…]' : '{{…}}')")


def shown(v: str, quantity: bool = False) -> str:
    """``webhook.core.quantity.shown``: ``quoted``, long strings cut to 16 characters and their length.
    ``quantity``: ``v`` is a quantity the apiserver decoded, a string of characters that need no escape."""
    if quantity:
        return f"(size({v}) > {MAX_LENGTH} ? '\"' + {v}.substring(0, 16) + '…\" (' + string(size({v})) + " \
               f"' characters)' : '\"' + {v} + '\"')"
    return (f"(type({v}) == string && size({v}) > {MAX_LENGTH} ? '\"' + {escaped(v + '.substring(0, 16)')} + "
            f"'…\" (' + string(size({v})) + ' characters)' : {quoted(v)})")


def about(v: str, quantity: bool = False) -> str:
    """``webhook.rules.pods.about``: a string as written, anything else ``shown``."""
    return v if quantity else f"(type({v}) == string ? {v} : {shown(v)})"


def type_name(v: str) -> str:
    """Python's ``type(value).__name__`` for what JSON decodes to."""
    return (f"(type({v}) == string ? 'str' : type({v}) == list ? 'list' : type({v}) == map ? 'dict' : "
            f"type({v}) == bool ? 'bool' : type({v}) == double ? 'float' : type({v}) == null_type ? 'NoneType' : "
            f"'int')")


# --- quantities (webhook.core.quantity.gpu_count) -------------------------------------------------------------

NOT_SENSIBLE = f" is not a sensible GPU count (at most {CEILING})"
NOT_A_QUANTITY = " is not a quantity"
PLACEHOLDER_LEFT = " is a placeholder that was never substituted; render the manifest first"
NEGATIVE = " is negative (GPU counts are zero or more)"
NOT_WHOLE = " is not a whole number (GPUs cannot be shared)"

# The usual spelling (what a Pod's quantities are canonicalised to): a whole count of at most 6 digits.
DIGITS = "^[0-9]{1,6}$"


def quantity_reason(v: str, typed: bool = False) -> str:
    """What ``gpu_count`` finds wrong with the value ``v`` (not a string of it), as the end of its message (``' is
    not a quantity'``...), or ``''`` when it is a count. ``typed``: a quantity the apiserver decoded (Pods and
    built-in workloads), which is canonical, whole and not negative, so only its size can be wrong."""
    ceiling = f"quantity('{CEILING}')"
    if typed:
        return f"({matches(v, DIGITS)} || !quantity({v}).isGreaterThan({ceiling}) ? '' : {lit(NOT_SENSIBLE)})"
    string = (
        f"{matches(v, DIGITS)} ? '' : size({v}) > {MAX_LENGTH} ? {lit(NOT_SENSIBLE)} : "
        f"!{matches(v, QUANTITY_GRAMMAR)} ? "
        f"({matches(v, PLACEHOLDER)} ? {lit(PLACEHOLDER_LEFT)} : {lit(NOT_A_QUANTITY)}) : "
        f"{matches(v, EXPONENT)} && !{matches(v, SENSIBLE_EXPONENT)} ? {lit(NOT_SENSIBLE)} : "
        f"!isQuantity({v}) ? {lit(NOT_A_QUANTITY)} : "
        f"[quantity({v})].map(amount, sign(amount) < 0 ? {lit(NEGATIVE)} : "
        f"amount.isGreaterThan({ceiling}) ? {lit(NOT_SENSIBLE)} : "
        # isInteger() is false for 1000m (it gives up on negative scales): compare with the rounded value instead,
        # bounded above so the rounding is exact.
        f"amount.compareTo(quantity(string(int(amount.asApproximateFloat() + 0.5)))) != 0 ? {lit(NOT_WHOLE)} : '')[0]"
    )
    return (
        f"(type({v}) == string ? ({string}) : "
        f"type({v}) == int ? ({v} > {CEILING} || {v} < -{CEILING} ? {lit(NOT_SENSIBLE)} : {v} < 0 ? {lit(NEGATIVE)} : "
        f"'') : "
        f"type({v}) == double ? ({v} < 0.0 ? {lit(NEGATIVE)} : {v} > {CEILING}.0 ? {lit(NOT_SENSIBLE)} : "
        f"double(int({v})) != {v} ? {lit(NOT_WHOLE)} : '') : {lit(NOT_A_QUANTITY)})"
    )


def quantity_error(v: str, typed: bool = False) -> str:
    """The message ``gpu_count`` raises for ``v`` (the value itself, not a string of it), or ``''``: the value as
    ``shown`` words it, then what is wrong."""
    return f"[{quantity_reason(v, typed)}].map(reason, reason == '' ? '' : {shown(v, typed)} + reason)[0]"


def count(v: str) -> str:
    """The GPU count of ``v``; only where ``quantity_error(v)`` is empty."""
    parsed = f"int(quantity({v}).asApproximateFloat() + 0.5)"
    return (f"(type({v}) == string ? ({matches(v, DIGITS)} ? int({v}) : {parsed}) : "
            f"type({v}) == int ? int({v}) : int({v}))")


def is_zero(v: str, typed: bool = False) -> str:
    """``v`` is a valid count of 0 (``context.Named.nonzero`` is its negation). ``typed``: a quantity the apiserver
    decoded, whose canonical zero is ``0``."""
    if typed:
        return f"({v} == '0')"
    if not _PLAIN.fullmatch(v):
        return f"[{v}].exists(value, {is_zero('value')})"
    return (f"(type({v}) == int ? {v} == 0 : type({v}) == double ? {v} == 0.0 : type({v}) == string ? "
            f"(size({v}) <= {MAX_LENGTH} && {matches(v, QUANTITY_GRAMMAR)} && "
            f"(!{matches(v, EXPONENT)} || {matches(v, SENSIBLE_EXPONENT)}) && isQuantity({v}) && "
            f"sign(quantity({v})) == 0) : false)")


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]+\])*")


def guarded(parent: str, key: str, kind: str, default: str) -> str:
    """``parent[key]`` when ``parent`` is a map holding ``key`` of CEL type ``kind``, else ``default``.

    A ``parent`` that is more than a field read is evaluated once (bound by a one-element list), so guards can
    nest without the text, or the cost, growing with every level.
    """
    if not _PLAIN.fullmatch(parent):
        return f"[{parent}].map(parent, {guarded('parent', key, kind, default)})[0]"
    value = f"{parent}[{lit(key)}]"
    return f"(type({parent}) == map && {lit(key)} in {parent} && type({value}) == {kind} ? {value} : {default})"


def ranked(values: str, field: str = "") -> str:
    """The distinct ``values`` in order (of their ``field`` when given) without sortBy() or sort(), which the oldest
    targets lack: at each position, the value whose rank (how many are smaller) is that position."""
    smaller, candidate = (f"smaller.{field}", f"candidate.{field}") if field else ("smaller", "candidate")
    return (f"[{values}].map(values, values.map(item, values.filter(candidate, size(values.filter(smaller, "
            f"{smaller} < {candidate})) == values.indexOf(item))[0]))[0]")


def stable_item(path: str, index: str, item: str, by: str) -> str:
    """``FieldPath.item``: ``[by=name]`` when the item names itself, ``[i]`` otherwise."""
    return (f"(type({item}) == map && {lit(by)} in {item} && type({item}[{lit(by)}]) == string && "
            f"{item}[{lit(by)}] != '' ? {path} + '[{by}=' + {item}[{lit(by)}] + ']' : "
            f"{path} + '[' + string({index}) + ']')")


__all__ = [
    "Ctx", "about", "count", "guarded", "holds_name", "implicit_gpu", "is_gpu", "is_zero", "names_gpu",
    "quantity_error", "quoted", "shown", "stable_item", "taint_names", "tolerates_gpu_taint", "type_name",
    "zero_counting", "Policy",
]
