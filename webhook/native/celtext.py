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
from collections.abc import Callable, Iterable, Sequence

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


_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def _escape(char: str) -> str:
    return "\\" + char if char in _RE2_SPECIAL else char


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


def all_policies(policies: PolicySet) -> list[Policy]:
    return [policies.default, *(policies.by_namespace[n] for n in sorted(policies.by_namespace))]


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
