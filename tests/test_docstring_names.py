"""The docstrings and comments of ``webhook/`` name what exists: every dotted name they quote that starts with a
module of the package (``core.podspecs.read_containers``, ``webhook.rules.admission.decide``, ``snippets.Shape``
from inside ``webhook.native``, ``Violation.subject`` inside its own module) resolves to a module or an attribute,
and every repository path they give (``tests/chart/sync_schema.py``) is a file. A quoted name that resolves to
nothing of the package may be a policy setting (``isolation.hideGpus``: a key of the policy's schema) or one of the
few Kubernetes fields in :data:`OUTSIDE`; a file name (``rules.md``) is no dotted name."""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from webhook.core.policyschema import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "webhook"
# Names quoted in the package that are not the package's though they start like one: Kubernetes' own fields and
# types.
OUTSIDE = {"resources.limits", "resources.requests", "resources.claims",
           "field.Path", "field.Error"}  # apimachinery's Go package field
# File names (``rules.md``, a Secret's ``tls.crt``) are not dotted names.
FILE_SUFFIXES = ("md", "py", "yaml", "json", "crt", "key", "pem", "tpl")
# Quoted code: ``x``, `x`, and Sphinx roles (:func:`~x.y`).
QUOTED = re.compile(r"``([^`\s]+)``|(?<![`\w]):?[a-z]*:?`~?([^`\s]+)`(?!`)")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PLAIN = re.compile(r"(?<![\w./-])webhook(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])(?:tests|docs|charts|bench|webhook|examples)/[\w./-]*[\w]"
                  r"\.(?:py|md|tpl|yaml|json|go|sh)\b")


@cache
def modules() -> dict[str, Path]:
    """The package's modules by name (``webhook.core.policy``), and where they are."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__main__.py":  # importing it runs the command line
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring and comment of a module."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                yield node.body[0].lineno, doc
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


@cache
def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _attribute(root: Any, names: list[str]) -> bool:
    for name in names:
        if isinstance(root, ModuleType) and _module(f"{root.__name__}.{name}") is not None:
            root = _module(f"{root.__name__}.{name}")
            continue
        annotations = getattr(root, "__annotations__", {}) if isinstance(root, type) else {}
        fields = getattr(root, "__dataclass_fields__", {}) or getattr(root, "_fields", ())
        if hasattr(root, name):
            root = getattr(root, name)
        elif name in annotations or name in fields or name in getattr(root, "__slots__", ()):
            return True  # an instance field: nothing further to resolve
        else:
            return False
    return True


def resolves(name: str, module: str) -> bool:
    """``name`` is a module of the package or an attribute of one, read from ``module``: absolute (``webhook.x``),
    from the package (``core.x``), from the module's own package (``snippets.x`` in ``webhook.native``), from a
    module known by its last name (``podspecs.x``), or in the module itself (``Violation.subject``)."""
    parts = name.split(".")
    package = module.rsplit(".", 1)[0]
    for base in ("", "webhook.", package + "."):
        for cut in range(len(parts), 0, -1):
            found = _module(base + ".".join(parts[:cut]))
            if found is not None and _attribute(found, parts[cut:]):
                return True
    for other in modules():
        if other.rsplit(".", 1)[-1] == parts[0] and _attribute(_module(other), parts[1:]):
            return True
        # An instance by its class's name: ``policy.is_gpu`` is Policy.is_gpu.
        found = getattr(_module(other), parts[0].capitalize(), None)
        if isinstance(found, type) and _attribute(found, parts[1:]):
            return True
    return _attribute(_module(module), parts)


def concerns_package(name: str, module: str) -> bool:
    """Whether ``name`` starts with what the package names: itself, a module or subpackage, or something defined
    at the top of ``module``."""
    first = name.split(".")[0]
    shorts = {m.rsplit(".", 1)[-1] for m in modules()} | {m.split(".")[1] for m in modules() if "." in m}
    own = _module(module)
    return first == "webhook" or first in shorts or (own is not None and first in vars(own)
                                                     and not isinstance(vars(own)[first], ModuleType))


def policy_setting(name: str) -> bool:
    """A key path of the policy's schema (``isolation.hideGpus``, ``checks.privilegedGpu``)."""
    node: Any = SCHEMA
    for part in name.split("."):
        properties = node.get("properties", {}) if isinstance(node, dict) else {}
        if part in properties:
            node = properties[part]
        elif isinstance(node, dict) and isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return False
    return True


def references() -> Iterator[tuple[str, int, str, str]]:
    """(module, line, kind, what) of every dotted name and repository path quoted in the package's prose."""
    for module, path in modules().items():
        for line, text in texts(path):
            names = {m.group(1) or m.group(2) for m in QUOTED.finditer(text)}
            names = {DOTTED.match(n).group() for n in names if DOTTED.match(n)} | set(PLAIN.findall(text))
            for name in sorted(names):
                yield module, line, "name", name
            for found in sorted(set(PATH.findall(text))):
                yield module, line, "path", found


def broken() -> list[str]:
    out = []
    for module, line, kind, what in references():
        where = f"{modules()[module].relative_to(ROOT)}:{line}"
        if kind == "path":
            if not (ROOT / what).exists():
                out.append(f"{where}: {what} is not a file of the repository")
        elif concerns_package(what, module) and what not in OUTSIDE and what.rsplit(".", 1)[-1] not in FILE_SUFFIXES \
                and not resolves(what, module) and not policy_setting(what):
            out.append(f"{where}: {what} names nothing of the package")
    return out


def test_docstrings_and_comments_name_what_exists():
    assert broken() == []


@pytest.mark.parametrize(("name", "module", "ok"), [
    ("core.podspecs.read_containers", "webhook.rules.pods", True),
    ("webhook.rules.admission.decide", "webhook.cli.check", True),
    ("snippets.Shape", "webhook.native.pods", True),
    ("Violation.subject", "webhook.core.field", True),
    ("podspecs.no_such_function", "webhook.rules.pods", False),
    ("webhook.core.nosuch", "webhook.rules.pods", False),
    ("policy.is_gpu", "webhook.native.snippets", True),
])
def test_a_name_resolves_from_where_it_is_written(name, module, ok):
    assert resolves(name, module) is ok


def test_a_policy_setting_is_not_taken_for_a_module():
    assert policy_setting("isolation.hideGpus") and policy_setting("checks.privilegedGpu")
    assert not policy_setting("isolation.container_gpus")
